//! The NATS JetStream sink against a real nats-server (JetStream, file storage), one stream per
//! destination subject as an operator would create them; and what is NATS's own: the
//! duplicate window against the copies of a `kill -9`, a message over the stream's size
//! limit, credentials, `check`.

use std::sync::OnceLock;
use std::time::Duration;

use crate::support::nats::operator::{stranger_creds, Operator};
use crate::support::nats::{
    create_stream, jetstream, nats_url, read_subjects, start, start_cluster_node, stream_name,
};
use crate::support::server::ServerProcess;
use crate::support::{free_port, wait_for, within, Auth, Consumed, Relay};
use crate::{assert_delivered, insert, write_events, Setup};

use super::{sink_scenarios, SinkServer};

/// JetStream's default duplicate window.
const TWO_MINUTES: Duration = Duration::from_secs(120);

/// A nats-server and the duplicate window of the streams [`SinkServer::prepare`] creates.
struct Nats {
    process: &'static ServerProcess,
    duplicate_window: Duration,
}

/// The run's NATS server, started on first use.
fn shared_process() -> &'static ServerProcess {
    static SERVER: OnceLock<ServerProcess> = OnceLock::new();
    SERVER.get_or_init(|| start(free_port(), &[]))
}

/// The run's NATS server with streams of the default duplicate window.
fn shared() -> &'static Nats {
    static NATS: OnceLock<Nats> = OnceLock::new();
    NATS.get_or_init(|| Nats {
        process: shared_process(),
        duplicate_window: TWO_MINUTES,
    })
}

/// A server of the test's own (the restart test stops it; it is killed at the run's end).
fn private() -> Nats {
    Nats {
        process: Box::leak(Box::new(start(free_port(), &[]))),
        duplicate_window: TWO_MINUTES,
    }
}

impl SinkServer for Nats {
    fn kind(&self) -> &'static str {
        "nats"
    }

    fn sink_settings(&self) -> String {
        format!("url = \"{}\"", nats_url(self.process))
    }

    async fn prepare(&self, destinations: &[String]) {
        let js = jetstream(self.process).await;
        for subject in destinations {
            create_stream(&js, subject, self.duplicate_window, -1).await;
        }
    }

    async fn read(&self, destinations: &[String]) -> Vec<Consumed> {
        read_subjects(&jetstream(self.process).await, destinations).await
    }

    async fn refuse(&self, destination: &str) {
        // No stream takes the subject any more: JetStream answers "no responders".
        let js = jetstream(self.process).await;
        let name = stream_name(destination);
        within(
            &format!("deleting stream {name}"),
            Duration::from_secs(30),
            js.delete_stream(&name),
        )
        .await
        .unwrap_or_else(|e| panic!("deleting stream {name}: {e}"));
    }

    fn stop(&self) {
        self.process.stop();
    }

    fn start(&self) {
        self.process.start();
    }

    fn invalid_aggregate_type(&self) -> &'static str {
        // A legal Kafka topic name, not a NATS subject (an empty token).
        "Orders..v2"
    }
}

sink_scenarios!(shared(), private(), bad_routing_input);

/// A line break in a header value, which no NATS header carries: the dead-letter copy goes out
/// all the same and the next row follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_nats_cannot_carry_is_dead_lettered_and_the_next_row_follows() {
    super::hostile_headers_are_dead_lettered(shared(), r#"{"trace": "a\r\nNats-Msg-Id: x"}"#).await;
}

/// Events in the stream of `subject` (copies included).
async fn stored(js: &async_nats::jetstream::Context, subject: &str) -> u64 {
    let name = stream_name(subject);
    let mut stream = within(
        &format!("stream {name}"),
        Duration::from_secs(30),
        js.get_stream(&name),
    )
    .await
    .unwrap_or_else(|e| panic!("stream {name}: {e}"));
    within(
        &format!("info of {name}"),
        Duration::from_secs(30),
        stream.info(),
    )
    .await
    .unwrap_or_else(|e| panic!("info of {name}: {e}"))
    .state
    .messages
}

/// A backlog of 10 transactions of 500 events drained by a relay killed with `kill -9` five
/// times, each when the stream holds about half a transaction more than the last time (so
/// acknowledged events of an unconfirmed transaction are published again); then drained to
/// the end. Returns the records in the stream and the events written.
async fn kill_9_while_draining(server: &Nats) -> (usize, usize) {
    let setup = super::setup("nats_dupes", &["Order"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let (_dir, args) = super::relay_args(&setup, server, "");
    // The slot first, then the backlog behind it.
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    relay.kill();
    setup.wait_released("the first relay's kill -9").await;
    let (written, before_commit) = write_events(
        &setup.db.client,
        10,
        500,
        &setup.types,
        50,
        0,
        Duration::ZERO,
    )
    .await;
    let js = jetstream(server.process).await;
    for round in 1..=5u64 {
        let threshold = (round - 1) * 1000 + 250;
        let mut relay = Relay::spawn(&args);
        wait_for(
            &format!("{threshold} messages in the stream before kill -9 {round}"),
            Duration::from_secs(60),
            || async { (stored(&js, &destinations[0]).await >= threshold).then_some(()) },
        )
        .await;
        relay.kill();
        setup.wait_released(&format!("kill -9 {round}")).await;
    }
    let relay = Relay::spawn(&args);
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "the slot to be confirmed past the backlog",
            Duration::from_secs(120),
        )
        .await;
    let got = read_subjects(&js, &destinations).await;
    assert_delivered(&written, &got, false);
    drop(relay);
    (got.len(), written.len())
}

/// The copies that `kill -9`s make: none stay in a stream whose duplicate window covers the
/// test (the default 2 minutes; `Nats-Msg-Id` is the event id), some with the shortest window
/// JetStream takes (100 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_window_drops_the_copies_a_kill_9_makes() {
    let without = Nats {
        process: shared_process(),
        duplicate_window: Duration::from_millis(100),
    };
    let (copies, events_without) = kill_9_while_draining(&without).await;
    let with = Nats {
        process: shared_process(),
        duplicate_window: TWO_MINUTES,
    };
    let (records, events) = kill_9_while_draining(&with).await;
    eprintln!(
        "kill -9 x5 while draining: duplicate window 100 ms: {copies} records for {events_without} events; 2 min: {records} records for {events} events"
    );
    assert!(
        copies > events_without,
        "the kills made no copies ({copies} records for {events_without} events): the test shows nothing"
    );
    assert_eq!(
        records, events,
        "a 2 minute duplicate window leaves one copy of each event"
    );
}

/// `run --config` for one pipeline on `setup` with the sink table `sink` (TOML lines after
/// `kind = "nats"`) and `extra` pipeline keys.
fn nats_relay_args(setup: &Setup, sink: &str, extra: &str) -> (tempfile::TempDir, Vec<String>) {
    crate::run_with_config(&format!(
        "[[pipelines]]\nname = \"{slot}\"\nsource_url = \"{url}\"\nslot = \"{slot}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\n{extra}\n[pipelines.sink]\nkind = \"nats\"\n{sink}\n",
        slot = setup.slot,
        url = setup.db.url(Auth::Trust),
    ))
}

/// A message over the stream's `max_msg_size` is refused by JetStream, one over the server's
/// `max_payload` by the relay before sending (the server would close the connection): both
/// are dead-lettered without their value, naming the sizes, and the events after them flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_records_are_refused_by_the_stream_or_before_sending() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nats.conf");
    std::fs::write(&conf, "max_payload: 8192\n").unwrap();
    let process: &'static ServerProcess = Box::leak(Box::new(start(
        free_port(),
        &["-c", &conf.display().to_string()],
    )));
    let setup = super::setup("nats_big", &["Order", "Big"]).await;
    let destinations = setup.topics();
    let dead_letter = format!("{}.dead-letter", setup.slot);
    let js = jetstream(process).await;
    create_stream(&js, &destinations[0], TWO_MINUTES, -1).await;
    create_stream(&js, &destinations[1], TWO_MINUTES, 1024).await;
    create_stream(&js, &dead_letter, TWO_MINUTES, -1).await;
    let (_dir, args) = nats_relay_args(
        &setup,
        &format!("url = \"{}\"", nats_url(process)),
        &format!("on_bad_event = \"dead_letter\"\ndead_letter_topic = \"{dead_letter}\""),
    );
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let client = &setup.db.client;
    let big = |n: usize| format!(r#"{{"pad": "{}"}}"#, "x".repeat(n));
    let first = insert(client, &setup.types[0], "k1", r#"{"n": 1}"#).await;
    let over_stream = insert(client, &setup.types[1], "k1", &big(2000)).await;
    let over_server = insert(client, &setup.types[0], "k1", &big(10_000)).await;
    let last = insert(client, &setup.types[0], "k1", r#"{"n": 4}"#).await;
    let dead = super::read_until(
        &Nats {
            process,
            duplicate_window: TWO_MINUTES,
        },
        std::slice::from_ref(&dead_letter),
        2,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    let got = read_subjects(&js, &destinations[..1]).await;
    assert_delivered(&[first, last], &got, true);
    let reason = |id: &str| {
        let record = dead
            .iter()
            .find(|r| r.header_str("id").as_deref() == Some(id))
            .unwrap_or_else(|| panic!("{id} not dead-lettered: {dead:?}"));
        let document: serde_json::Value =
            serde_json::from_slice(record.value.as_deref().expect("the copy's document")).unwrap();
        assert_eq!(
            document.get("value"),
            None,
            "a too-large copy carries no value: {document}"
        );
        record.header_str("outbox_relay_error").unwrap_or_default()
    };
    let by_stream = reason(&over_stream.id);
    assert!(
        by_stream.contains("message size exceeds maximum"),
        "{by_stream}"
    );
    let by_server = reason(&over_server.id);
    assert!(
        by_server.contains("exceed the server's max_payload of 8192 bytes"),
        "{by_server}"
    );
    drop(relay);
}

/// Credentials from the environment (a password in the URL, or beside it as `password`) and
/// from a file (a token) reach the server and never the log; refused credentials stop the relay with an error naming the
/// server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_come_from_the_environment_or_files_and_stay_out_of_the_log() {
    const PASSWORD: &str = "pw-0f3a9c";
    const TOKEN: &str = "tok-77d1e2";
    let with_password: &'static ServerProcess = Box::leak(Box::new(start(
        free_port(),
        &["--user", "relay", "--pass", PASSWORD],
    )));
    let with_token: &'static ServerProcess =
        Box::leak(Box::new(start(free_port(), &["--auth", TOKEN])));
    let setup = super::setup("nats_auth", &["Order"]).await;
    let destinations = setup.topics();
    let options =
        async_nats::ConnectOptions::with_user_and_password("relay".into(), PASSWORD.into());
    let js_password = crate::support::nats::jetstream_with(with_password, options).await;
    create_stream(&js_password, &destinations[0], TWO_MINUTES, -1).await;
    let js_token = crate::support::nats::jetstream_with(
        with_token,
        async_nats::ConnectOptions::with_token(TOKEN.into()),
    )
    .await;
    create_stream(&js_token, &destinations[0], TWO_MINUTES, -1).await;

    let url = format!(
        "url = \"nats://relay:${{NATS_PASSWORD}}@127.0.0.1:{}\"",
        with_password.port
    );
    let env = [("NATS_PASSWORD", PASSWORD)];
    let log = deliver_one(&setup, &js_password, &url, &env, 1, "password").await;
    assert!(
        !log.contains(PASSWORD),
        "the password is in the log:\n{log}"
    );

    let token_file = setup_file("token", TOKEN);
    let sink = format!(
        "url = \"nats://127.0.0.1:{}\"\ntoken_file = \"{}\"",
        with_token.port,
        token_file.1.display()
    );
    // The first event went to the other server (and the slot past it): this one alone arrives.
    let log = deliver_one(&setup, &js_token, &sink, &[], 2, "token").await;
    assert!(!log.contains(TOKEN), "the token is in the log:\n{log}");

    // A password with URL punctuation, beside the URL: taken as written.
    const PUNCTUATED: &str = "p@ss#w/rd:9?";
    let with_punctuated: &'static ServerProcess = Box::leak(Box::new(start(
        free_port(),
        &["--user", "relay", "--pass", PUNCTUATED],
    )));
    let js_punctuated = crate::support::nats::jetstream_with(
        with_punctuated,
        async_nats::ConnectOptions::with_user_and_password("relay".into(), PUNCTUATED.into()),
    )
    .await;
    create_stream(&js_punctuated, &destinations[0], TWO_MINUTES, -1).await;
    let sink = format!(
        "url = \"nats://relay@127.0.0.1:{}\"\npassword = \"${{NATS_PASSWORD}}\"",
        with_punctuated.port
    );
    let env = [("NATS_PASSWORD", PUNCTUATED)];
    let log = deliver_one(
        &setup,
        &js_punctuated,
        &sink,
        &env,
        3,
        "punctuated password",
    )
    .await;
    assert!(
        !log.contains(PUNCTUATED),
        "the password is in the log:\n{log}"
    );

    let url = format!(
        "url = \"nats://relay:wrong-{PASSWORD}@127.0.0.1:{}\"",
        with_password.port
    );
    let shown = format!("nats://relay:***@127.0.0.1:{}", with_password.port);
    let log = refused_naming(&setup, &url, &shown);
    assert!(
        !log.contains(PASSWORD),
        "the password is in the log:\n{log}"
    );
}

/// An nkey seed from a file authenticates with a server that knows the user by its public key
/// and never reaches the log; a seed the server does not know stops the relay with an error
/// naming the server and the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nkey_seed_from_a_file_authenticates_and_stays_out_of_the_log() {
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let server_config = setup_file(
        "nats.conf",
        &format!(
            "authorization {{\n  users = [ {{ nkey: \"{}\" }} ]\n}}\n",
            user.public_key()
        ),
    );
    let server: &'static ServerProcess = Box::leak(Box::new(start(
        free_port(),
        &["-c", &server_config.1.display().to_string()],
    )));
    let setup = super::setup("nats_nkey", &["Order"]).await;
    let destinations = setup.topics();
    let js = crate::support::nats::jetstream_with(
        server,
        async_nats::ConnectOptions::with_nkey(seed.clone()),
    )
    .await;
    create_stream(&js, &destinations[0], TWO_MINUTES, -1).await;

    // As seed files are written: the seed on a line of its own.
    let seed_file = setup_file("relay.nk", &format!("{seed}\n"));
    let settings = |seed_file: &std::path::Path| {
        format!(
            "url = \"nats://127.0.0.1:{}\"\nnkey_file = \"{}\"",
            server.port,
            seed_file.display()
        )
    };
    let log = deliver_one(&setup, &js, &settings(&seed_file.1), &[], 1, "nkey").await;
    assert!(!log.contains(&seed), "the seed is in the log:\n{log}");

    let stranger = nkeys::KeyPair::new_user().seed().unwrap();
    let stranger_file = setup_file("stranger.nk", &stranger);
    let shown = format!("nats://127.0.0.1:{}", server.port);
    let log = refused_naming(&setup, &settings(&stranger_file.1), &shown);
    assert!(!log.contains(&stranger), "the seed is in the log:\n{log}");
}

/// Operator mode (decentralized JWT authentication, as `nsc` sets it up): a `.creds` file of a
/// user of an account the server knows takes the relay in; one of an account it does not know
/// stops the relay naming the server; neither file's seed reaches the log at debug level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creds_file_authenticates_in_operator_mode_and_stays_out_of_the_log() {
    let operator = Operator::new();
    let server_config = setup_file("nats.conf", &operator.server_config());
    let server: &'static ServerProcess = Box::leak(Box::new(start(
        free_port(),
        &["-c", &server_config.1.display().to_string()],
    )));
    let setup = super::setup("nats_creds", &["Order"]).await;
    let destinations = setup.topics();
    let (admin, _) = operator.user_creds();
    let js = crate::support::nats::jetstream_with(
        server,
        async_nats::ConnectOptions::with_credentials(&admin).unwrap(),
    )
    .await;
    create_stream(&js, &destinations[0], TWO_MINUTES, -1).await;

    let settings = |creds_file: &std::path::Path| {
        format!(
            "url = \"nats://127.0.0.1:{}\"\ncredentials_file = \"{}\"",
            server.port,
            creds_file.display()
        )
    };
    let (creds, seed) = operator.user_creds();
    let creds_file = setup_file("relay.creds", &creds);
    let log = deliver_one(
        &setup,
        &js,
        &settings(&creds_file.1),
        &[],
        1,
        "operator-mode",
    )
    .await;
    assert!(!log.contains(&seed), "the seed is in the log:\n{log}");

    // Operator mode refuses a connection without credentials too: this half shows the error
    // and that the seed stays out of the log; the half above shows the file is used.
    let (stranger, stranger_seed) = stranger_creds();
    let stranger_file = setup_file("stranger.creds", &stranger);
    let shown = format!("nats://127.0.0.1:{}", server.port);
    let log = refused_naming(&setup, &settings(&stranger_file.1), &shown);
    assert!(
        !log.contains(&stranger_seed),
        "the seed is in the log:\n{log}"
    );
}

/// Runs the relay with the sink settings `sink` and `env` (logging at debug), writes event `n`
/// and waits until the `server` server's stream (`js`) holds it and nothing else; returns the
/// relay's log, the relay stopped.
async fn deliver_one(
    setup: &Setup,
    js: &async_nats::jetstream::Context,
    sink: &str,
    env: &[(&str, &str)],
    n: u32,
    server: &str,
) -> String {
    let destinations = setup.topics();
    let (_dir, args) = nats_relay_args(setup, sink, "");
    let env: Vec<(&str, &str)> = env.iter().copied().chain([("RUST_LOG", "debug")]).collect();
    let relay = Relay::spawn_with_env(&args, &env);
    setup.wait_streaming().await;
    let payload = format!(r#"{{"n": {n}}}"#);
    let event = insert(&setup.db.client, &setup.types[0], "k1", &payload).await;
    wait_for(
        &format!("the event in the {server} server's stream"),
        Duration::from_secs(60),
        || async { (!read_subjects(js, &destinations).await.is_empty()).then_some(()) },
    )
    .await;
    assert_delivered(&[event], &read_subjects(js, &destinations).await, true);
    let log = relay.log();
    drop(relay);
    log
}

/// Runs the relay with the sink settings `sink` (logging at debug) and asserts that the server
/// refuses its credentials: it stops with an error naming the server as `shown` and the
/// refusal. Returns its log.
fn refused_naming(setup: &Setup, sink: &str, shown: &str) -> String {
    let (_dir, args) = nats_relay_args(setup, sink, "");
    let mut relay = Relay::spawn_with_env(&args, &[("RUST_LOG", "debug")]);
    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert!(
        !status.success(),
        "the relay exited with {status} on refused credentials"
    );
    assert!(
        log.contains(shown) && log.contains("authorization violation"),
        "the error names the server ({shown}) and the refusal:\n{}",
        crate::support::tail_lines(&log, 20)
    );
    log
}

/// A file in a directory that lives as long as the returned handle.
fn setup_file(name: &str, contents: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, contents).unwrap();
    (dir, path)
}

/// `check` says which stream takes the template's subjects: none on a server without streams
/// (a failure naming the subjects), some with a stream per aggregate type (a warning), all
/// with a stream for `*.events`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_says_which_stream_takes_the_subjects() {
    let process: &'static ServerProcess = Box::leak(Box::new(start(free_port(), &[])));
    let setup = super::setup("nats_check", &["Order"]).await;
    let (_dir, mut args) = nats_relay_args(&setup, &format!("url = \"{}\"", nats_url(process)), "");
    args = crate::as_command(&args, "check");
    let check = |expect: &'static str| {
        let args = args.clone();
        async move {
            let mut check = Relay::spawn(&args);
            check.wait(Duration::from_secs(60));
            let out = check.log();
            assert!(
                out.lines()
                    .any(|l| l.contains("nats stream") && l.contains(expect)),
                "no `nats stream` line with {expect:?}:\n{out}"
            );
        }
    };
    check("no stream takes subjects *.events").await;
    let js = jetstream(process).await;
    create_stream(&js, &setup.topics()[0], TWO_MINUTES, -1).await;
    check("only some subjects *.events go to a stream").await;
    within(
        "deleting the stream",
        Duration::from_secs(30),
        js.delete_stream(stream_name(&setup.topics()[0])),
    )
    .await
    .unwrap();
    let config = async_nats::jetstream::stream::Config {
        name: "EVENTS".into(),
        subjects: vec!["*.events".into()],
        ..Default::default()
    };
    within(
        "creating EVENTS",
        Duration::from_secs(30),
        js.create_stream(config),
    )
    .await
    .unwrap();
    check("subjects *.events go to stream EVENTS (duplicate window 120s").await;
}

/// The polling source publishes to NATS too: every event once, per key in order, and its row
/// marked published only after the PubAck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_polling_source_publishes_to_nats() {
    let setup = super::setup("nats_polling", &["Order", "Customer"]).await;
    let kit = std::fs::read_to_string(
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sql/outbox_polling.sql"),
    )
    .unwrap();
    let client = &setup.db.client;
    client
        .batch_execute("DROP PUBLICATION outbox_pub; DROP TABLE outbox;")
        .await
        .unwrap();
    client.batch_execute(&kit).await.unwrap();
    let destinations = setup.topics();
    shared().prepare(&destinations).await;
    let (_dir, args) = crate::run_with_config(&format!(
        "[[pipelines]]\nname = \"{name}\"\nsource_url = \"{url}\"\nsource_kind = \"polling\"\ntable = \"public.outbox\"\n[pipelines.sink]\nkind = \"nats\"\n{sink}\n",
        name = setup.slot,
        url = setup.db.url(Auth::Trust),
        sink = shared().sink_settings(),
    ));
    let relay = Relay::spawn(&args);
    let (written, _) = write_events(client, 20, 3, &setup.types, 4, 0, Duration::ZERO).await;
    let got = super::read_until(
        shared(),
        &destinations,
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &got, true);
    wait_for(
        "every row marked PUBLISHED",
        Duration::from_secs(30),
        || async {
            let row = client
                .query_one(
                    "SELECT count(*) FROM outbox WHERE status <> 'PUBLISHED'",
                    &[],
                )
                .await
                .unwrap();
            (row.get::<_, i64>(0) == 0).then_some(())
        },
    )
    .await;
    drop(relay);
}

/// `tls://` verifies the server with the system's trusted roots (here `SSL_CERT_FILE`, which
/// the system's certificate loader reads): with the test CA among them the events flow;
/// without it the relay stops (connecting again would not help) naming the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verifies_the_server_with_the_system_roots() {
    let ca = crate::support::pg().ca_cert();
    let certs = ca.parent().unwrap();
    let (cert, key) = (certs.join("server.crt"), certs.join("server.key"));
    let process: &'static ServerProcess = Box::leak(Box::new(start(
        free_port(),
        &[
            "--tls",
            "--tlscert",
            &cert.display().to_string(),
            "--tlskey",
            &key.display().to_string(),
        ],
    )));
    let url = format!("tls://localhost:{}", process.port);
    let js = crate::support::nats::jetstream_at(
        &url,
        async_nats::ConnectOptions::new().add_root_certificates(ca.clone()),
    )
    .await;
    let setup = super::setup("nats_tls", &["Order"]).await;
    let destinations = setup.topics();
    create_stream(&js, &destinations[0], TWO_MINUTES, -1).await;
    let (_dir, args) = nats_relay_args(&setup, &format!("url = \"{url}\""), "");
    let ca_file = ca.display().to_string();
    let relay = Relay::spawn_with_env(&args, &[("SSL_CERT_FILE", &ca_file)]);
    setup.wait_streaming().await;
    let one = insert(&setup.db.client, &setup.types[0], "k1", r#"{"n": 1}"#).await;
    wait_for("the event over TLS", Duration::from_secs(60), || async {
        (!read_subjects(&js, &destinations).await.is_empty()).then_some(())
    })
    .await;
    assert_delivered(&[one], &read_subjects(&js, &destinations).await, true);
    drop(relay);

    // An empty file of roots: the test CA is not trusted.
    let empty = setup_file("no-roots.pem", "");
    let mut relay =
        Relay::spawn_with_env(&args, &[("SSL_CERT_FILE", &empty.1.display().to_string())]);
    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert!(
        !status.success(),
        "the relay exited with {status} on an untrusted server"
    );
    assert!(
        log.contains(&url) && log.contains("invalid peer certificate"),
        "the error names the server and TLS:\n{}",
        crate::support::tail_lines(&log, 20)
    );
}

/// A three-node JetStream cluster, a stream of one replica, and the node holding it stopped
/// while events come: publishes get "no responders" though the stream exists. The relay,
/// connected to another node, retries them (JetStream still knows the stream: its leader is
/// out of reach) instead of refusing them, and once the node is back every event is in the
/// stream, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_responders_from_a_stream_whose_node_is_down_is_retried_not_refused() {
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let nodes: Vec<ServerProcess> = (0..3)
        .map(|i| {
            let others: Vec<u16> = (0..3).filter(|j| *j != i).map(|j| ports[j].1).collect();
            start_cluster_node(&format!("n{i}"), ports[i].0, ports[i].1, &others)
        })
        .collect();
    let setup = super::setup("nats_leaderless", &["Order"]).await;
    let destinations = setup.topics();
    let js = jetstream(&nodes[0]).await;
    // The cluster's meta leader is elected within seconds of the routes connecting.
    let config = async_nats::jetstream::stream::Config {
        name: stream_name(&destinations[0]),
        subjects: destinations.clone(),
        storage: async_nats::jetstream::stream::StorageType::File,
        num_replicas: 1,
        ..Default::default()
    };
    wait_for(
        "the cluster to create the stream",
        Duration::from_secs(60),
        || async { js.get_or_create_stream(config.clone()).await.ok() },
    )
    .await;
    let leader = wait_for("the stream's leader", Duration::from_secs(30), || async {
        let mut stream = js.get_stream(&config.name).await.ok()?;
        let info = stream.info().await.ok()?;
        info.cluster.as_ref()?.leader.clone()
    })
    .await;
    let holder = (0..3).find(|i| leader == format!("n{i}")).unwrap();
    let other = &nodes[(holder + 1) % 3];
    let js = jetstream(other).await;

    let (_dir, args) = nats_relay_args(&setup, &format!("url = \"{}\"", nats_url(other)), "");
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let mut written = vec![insert(&setup.db.client, &setup.types[0], "k1", r#"{"n": 0}"#).await];
    wait_for(
        "the first event in the stream",
        Duration::from_secs(60),
        || async { (!read_subjects(&js, &destinations).await.is_empty()).then_some(()) },
    )
    .await;

    nodes[holder].stop();
    for n in 1..=5 {
        let payload = format!(r#"{{"n": {n}}}"#);
        written.push(insert(&setup.db.client, &setup.types[0], "k1", &payload).await);
    }
    // Until the relay meets "no responders" and retries it; the relay stopping fails the test.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let log = relay.log();
        if log.contains("did not answer (no responders)") {
            break;
        }
        let tail = crate::support::tail_lines(&log, 30);
        assert!(
            relay.is_running(),
            "the relay stopped while the stream's node was down:\n{tail}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the relay met no \"no responders\" within 60 s of the node's stop:\n{tail}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    nodes[holder].start();
    wait_for(
        "every event in the stream",
        Duration::from_secs(90),
        || async { (read_subjects(&js, &destinations).await.len() >= written.len()).then_some(()) },
    )
    .await;
    assert_delivered(&written, &read_subjects(&js, &destinations).await, true);
    drop(relay);
}

/// A server without JetStream: publishes get "no responders" and so does the stream lookup.
/// There is nothing to wait for, so the relay stops naming it rather than retrying forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_jetstream_stops_the_pipeline_naming_it() {
    let port = free_port();
    let plain = ServerProcess::spawn("nats-server", port, Duration::from_secs(30), move || {
        let mut cmd = std::process::Command::new("nats-server");
        cmd.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
        cmd
    });
    let setup = super::setup("nats_no_js", &["Order"]).await;
    let (_dir, args) = nats_relay_args(&setup, &format!("url = \"{}\"", nats_url(&plain)), "");
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    insert(&setup.db.client, &setup.types[0], "k1", r#"{"n": 1}"#).await;
    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert!(
        !status.success(),
        "the relay exited with {status} without JetStream"
    );
    assert!(
        log.contains("JetStream is not enabled"),
        "the error says why:\n{}",
        crate::support::tail_lines(&log, 30)
    );
}

/// CloudEvents in binary mode over NATS (the NATS binding): `ce-` headers with
/// percent-encoded values, `ce-datacontenttype`, the payload byte for byte as the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_cloudevents_carry_ce_headers_and_the_payload() {
    let server = shared();
    let setup = super::setup("nats_ce", &["Order"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let (_dir, args) = super::relay_args(
        &setup,
        server,
        "value_format = \"cloudevents\"\ncolumns = { timestamp = \"created_at\" }\ncloudevents = { mode = \"binary\", source = \"urn:shop:orders\" }",
    );
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let id: String = within(
        "INSERT of an outbox row",
        Duration::from_secs(30),
        setup.db.client.query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
             VALUES ($1, 'o 1 €', 'OrderCreated', '{\"total\": 12.50}', '2026-12-06 11:26:51.123+00')
             RETURNING id::text",
            &[&setup.types[0]],
        ),
    )
    .await
    .unwrap()
    .get(0);
    let got = super::read_until(
        server,
        &destinations,
        1,
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    drop(relay);
    assert_eq!(got[0].value.as_deref(), Some(&br#"{"total": 12.50}"#[..]));
    let header = |name: &str| {
        got[0]
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
            .map(|v| String::from_utf8(v.to_vec()).unwrap())
    };
    for (name, value) in [
        ("ce-specversion", "1.0"),
        ("ce-id", id.as_str()),
        ("ce-source", "urn:shop:orders"),
        ("ce-type", "OrderCreated"),
        ("ce-subject", "o%201%20%E2%82%AC"),
        ("ce-time", "2026-12-06T11:26:51.123Z"),
        ("ce-datacontenttype", "application/json"),
        ("id", id.as_str()),
    ] {
        assert_eq!(header(name).as_deref(), Some(value), "header {name}");
    }
}
