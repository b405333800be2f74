//! A nats-server of the run (JetStream on, file storage in the run directory, so a stopped
//! server comes back with its streams), the streams the operator would create, and a reader
//! of what they hold.

pub mod operator;

use std::process::Command;
use std::time::Duration;

use async_nats::jetstream::{self, stream};

use super::kafka::Consumed;
use super::server::ServerProcess;
use super::within;

/// How long a JetStream request of the harness may take.
const DEADLINE: Duration = Duration::from_secs(30);

/// Starts a NATS server with JetStream on `port`, its store in the run directory, with `args`
/// after the harness's (`--user u --pass p`, `--auth <token>`, `-c <file>`).
pub fn start(port: u16, args: &[&str]) -> ServerProcess {
    let dir = ServerProcess::data_dir("nats", port);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    ServerProcess::spawn("nats-server", port, Duration::from_secs(30), move || {
        let mut cmd = Command::new("nats-server");
        cmd.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string()])
            .args(["-sd", &dir.display().to_string()])
            .args(&args);
        cmd
    })
}

/// Starts JetStream cluster node `name` (cluster `outbox-test`) for clients on `port`, for
/// the other nodes on `route`, joining the nodes whose route ports are `others`; its store in
/// the run directory, so a stopped node comes back with its streams.
pub fn start_cluster_node(name: &str, port: u16, route: u16, others: &[u16]) -> ServerProcess {
    let dir = ServerProcess::data_dir(&format!("nats-{name}"), port);
    let routes: Vec<String> = others
        .iter()
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect();
    let (name, routes) = (name.to_owned(), routes.join(","));
    ServerProcess::spawn("nats-server", port, Duration::from_secs(30), move || {
        let mut cmd = Command::new("nats-server");
        cmd.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string()])
            .args(["-sd", &dir.display().to_string()])
            .args(["--server_name", &name, "--cluster_name", "outbox-test"])
            .args(["--cluster", &format!("nats://127.0.0.1:{route}")])
            .args(["--routes", &routes]);
        cmd
    })
}

/// `nats://127.0.0.1:<port>`.
pub fn nats_url(server: &ServerProcess) -> String {
    format!("nats://127.0.0.1:{}", server.port)
}

/// A JetStream context on `server` (with `options` for its credentials). Panics if it does not
/// connect within 30 s.
pub async fn jetstream_with(
    server: &ServerProcess,
    options: async_nats::ConnectOptions,
) -> jetstream::Context {
    jetstream_at(&nats_url(server), options).await
}

/// A JetStream context on the server at `url`. Panics if it does not connect within 30 s.
pub async fn jetstream_at(url: &str, options: async_nats::ConnectOptions) -> jetstream::Context {
    let client = within("connecting to nats-server", DEADLINE, options.connect(url))
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    jetstream::new(client)
}

/// [`jetstream_with`] without credentials.
pub async fn jetstream(server: &ServerProcess) -> jetstream::Context {
    jetstream_with(server, async_nats::ConnectOptions::new()).await
}

/// The name of the test stream that takes exactly `subject`.
pub fn stream_name(subject: &str) -> String {
    let name: String = subject
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("T_{name}")
}

/// Creates (or updates) a file-stored stream taking exactly `subject`, with `duplicate_window`
/// and `max_message_size` (-1: no limit).
pub async fn create_stream(
    js: &jetstream::Context,
    subject: &str,
    duplicate_window: Duration,
    max_message_size: i32,
) {
    let config = stream::Config {
        name: stream_name(subject),
        subjects: vec![subject.to_owned()],
        storage: stream::StorageType::File,
        duplicate_window,
        max_message_size,
        ..Default::default()
    };
    within(
        &format!("creating stream {}", config.name),
        DEADLINE,
        js.get_or_create_stream(config.clone()),
    )
    .await
    .unwrap_or_else(|e| panic!("creating stream {}: {e}", config.name));
    within(
        &format!("updating stream {}", config.name),
        DEADLINE,
        js.update_stream(config.clone()),
    )
    .await
    .unwrap_or_else(|e| panic!("updating stream {}: {e}", config.name));
}

/// Every message the streams of `subjects` ([`stream_name`]) hold, as [`Consumed`] (topic =
/// subject, offset = stream sequence, header `key` as the key, every other header a header);
/// a subject without its stream holds nothing.
pub async fn read_subjects(js: &jetstream::Context, subjects: &[String]) -> Vec<Consumed> {
    let mut out = Vec::new();
    for subject in subjects {
        let name = stream_name(subject);
        let Ok(mut stream) =
            within(&format!("stream {name}"), DEADLINE, js.get_stream(&name)).await
        else {
            continue;
        };
        let last = within(&format!("info of {name}"), DEADLINE, stream.info())
            .await
            .unwrap_or_else(|e| panic!("info of {name}: {e}"))
            .state
            .last_sequence;
        for seq in 1..=last {
            let message = match within(
                &format!("message {seq} of {name}"),
                DEADLINE,
                stream.get_raw_message(seq),
            )
            .await
            {
                Ok(message) => message,
                Err(e) => panic!("message {seq} of {name}: {e}"),
            };
            let mut record = Consumed {
                topic: message.subject.to_string(),
                partition: 0,
                offset: seq as i64,
                key: None,
                value: Some(message.payload.to_vec()),
                headers: Vec::new(),
                timestamp_ms: None,
            };
            for (name, values) in message.headers.iter() {
                for value in values {
                    let value = value.as_str().as_bytes().to_vec();
                    match name.as_ref() {
                        "key" => record.key = Some(value),
                        name => record.headers.push((name.to_owned(), Some(value))),
                    }
                }
            }
            out.push(record);
        }
    }
    out
}
