//! The RabbitMQ sink against a real rabbitmq-server 3.10 node: the shared scenarios (a queue
//! unbound from the exchange makes its routing key unroutable: the refusal), a routing key over
//! AMQP's 255 bytes as bad routing input, and what RabbitMQ adds: message properties, a
//! routing key Kafka would refuse, `check`, and the polling source.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lapin::types::AMQPValue;

use crate::support::rabbitmq::{
    amqp_url, declare, start, unbind, Taken, EXCHANGE, MAX_MESSAGE_SIZE,
};
use crate::support::server::ServerProcess;
use crate::support::{free_port, tail_lines, within, Consumed, Relay};
use crate::{assert_delivered, insert, run_with_config};

use super::{dead_letter_to, read_until, relay_args, setup, sink_scenarios, SinkServer};

struct RabbitMq {
    server: ServerProcess,
    taken: Taken,
}

impl RabbitMq {
    fn new(port: u16) -> RabbitMq {
        RabbitMq {
            server: start(port),
            taken: Taken::default(),
        }
    }
}

/// The run's RabbitMQ node, started on first use.
fn shared() -> &'static RabbitMq {
    static SERVER: OnceLock<RabbitMq> = OnceLock::new();
    SERVER.get_or_init(|| RabbitMq::new(free_port()))
}

impl SinkServer for RabbitMq {
    fn kind(&self) -> &'static str {
        "rabbitmq"
    }

    fn sink_settings(&self) -> String {
        format!(
            "url = \"{}\"\nexchange = \"{EXCHANGE}\"",
            amqp_url(&self.server)
        )
    }

    async fn prepare(&self, destinations: &[String]) {
        declare(&self.server, destinations).await;
    }

    async fn read(&self, destinations: &[String]) -> Vec<Consumed> {
        let got = self.taken.read(&self.server, destinations).await;
        got.into_iter().map(|(record, _)| record).collect()
    }

    async fn refuse(&self, destination: &str) {
        // No queue bound for the routing key: the message comes back (mandatory), for good.
        unbind(&self.server, destination).await;
    }

    fn stop(&self) {
        self.server.stop();
    }

    fn start(&self) {
        self.server.start();
    }

    fn invalid_aggregate_type(&self) -> &'static str {
        // `<aggregate type>.events` is over AMQP's 255 bytes for a routing key.
        static LONG: OnceLock<String> = OnceLock::new();
        LONG.get_or_init(|| "A".repeat(250))
    }
}

sink_scenarios!(shared(), RabbitMq::new(free_port()), bad_routing_input);

/// A header name over AMQP's 255 bytes: the dead-letter copy goes out all the same and the next
/// row follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_amqp_cannot_carry_is_dead_lettered_and_the_next_row_follows() {
    let headers = format!(r#"{{"{}": "v"}}"#, "h".repeat(300));
    super::hostile_headers_are_dead_lettered(shared(), &headers).await;
}

/// A config file's text: one pipeline on `setup` with the RabbitMQ sink table `sink` (its
/// TOML lines after `kind`).
fn pipeline_toml(setup: &crate::Setup, sink: &str) -> String {
    format!(
        "[[pipelines]]\nname = \"{slot}\"\nsource_url = \"{url}\"\nslot = \"{slot}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\n[pipelines.sink]\nkind = \"rabbitmq\"\n{sink}\n",
        slot = setup.slot,
        url = setup.db.url(crate::support::Auth::Trust),
    )
}

/// A persistent message with the event id as `message_id`, JSON content type, the commit time
/// and every header; its routing key has a space, which no Kafka topic may have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_persistent_with_id_headers_and_any_routing_key() {
    let server = shared();
    let setup = setup("rabbitmq_props", &["Order Line"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let (_dir, args) = relay_args(&setup, server, "");
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let row = setup
        .db
        .client
        .query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
             VALUES ($1, 'o-1', 'Created', '{\"n\": 1}', '{\"trace\": \"t-1\", \"key\": \"clash\"}')
             RETURNING id::text",
            &[&setup.types[0]],
        )
        .await
        .unwrap();
    let id: String = row.get(0);
    let got = read_until(
        server,
        &destinations,
        1,
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    let taken = server.taken.read(&server.server, &destinations).await;
    let (record, properties) = &taken[0];
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(record.topic, destinations[0]);
    assert_eq!(record.key.as_deref(), Some(&b"o-1"[..]));
    assert_eq!(record.value.as_deref(), Some(&br#"{"n": 1}"#[..]));
    assert_eq!(properties.delivery_mode(), &Some(2), "persistent");
    assert_eq!(
        properties.message_id().as_ref().map(|s| s.to_string()),
        Some(id.clone())
    );
    assert_eq!(
        properties
            .content_type()
            .as_ref()
            .map(|s| s.to_string())
            .as_deref(),
        Some("application/json")
    );
    let at = properties.timestamp().expect("a timestamp");
    assert!(
        at + 1 >= before && at <= before + 60,
        "commit time {at}, test started {before}"
    );
    for (name, value) in [
        ("id", id.as_str()),
        ("event_type", "Created"),
        ("trace", "t-1"),
        ("header.key", "clash"),
    ] {
        assert_eq!(
            record.header_str(name).as_deref(),
            Some(value),
            "header {name}: {:?}",
            record.headers
        );
    }
    assert!(
        matches!(
            properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("key").cloned()),
            Some(AMQPValue::LongString(_))
        ),
        "the aggregate id as a long string header"
    );
    drop(relay);
}

/// `check`: reachable, authenticated, the exchange exists; a missing exchange and a refused
/// password fail, naming the exchange and the server, never the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_finds_the_exchange_and_refuses_bad_credentials() {
    let server = shared();
    let setup = setup("rabbitmq_check", &["Order"]).await;
    server.prepare(&setup.topics()).await;
    let check = |settings: String| {
        let toml = pipeline_toml(&setup, &settings);
        let (dir, mut args) = run_with_config(&toml);
        args = crate::as_command(&args, "check");
        let mut relay = Relay::spawn(&args);
        let ok = relay.wait(Duration::from_secs(60)).success();
        drop(dir);
        (ok, relay.log())
    };
    let (ok, out) = check(server.sink_settings());
    assert!(ok, "{out}");
    assert!(
        out.contains("ok    rabbitmq") && out.contains("exchange \"outbox\" exists"),
        "{out}"
    );

    let url = amqp_url(&server.server);
    let (ok, out) = check(format!("url = \"{url}\"\nexchange = \"no-such-exchange\""));
    assert!(!ok, "check passed with a missing exchange:\n{out}");
    assert!(
        out.contains("FAIL  rabbitmq") && out.contains("no-such-exchange"),
        "{}",
        tail_lines(&out, 20)
    );

    let bad = url.replace("guest:guest", "guest:not-the-password");
    let (ok, out) = check(format!("url = \"{bad}\"\nexchange = \"{EXCHANGE}\""));
    assert!(!ok, "check passed with a wrong password:\n{out}");
    assert!(
        out.contains("FAIL  rabbitmq") && out.contains(&server.server.port.to_string()),
        "{}",
        tail_lines(&out, 20)
    );
    assert!(
        !out.contains("not-the-password"),
        "the password is in the output:\n{out}"
    );

    // `run` with it stops the pipeline (retrying cannot fix a refused login), password hidden.
    let toml_settings = format!("url = \"{bad}\"\nexchange = \"{EXCHANGE}\"");
    let toml = pipeline_toml(&setup, &toml_settings);
    let (_dir, args) = run_with_config(&toml);
    let mut relay = Relay::spawn(&args);
    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert!(
        !status.success(),
        "run succeeded with a wrong password:\n{log}"
    );
    assert!(
        log.contains("ACCESS") && !log.contains("not-the-password"),
        "{}",
        tail_lines(&log, 20)
    );
}

/// The polling source publishes through the RabbitMQ sink too, and marks rows only once
/// confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_polling_source_publishes_to_rabbitmq() {
    let server = shared();
    let setup = setup("rabbitmq_polling", &["Order"]).await;
    let client = &setup.db.client;
    let kit = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sql/outbox_polling.sql"),
    )
    .unwrap();
    client
        .batch_execute("DROP PUBLICATION outbox_pub; DROP TABLE outbox;")
        .await
        .unwrap();
    client.batch_execute(&kit).await.unwrap();
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let mut written = Vec::new();
    for n in 0..20 {
        written.push(
            insert(
                client,
                &setup.types[0],
                &format!("k{}", n % 3),
                &format!(r#"{{"n": {n}}}"#),
            )
            .await,
        );
    }
    let toml = format!(
        "[[pipelines]]\nname = \"{name}\"\nsource_url = \"{url}\"\nsource_kind = \"polling\"\ntable = \"public.outbox\"\n[pipelines.sink]\nkind = \"rabbitmq\"\n{settings}\n",
        name = setup.slot,
        url = setup.db.url(crate::support::Auth::Trust),
        settings = server.sink_settings(),
    );
    let (_dir, args) = run_with_config(&toml);
    let relay = Relay::spawn(&args);
    let got = read_until(
        server,
        &destinations,
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &got, true);
    crate::support::wait_for(
        "every row marked PUBLISHED",
        Duration::from_secs(30),
        || async {
            let pending: i64 = setup
                .db
                .query_one_value("SELECT count(*) FROM outbox WHERE status <> 'PUBLISHED'")
                .await;
            (pending == 0).then_some(())
        },
    )
    .await;
    drop(relay);
}

/// Unroutable messages among routable ones on the same connection, many in flight: each
/// returned message is the refusal of its own event, never of another. lapin hands a
/// `basic.return` to whichever confirm of the channel it resolves next, and RabbitMQ confirms
/// several messages with one `multiple` ack, so with many messages in flight on one channel an
/// unroutable event could be counted as delivered (its LSN confirmed, the event lost) while a
/// delivered one went to the dead-letter queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_returned_message_refuses_its_own_event_with_many_in_flight() {
    const EVENTS: i32 = 2_000;
    let server = shared();
    let setup = setup("rabbitmq_returns", &["Order", "Refused"]).await;
    let destinations = setup.topics();
    let dead_letter = format!("{}.dead-letter", setup.slot);
    server.prepare(&destinations).await;
    server.prepare(std::slice::from_ref(&dead_letter)).await;
    server.refuse(&destinations[1]).await;
    let (_dir, args) = relay_args(&setup, server, &dead_letter_to(&dead_letter));
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    // One transaction, every event its own aggregate: all of them may be in flight at once.
    let rows = setup
        .db
        .client
        .query(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             SELECT CASE WHEN i % 2 = 0 THEN $1 ELSE $2 END, 'k-' || i, 'Test', '{}'::jsonb
             FROM generate_series(1, $3) AS i
             RETURNING id::text, aggregate_type",
            &[&setup.types[0], &setup.types[1], &EVENTS],
        )
        .await
        .unwrap();
    let ids_of = |aggregate_type: &str| -> std::collections::BTreeSet<String> {
        rows.iter()
            .filter(|row| row.get::<_, &str>(1) == aggregate_type)
            .map(|row| row.get(0))
            .collect()
    };
    let (routable, unroutable) = (ids_of(&setup.types[0]), ids_of(&setup.types[1]));
    let half = usize::try_from(EVENTS / 2).unwrap();
    let ids = |records: Vec<Consumed>| -> std::collections::BTreeSet<String> {
        records.iter().filter_map(|r| r.header_str("id")).collect()
    };
    let dead = ids(read_until(
        server,
        std::slice::from_ref(&dead_letter),
        half,
        Duration::from_secs(1),
        Duration::from_secs(120),
    )
    .await);
    let delivered = ids(read_until(
        server,
        &destinations[..1],
        half,
        Duration::ZERO,
        Duration::from_secs(120),
    )
    .await);
    let lost: Vec<&String> = unroutable.difference(&dead).collect();
    let wrongly_dead: Vec<&String> = dead.difference(&unroutable).collect();
    assert!(
        lost.is_empty() && wrongly_dead.is_empty(),
        "{} unroutable events are not in the dead-letter queue (counted as delivered: lost), \
         {} delivered events are (another message's return): {:?} / {:?}",
        lost.len(),
        wrongly_dead.len(),
        lost.iter().take(5).collect::<Vec<_>>(),
        wrongly_dead.iter().take(5).collect::<Vec<_>>(),
    );
    assert_eq!(delivered, routable, "the routable events, each once");
    drop(relay);
}

/// A message over the server's `max_message_size` (the relay's `max_message_bytes` set above
/// it): the server closes the channel over it, and that is a too-large refusal naming the
/// event, not a retry of it until the delivery timeout, session after session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_servers_max_message_size_is_refused_as_too_large() {
    let server = shared();
    let setup = setup("rabbitmq_too_large", &["Order"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let toml_settings = format!(
        "{}\nmax_message_bytes = {}",
        server.sink_settings(),
        4 * MAX_MESSAGE_SIZE
    );
    let toml = pipeline_toml(&setup, &toml_settings);
    let (_dir, args) = run_with_config(&toml);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let client = &setup.db.client;
    let before = insert(client, &setup.types[0], "k1", r#"{"n": 1}"#).await;
    let witness = setup.witness().await;
    let big = format!(r#"{{"blob": "{}"}}"#, "x".repeat(MAX_MESSAGE_SIZE + 1024));
    let big = insert(client, &setup.types[0], "k2", &big).await;
    let big_commit = setup.commit_end_of(&witness, &big.id).await;
    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert!(
        !status.success(),
        "the relay exited with {status} after a too-large message"
    );
    assert!(
        log.contains(&big.id) && log.contains("larger than configured max size"),
        "the error names the event {} and the server's size limit:\n{}",
        big.id,
        tail_lines(&log, 30)
    );
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed < big_commit,
        "confirmed_flush_lsn {confirmed:X} passed the refused event's commit ({big_commit:X})"
    );
    let got = server.read(&destinations).await;
    assert_delivered(&[before], &got, true);
}

/// A `max_concurrency` above the server's `channel_max` (2047 by default) is named at
/// connect: each message awaiting its confirm needs a channel of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_concurrency_above_channel_max_is_named() {
    let server = shared();
    let setup = setup("rabbitmq_channel_max", &["Order"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let toml = pipeline_toml(
        &setup,
        &format!("{}\nmax_concurrency = 5000", server.sink_settings()),
    );
    let (_dir, args) = run_with_config(&toml);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let event = insert(&setup.db.client, &setup.types[0], "k1", r#"{"n": 1}"#).await;
    let got = read_until(
        server,
        &destinations,
        1,
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&[event], &got, true);
    let log = relay.log();
    assert!(
        log.contains("above the server's channel_max") && log.contains("channel_max=2047"),
        "{}",
        tail_lines(&log, 20)
    );
    drop(relay);
}

/// Runs a pipeline with `value_format = "cloudevents"` and `cloudevents` = `options`, inserts
/// one row whose headers try to pass for attributes (`cloudEvents_id`, `cloudEvents:type`,
/// `content-type`) beside a `tenant`, and returns its id, the message's headers (sorted: a
/// field table has no order), its `content_type` property and its body.
async fn cloudevents_message(
    prefix: &str,
    options: &str,
) -> (String, Vec<(String, String)>, Option<String>, Vec<u8>) {
    let server = shared();
    let setup = setup(prefix, &["Order"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let (_dir, args) = relay_args(
        &setup,
        server,
        &format!(
            "value_format = \"cloudevents\"\ncolumns = {{ timestamp = \"created_at\" }}\ncloudevents = {options}"
        ),
    );
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let id: String = within(
        "INSERT of an outbox row",
        Duration::from_secs(30),
        setup.db.client.query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, created_at)
             VALUES ($1, 'o 1 €', 'OrderCreated', '{\"total\": 12.50}',
                     '{\"tenant\": \"acme\", \"cloudEvents_id\": \"forged\", \"cloudEvents:type\": \"forged\", \"content-type\": \"text/html\"}',
                     '2026-12-06 11:26:51.123+00')
             RETURNING id::text",
            &[&setup.types[0]],
        ),
    )
    .await
    .unwrap()
    .get(0);
    let got = read_until(
        server,
        &destinations,
        1,
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    drop(relay);
    assert_eq!(got.len(), 1, "{got:?}");
    let taken = server.taken.read(&server.server, &destinations).await;
    let (record, properties) = &taken[0];
    let mut headers: Vec<(String, String)> = record
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                String::from_utf8_lossy(v.as_deref().unwrap_or(b"<void>")).into_owned(),
            )
        })
        .collect();
    headers.sort();
    let content_type = properties.content_type().as_ref().map(|s| s.to_string());
    (
        id,
        headers,
        content_type,
        record.value.clone().unwrap_or_default(),
    )
}

fn sorted(list: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut list: Vec<(String, String)> = list
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    list.sort();
    list
}

/// CloudEvents in binary mode over AMQP: each attribute a `cloudEvents_` header (a string, as
/// it is), `datacontenttype` the `content_type` property, the payload byte for byte the body;
/// the row's look-alike headers are left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_cloudevents_carry_cloud_events_headers_and_the_content_type_property() {
    let (id, headers, content_type, body) = cloudevents_message(
        "rabbitmq_ce_binary",
        "{ mode = \"binary\", source = \"urn:shop:orders\" }",
    )
    .await;
    assert_eq!(body, br#"{"total": 12.50}"#);
    assert_eq!(content_type.as_deref(), Some("application/json"));
    assert_eq!(
        headers,
        sorted(&[
            ("id", &id),
            ("event_type", "OrderCreated"),
            ("cloudEvents_specversion", "1.0"),
            ("cloudEvents_id", &id),
            ("cloudEvents_source", "urn:shop:orders"),
            ("cloudEvents_type", "OrderCreated"),
            ("cloudEvents_subject", "o 1 €"),
            ("cloudEvents_time", "2026-12-06T11:26:51.123Z"),
            ("tenant", "acme"),
        ])
    );
}

/// CloudEvents in structured mode over AMQP: the JSON event format as the body and its media
/// type as the `content_type` property (not `sink.content_type`), no attribute headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_cloudevents_carry_the_event_format_and_its_content_type_property() {
    let (id, headers, content_type, body) = cloudevents_message(
        "rabbitmq_ce_structured",
        "{ mode = \"structured\", source = \"urn:shop:orders\" }",
    )
    .await;
    assert_eq!(
        String::from_utf8(body).unwrap(),
        format!(
            r#"{{"specversion":"1.0","id":"{id}","source":"urn:shop:orders","type":"OrderCreated","subject":"o 1 €","time":"2026-12-06T11:26:51.123Z","datacontenttype":"application/json","data":{{"total": 12.50}}}}"#
        )
    );
    assert_eq!(
        content_type.as_deref(),
        Some("application/cloudevents+json; charset=UTF-8")
    );
    assert_eq!(
        headers,
        sorted(&[
            ("id", &id),
            ("event_type", "OrderCreated"),
            ("tenant", "acme"),
        ])
    );
}
