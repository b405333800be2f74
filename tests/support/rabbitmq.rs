//! A rabbitmq-server node of the run (its own node name, ports, Mnesia and log directories under
//! the run directory, no plugins) with an epmd of the run's own, and a reader of its queues.
//!
//! The node runs the Erlang VM in the foreground as the harness's child (the package script
//! `exec`s `erl` when `RUNNING_UNDER_SYSTEMD` is set), so SIGTERM stops it cleanly and the
//! harness's SIGKILL at exit leaves nothing behind. Startup takes several seconds: a test run
//! starts one shared node and at most one private (restart) node.

use std::collections::HashMap;
use std::fs;
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

use super::kafka::Consumed;
use super::server::ServerProcess;
use super::{free_port, within};

/// The topic exchange the tests publish to (`sink.exchange`), declared by [`declare`].
pub const EXCHANGE: &str = "outbox";

/// How long a node may take to boot (several seconds on an idle machine).
const START_DEADLINE: Duration = Duration::from_secs(120);

/// The run's epmd (Erlang's port mapper), on a port of its own: every node of the run
/// registers there, and it goes with the run.
fn epmd_port() -> u16 {
    static EPMD: OnceLock<ServerProcess> = OnceLock::new();
    EPMD.get_or_init(|| {
        let port = free_port();
        ServerProcess::spawn("epmd", port, Duration::from_secs(30), move || {
            let mut cmd = Command::new("epmd");
            cmd.args(["-port", &port.to_string()]);
            cmd
        })
    })
    .port
}

/// The nodes' `max_message_size` (RabbitMQ 3.10's default is 128 MiB):
/// a larger message makes the server close the channel with `PRECONDITION_FAILED`.
pub const MAX_MESSAGE_SIZE: usize = 4 << 20;

/// Starts a RabbitMQ node listening for AMQP on 127.0.0.1:`port`, named
/// `outbox-<port>@localhost`, its data under the run directory, taking messages of up to
/// [`MAX_MESSAGE_SIZE`] bytes.
pub fn start(port: u16) -> ServerProcess {
    let epmd = epmd_port();
    let dist = free_port();
    let dir = ServerProcess::data_dir("rabbitmq", port);
    let config = dir.join("rabbitmq.conf");
    fs::write(
        &config,
        format!(
            "listeners.tcp.default = 127.0.0.1:{port}\nloopback_users = none\ndisk_free_limit.absolute = 10MB\nmax_message_size = {MAX_MESSAGE_SIZE}\n"
        ),
    )
    .expect("writing rabbitmq.conf");
    let plugins = dir.join("enabled_plugins");
    fs::write(&plugins, "[].\n").expect("writing enabled_plugins");
    for sub in ["home", "mnesia", "log"] {
        fs::create_dir_all(dir.join(sub)).expect("creating a rabbitmq directory");
    }
    ServerProcess::spawn("rabbitmq-server", port, START_DEADLINE, move || {
        let mut cmd = Command::new("/usr/lib/rabbitmq/bin/rabbitmq-server");
        cmd.env("RUNNING_UNDER_SYSTEMD", "true")
            .env("HOME", dir.join("home"))
            .env("ERL_EPMD_PORT", epmd.to_string())
            .env("RABBITMQ_NODENAME", format!("outbox-{port}@localhost"))
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", port.to_string())
            .env("RABBITMQ_DIST_PORT", dist.to_string())
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_CONFIG_FILE", &config)
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", &plugins);
        cmd
    })
}

/// `amqp://guest:guest@127.0.0.1:<port>/%2f` (the default user and vhost of a new node).
pub fn amqp_url(server: &ServerProcess) -> String {
    format!("amqp://guest:guest@127.0.0.1:{}/%2f", server.port)
}

/// A channel on a new connection to `server` (a test's runtime owns it); panics after 30 s.
pub async fn channel(server: &ServerProcess) -> (Connection, Channel) {
    let properties = ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio);
    let connection = within(
        "connecting to rabbitmq-server",
        Duration::from_secs(30),
        Connection::connect(&amqp_url(server), properties),
    )
    .await
    .unwrap_or_else(|e| panic!("connecting to rabbitmq-server on {}: {e}", server.port));
    let channel = connection
        .create_channel()
        .await
        .expect("opening a channel");
    (connection, channel)
}

/// Declares the durable topic exchange [`EXCHANGE`] and, per destination, a durable queue of
/// that name bound to it with the destination as binding key (what an operator would set up).
pub async fn declare(server: &ServerProcess, destinations: &[String]) {
    let (connection, channel) = channel(server).await;
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            EXCHANGE,
            ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await
        .expect("declaring the exchange");
    for queue in destinations {
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(queue, options, FieldTable::default())
            .await
            .unwrap_or_else(|e| panic!("declaring queue {queue}: {e}"));
        channel
            .queue_bind(
                queue,
                EXCHANGE,
                queue,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("binding queue {queue}: {e}"));
    }
    let _ = connection.close(200, "declared").await;
}

/// Unbinds `destination`'s queue: from now on a message with that routing key is unroutable.
pub async fn unbind(server: &ServerProcess, destination: &str) {
    let (connection, channel) = channel(server).await;
    channel
        .queue_unbind(destination, EXCHANGE, destination, FieldTable::default())
        .await
        .unwrap_or_else(|e| panic!("unbinding queue {destination}: {e}"));
    let _ = connection.close(200, "unbound").await;
}

/// Messages taken from the queues so far (`basic.get` takes them), by queue: a reader returns
/// them again with the new ones.
#[derive(Default)]
pub struct Taken(Mutex<HashMap<String, Vec<(Consumed, BasicProperties)>>>);

impl Taken {
    /// Takes every message now in `queues` (`basic.get` with auto-ack) and returns, per queue
    /// in arrival order, every message taken from it so far, as [`Consumed`] (topic = routing
    /// key; the `key` header as key; the body as value, `None` for an empty body without
    /// `content_type`: a tombstone) with its properties. Panics if the server does not answer
    /// within 30 s.
    pub async fn read(
        &self,
        server: &ServerProcess,
        queues: &[String],
    ) -> Vec<(Consumed, BasicProperties)> {
        let (connection, channel) = channel(server).await;
        let mut fresh: HashMap<String, Vec<(Consumed, BasicProperties)>> = HashMap::new();
        for queue in queues {
            loop {
                let got = within(
                    &format!("basic.get from {queue}"),
                    Duration::from_secs(30),
                    channel.basic_get(queue, BasicGetOptions { no_ack: true }),
                )
                .await
                .unwrap_or_else(|e| panic!("basic.get from {queue}: {e}"));
                let Some(message) = got else {
                    break;
                };
                let delivery = message.delivery;
                let properties = delivery.properties.clone();
                fresh.entry(queue.clone()).or_default().push((
                    consumed(
                        &delivery.routing_key.to_string(),
                        &properties,
                        delivery.data,
                    ),
                    properties,
                ));
            }
        }
        let _ = connection.close(200, "read").await;
        let mut taken = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (queue, messages) in fresh {
            let list = taken.entry(queue).or_default();
            for (mut record, properties) in messages {
                record.offset = list.len() as i64;
                list.push((record, properties));
            }
        }
        queues
            .iter()
            .flat_map(|q| taken.get(q).cloned().unwrap_or_default())
            .collect()
    }
}

/// A message as the scenarios compare records (see [`Taken::read`]).
fn consumed(routing_key: &str, properties: &BasicProperties, body: Vec<u8>) -> Consumed {
    let mut record = Consumed {
        topic: routing_key.to_owned(),
        partition: 0,
        offset: 0,
        key: None,
        value: (!body.is_empty() || properties.content_type().is_some()).then_some(body),
        headers: Vec::new(),
        timestamp_ms: properties.timestamp().map(|s| s as i64 * 1000),
    };
    let text = |v: &AMQPValue| match v {
        AMQPValue::LongString(s) => Some(s.as_bytes().to_vec()),
        AMQPValue::Void => None,
        other => panic!("header value {other:?}: the relay writes long strings"),
    };
    if let Some(headers) = properties.headers() {
        for (name, value) in headers.inner() {
            let name = name.to_string();
            match (name.as_str(), value) {
                ("key", v) => record.key = text(v),
                (_, AMQPValue::FieldArray(values)) => {
                    for v in values.as_slice() {
                        record.headers.push((name.clone(), text(v)));
                    }
                }
                (_, v) => record.headers.push((name, text(v))),
            }
        }
    }
    record
}
