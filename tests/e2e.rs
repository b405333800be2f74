//! End to end: a real PostgreSQL 15 cluster in, a real Kafka-protocol broker (tansu) out,
//! the relay binary in between. One cluster and one broker per run (tests/support); each test
//! has its own database, slot, publication and topics.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use support::{
    consume, kafka, parse_lsn, pg, unique_name, wait_for, Auth, Consumed, Relay, TestDb,
};

/// One outbox row as written, with what PostgreSQL printed for it.
#[derive(Debug, Clone)]
struct Written {
    id: String,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    /// `payload::text`: what must arrive as the record value, byte for byte.
    payload: String,
}

/// A payload with what tends to break relays: many-digit numbers, unicode, escapes, nesting.
fn payload(n: usize) -> String {
    format!(
        r#"{{"n": {n}, "amount": 1234567890.12345678901234567890, "tiny": 1e-30, "s": "é😀 \"q\" \\ {n}", "nested": {{"list": [1, 2.50, null, true]}}}}"#
    )
}

/// Writes `txns` transactions of `per_txn` events each, cycling through `types` and `keys`
/// aggregate ids per type, one transaction after another (so commit order = write order).
/// Returns the rows and, for each transaction, the WAL insert LSN just before its COMMIT (the
/// commit record starts at or after it).
async fn write_events(
    client: &tokio_postgres::Client,
    txns: usize,
    per_txn: usize,
    types: &[String],
    keys: usize,
    offset: usize,
    pause: Duration,
) -> (Vec<Written>, Vec<u64>) {
    let mut written = Vec::with_capacity(txns * per_txn);
    let mut before_commit = Vec::with_capacity(txns);
    for t in 0..txns {
        client.batch_execute("BEGIN").await.unwrap();
        for e in 0..per_txn {
            let n = offset + t * per_txn + e;
            let aggregate_type = types[n % types.len()].clone();
            let aggregate_id = format!(
                "{}-{}",
                aggregate_type.to_lowercase(),
                (n / types.len()) % keys
            );
            let event_type = format!("Event{}", n % 7);
            let row = client
                .query_one(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                     VALUES ($1, $2, $3, $4::text::jsonb) RETURNING id::text, payload::text",
                    &[&aggregate_type, &aggregate_id, &event_type, &payload(n)],
                )
                .await
                .unwrap();
            written.push(Written {
                id: row.get(0),
                aggregate_type,
                aggregate_id,
                event_type,
                payload: row.get(1),
            });
        }
        let lsn: String = client
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .unwrap()
            .get(0);
        before_commit.push(parse_lsn(&lsn));
        client.batch_execute("COMMIT").await.unwrap();
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    (written, before_commit)
}

fn header<'a>(record: &'a Consumed, name: &str) -> Option<&'a [u8]> {
    record
        .headers
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.as_deref())
}

/// Asserts I1, I5 and I3 on what the consumer saw: every written event exactly once (when
/// `exactly_once`) or at least once, in its `<aggregate_type>.events` topic, key, value and
/// headers byte for byte, and per key in write order.
fn assert_delivered(written: &[Written], consumed: &[Consumed], exactly_once: bool) {
    let by_id: HashMap<&str, &Written> = written.iter().map(|w| (w.id.as_str(), w)).collect();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for record in consumed {
        let id = std::str::from_utf8(header(record, "id").expect("id header")).unwrap();
        let w = by_id
            .get(id)
            .unwrap_or_else(|| panic!("record with unknown id {id} in {}", record.topic));
        *seen.entry(&w.id).or_default() += 1;
        assert_eq!(
            record.topic,
            format!("{}.events", w.aggregate_type),
            "topic of {id}"
        );
        assert_eq!(
            record.key.as_deref(),
            Some(w.aggregate_id.as_bytes()),
            "key of {id}"
        );
        assert_eq!(
            record.value.as_deref(),
            Some(w.payload.as_bytes()),
            "value of {id}"
        );
        assert_eq!(
            header(record, "event_type"),
            Some(w.event_type.as_bytes()),
            "event_type of {id}"
        );
    }
    let missing: Vec<&str> = written
        .iter()
        .filter(|w| !seen.contains_key(w.id.as_str()))
        .map(|w| w.id.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} events never arrived, e.g. {:?}",
        missing.len(),
        written.len(),
        &missing[..missing.len().min(3)]
    );
    if exactly_once {
        let duplicated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            duplicated.is_empty(),
            "{} events arrived more than once, e.g. {:?}",
            duplicated.len(),
            duplicated.first()
        );
        assert_eq!(consumed.len(), written.len());
    }
    // Per key, first arrivals are in commit order (consumed records are in offset order per
    // partition, and a key lives in one partition).
    let mut expected_order: HashMap<(&str, &str), Vec<&str>> = HashMap::new();
    for w in written {
        expected_order
            .entry((&w.aggregate_type, &w.aggregate_id))
            .or_default()
            .push(&w.id);
    }
    let mut actual_order: HashMap<(&str, &str), Vec<&str>> = HashMap::new();
    for record in consumed {
        let id = std::str::from_utf8(header(record, "id").unwrap()).unwrap();
        let w = by_id[id];
        let ids = actual_order
            .entry((&w.aggregate_type, &w.aggregate_id))
            .or_default();
        if !ids.contains(&w.id.as_str()) {
            ids.push(&w.id);
        }
    }
    for (key, expected) in &expected_order {
        assert_eq!(
            actual_order.get(key),
            Some(expected),
            "order of events for aggregate {key:?}"
        );
    }
}

/// A test's database, slot, topics and the relay arguments that point at them.
struct Setup {
    db: TestDb,
    slot: String,
    types: Vec<String>,
}

impl Setup {
    /// Reads every topic of this test (see [`consume`]).
    async fn consume_all(
        &self,
        expected: usize,
        settle: Duration,
        deadline: Duration,
    ) -> Vec<Consumed> {
        let topics = self.topics();
        let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
        consume(&kafka().bootstrap(), &topics, expected, settle, deadline).await
    }

    /// Waits until the slot's `confirmed_flush_lsn` is past `lsn` (a commit's start).
    async fn wait_confirmed_past(&self, lsn: u64, what: &str, deadline: Duration) {
        wait_for(what, deadline, || async {
            (self.confirmed_flush().await > lsn).then_some(())
        })
        .await;
    }

    async fn new(prefix: &str, types: &[&str], partitions: i32) -> Setup {
        let name = unique_name(prefix);
        let db = pg().create_database(&name).await;
        // Aggregate types unique to this test keep topics apart; case is preserved in topics.
        let types: Vec<String> = types.iter().map(|t| format!("{t}_{name}")).collect();
        for t in &types {
            kafka().create_topic(&format!("{t}.events"), partitions);
        }
        Setup {
            db,
            slot: format!("{name}_slot"),
            types,
        }
    }

    fn relay_args(&self, bootstrap: &str, auth: Auth) -> Vec<String> {
        [
            "run",
            "--source-url",
            &self.db.url(auth),
            "--slot",
            &self.slot,
            "--publication",
            "outbox_pub",
            "--table",
            "public.outbox",
            "--bootstrap-servers",
            bootstrap,
            "--pipeline-name",
            &self.slot,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn topics(&self) -> Vec<String> {
        self.types.iter().map(|t| format!("{t}.events")).collect()
    }

    async fn confirmed_flush(&self) -> u64 {
        self.db
            .confirmed_flush_lsn(&self.slot)
            .await
            .map(|l| parse_lsn(&l))
            .unwrap_or(0)
    }

    /// Waits until a walsender streams from the slot. (While the relay creates the slot, its
    /// SQL backend is the slot's `active_pid`, and events committed then are before the slot's
    /// start: only a walsender in `pg_stat_replication` means streaming.)
    async fn wait_streaming(&self) {
        wait_for("the relay to stream from its slot", Duration::from_secs(60), || async {
            let row = self
                .db
                .client
                .query_opt(
                    "SELECT 1 FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1",
                    &[&self.slot],
                )
                .await
                .unwrap();
            row.map(|_| ())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_events_arrive_once_in_order_and_the_slot_catches_up() {
    let setup = Setup::new("roundtrip", &["Order", "customer", "PAYMENT"], 3).await;
    let relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    setup.wait_streaming().await;

    let started = std::time::Instant::now();
    let (written, before_commit) = write_events(
        &setup.db.client,
        1_000,
        10,
        &setup.types,
        25,
        0,
        Duration::ZERO,
    )
    .await;
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(3),
            Duration::from_secs(120),
        )
        .await;
    let elapsed = started.elapsed();
    eprintln!(
        "10,000 events written and consumed in {elapsed:?} ({:.0} events/s)",
        10_000.0 / elapsed.as_secs_f64()
    );
    assert_delivered(&written, &consumed, true);

    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "confirmed_flush_lsn to pass the last commit",
            Duration::from_secs(5),
        )
        .await;
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_lsn_waits_for_an_unreachable_broker() {
    let setup = Setup::new("outage", &["Order", "Invoice"], 2).await;
    let port = support::free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&bootstrap, Auth::Trust);
    args.extend(["--metrics-listen".to_string(), metrics.clone()]);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    let (written, before_commit) =
        write_events(&setup.db.client, 20, 5, &setup.types, 4, 0, Duration::ZERO).await;
    let first_commit = before_commit[0];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let confirmed = setup.confirmed_flush().await;
        assert!(
            confirmed <= first_commit,
            "confirmed_flush_lsn {confirmed:X} passed an unacknowledged commit at {first_commit:X}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The records have waited about 10 s for a broker: the age gauge says so.
    let age_series = format!(
        "outbox_relay_oldest_unacked_event_age_seconds{{pipeline=\"{}\"}}",
        setup.slot
    );
    let (_, text) = http_get(&metrics, "/metrics").await.unwrap();
    let age = metric_value(&text, &age_series);
    assert!(
        (8.0..60.0).contains(&age),
        "oldest unacked event age {age} s after 10 s without a broker"
    );

    let broker = support::Broker::start_on(port);
    for topic in setup.topics() {
        broker.create_topic(&topic, 2);
    }
    let topics = setup.topics();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let consumed = consume(
        &bootstrap,
        &topics,
        written.len(),
        Duration::from_secs(2),
        Duration::from_secs(90),
    )
    .await;
    assert_delivered(&written, &consumed, false);
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "confirmed_flush_lsn to pass the last commit once the broker is back",
            Duration::from_secs(30),
        )
        .await;
    wait_for(
        "the oldest unacked event age to return to 0",
        Duration::from_secs(10),
        || async {
            let (_, text) = http_get(&metrics, "/metrics").await?;
            (metric_value(&text, &age_series) == 0.0).then_some(())
        },
    )
    .await;
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_stream_then_restart_loses_and_duplicates_nothing() {
    let setup = Setup::new("restart", &["Order", "Shipment"], 2).await;
    let args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    let (mut written, _) = write_events(
        &setup.db.client,
        100,
        10,
        &setup.types,
        10,
        0,
        Duration::ZERO,
    )
    .await;
    // Stop while events are still flowing in.
    let writer_db = pg().connect(&setup.db.name, Auth::Trust).await;
    let types = setup.types.clone();
    let writer = tokio::spawn(async move {
        write_events(
            &writer_db,
            200,
            5,
            &types,
            10,
            1_000,
            Duration::from_millis(10),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.sigterm();
    let status = relay.wait(Duration::from_secs(40));
    assert!(
        status.success(),
        "relay exited with {status} after SIGTERM:\n{}",
        relay.log()
    );
    assert!(
        !writer.is_finished(),
        "the writer finished before the relay stopped: not mid-stream"
    );

    let mut relay = Relay::spawn(&args);
    let (more, _) = writer.await.unwrap();
    written.extend(more);
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(3),
            Duration::from_secs(120),
        )
        .await;
    assert_delivered(&written, &consumed, true);
    relay.sigterm();
    relay.wait(Duration::from_secs(40));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn illegal_topic_name_halts_without_confirming_the_transaction() {
    let setup = Setup::new("badtopic", &["Order"], 1).await;
    let mut relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    setup.wait_streaming().await;
    let (good, _) = write_events(&setup.db.client, 1, 1, &setup.types, 1, 0, Duration::ZERO).await;
    let bad_types = vec!["no spaces allowed".to_string()];
    let (bad, before_commit) =
        write_events(&setup.db.client, 1, 1, &bad_types, 1, 1, Duration::ZERO).await;

    let status = relay.wait(Duration::from_secs(30));
    assert!(
        !status.success(),
        "relay must stop on an illegal topic name"
    );
    let log = relay.log();
    assert!(
        log.contains(&bad[0].id),
        "error names the event id {}:\n{log}",
        bad[0].id
    );
    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        1,
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
    .await;
    assert_delivered(&good, &consumed, true);
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed <= before_commit[0],
        "confirmed_flush_lsn {confirmed:X} passed the bad event's commit"
    );
}

/// Writes `toml` to `relay.toml` in a new temporary directory; returns the directory (the
/// file lives as long as it does) and the arguments `run --config <file>`.
fn run_with_config(toml: &str) -> (tempfile::TempDir, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.toml");
    std::fs::write(&path, toml).unwrap();
    let args = vec!["run".into(), "--config".into(), path.display().to_string()];
    (dir, args)
}

/// The relay's own parsing of a source URL (TLS parameters included).
fn source_config(
    url: &str,
) -> (
    tokio_postgres::Config,
    outbox_relay::source::tls::TlsSettings,
) {
    let (rest, tls) = outbox_relay::source::tls::split_url(url).unwrap();
    (rest.parse().unwrap(), tls)
}

#[tokio::test]
async fn replication_connection_authenticates_with_every_method() {
    use outbox_relay::source::replication::ReplicationClient;
    let db = pg().create_database(&unique_name("auth")).await;
    for auth in [Auth::Trust, Auth::Password, Auth::Md5, Auth::Scram] {
        let (config, tls) = source_config(&db.url(auth));
        let mut client = ReplicationClient::connect(&config, &tls)
            .await
            .unwrap_or_else(|e| panic!("{auth:?}: {}", outbox_relay::error::chain(&e)));
        let identity = client.identify_system().await.unwrap();
        assert_eq!(
            identity.dbname.as_deref(),
            Some(db.name.as_str()),
            "{auth:?}"
        );
        assert!(identity.xlogpos.0 > 0);
    }
    for auth in [Auth::Password, Auth::Md5, Auth::Scram] {
        let url = db.url(auth);
        let (config, tls) = source_config(&url.replace(support::PASSWORD, "wrong"));
        let error = ReplicationClient::connect(&config, &tls)
            .await
            .err()
            .expect("wrong password accepted");
        assert!(
            matches!(&error, outbox_relay::source::SourceError::Server { code, .. } if code == "28P01"),
            "{auth:?}: {error}"
        );
        assert!(
            !error.is_transient(),
            "{auth:?}: a wrong password is not worth retrying"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_walsender_is_terminated_and_loses_nothing() {
    let setup = Setup::new("terminate", &["Order", "Refund"], 2).await;
    let mut relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Scram));
    setup.wait_streaming().await;
    let first_pid = setup.db.slot_active_pid(&setup.slot).await.unwrap();

    let (mut written, _) =
        write_events(&setup.db.client, 30, 3, &setup.types, 5, 0, Duration::ZERO).await;
    assert!(
        setup.db.terminate_slot_backend(&setup.slot).await,
        "no walsender to terminate"
    );
    let (more, before_commit) =
        write_events(&setup.db.client, 30, 3, &setup.types, 5, 90, Duration::ZERO).await;
    written.extend(more);

    relay
        .wait_for_log("reconnecting", Duration::from_secs(30))
        .await;
    wait_for(
        "the relay to stream again from a new walsender",
        Duration::from_secs(60),
        || async {
            setup
                .db
                .slot_active_pid(&setup.slot)
                .await
                .filter(|pid| *pid != first_pid)
        },
    )
    .await;
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(2),
            Duration::from_secs(90),
        )
        .await;
    assert_delivered(&written, &consumed, false);
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "confirmed_flush_lsn to pass the last commit after the reconnect",
            Duration::from_secs(30),
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_slot_one_streams_and_the_other_takes_over() {
    let setup = Setup::new("standby", &["Order"], 2).await;
    let args = setup.relay_args(&kafka().bootstrap(), Auth::Md5);
    let mut active = Relay::spawn(&args);
    setup.wait_streaming().await;
    let mut standby = Relay::spawn(&args);
    standby
        .wait_for_log("is active for PID", Duration::from_secs(30))
        .await;

    let (mut written, _) =
        write_events(&setup.db.client, 10, 2, &setup.types, 3, 0, Duration::ZERO).await;
    setup
        .consume_all(written.len(), Duration::ZERO, Duration::from_secs(60))
        .await;
    assert!(
        !standby.log().contains("streaming"),
        "the standby streamed while the slot was held:\n{}",
        standby.log()
    );

    active.kill();
    let (more, before_commit) =
        write_events(&setup.db.client, 10, 2, &setup.types, 3, 20, Duration::ZERO).await;
    written.extend(more);
    standby
        .wait_for_log("streaming", Duration::from_secs(60))
        .await;
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(2),
            Duration::from_secs(90),
        )
        .await;
    assert_delivered(&written, &consumed, false);
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "the standby to confirm past the last commit",
            Duration::from_secs(30),
        )
        .await;
}

/// Idle progress, both sides: ~300 MB of WAL outside the publication behind one event. While
/// the broker hangs, the slot stays before that event; once Kafka acknowledges it, the slot's
/// confirmed_flush_lsn and restart_lsn follow the WAL within 60 s, so WAL does not pile up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_outbox_lets_the_slot_follow_other_wal() {
    const NOISE_BYTES: u64 = 300 << 20;
    let setup = Setup::new("idle", &["Order"], 1).await;
    // wal_sender_timeout = 0: the walsender never asks for a reply; the slot must advance anyway.
    let setting = format!(
        "ALTER DATABASE {} SET wal_sender_timeout = 0",
        setup.db.name
    );
    setup.db.client.batch_execute(&setting).await.unwrap();
    setup
        .db
        .client
        .batch_execute("CREATE TABLE noise (id bigserial PRIMARY KEY, filler text)")
        .await
        .unwrap();
    let broker = support::Broker::start_on(support::free_port());
    for topic in setup.topics() {
        broker.create_topic(&topic, 1);
    }
    let relay = Relay::spawn(&setup.relay_args(&broker.bootstrap(), Auth::Trust));
    setup.wait_streaming().await;

    broker.pause(true);
    let (written, before_commit) =
        write_events(&setup.db.client, 1, 1, &setup.types, 1, 0, Duration::ZERO).await;
    let start = setup.db.current_wal_insert_lsn().await;
    while setup.db.current_wal_insert_lsn().await - start < NOISE_BYTES {
        setup.db.client
            .batch_execute("INSERT INTO noise (filler) SELECT repeat(md5(g::text), 32) FROM generate_series(1, 4000) g")
            .await
            .unwrap();
    }
    let end_of_noise = setup.db.current_wal_insert_lsn().await;
    // Keepalives report WAL far past the event, but Kafka has not acknowledged it.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed <= before_commit[0],
        "confirmed_flush_lsn {confirmed:X} passed the unacknowledged event's commit {:X}",
        before_commit[0]
    );
    broker.pause(false);

    let topics = setup.topics();
    let consumed = consume(
        &broker.bootstrap(),
        &[topics[0].as_str()],
        1,
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &consumed, true);
    wait_for(
        "confirmed_flush_lsn and restart_lsn to follow WAL written outside the publication",
        Duration::from_secs(60),
        || async {
            let row = setup
                .db
                .client
                .query_one(
                    "SELECT confirmed_flush_lsn::text, restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                    &[&setup.slot],
                )
                .await
                .ok()?;
            let confirmed = support::parse_lsn(&row.get::<_, String>(0));
            let restart = support::parse_lsn(&row.get::<_, String>(1));
            // restart_lsn moves at the server's running-xacts records, every 15 s at most.
            (confirmed >= end_of_noise && restart + (16 << 20) >= end_of_noise).then_some(())
        },
    )
    .await;
    drop(relay);
}

/// Inserts one event per statement in the current transaction of `client`; returns what was written.
async fn insert(
    client: &tokio_postgres::Client,
    aggregate_type: &str,
    aggregate_id: &str,
    payload: &str,
) -> Written {
    let row = client
        .query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             VALUES ($1, $2, 'Test', $3::text::jsonb) RETURNING id::text, payload::text",
            &[&aggregate_type, &aggregate_id, &payload],
        )
        .await
        .unwrap();
    Written {
        id: row.get(0),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        event_type: "Test".to_owned(),
        payload: row.get(1),
    }
}

async fn insert_lsn(client: &tokio_postgres::Client) -> u64 {
    let lsn: String = client
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    parse_lsn(&lsn)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_event_halts_before_its_key_moves_on_then_publishes_in_order_after_the_limit_is_raised(
) {
    let setup = Setup::new("oversized", &["Order"], 2).await;
    let t = setup.types[0].clone();
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let base_args = args.clone();
    args.extend([
        "--kafka-property".to_string(),
        "message.max.bytes=2000".to_string(),
    ]);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    let client = &setup.db.client;
    let big_payload = format!(r#"{{"blob": "{}"}}"#, "x".repeat(5_000));
    client.batch_execute("BEGIN").await.unwrap();
    let big = insert(client, &t, "k1", &big_payload).await;
    let before_big_commit = insert_lsn(client).await;
    client.batch_execute("COMMIT").await.unwrap();
    let after_same_key = insert(client, &t, "k1", r#"{"n": 2}"#).await;
    let other_key = insert(client, &t, "k2", r#"{"n": 3}"#).await;

    let status = relay.wait(Duration::from_secs(30));
    assert!(
        !status.success(),
        "relay must halt on a record it cannot publish"
    );
    let log = relay.log();
    for needle in [big.id.as_str(), "message.max.bytes = 2000", "bytes"] {
        assert!(log.contains(needle), "the error names {needle:?}:\n{log}");
    }
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed <= before_big_commit,
        "confirmed_flush_lsn {confirmed:X} passed the oversized event"
    );

    let relay = Relay::spawn(&base_args);
    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        3,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&[big, after_same_key, other_key], &consumed, true);
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follow_commit_order_not_insert_order() {
    let setup = Setup::new("commitorder", &["Order"], 2).await;
    let t = setup.types[0].clone();
    let relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    setup.wait_streaming().await;

    let s1 = &setup.db.client;
    let s2 = pg().connect(&setup.db.name, Auth::Trust).await;
    s1.batch_execute("BEGIN").await.unwrap();
    let first_inserted = insert(s1, &t, "o-c", r#"{"session": 1}"#).await;
    s2.batch_execute("BEGIN").await.unwrap();
    let first_committed = insert(&s2, &t, "o-c", r#"{"session": 2}"#).await;
    s2.batch_execute("COMMIT").await.unwrap();
    s1.batch_execute("COMMIT").await.unwrap();

    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        2,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&[first_committed, first_inserted], &consumed, true);
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_work_is_never_published_and_the_lsn_moves_past_it() {
    let setup = Setup::new("rollback", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    setup.wait_streaming().await;
    let c = &setup.db.client;

    c.batch_execute("BEGIN").await.unwrap();
    let a = insert(c, &t, "k", r#"{"e": "a"}"#).await;
    c.batch_execute("SAVEPOINT s").await.unwrap();
    insert(c, &t, "k", r#"{"e": "b"}"#).await;
    c.batch_execute("ROLLBACK TO SAVEPOINT s").await.unwrap();
    let c_event = insert(c, &t, "k", r#"{"e": "c"}"#).await;
    c.batch_execute("COMMIT").await.unwrap();

    // A PL/pgSQL exception block rolls back its own subtransaction.
    c.batch_execute(&format!(
        "DO $$ BEGIN
           BEGIN
             INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('{t}', 'k', 'Test', '{{\"e\": \"inner\"}}');
             RAISE EXCEPTION 'roll back the inner block';
           EXCEPTION WHEN raise_exception THEN NULL;
           END;
           INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('{t}', 'k', 'Test', '{{\"e\": \"d\"}}');
         END $$"
    ))
    .await
    .unwrap();
    let d: String = c
        .query_one("SELECT id::text FROM outbox WHERE payload->>'e' = 'd'", &[])
        .await
        .unwrap()
        .get(0);
    let d_event = Written {
        id: d,
        aggregate_type: t.clone(),
        aggregate_id: "k".into(),
        event_type: "Test".into(),
        payload: r#"{"e": "d"}"#.into(),
    };

    for rows in [10, 100_000] {
        c.batch_execute(&format!(
            "BEGIN; INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             SELECT '{t}', 'k', 'Test', jsonb_build_object('rolled_back', g) FROM generate_series(1, {rows}) g; ROLLBACK"
        ))
        .await
        .unwrap();
    }
    let last = insert(c, &t, "k", r#"{"e": "last"}"#).await;
    let after_rollbacks = insert_lsn(c).await;

    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        4,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&[a, c_event, d_event, last], &consumed, true);
    wait_for(
        "confirmed_flush_lsn to move past the rolled-back transactions",
        Duration::from_secs(30),
        || async { (setup.confirmed_flush().await >= after_rollbacks).then_some(()) },
    )
    .await;
    drop(relay);
}

/// Peak resident set size of a process (`VmHWM`), bytes.
fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100k_row_transaction_streams_through_bounded_memory_in_key_order() {
    let setup = Setup::new("bulk", &["Order"], 3).await;
    let t = setup.types[0].clone();
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.extend(
        [
            "--max-in-flight-bytes",
            "8388608",
            "--max-in-flight-events",
            "5000",
        ]
        .map(String::from),
    );
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let c = &setup.db.client;

    // 100,000 rows of ~1 kB for 1,000 keys in one transaction, then one more event for key 7.
    c.batch_execute(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT '{t}', 'key-' || (g % 1000), 'Bulk', jsonb_build_object('seq', g, 'pad', repeat('p', 1000))
         FROM generate_series(1, 100000) g"
    ))
    .await
    .unwrap();
    let last = insert(c, &t, "key-7", r#"{"seq": "after the bulk"}"#).await;
    let rows = c
        .query(
            "SELECT id::text, aggregate_id, payload::text FROM outbox WHERE event_type = 'Bulk' ORDER BY (payload->>'seq')::int",
            &[],
        )
        .await
        .unwrap();
    let mut written: Vec<Written> = rows
        .iter()
        .map(|r| Written {
            id: r.get(0),
            aggregate_type: t.clone(),
            aggregate_id: r.get(1),
            event_type: "Bulk".into(),
            payload: r.get(2),
        })
        .collect();
    written.push(last);

    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        written.len(),
        Duration::from_secs(2),
        Duration::from_secs(300),
    )
    .await;
    assert_delivered(&written, &consumed, true);
    let rss = peak_rss_bytes(relay.pid());
    eprintln!("peak RSS of the relay after a 100,000-row (~100 MB) transaction with 8 MiB in flight: {} MiB", rss >> 20);
    // Buffering the transaction would take well over 100 MB.
    assert!(
        rss < 100 << 20,
        "peak RSS {} MiB: memory is not bounded by the in-flight limits",
        rss >> 20
    );
}

/// Writes 10,000 events in one round: 5,000 in one multi-row INSERT ... SELECT transaction,
/// 4,000 by COPY (one transaction), 1,000 as 100 transactions of 10 VALUES rows. `seq`
/// numbers the events in commit order.
async fn write_bulk_round(client: &tokio_postgres::Client, t: &str, seq: &mut u64) {
    use futures::SinkExt;
    let start = *seq;
    client
        .batch_execute(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             SELECT '{t}', 'key-' || (g % 97), 'Bulk', jsonb_build_object('seq', g)
             FROM generate_series({}, {}) g",
            start,
            start + 4_999
        ))
        .await
        .unwrap();
    *seq += 5_000;
    let sink = client
        .copy_in("COPY outbox (aggregate_type, aggregate_id, event_type, payload) FROM STDIN")
        .await
        .unwrap();
    futures::pin_mut!(sink);
    let mut data = String::new();
    for s in *seq..*seq + 4_000 {
        data.push_str(&format!("{t}\tkey-{}\tCopied\t{{\"seq\": {s}}}\n", s % 97));
    }
    sink.send(bytes::Bytes::from(data)).await.unwrap();
    sink.finish().await.unwrap();
    *seq += 4_000;
    for _ in 0..100 {
        let values: Vec<String> = (*seq..*seq + 10)
            .map(|s| format!("('{t}', 'key-{}', 'Small', '{{\"seq\": {s}}}')", s % 97))
            .collect();
        client
            .batch_execute(&format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES {}",
                values.join(", ")
            ))
            .await
            .unwrap();
        *seq += 10;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_loses_nothing_and_keeps_key_order() {
    let setup = Setup::new("kill9", &["Order"], 3).await;
    let t = setup.types[0].clone();
    let args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let mut rng = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("kill -9 test seed {rng}");
    let mut next_delay_ms = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % 1_500
    };
    let mut seq = 0u64;
    for round in 0..20 {
        let mut relay = Relay::spawn(&args);
        setup.wait_streaming().await;
        write_bulk_round(&setup.db.client, &t, &mut seq).await;
        tokio::time::sleep(Duration::from_millis(next_delay_ms())).await;
        relay.kill();
        // The old walsender must let go of the slot before the next round's relay can stream.
        wait_for(
            &format!("the slot to be released after kill -9 in round {round}"),
            Duration::from_secs(30),
            || async {
                setup
                    .db
                    .slot_active_pid(&setup.slot)
                    .await
                    .is_none()
                    .then_some(())
            },
        )
        .await;
    }
    let relay = Relay::spawn(&args);

    let rows = setup
        .db
        .client
        .query("SELECT id::text, aggregate_id, event_type, payload::text FROM outbox ORDER BY (payload->>'seq')::bigint", &[])
        .await
        .unwrap();
    let written: Vec<Written> = rows
        .iter()
        .map(|r| Written {
            id: r.get(0),
            aggregate_type: t.clone(),
            aggregate_id: r.get(1),
            event_type: r.get(2),
            payload: r.get(3),
        })
        .collect();
    assert_eq!(written.len(), 200_000);
    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        written.len(),
        Duration::from_secs(3),
        Duration::from_secs(600),
    )
    .await;
    eprintln!(
        "{} records for {} events after 20 kill -9s",
        consumed.len(),
        written.len()
    );
    assert_delivered(&written, &consumed, false);
    drop(relay);
}

/// A plain HTTP/1.1 GET; returns the status code and body.
async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_config_file_three_databases_and_a_failing_one_degrades_only_itself() {
    let setups = [
        Setup::new("multi_a", &["Order"], 1).await,
        Setup::new("multi_b", &["Order"], 1).await,
        Setup::new("multi_c", &["Order"], 1).await,
    ];
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut toml = format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[metrics]\nlisten = \"{metrics}\"\n",
        kafka().bootstrap()
    );
    let mut env = Vec::new();
    for (i, s) in setups.iter().enumerate() {
        toml.push_str(&format!(
            "[[pipelines]]\nname = \"db{i}\"\nsource_url = \"${{DB{i}_URL}}\"\nslot = \"{}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\n",
            s.slot
        ));
        env.push((format!("DB{i}_URL"), s.db.url(Auth::Scram)));
    }
    let (_dir, args) = run_with_config(&toml);
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let relay = Relay::spawn_with_env(&args, &env_refs);

    wait_for(
        "/readyz to report all three pipelines streaming",
        Duration::from_secs(60),
        || async {
            http_get(&metrics, "/readyz")
                .await
                .filter(|(status, _)| *status == 200)
        },
    )
    .await;
    let mut written = Vec::new();
    for s in &setups {
        written.push(
            write_events(&s.db.client, 3, 2, &s.types, 2, 0, Duration::ZERO)
                .await
                .0,
        );
    }
    for (s, w) in setups.iter().zip(&written) {
        let topics = s.topics();
        let consumed = consume(
            &kafka().bootstrap(),
            &[topics[0].as_str()],
            w.len(),
            Duration::ZERO,
            Duration::from_secs(60),
        )
        .await;
        assert_delivered(w, &consumed, false);
    }

    // Database b goes away: its pipeline reconnects while a and c keep flowing.
    let b = &setups[1];
    let admin = pg().connect("postgres", Auth::Trust).await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS false",
            b.db.name
        ))
        .await
        .unwrap();
    assert!(b.db.terminate_slot_backend(&b.slot).await);
    let (status, body) = wait_for(
        "/readyz to report db1 reconnecting",
        Duration::from_secs(30),
        || async {
            http_get(&metrics, "/readyz")
                .await
                .filter(|(_, body)| body.contains("reconnecting"))
        },
    )
    .await;
    assert_eq!(status, 503, "{body}");
    let readiness: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        readiness["pipelines"]["db0"]["state"], "streaming",
        "{body}"
    );
    assert_eq!(
        readiness["pipelines"]["db1"]["state"], "reconnecting",
        "{body}"
    );
    assert_eq!(
        readiness["pipelines"]["db2"]["state"], "streaming",
        "{body}"
    );
    for i in [0, 2] {
        let s = &setups[i];
        let more = write_events(&s.db.client, 3, 2, &s.types, 2, 100, Duration::ZERO)
            .await
            .0;
        written[i].extend(more);
        let topics = s.topics();
        let consumed = consume(
            &kafka().bootstrap(),
            &[topics[0].as_str()],
            written[i].len(),
            Duration::ZERO,
            Duration::from_secs(60),
        )
        .await;
        assert_delivered(&written[i], &consumed, false);
    }
    let (_, text) = http_get(&metrics, "/metrics").await.unwrap();
    assert!(
        text.contains("outbox_relay_pipeline_streaming{pipeline=\"db1\"} 0"),
        "{text}"
    );
    let published_db0: f64 = text
        .lines()
        .filter(|l| l.starts_with("outbox_relay_events_published_total{pipeline=\"db0\",topic="))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(published_db0, 12.0, "{text}");
    assert!(
        text.contains("outbox_relay_events_decoded_total{pipeline=\"db0\"} 12"),
        "{text}"
    );
    assert!(
        text.contains("outbox_relay_delivery_latency_seconds_count{pipeline=\"db0\"} 12"),
        "{text}"
    );
    assert!(
        text.contains("outbox_relay_commit_to_ack_latency_seconds_count{pipeline=\"db2\"} 12"),
        "{text}"
    );
    assert!(
        text.contains("outbox_relay_replication_lag_bytes{pipeline=\"db0\"}"),
        "{text}"
    );
    // Everything was acknowledged, and the slots (read every 10 s) keep their WAL within
    // max_wal_size. The status update after the last ack may not be out yet: wait for it.
    let limited: String = admin
        .query_one("SHOW max_slot_wal_keep_size", &[])
        .await
        .unwrap()
        .get(0);
    for db in ["db0", "db2"] {
        let text = wait_for(
            "the slot metrics of the streaming pipelines",
            Duration::from_secs(15),
            || async {
                let (_, text) = http_get(&metrics, "/metrics").await?;
                let age = format!(
                    "outbox_relay_oldest_unacked_event_age_seconds{{pipeline=\"{db}\"}} 0\n"
                );
                let reserved = format!(
                    "outbox_relay_slot_wal_status{{pipeline=\"{db}\",status=\"reserved\"}} 1\n"
                );
                (text.contains(&age) && text.contains(&reserved)).then_some(text)
            },
        )
        .await;
        for status in ["extended", "unreserved", "lost"] {
            let line = format!(
                "outbox_relay_slot_wal_status{{pipeline=\"{db}\",status=\"{status}\"}} 0\n"
            );
            assert!(text.contains(&line), "{line} missing in\n{text}");
        }
        let safe = format!("outbox_relay_slot_safe_wal_size_bytes{{pipeline=\"{db}\"}}");
        if limited == "-1" {
            assert!(!text.contains(&safe), "no WAL limit, yet {safe} in\n{text}");
        } else {
            assert!(metric_value(&text, &safe) > 0.0, "{text}");
        }
    }

    // b comes back and catches up.
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS true",
            b.db.name
        ))
        .await
        .unwrap();
    let more = write_events(&b.db.client, 3, 2, &b.types, 2, 100, Duration::ZERO)
        .await
        .0;
    written[1].extend(more);
    let topics = b.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        written[1].len(),
        Duration::ZERO,
        Duration::from_secs(90),
    )
    .await;
    assert_delivered(&written[1], &consumed, false);
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verify_full_streams_and_a_wrong_host_name_is_refused() {
    use outbox_relay::source::replication::ReplicationClient;
    use outbox_relay::source::SourceError;
    let setup = Setup::new("tls", &["Order"], 1).await;
    let ca = pg().ca_cert();
    // relay_tls may only connect over TLS (pg_hba: hostnossl reject).
    let url = |host: &str, mode: &str| {
        format!(
            "postgres://relay_tls:{}@{host}:{}/{}?sslmode={mode}&sslrootcert={}",
            support::PASSWORD,
            pg().port(),
            setup.db.name,
            ca.display()
        )
    };

    for (host, mode) in [
        ("localhost", "verify-full"),
        ("127.0.0.1", "verify-ca"),
        ("127.0.0.1", "require"),
    ] {
        let (config, tls) = source_config(&url(host, mode));
        let mut client = ReplicationClient::connect(&config, &tls)
            .await
            .unwrap_or_else(|e| panic!("{host} {mode}: {}", outbox_relay::error::chain(&e)));
        client.identify_system().await.unwrap();
    }
    // The server certificate names only localhost.
    let (config, tls) = source_config(&url("127.0.0.1", "verify-full"));
    let error = ReplicationClient::connect(&config, &tls)
        .await
        .err()
        .expect("verify-full accepted a wrong host name");
    assert!(
        matches!(&error, SourceError::Tls(text) if text.contains("127.0.0.1")),
        "{error}"
    );
    assert!(!error.is_transient());
    // Without TLS the server refuses relay_tls: the connections above really used TLS.
    let (config, tls) = source_config(&url("localhost", "disable"));
    let error = ReplicationClient::connect(&config, &tls)
        .await
        .err()
        .expect("plain connection accepted");
    assert!(
        matches!(&error, SourceError::Server { code, .. } if code == "28000"),
        "{error}"
    );

    // SCRAM over TLS binds the channel (SCRAM-SHA-256-PLUS), so channel_binding=require
    // connects; without TLS there is nothing to bind and require is refused before the
    // password is sent.
    let (config, tls) = source_config(&format!(
        "{}&channel_binding=require",
        url("localhost", "verify-full")
    ));
    ReplicationClient::connect(&config, &tls)
        .await
        .unwrap_or_else(|e| panic!("channel binding: {}", outbox_relay::error::chain(&e)));
    let (config, tls) = source_config(&format!(
        "{}?sslmode=disable&channel_binding=require",
        setup.db.url(Auth::Scram)
    ));
    let error = ReplicationClient::connect(&config, &tls)
        .await
        .err()
        .expect("channel_binding=require accepted a session without TLS");
    assert!(
        matches!(&error, SourceError::Auth(text) if text.contains("channel_binding")),
        "{error}"
    );
    // hostaddr gives the address; the host name is only for TLS verification.
    let (config, tls) = source_config(&format!(
        "postgres://relay_tls:{}@localhost.invalid:{}/{}?hostaddr=127.0.0.1&sslmode=verify-ca&sslrootcert={}",
        support::PASSWORD,
        pg().port(),
        setup.db.name,
        ca.display()
    ));
    ReplicationClient::connect(&config, &tls)
        .await
        .unwrap_or_else(|e| panic!("hostaddr: {}", outbox_relay::error::chain(&e)));
    // hostaddr alone, as libpq allows.
    let (config, tls) = source_config(&format!(
        "hostaddr=127.0.0.1 port={} dbname={} user=relay_tls password={} sslmode=require",
        pg().port(),
        setup.db.name,
        support::PASSWORD,
    ));
    ReplicationClient::connect(&config, &tls)
        .await
        .unwrap_or_else(|e| panic!("hostaddr alone: {}", outbox_relay::error::chain(&e)));

    // The relay stops on a certificate that does not verify instead of retrying forever.
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args[2] = url("127.0.0.1", "verify-full");
    let mut refused = Relay::spawn(&args);
    let status = refused.wait(Duration::from_secs(30));
    assert!(
        !status.success(),
        "the relay accepted a certificate for another host"
    );
    assert!(
        refused.log().to_lowercase().contains("certificate"),
        "{}",
        refused.log()
    );

    // The relay end to end over TLS (replication and SQL connections).
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args[2] = url("localhost", "verify-full");
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (written, _) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 0, Duration::ZERO).await;
    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &consumed, true);
    assert!(
        !relay.log().contains(support::PASSWORD),
        "the password was logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_creates_publication_and_slot_and_a_dropped_slot_stops_the_relay() {
    let setup = Setup::new("setupcmd", &["Order"], 1).await;
    setup
        .db
        .client
        .batch_execute("DROP PUBLICATION outbox_pub")
        .await
        .unwrap();
    let mut run_args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let mut setup_args = run_args.clone();
    setup_args[0] = "setup".into();

    let mut print = setup_args.clone();
    print.push("--print-sql".into());
    let mut printer = Relay::spawn(&print);
    assert!(
        printer.wait(Duration::from_secs(30)).success(),
        "{}",
        printer.log()
    );
    assert!(
        printer
            .log()
            .contains("CREATE PUBLICATION \"outbox_pub\" FOR TABLE \"public\".\"outbox\""),
        "{}",
        printer.log()
    );
    assert!(
        setup.db.confirmed_flush_lsn(&setup.slot).await.is_none(),
        "--print-sql created the slot"
    );

    let mut creator = Relay::spawn(&setup_args);
    assert!(
        creator.wait(Duration::from_secs(60)).success(),
        "{}",
        creator.log()
    );
    assert!(
        setup.db.confirmed_flush_lsn(&setup.slot).await.is_some(),
        "setup did not create the slot"
    );

    // Events committed between setup and the first start are published: the slot holds them.
    let (written, _) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 0, Duration::ZERO).await;
    run_args.push("--no-create-slot".into());
    let mut relay = Relay::spawn(&run_args);
    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &consumed, true);
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());

    setup.db.drop_slot(&setup.slot).await;
    let mut relay = Relay::spawn(&run_args);
    let status = relay.wait(Duration::from_secs(30));
    assert!(!status.success(), "the relay ran without its slot");
    assert!(relay.log().contains("does not exist"), "{}", relay.log());
    assert!(
        setup.db.confirmed_flush_lsn(&setup.slot).await.is_none(),
        "the slot was re-created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_tombstones_headers_and_case_are_published_as_postgres_printed_them() {
    let setup = Setup::new("fidelity", &["OrderLine", "orderline"], 1).await;
    let (upper, lower) = (setup.types[0].clone(), setup.types[1].clone());
    let relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    setup.wait_streaming().await;
    let c = &setup.db.client;

    let mut ids = Vec::new();
    for payload in [
        "NULL",
        "'{}'",
        "'null'",
        "'\"FIRST\"'",
        "'42'",
        r#"'{ "b":1, "a":2, "a":3 }'"#,
    ] {
        let row = c
            .query_one(
                &format!(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
                     VALUES ($1, 'k', 'T', {payload}, '{{\"trace\": \"t-1\", \"n\": 12.50, \"none\": null}}') RETURNING id::text"
                ),
                &[&upper],
            )
            .await
            .unwrap();
        ids.push(row.get::<_, String>(0));
    }
    let other = insert(c, &lower, "k", r#"{"case": "lower"}"#).await;

    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        6,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    let values: Vec<Option<&[u8]>> = consumed.iter().map(|r| r.value.as_deref()).collect();
    assert_eq!(
        values,
        vec![
            None,
            Some(&b"{}"[..]),
            Some(b"null"),
            Some(b"\"FIRST\""),
            Some(b"42"),
            Some(br#"{"a": 3, "b": 1}"#)
        ],
        "one tombstone, then the values byte for byte, in commit order"
    );
    for (record, id) in consumed.iter().zip(&ids) {
        assert_eq!(header(record, "id"), Some(id.as_bytes()));
        assert_eq!(
            header(record, "trace"),
            Some(&b"t-1"[..]),
            "string header as its text"
        );
        assert_eq!(
            header(record, "n"),
            Some(&b"12.50"[..]),
            "number header as its JSON text"
        );
        assert_eq!(
            record
                .headers
                .iter()
                .find(|(k, _)| k == "none")
                .map(|(_, v)| v.is_none()),
            Some(true),
            "null header value"
        );
    }
    let lower_topic = consume(
        &kafka().bootstrap(),
        &[topics[1].as_str()],
        1,
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
    .await;
    assert_delivered(&[other], &lower_topic, true);
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_status_tell_the_operator_what_is_wrong_and_where_the_slot_is() {
    let setup = Setup::new("check", &["Order"], 1).await;
    let args = |command: &str| {
        let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Scram);
        args[0] = command.into();
        args
    };
    let mut check = Relay::spawn(&args("check"));
    assert!(
        check.wait(Duration::from_secs(60)).success(),
        "{}",
        check.log()
    );
    for needle in [
        "ok    wal_level",
        "ok    role",
        "ok    publication",
        "WARN  slot",
        "ok    kafka",
    ] {
        assert!(
            check.log().contains(needle),
            "{needle:?} missing:\n{}",
            check.log()
        );
    }

    setup
        .db
        .client
        .batch_execute("ALTER PUBLICATION outbox_pub DROP TABLE outbox")
        .await
        .unwrap();
    let mut check = Relay::spawn(&args("check"));
    assert!(
        !check.wait(Duration::from_secs(60)).success(),
        "check passed without the table in the publication"
    );
    assert!(check.log().contains("FAIL  publication"), "{}", check.log());
    setup
        .db
        .client
        .batch_execute("ALTER PUBLICATION outbox_pub ADD TABLE outbox")
        .await
        .unwrap();

    let mut status = Relay::spawn(&args("status"));
    assert!(
        !status.wait(Duration::from_secs(30)).success(),
        "status succeeded without a slot"
    );
    assert!(
        status.log().contains("slot does not exist"),
        "{}",
        status.log()
    );
    let relay = Relay::spawn(&args("run"));
    setup.wait_streaming().await;
    let mut status = Relay::spawn(&args("status"));
    assert!(
        status.wait(Duration::from_secs(30)).success(),
        "{}",
        status.log()
    );
    let pid = setup.db.slot_active_pid(&setup.slot).await.unwrap();
    let line = status
        .log()
        .lines()
        .find(|l| l.contains(&setup.slot))
        .map(str::to_owned)
        .unwrap_or_default();
    assert!(
        line.contains(&pid.to_string()) && line.contains("reserved"),
        "status line {line:?}"
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libpq_environment_and_password_file_are_honoured() {
    use std::os::unix::fs::PermissionsExt;
    let setup = Setup::new("pgenv", &["Order"], 1).await;
    let dir = tempfile::tempdir().unwrap();
    let passfile = dir.path().join("pgpass");
    std::fs::write(
        &passfile,
        format!(
            "127.0.0.1:{}:{}:relay_scram:{}\n",
            pg().port(),
            setup.db.name,
            support::PASSWORD
        ),
    )
    .unwrap();
    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args[2] = format!("dbname={}", setup.db.name);
    let port = pg().port().to_string();
    let passfile = passfile.display().to_string();
    let relay = Relay::spawn_with_env(
        &args,
        &[
            ("PGHOST", "127.0.0.1"),
            ("PGPORT", &port),
            ("PGUSER", "relay_scram"),
            ("PGPASSFILE", &passfile),
            ("PGSSLMODE", "disable"),
        ],
    );
    setup.wait_streaming().await;
    let (written, _) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 0, Duration::ZERO).await;
    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &consumed, true);
    assert!(
        !relay.log().contains(support::PASSWORD),
        "the password was logged"
    );
}

/// `run` arguments for a relay on `db` (a private cluster's database) with slot `slot`,
/// outbox_pub, public.outbox and the shared broker.
fn private_cluster_args(db: &support::TestDb, slot: &str) -> Vec<String> {
    [
        "run",
        "--source-url",
        &db.url(Auth::Scram),
        "--slot",
        slot,
        "--publication",
        "outbox_pub",
        "--table",
        "public.outbox",
        "--bootstrap-servers",
        &kafka().bootstrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Waits until a walsender streams from `slot` (as seen from `client`'s database).
async fn wait_slot_streaming(client: &tokio_postgres::Client, slot: &str) {
    wait_for("a walsender on the slot", Duration::from_secs(60), || async {
        client
            .query_opt(
                "SELECT 1 FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1",
                &[&slot],
            )
            .await
            .ok()
            .flatten()
            .map(|_| ())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restarts_fast_and_immediate_lose_nothing_and_publish_nothing_uncommitted() {
    // A cluster of its own: this test restarts it.
    let cluster = support::PgCluster::start_private(&unique_name("restartable"));
    let name = unique_name("srvrestart");
    let db = cluster.create_database(&name).await;
    let types = vec![format!("Order_{name}")];
    let topic = format!("{}.events", types[0]);
    kafka().create_topic(&topic, 2);
    let slot = format!("{name}_slot");
    let args = private_cluster_args(&db, &slot);
    let mut relay = Relay::spawn(&args);
    let streaming = |client: tokio_postgres::Client| {
        let slot = slot.clone();
        async move {
            wait_slot_streaming(&client, &slot).await;
            client
        }
    };
    // Commits must be durable before a crash for the comparison to mean anything.
    let session = |client: tokio_postgres::Client| async move {
        client
            .batch_execute("SET synchronous_commit = on")
            .await
            .unwrap();
        client
    };
    let client = session(streaming(cluster.connect(&name, Auth::Trust).await).await).await;
    let (mut written, _) = write_events(&client, 10, 3, &types, 3, 0, Duration::ZERO).await;

    // A transaction open at the crash is never published.
    let open = cluster.connect(&name, Auth::Trust).await;
    open.batch_execute(&format!(
        "BEGIN; INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('{}', 'k', 'Phantom', '{{}}')",
        types[0]
    ))
    .await
    .unwrap();
    cluster.restart("immediate");
    let client = session(streaming(cluster.connect(&name, Auth::Trust).await).await).await;
    written.extend(
        write_events(&client, 10, 3, &types, 3, 30, Duration::ZERO)
            .await
            .0,
    );

    cluster.restart("fast");
    let client = session(streaming(cluster.connect(&name, Auth::Trust).await).await).await;
    let (more, before_commit) = write_events(&client, 10, 3, &types, 3, 60, Duration::ZERO).await;
    written.extend(more);

    let consumed = consume(
        &kafka().bootstrap(),
        &[topic.as_str()],
        written.len(),
        Duration::from_secs(3),
        Duration::from_secs(120),
    )
    .await;
    // Unknown ids (the phantom) fail here too.
    assert_delivered(&written, &consumed, false);
    relay
        .wait_for_log("reconnecting", Duration::from_secs(5))
        .await;
    let last_commit = *before_commit.last().unwrap();
    wait_for("confirmed_flush_lsn to pass the last commit after the restarts", Duration::from_secs(30), || async {
        let lsn: Option<String> = client
            .query_one("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", &[&slot])
            .await
            .ok()
            .and_then(|r| r.get(0));
        lsn.filter(|l| parse_lsn(l) > last_commit).map(|_| ())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_messages_with_the_prefix_are_published_in_commit_order() {
    let setup = Setup::new("messages", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.extend(["--message-prefix".to_string(), "outbox".to_string()]);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let c = &setup.db.client;
    let message = |id: &str, payload: &str| {
        format!(
            r#"{{"id": "{id}", "aggregate_type": "{t}", "aggregate_id": "k", "event_type": "T", "payload": {payload}, "headers": {{"via": "message"}}}}"#
        )
    };

    c.batch_execute("BEGIN").await.unwrap();
    let row = insert(c, &t, "k", r#"{"from": "table"}"#).await;
    c.execute(
        "SELECT pg_logical_emit_message(true, 'outbox', $1)",
        &[&message("m-1", r#"{"from": "message", "n": 1.50}"#)],
    )
    .await
    .unwrap();
    c.execute(
        "SELECT pg_logical_emit_message(true, 'other', $1)",
        &[&message("m-other", "1")],
    )
    .await
    .unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    c.batch_execute("BEGIN").await.unwrap();
    c.execute(
        "SELECT pg_logical_emit_message(true, 'outbox', $1)",
        &[&message("m-rolled-back", "2")],
    )
    .await
    .unwrap();
    c.batch_execute("ROLLBACK").await.unwrap();
    c.execute(
        "SELECT pg_logical_emit_message(false, 'outbox', $1)",
        &[&message("m-non-transactional", "3")],
    )
    .await
    .unwrap();
    c.execute(
        "SELECT pg_logical_emit_message(true, 'outbox', $1)",
        &[&message("m-2", "null")],
    )
    .await
    .unwrap();

    let expected = vec![
        row,
        Written {
            id: "m-1".into(),
            aggregate_type: t.clone(),
            aggregate_id: "k".into(),
            event_type: "T".into(),
            payload: r#"{"from": "message", "n": 1.50}"#.into(),
        },
    ];
    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        3,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        consumed.len(),
        3,
        "only the two committed outbox messages and the row: {consumed:?}"
    );
    assert_delivered(&expected, &consumed[..2], true);
    assert_eq!(header(&consumed[1], "via"), Some(&b"message"[..]));
    assert_eq!(header(&consumed[2], "id"), Some(&b"m-2"[..]));
    assert_eq!(consumed[2].value, None, "a null payload is a tombstone");
    assert!(
        relay.log().contains("non-transactional logical message"),
        "{}",
        relay.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_wal_sender_timeout_survives_idle_time_and_a_hung_broker() {
    let setup = Setup::new("keepalive", &["Order"], 1).await;
    setup
        .db
        .client
        .batch_execute(&format!(
            "ALTER DATABASE {} SET wal_sender_timeout = '10s'",
            setup.db.name
        ))
        .await
        .unwrap();
    let broker = support::Broker::start_on(support::free_port());
    for topic in setup.topics() {
        broker.create_topic(&topic, 1);
    }
    let mut args = setup.relay_args(&broker.bootstrap(), Auth::Trust);
    args.extend(["--max-in-flight-events", "1000"].map(String::from));
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let pid = setup.db.slot_active_pid(&setup.slot).await.unwrap();

    // 120 s with nothing to send.
    tokio::time::sleep(Duration::from_secs(120)).await;
    // 40 s with the broker hung while a 20,000-row transaction waits behind the in-flight limit.
    broker.pause(true);
    setup
        .db
        .client
        .batch_execute(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             SELECT '{}', 'k-' || (g % 10), 'Bulk', jsonb_build_object('seq', g) FROM generate_series(1, 20000) g",
            setup.types[0]
        ))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(40)).await;
    broker.pause(false);

    let topics = setup.topics();
    let consumed = consume(
        &broker.bootstrap(),
        &[topics[0].as_str()],
        20_000,
        Duration::from_secs(1),
        Duration::from_secs(120),
    )
    .await;
    assert!(consumed.len() >= 20_000);
    assert_eq!(
        setup.db.slot_active_pid(&setup.slot).await,
        Some(pid),
        "the walsender was replaced:\n{}",
        relay.log()
    );
    let server_log = pg().log_contents();
    let timeouts: Vec<&str> = server_log
        .lines()
        .filter(|l| l.contains(&setup.db.name) && l.contains("replication timeout"))
        .collect();
    assert!(timeouts.is_empty(), "walsender timed out: {timeouts:?}");
    assert!(!relay.log().contains("reconnecting"), "{}", relay.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_event_function_and_debezium_named_columns() {
    let setup = Setup::new("sqlkit", &["Order", "Payment"], 1).await;
    let sql = |file: &str| {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("sql").join(file))
            .unwrap()
    };
    setup
        .db
        .client
        .batch_execute(&sql("publish_event.sql"))
        .await
        .unwrap();
    setup
        .db
        .client
        .batch_execute(&sql("outbox_debezium.sql"))
        .await
        .unwrap();
    let (t, t2) = (setup.types[0].clone(), setup.types[1].clone());

    let relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    // Debezium's column names, through a config file.
    let (_dir, args) = run_with_config(&format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[[pipelines]]\nname = \"debezium\"\nsource_url = \"{}\"\nslot = \"{}_dbz\"\npublication = \"outboxevent_pub\"\ntable = \"public.outboxevent\"\n[pipelines.columns]\naggregate_type = \"aggregatetype\"\naggregate_id = \"aggregateid\"\nevent_type = \"type\"\n",
        kafka().bootstrap(),
        setup.db.url(Auth::Trust),
        setup.slot
    ));
    let debezium = Relay::spawn(&args);
    setup.wait_streaming().await;
    wait_for(
        "the Debezium-named pipeline to stream",
        Duration::from_secs(60),
        || async {
            setup
                .db
                .slot_active_pid(&format!("{}_dbz", setup.slot))
                .await
        },
    )
    .await;

    let c = &setup.db.client;
    c.batch_execute("BEGIN").await.unwrap();
    let kept: String = c
        .query_one(
            "SELECT publish_event($1, 'k', 'Kept', '{\"n\": 1}')::text",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    let dropped: String = c
        .query_one(
            "SELECT publish_event($1, 'k', 'Dropped', '{\"n\": 2}', keep => false)::text",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    c.batch_execute("COMMIT").await.unwrap();
    let dbz_id: String = c
        .query_one(
            "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), $1, 'k', 'FromDebeziumTable', '{\"n\": 3}') RETURNING id::text",
            &[&t2],
        )
        .await
        .unwrap()
        .get(0);
    let remaining: i64 = c
        .query_one("SELECT count(*) FROM outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(remaining, 1, "keep => false deletes the row");

    let written = [
        Written {
            id: kept,
            aggregate_type: t.clone(),
            aggregate_id: "k".into(),
            event_type: "Kept".into(),
            payload: r#"{"n": 1}"#.into(),
        },
        Written {
            id: dropped,
            aggregate_type: t.clone(),
            aggregate_id: "k".into(),
            event_type: "Dropped".into(),
            payload: r#"{"n": 2}"#.into(),
        },
    ];
    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        2,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &consumed, true);
    let from_debezium_table = Written {
        id: dbz_id,
        aggregate_type: t2.clone(),
        aggregate_id: "k".into(),
        event_type: "FromDebeziumTable".into(),
        payload: r#"{"n": 3}"#.into(),
    };
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[1].as_str()],
        1,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&[from_debezium_table], &consumed, true);
    drop((relay, debezium));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_by_another_column_with_a_topic_template_and_lower_case() {
    let setup = Setup::new("routing", &["Order"], 1).await;
    setup
        .db
        .client
        .batch_execute("ALTER TABLE outbox ADD COLUMN tenant_id text")
        .await
        .unwrap();
    let tenant = format!("Tenant_{}", setup.db.name);
    let topic = format!("tenant.{}", tenant.to_lowercase());
    kafka().create_topic(&topic, 1);
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.extend(
        [
            "--route-by-field",
            "tenant_id",
            "--topic-template",
            "tenant.${routedByValue}",
            "--topic-case",
            "lower",
        ]
        .map(String::from),
    );
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let id: String = setup
        .db
        .client
        .query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, tenant_id) VALUES ('Order', 'k', 'T', '{}', $1) RETURNING id::text",
            &[&tenant],
        )
        .await
        .unwrap()
        .get(0);
    let consumed = consume(
        &kafka().bootstrap(),
        &[topic.as_str()],
        1,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(header(&consumed[0], "id"), Some(id.as_bytes()));
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_and_deletes_of_outbox_rows_are_passed_over_or_halt_as_configured() {
    let setup = Setup::new("invalidop", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let c = &setup.db.client;
    c.batch_execute("ALTER PUBLICATION outbox_pub SET (publish = 'insert, update, delete'); ALTER TABLE outbox REPLICA IDENTITY FULL")
        .await
        .unwrap();
    let mut relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    setup.wait_streaming().await;

    c.batch_execute("BEGIN").await.unwrap();
    let a = insert(c, &t, "k", r#"{"e": "a"}"#).await;
    c.execute("DELETE FROM outbox WHERE id = $1::text::uuid", &[&a.id])
        .await
        .unwrap();
    let b = insert(c, &t, "k", r#"{"e": "b"}"#).await;
    c.execute(
        "UPDATE outbox SET event_type = 'Changed' WHERE id = $1::text::uuid",
        &[&b.id],
    )
    .await
    .unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        2,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&[a, b], &consumed, true);
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());

    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.extend(["--op-invalid-behavior", "error"].map(String::from));
    let mut strict = Relay::spawn(&args);
    setup.wait_streaming().await;
    c.batch_execute("BEGIN").await.unwrap();
    let d = insert(c, &t, "k", r#"{"e": "d"}"#).await;
    c.execute(
        "UPDATE outbox SET event_type = 'Changed' WHERE id = $1::text::uuid",
        &[&d.id],
    )
    .await
    .unwrap();
    let before_commit = insert_lsn(c).await;
    c.batch_execute("COMMIT").await.unwrap();
    assert!(
        !strict.wait(Duration::from_secs(30)).success(),
        "op_invalid_behavior = error must stop the relay"
    );
    assert!(
        strict.log().contains("update of an outbox row"),
        "{}",
        strict.log()
    );
    assert!(
        setup.confirmed_flush().await <= before_commit,
        "confirmed past the transaction with the update"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidated_slot_is_refused_and_never_recreated() {
    // A cluster of its own: the test lowers max_slot_wal_keep_size, which would invalidate
    // the other tests' slots.
    let cluster = support::PgCluster::start_private(&unique_name("lostslot"));
    let name = unique_name("lostslot");
    let db = cluster.create_database(&name).await;
    for sql in [
        "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'",
        "SELECT pg_reload_conf()",
        "CREATE TABLE scratch (filler text)",
    ] {
        db.client.batch_execute(sql).await.unwrap();
    }
    let aggregate = format!("Order_{name}");
    let topic = format!("{aggregate}.events");
    kafka().create_topic(&topic, 1);
    let slot = format!("{name}_slot");
    let args = private_cluster_args(&db, &slot);

    // A first start creates the slot and publishes an event; then the relay stops.
    let mut relay = Relay::spawn(&args);
    wait_slot_streaming(&db.client, &slot).await;
    let (written, _) = write_events(
        &db.client,
        1,
        1,
        std::slice::from_ref(&aggregate),
        1,
        0,
        Duration::ZERO,
    )
    .await;
    consume(
        &kafka().bootstrap(),
        &[topic.as_str()],
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    relay.sigterm();
    assert!(
        relay.wait(Duration::from_secs(30)).success(),
        "{}",
        relay.log()
    );

    // While it is stopped, events are written and WAL moves far past max_slot_wal_keep_size:
    // the checkpoint removes WAL the slot still needs.
    let (lost, _) = write_events(
        &db.client,
        1,
        1,
        std::slice::from_ref(&aggregate),
        1,
        10,
        Duration::ZERO,
    )
    .await;
    assert_eq!(lost.len(), 1);
    for _ in 0..4 {
        db.client
            .batch_execute(
                "INSERT INTO scratch SELECT repeat('x', 1000) FROM generate_series(1, 2000);
                 SELECT pg_switch_wal();",
            )
            .await
            .unwrap();
    }
    db.client.batch_execute("CHECKPOINT").await.unwrap();
    let status: Option<String> = db
        .client
        .query_one(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        status.as_deref(),
        Some("lost"),
        "the test did not invalidate the slot"
    );

    // The relay refuses to run, says why and what to do, and leaves the slot as it is.
    let mut relay = Relay::spawn(&args);
    let status = relay.wait(Duration::from_secs(60));
    assert!(!status.success(), "the relay ran on an invalidated slot");
    let log = relay.log();
    assert!(
        log.contains("invalidated") && log.contains("pg_drop_replication_slot"),
        "{log}"
    );
    let (count, status): (i64, Option<String>) = {
        let row = db
            .client
            .query_one(
                "SELECT count(*), max(wal_status) FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((count, status.as_deref()), (1, Some("lost")));

    // `status` shows it too, so an operator sees it before starting the relay.
    let mut status_args = vec!["status".to_string()];
    status_args.extend(args[1..].iter().cloned());
    let mut report = Relay::spawn(&status_args);
    report.wait(Duration::from_secs(30));
    assert!(report.log().contains("lost"), "{}", report.log());
}

/// Issue 5, case 1: the broker hangs longer than the producer's message timeout. librdkafka
/// gives up on the records; the relay must not skip them: it drops the producer, reconnects
/// from the slot's confirmed LSN and publishes again, retrying with backoff until the broker is
/// back. Meanwhile the slot stays before the first unacknowledged commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_outage_longer_than_the_message_timeout_loses_nothing() {
    let setup = Setup::new("timeout", &["Order"], 2).await;
    let broker = support::Broker::start_on(support::free_port());
    for topic in setup.topics() {
        broker.create_topic(&topic, 2);
    }
    let mut args = setup.relay_args(&broker.bootstrap(), Auth::Trust);
    args.extend(["--kafka-property", "message.timeout.ms=2000"].map(String::from));
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (mut written, _) =
        write_events(&setup.db.client, 1, 1, &setup.types, 1, 0, Duration::ZERO).await;
    let topics = setup.topics();
    consume(
        &broker.bootstrap(),
        &[topics[0].as_str()],
        1,
        Duration::ZERO,
        Duration::from_secs(30),
    )
    .await;

    broker.pause(true);
    // Ten single-event transactions for three keys while the broker hangs.
    let (during, before_commit) =
        write_events(&setup.db.client, 10, 1, &setup.types, 3, 1, Duration::ZERO).await;
    written.extend(during);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        let confirmed = setup.confirmed_flush().await;
        assert!(
            confirmed <= before_commit[0],
            "confirmed_flush_lsn {confirmed:X} passed an unacknowledged commit at {:X}",
            before_commit[0]
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    broker.pause(false);

    let consumed = consume(
        &broker.bootstrap(),
        &[topics[0].as_str()],
        written.len(),
        Duration::from_secs(2),
        Duration::from_secs(120),
    )
    .await;
    assert_delivered(&written, &consumed, false);
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "confirmed_flush_lsn to pass the last commit once the broker is back",
            Duration::from_secs(60),
        )
        .await;
    let log = relay.log();
    assert!(
        log.contains("timed out") && log.contains("reconnecting"),
        "the relay did not report the timed-out deliveries and its retry:\n{log}"
    );
}

/// Role and database defaults cannot break the relay's sessions: a 1 ms statement_timeout, a
/// 1 s idle_session_timeout, a search_path without pg_catalog's friends and another DateStyle
/// and TimeZone on the database. The relay streams, stays connected while idle and publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_database_defaults_do_not_break_the_sessions() {
    let setup = Setup::new("defaults", &["Order"], 1).await;
    let db = setup.db.name.clone();
    for setting in [
        "statement_timeout = '1ms'",
        "lock_timeout = '1ms'",
        "idle_session_timeout = '1s'",
        "idle_in_transaction_session_timeout = '1s'",
        "search_path = nowhere",
        "DateStyle = 'SQL, DMY'",
        "TimeZone = 'America/Bogota'",
    ] {
        setup
            .db
            .client
            .batch_execute(&format!("ALTER DATABASE {db} SET {setting}"))
            .await
            .unwrap();
    }
    let relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    setup.wait_streaming().await;
    let pid = setup.db.slot_active_pid(&setup.slot).await.unwrap();
    let (mut written, _) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 0, Duration::ZERO).await;
    // Idle well past idle_session_timeout.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (more, before_commit) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 4, Duration::ZERO).await;
    written.extend(more);
    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &consumed, true);
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "confirmed_flush_lsn to pass the last commit",
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(
        setup.db.slot_active_pid(&setup.slot).await,
        Some(pid),
        "the relay reconnected:\n{}",
        relay.log()
    );
    assert!(!relay.log().contains("reconnecting"), "{}", relay.log());
}

/// One row of the routing-options test as written, with what PostgreSQL printed.
struct Routed {
    id: String,
    aggregate_id: String,
    /// `payload::text`.
    payload: String,
    /// `created_at` as Unix ms.
    created_ms: i64,
}

async fn insert_routed(
    client: &tokio_postgres::Client,
    aggregate_type: &str,
    aggregate_id: &str,
    tenant: &str,
    shard: Option<i32>,
    created_at: &str,
) -> Routed {
    let row = client
        .query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, tenant_id, shard, created_at)
             VALUES ($1, $2, 'Routed', '{\"amount\": 1500000.10, \"s\": \"é\"}', $3, $4, $5::text::timestamptz)
             RETURNING id::text, payload::text, (extract(epoch FROM created_at) * 1000)::int8",
            &[&aggregate_type, &aggregate_id, &tenant, &shard, &created_at],
        )
        .await
        .unwrap();
    Routed {
        id: row.get(0),
        aggregate_id: aggregate_id.to_owned(),
        payload: row.get(1),
        created_ms: row.get(2),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_options_timestamp_regex_column_placements_envelope_and_dead_letter() {
    let setup = Setup::new("mapping", &[], 1).await;
    let c = &setup.db.client;
    c.batch_execute("ALTER TABLE outbox ADD COLUMN tenant_id text, ADD COLUMN shard int4")
        .await
        .unwrap();
    // The test's database name is unique: it is the tenant, and so in every topic name.
    let tenant = setup.db.name.clone();
    let billing = format!("{tenant}.billing.v2.events");
    let orders = format!("{tenant}.orders.v1.events");
    let dlq = format!("{tenant}.dlq");
    kafka().create_topic(&billing, 4);
    kafka().create_topic(&orders, 4);
    kafka().create_topic(&dlq, 1);
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let toml = format!(
        r#"[kafka]
bootstrap_servers = "{bootstrap}"
[metrics]
listen = "{metrics}"
[[pipelines]]
name = "mapping"
source_url = "{url}"
slot = "{slot}"
publication = "outbox_pub"
table = "public.outbox"
columns = {{ timestamp = "created_at" }}
route = {{ topic_regex = "(?P<domain>.+)_(v[0-9]+)", topic_template = "${{column:tenant_id}}.${{domain}}.${{2}}.events" }}
additional_placement = [
  {{ field = "tenant_id", placement = "header", alias = "tenant" }},
  {{ field = "shard", placement = "partition" }},
  {{ field = "tenant_id", placement = "envelope", alias = "tenant" }},
  {{ field = "shard", placement = "envelope" }},
]
value_format = "envelope"
on_bad_event = "dead_letter"
dead_letter_topic = "{dlq}"
"#,
        bootstrap = kafka().bootstrap(),
        url = setup.db.url(Auth::Trust),
        slot = setup.slot,
    );
    let (_dir, args) = run_with_config(&toml);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    c.batch_execute("BEGIN").await.unwrap();
    let first = insert_routed(
        c,
        "billing_v2",
        "b-1",
        &tenant,
        Some(1),
        "2026-01-02 03:04:05.678+05:30",
    )
    .await;
    // "bad domain" makes an illegal topic name: dead-lettered, and the events after it flow.
    let bad = insert_routed(
        c,
        "bad domain_v2",
        "x-1",
        &tenant,
        Some(2),
        "2026-01-02 03:04:05-03",
    )
    .await;
    let by_key = insert_routed(
        c,
        "orders_v1",
        "o-1",
        &tenant,
        None,
        "2026-01-02 03:04:05.5+00",
    )
    .await;
    c.batch_execute("COMMIT").await.unwrap();
    c.batch_execute("BEGIN").await.unwrap();
    let last = insert_routed(
        c,
        "billing_v2",
        "b-2",
        &tenant,
        Some(3),
        "1999-12-31 23:59:59.999-12",
    )
    .await;
    let before_last_commit = insert_lsn(c).await;
    c.batch_execute("COMMIT").await.unwrap();

    let consumed = consume(
        &kafka().bootstrap(),
        &[billing.as_str(), orders.as_str(), dlq.as_str()],
        4,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    let record = |id: &str| {
        let found: Vec<&Consumed> = consumed
            .iter()
            .filter(|r| header(r, "id") == Some(id.as_bytes()))
            .collect();
        assert_eq!(found.len(), 1, "event {id} once in {consumed:#?}");
        found[0]
    };
    for (event, topic, partition, shard) in [
        (&first, &billing, Some(1), "1"),
        (&last, &billing, Some(3), "3"),
        (&by_key, &orders, None, "null"),
    ] {
        let r = record(&event.id);
        assert_eq!(
            &r.topic, topic,
            "topic from the tenant column and the regex groups"
        );
        if let Some(partition) = partition {
            assert_eq!(r.partition, partition, "partition from the shard column");
        }
        assert_eq!(
            r.timestamp_ms,
            Some(event.created_ms),
            "timestamp from created_at"
        );
        assert_eq!(r.key.as_deref(), Some(event.aggregate_id.as_bytes()));
        let headers: Vec<(&str, Option<&[u8]>)> = r
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref()))
            .collect();
        assert_eq!(
            headers,
            vec![
                ("id", Some(event.id.as_bytes())),
                ("event_type", Some(&b"Routed"[..])),
                ("tenant", Some(tenant.as_bytes())),
            ],
            "built-in headers, then the header placement under its alias"
        );
        assert_eq!(
            r.value_str().unwrap(),
            format!(
                r#"{{"payload":{},"tenant":"{tenant}","shard":{shard}}}"#,
                event.payload
            ),
            "envelope with the jsonb payload byte for byte"
        );
    }
    assert_eq!(
        first.payload, r#"{"s": "é", "amount": 1500000.10}"#,
        "the payload as jsonb printed it"
    );
    assert_eq!(first.created_ms, 1_767_303_245_678);
    assert_eq!(last.created_ms, 946_727_999_999);

    let dead = record(&bad.id);
    assert_eq!(dead.topic, dlq);
    assert_eq!(dead.key.as_deref(), Some(&b"x-1"[..]), "the original key");
    assert_eq!(
        dead.value_str().unwrap(),
        bad.payload,
        "the raw payload, no envelope"
    );
    assert_eq!(header(dead, "event_type"), Some(&b"Routed"[..]));
    let reason = dead.header_str("outbox_relay_error").unwrap();
    assert!(
        reason.contains(&bad.id)
            && reason.contains("bad domain")
            && reason.contains("not a legal Kafka topic name"),
        "{reason}"
    );

    setup
        .wait_confirmed_past(
            before_last_commit,
            "confirmed_flush_lsn past the last commit",
            Duration::from_secs(30),
        )
        .await;
    let (_, text) = http_get(&metrics, "/metrics").await.unwrap();
    assert!(
        text.contains(
            "outbox_relay_events_dead_lettered_total{pipeline=\"mapping\",reason=\"illegal_topic\"} 1"
        ),
        "{text}"
    );
    assert!(
        relay.log().contains(&bad.id),
        "the warning names the dead-lettered event"
    );
    drop(relay);
}

/// `on_bad_event = "dead_letter"` also covers records Kafka refuses for good: an event over
/// the producer's size limit goes to the dead-letter topic (key and headers, no value, the
/// reason with size and limit, the topic it was meant for), the events after it flow in
/// order, and the slot passes the last commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_event_is_dead_lettered_and_the_rest_flows() {
    let setup = Setup::new("dlqsize", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let dlq = format!("{}.dead-letter", setup.slot);
    kafka().create_topic(&dlq, 1);
    let toml = format!(
        r#"
[kafka]
bootstrap_servers = "{bootstrap}"

[[pipelines]]
name = "dlqsize"
source_url = "{url}"
slot = "{slot}"
publication = "outbox_pub"
table = "public.outbox"
on_bad_event = "dead_letter"
dead_letter_topic = "{dlq}"
[pipelines.kafka.properties]
"message.max.bytes" = "2000"
"#,
        bootstrap = kafka().bootstrap(),
        url = setup.db.url(Auth::Trust),
        slot = setup.slot,
    );
    let (_dir, args) = run_with_config(&toml);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    let client = &setup.db.client;
    let before = insert(client, &t, "k1", r#"{"n": 1}"#).await;
    let big = insert(
        client,
        &t,
        "k1",
        &format!(r#"{{"blob": "{}"}}"#, "x".repeat(5_000)),
    )
    .await;
    let after_same_key = insert(client, &t, "k1", r#"{"n": 3}"#).await;
    let other_key = insert(client, &t, "k2", r#"{"n": 4}"#).await;
    let last_commit = setup.db.current_wal_insert_lsn().await;

    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        3,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&[before, after_same_key, other_key], &consumed, true);
    let dead = consume(
        &kafka().bootstrap(),
        &[dlq.as_str()],
        1,
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(dead.len(), 1);
    let dead = &dead[0];
    assert_eq!(dead.key_str().as_deref(), Some("k1"));
    assert_eq!(dead.value, None, "an oversized copy would be refused too");
    assert_eq!(dead.header_str("id").as_deref(), Some(big.id.as_str()));
    assert_eq!(
        dead.header_str("outbox_relay_topic").as_deref(),
        Some(topics[0].as_str())
    );
    let reason = dead.header_str("outbox_relay_error").unwrap_or_default();
    assert!(
        reason.contains("message.max.bytes = 2000") && reason.contains("bytes"),
        "{reason}"
    );
    setup
        .wait_confirmed_past(
            last_commit,
            "confirmed_flush_lsn to pass the last commit",
            Duration::from_secs(30),
        )
        .await;
    assert!(relay.log().contains(&big.id), "{}", relay.log());
}

/// The value of the series `series` (name and labels as rendered) in a Prometheus text page.
///
/// Panics if the page has no such series.
fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
}

/// A test database where the server never times a walsender out (`wal_sender_timeout = 0`), so
/// only a relay can end a stale one.
async fn takeover_setup(prefix: &str) -> Setup {
    let setup = Setup::new(prefix, &["Order"], 1).await;
    setup
        .db
        .client
        .batch_execute(&format!(
            "ALTER DATABASE {} SET wal_sender_timeout = 0",
            setup.db.name
        ))
        .await
        .unwrap();
    setup
}

/// `args` with `--terminate-stale-walsender-after-secs 5`.
fn with_takeover(mut args: Vec<String>) -> Vec<String> {
    args.extend(["--terminate-stale-walsender-after-secs".into(), "5".into()]);
    args
}

/// Starts a relay (as `relay_md5`), waits until it streams, then stops it with SIGSTOP: its
/// walsender stays and holds the slot, its client sends no more status updates. Returns the
/// stopped relay and its walsender's pid.
async fn stopped_holder(setup: &Setup) -> (Relay, i32) {
    let stale = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Md5));
    setup.wait_streaming().await;
    let pid = setup.db.slot_active_pid(&setup.slot).await.unwrap();
    stale.signal(libc::SIGSTOP);
    (stale, pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_relay_holding_the_slot_is_terminated_and_its_slot_taken_over() {
    let setup = takeover_setup("stale_holder").await;
    let (stale, stale_pid) = stopped_holder(&setup).await;
    let id = setup
        .db
        .insert_event(&setup.types[0], "42", "Created", Some(r#"{"n": 1}"#), None)
        .await;

    let started = std::time::Instant::now();
    let mut taker = Relay::spawn(&with_takeover(
        setup.relay_args(&kafka().bootstrap(), Auth::Trust),
    ));
    taker
        .wait_for_log(
            "terminated the walsender holding the slot",
            Duration::from_secs(30),
        )
        .await;
    taker
        .wait_for_log("streaming", Duration::from_secs(30))
        .await;
    // How long it took is for the reader (speed belongs in bench/); the waits' deadlines bound it.
    eprintln!(
        "takeover after {:?} with a 5 s grace period",
        started.elapsed()
    );
    let log = taker.log();
    let warning = log
        .lines()
        .find(|l| l.contains("terminated the walsender holding the slot"))
        .unwrap();
    for field in [
        format!("pid={stale_pid}"),
        "application_name=outbox-relay".into(),
        "client=127.0.0.1:".into(),
        "reply_age_secs=".into(),
    ] {
        assert!(warning.contains(&field), "{field} missing in {warning}");
    }
    assert_ne!(
        setup.db.slot_active_pid(&setup.slot).await,
        Some(stale_pid),
        "the stale walsender still holds the slot"
    );

    let consumed = setup
        .consume_all(1, Duration::from_secs(1), Duration::from_secs(60))
        .await;
    assert_eq!(consumed.len(), 1, "{consumed:?}");
    assert_eq!(consumed[0].header_str("id").as_deref(), Some(id.as_str()));
    drop(stale);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_relay_holding_the_slot_is_never_terminated() {
    let setup = takeover_setup("live_holder").await;
    let mut active = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Md5));
    setup.wait_streaming().await;
    let active_pid = setup.db.slot_active_pid(&setup.slot).await.unwrap();
    // A superuser: sees every walsender's reply_time and may terminate any.
    let mut standby = Relay::spawn(&with_takeover(
        setup.relay_args(&kafka().bootstrap(), Auth::Trust),
    ));
    standby
        .wait_for_log("is active for PID", Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(15)).await;

    assert!(active.is_running(), "{}", active.log());
    assert_eq!(
        setup.db.slot_active_pid(&setup.slot).await,
        Some(active_pid),
        "the live relay's walsender was replaced"
    );
    let log = standby.log();
    assert!(
        !log.contains("terminated the walsender")
            && !log.contains("cannot terminate")
            && !log.contains("streaming"),
        "the standby fought the live relay:\n{log}"
    );
    assert!(
        log.matches("is active for PID").count() >= 4,
        "the standby stopped retrying:\n{log}"
    );
    // The live relay still publishes.
    let id = setup
        .db
        .insert_event(&setup.types[0], "7", "Created", Some("{}"), None)
        .await;
    let consumed = setup
        .consume_all(1, Duration::from_secs(1), Duration::from_secs(60))
        .await;
    assert_eq!(consumed[0].header_str("id").as_deref(), Some(id.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_walsender_takeover_needs_pg_read_all_stats_and_the_right_to_signal() {
    let setup = takeover_setup("takeover_roles").await;
    let role = unique_name("watcher");
    let admin = pg().connect("postgres", Auth::Trust).await;
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN REPLICATION; GRANT pg_read_all_data TO {role}"
        ))
        .await
        .unwrap();
    let (stale, stale_pid) = stopped_holder(&setup).await;
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let url = args.iter().position(|a| a == "--source-url").unwrap() + 1;
    args[url] = format!(
        "postgres://{role}@127.0.0.1:{}/{}",
        setup.db.port(),
        setup.db.name
    );
    let mut taker = Relay::spawn(&with_takeover(args));

    // Without pg_read_all_stats the holder's reply_time is hidden: nothing is terminated.
    taker
        .wait_for_log("GRANT pg_read_all_stats", Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(setup.db.slot_active_pid(&setup.slot).await, Some(stale_pid));

    // It sees the holder is stale but may not signal another role's backend.
    admin
        .batch_execute(&format!("GRANT pg_read_all_stats TO {role}"))
        .await
        .unwrap();
    taker
        .wait_for_log(
            "cannot terminate the stale walsender holding the slot",
            Duration::from_secs(30),
        )
        .await;
    let refusal = taker
        .log()
        .lines()
        .find(|l| l.contains("cannot terminate the stale walsender"))
        .unwrap()
        .to_owned();
    assert!(
        refusal.contains(&format!("pid={stale_pid}")) && refusal.contains("pg_signal_backend"),
        "{refusal}"
    );
    assert_eq!(setup.db.slot_active_pid(&setup.slot).await, Some(stale_pid));

    // With pg_signal_backend it takes over at its next attempt.
    admin
        .batch_execute(&format!("GRANT pg_signal_backend TO {role}"))
        .await
        .unwrap();
    let granted = std::time::Instant::now();
    taker
        .wait_for_log("streaming", Duration::from_secs(30))
        .await;
    eprintln!("streaming {:?} after the grant", granted.elapsed());
    let id = setup
        .db
        .insert_event(&setup.types[0], "9", "Created", Some("{}"), None)
        .await;
    let consumed = setup
        .consume_all(1, Duration::from_secs(1), Duration::from_secs(60))
        .await;
    assert_eq!(consumed[0].header_str("id").as_deref(), Some(id.as_str()));
    drop(stale);
}

/// Runs `outbox-relay probe --url URL` and returns its exit code and output.
fn probe(url: &str) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["probe", "--url", url])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_command_exits_0_when_ready_and_1_otherwise() {
    let setup = Setup::new("probe", &["Order"], 1).await;
    let metrics = format!("127.0.0.1:{}", support::free_port());
    // Nothing listens yet.
    let (code, text) = probe(&format!("http://{metrics}/readyz"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("cannot reach"), "{text}");

    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.extend(["--metrics-listen".to_string(), metrics.clone()]);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    wait_for("/readyz to answer 200", Duration::from_secs(30), || async {
        http_get(&metrics, "/readyz")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    let (code, text) = probe(&format!("http://{metrics}/readyz"));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("200"), "{text}");
    let (code, text) = probe(&format!("http://{metrics}/healthz"));
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = probe(&format!("http://{metrics}/no-such-page"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("404"), "{text}");
    drop(relay);
}

/// `target/<profile>/examples/inbox_consumer`, built first if `cargo test --test e2e` did not.
fn inbox_consumer_example() -> std::path::PathBuf {
    let relay = Path::new(env!("CARGO_BIN_EXE_outbox-relay"));
    let path = relay.parent().unwrap().join("examples/inbox_consumer");
    if !path.exists() {
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "--example", "inbox_consumer"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(status.success(), "cargo build --example inbox_consumer");
    }
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_consumer_example_applies_a_redelivered_event_once() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::FutureRecord;

    let setup = Setup::new("inbox", &["Order"], 1).await;
    let relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    setup.wait_streaming().await;
    let first = setup
        .db
        .insert_event(&setup.types[0], "o-1", "OrderPlaced", Some("{}"), None)
        .await;
    let second = setup
        .db
        .insert_event(&setup.types[0], "o-2", "OrderPlaced", Some("{}"), None)
        .await;
    let consumed = setup
        .consume_all(2, Duration::ZERO, Duration::from_secs(60))
        .await;
    drop(relay);
    // The first event again, as after a relay crash before its LSN was confirmed.
    let original = consumed
        .iter()
        .find(|r| r.header_str("id").as_deref() == Some(first.as_str()))
        .unwrap();
    let mut headers = OwnedHeaders::new();
    for (key, value) in &original.headers {
        headers = headers.insert(Header {
            key,
            value: value.as_deref(),
        });
    }
    let topic = &setup.topics()[0];
    support::kafka::producer(&kafka().bootstrap())
        .send(
            FutureRecord::to(topic)
                .key(original.key.as_deref().unwrap())
                .payload(original.value.as_deref().unwrap())
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .unwrap();

    let consumer_db = pg().create_database(&unique_name("inbox_consumer")).await;
    let example = inbox_consumer_example();
    let args: Vec<String> = [
        "--bootstrap-servers",
        &kafka().bootstrap(),
        "--topics",
        topic,
        "--group-id",
        &unique_name("inbox_group"),
        "--database-url",
        &consumer_db.url(Auth::Trust),
        "--max-records",
        "3",
        "--idle-timeout-secs",
        "60",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let run = tokio::task::spawn_blocking(move || {
        std::process::Command::new(example)
            .args(args)
            .output()
            .unwrap()
    });
    let out = support::within("the inbox consumer", Duration::from_secs(90), run)
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // One partition: the relay's two records, then the copy.
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].starts_with("applied ") && lines[0].ends_with(&first),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("applied ") && lines[1].ends_with(&second),
        "{stdout}"
    );
    assert!(
        lines[2].starts_with("duplicate ") && lines[2].ends_with(&first),
        "{stdout}"
    );

    let mut inbox: Vec<String> = consumer_db
        .client
        .query("SELECT event_id FROM inbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    inbox.sort();
    let mut expected = vec![first.clone(), second.clone()];
    expected.sort();
    assert_eq!(inbox, expected, "one inbox row per event");
    let counts: Vec<(String, i64)> = consumer_db
        .client
        .query(
            "SELECT aggregate_id, events FROM aggregate_event_counts ORDER BY aggregate_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        counts,
        [("o-1".to_string(), 1), ("o-2".to_string(), 1)],
        "the handler ran once per event"
    );
}

/// `args` with the value after `flag` replaced by `value`.
fn with_arg(mut args: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} not in {args:?}"));
    args[at + 1] = value.to_owned();
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoted_mixed_case_names_and_look_alike_tables_in_one_publication() {
    let setup = Setup::new("quoted", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let c = &setup.db.client;
    // The configured table and four look-alikes with the same columns.
    let look_alikes = [
        r#""Billing-Prod".outbox"#,
        r#""billing-prod"."Outbox""#,
        r#""billing-prod".outbox"#,
        "public.outbox",
    ];
    c.batch_execute(
        r#"CREATE SCHEMA "Billing-Prod";
           CREATE SCHEMA "billing-prod";
           CREATE TABLE "Billing-Prod"."Outbox" (LIKE public.outbox INCLUDING ALL);
           CREATE TABLE "Billing-Prod".outbox (LIKE public.outbox INCLUDING ALL);
           CREATE TABLE "billing-prod"."Outbox" (LIKE public.outbox INCLUDING ALL);
           CREATE TABLE "billing-prod".outbox (LIKE public.outbox INCLUDING ALL);"#,
    )
    .await
    .unwrap();
    let table = r#""Billing-Prod"."Outbox""#;
    let flags = |command: &str| {
        let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
        args[0] = command.into();
        let args = with_arg(args, "--publication", "Outbox-Pub");
        with_arg(args, "--table", table)
    };

    let mut print = flags("setup");
    print.push("--print-sql".into());
    let mut printer = Relay::spawn(&print);
    assert!(
        printer.wait(Duration::from_secs(30)).success(),
        "{}",
        printer.log()
    );
    assert!(
        printer.log().contains(
            r#"CREATE PUBLICATION "Outbox-Pub" FOR TABLE "Billing-Prod"."Outbox" WITH (publish = 'insert');"#
        ),
        "{}",
        printer.log()
    );
    let mut creator = Relay::spawn(&flags("setup"));
    assert!(
        creator.wait(Duration::from_secs(60)).success(),
        "{}",
        creator.log()
    );
    c.batch_execute(&format!(
        r#"ALTER PUBLICATION "Outbox-Pub" ADD TABLE {}"#,
        look_alikes.join(", ")
    ))
    .await
    .unwrap();
    let tables: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'Outbox-Pub'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 5, "setup published the configured table");
    let mut check = Relay::spawn(&flags("check"));
    assert!(
        check.wait(Duration::from_secs(60)).success(),
        "{}",
        check.log()
    );
    for needle in [
        "ok    outbox table            \"Billing-Prod\".\"Outbox\" readable",
        "ok    publication             Outbox-Pub publishes inserts of \"Billing-Prod\".\"Outbox\"",
        "ok    outbox columns          every mapped column exists",
    ] {
        assert!(
            check.log().contains(needle),
            "{needle:?} missing:\n{}",
            check.log()
        );
    }

    // The file form of the same names.
    let (_dir, args) = run_with_config(&format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[[pipelines]]\nname = \"quoted\"\nsource_url = \"{}\"\nslot = \"{}\"\npublication = \"Outbox-Pub\"\ntable = '{table}'\ncreate_slot = false\n",
        kafka().bootstrap(),
        setup.db.url(Auth::Trust),
        setup.slot
    ));
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    let mut written = Vec::new();
    let mut before_commit = 0;
    for round in 0..2 {
        c.batch_execute("BEGIN").await.unwrap();
        for target in std::iter::once(table).chain(look_alikes) {
            let row = c
                .query_one(
                    &format!(
                        "INSERT INTO {target} (aggregate_type, aggregate_id, event_type, payload)
                         VALUES ($1, 'k', $2, '{{\"round\": {round}}}') RETURNING id::text, payload::text"
                    ),
                    &[&t, &target],
                )
                .await
                .unwrap();
            if target == table {
                written.push(Written {
                    id: row.get(0),
                    aggregate_type: t.clone(),
                    aggregate_id: "k".into(),
                    event_type: target.to_owned(),
                    payload: row.get(1),
                });
            }
        }
        before_commit = insert_lsn(c).await;
        c.batch_execute("COMMIT").await.unwrap();
    }
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(3),
            Duration::from_secs(60),
        )
        .await;
    // Any record of a look-alike table would have an id not in `written`.
    assert_delivered(&written, &consumed, true);
    setup
        .wait_confirmed_past(
            before_commit,
            "the look-alikes' rows to be confirmed",
            Duration::from_secs(30),
        )
        .await;
    drop(relay);
}

/// Inserts one outbox row naming the event type column `event_type_column` and giving
/// `payload_sql` (an SQL expression) as the payload; returns what was written.
async fn insert_with(
    client: &tokio_postgres::Client,
    event_type_column: &str,
    aggregate_type: &str,
    event_type: &str,
    payload_sql: &str,
) -> Written {
    let row = client
        .query_one(
            &format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, {event_type_column}, payload)
                 VALUES ($1, 'k-1', $2, {payload_sql}) RETURNING id::text, payload::text"
            ),
            &[&aggregate_type, &event_type],
        )
        .await
        .unwrap_or_else(|e| panic!("inserting {event_type}: {e}"));
    Written {
        id: row.get(0),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: "k-1".to_owned(),
        event_type: event_type.to_owned(),
        payload: row.get(1),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alter_table_mid_stream_and_a_renamed_column_halts_until_it_is_mapped() {
    let setup = Setup::new("altertable", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let c = &setup.db.client;
    // A column before the mapped ones, so that dropping it moves all of them.
    c.batch_execute(
        "DROP TABLE outbox;
         CREATE TABLE outbox (
           id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
           legacy text,
           aggregate_type text NOT NULL,
           aggregate_id text NOT NULL,
           event_type text NOT NULL,
           payload jsonb,
           headers jsonb NOT NULL DEFAULT '{}');
         ALTER PUBLICATION outbox_pub ADD TABLE outbox;",
    )
    .await
    .unwrap();
    let mut relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    setup.wait_streaming().await;

    let mut written = vec![insert_with(c, "event_type", &t, "Before", r#"'{"n": 1}'"#).await];
    c.batch_execute("ALTER TABLE outbox ADD COLUMN tenant text DEFAULT 'x'")
        .await
        .unwrap();
    written.push(insert_with(c, "event_type", &t, "AfterAdd", r#"'{"n": 2}'"#).await);
    // A schema change inside a transaction, between two of its inserts.
    c.batch_execute("BEGIN").await.unwrap();
    written.push(insert_with(c, "event_type", &t, "InTxnBefore", r#"'{"n": 3}'"#).await);
    c.batch_execute("ALTER TABLE outbox ADD COLUMN note text NOT NULL DEFAULT 'n'")
        .await
        .unwrap();
    written.push(insert_with(c, "event_type", &t, "InTxnAfter", r#"'{"n": 4}'"#).await);
    c.batch_execute("COMMIT").await.unwrap();
    c.batch_execute("ALTER TABLE outbox DROP COLUMN tenant; ALTER TABLE outbox DROP COLUMN legacy")
        .await
        .unwrap();
    written.push(insert_with(c, "event_type", &t, "AfterDrop", r#"'{"n": 5}'"#).await);
    c.batch_execute("ALTER TABLE outbox ALTER COLUMN aggregate_id TYPE varchar(64)")
        .await
        .unwrap();
    written.push(insert_with(c, "event_type", &t, "Varchar", r#"'{"n": 6}'"#).await);
    c.batch_execute("ALTER TABLE outbox ALTER COLUMN payload TYPE json USING payload::json")
        .await
        .unwrap();
    // json keeps the text as inserted: spacing, key order and duplicate keys.
    let exact = r#"{ "b":1,  "a":2, "a":3 ,"n": 7.50 }"#;
    let json = insert_with(c, "event_type", &t, "Json", &format!("'{exact}'")).await;
    assert_eq!(json.payload, exact);
    written.push(json);
    c.batch_execute("BEGIN").await.unwrap();
    written.push(insert_with(c, "event_type", &t, "JsonArray", r#"'[1, 2.50 ,"x"]'"#).await);
    let before_last_commit = insert_lsn(c).await;
    c.batch_execute("COMMIT").await.unwrap();
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
        .await;
    assert_delivered(&written, &consumed, true);
    setup
        .wait_confirmed_past(
            before_last_commit,
            "the events before the rename to be confirmed",
            Duration::from_secs(30),
        )
        .await;

    // Renamed away: the relay stops naming the column, without confirming the row.
    c.batch_execute("ALTER TABLE outbox RENAME COLUMN event_type TO kind")
        .await
        .unwrap();
    c.batch_execute("BEGIN").await.unwrap();
    let renamed = insert_with(c, "kind", &t, "Renamed", r#"'{"n": 9}'"#).await;
    let before_commit = insert_lsn(c).await;
    c.batch_execute("COMMIT").await.unwrap();
    let status = relay.wait(Duration::from_secs(30));
    assert!(!status.success(), "the relay went on without event_type");
    let log = relay.log();
    for needle in [
        r#"has no column "event_type" (columns.event_type)"#,
        "aggregate_id, kind, payload",
    ] {
        assert!(
            log.contains(needle),
            "the error names the column and the table's columns ({needle:?}):\n{log}"
        );
    }
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed <= before_commit,
        "confirmed_flush_lsn {confirmed:X} passed the row the relay could not map"
    );
    let mut check_args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    check_args[0] = "check".into();
    let mut check = Relay::spawn(&check_args);
    assert!(
        !check.wait(Duration::from_secs(60)).success(),
        "check passed without event_type:\n{}",
        check.log()
    );
    assert!(
        check
            .log()
            .contains(r#"FAIL  outbox columns          missing "event_type" (columns.event_type)"#),
        "{}",
        check.log()
    );

    // Mapped to the new name, a restarted relay publishes it.
    let (_dir, args) = run_with_config(&format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[[pipelines]]\nname = \"renamed\"\nsource_url = \"{}\"\nslot = \"{}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\ncreate_slot = false\n[pipelines.columns]\nevent_type = \"kind\"\n",
        kafka().bootstrap(),
        setup.db.url(Auth::Trust),
        setup.slot
    ));
    let mut relay = Relay::spawn(&args);
    written.push(renamed);
    written.push(insert_with(c, "kind", &t, "AfterRestart", r#"'{"n": 10}'"#).await);
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
        .await;
    assert_delivered(&written, &consumed, true);

    // The outbox renamed under the running relay: its inserts stop it, they are not passed
    // over; a restart refuses the missing table.
    c.batch_execute("ALTER TABLE outbox RENAME TO outbox_moved; BEGIN")
        .await
        .unwrap();
    let moved: String = c
        .query_one(
            "INSERT INTO outbox_moved (aggregate_type, aggregate_id, kind, payload) VALUES ($1, 'k-1', 'Moved', '{}') RETURNING id::text",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    let before_commit = insert_lsn(c).await;
    c.batch_execute("COMMIT").await.unwrap();
    assert!(
        !relay.wait(Duration::from_secs(30)).success(),
        "the relay passed over an insert into the renamed outbox ({moved})"
    );
    assert!(
        relay
            .log()
            .contains("into public.outbox_moved, which was the outbox table public.outbox"),
        "{}",
        relay.log()
    );
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed <= before_commit,
        "confirmed_flush_lsn {confirmed:X} passed the insert into the renamed outbox"
    );
    let mut restarted = Relay::spawn(&args);
    assert!(!restarted.wait(Duration::from_secs(30)).success());
    assert!(
        restarted
            .log()
            .contains("table public.outbox is not in publication"),
        "{}",
        restarted.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_debezium_connector_takes_over_its_slot_and_keeps_its_topics() {
    let setup = Setup::new("dbzimport", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let c = &setup.db.client;
    let sql = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("sql")
            .join("outbox_debezium.sql"),
    )
    .unwrap();
    c.batch_execute(&sql).await.unwrap();
    // The slot Debezium left behind (pgoutput), with an event it had not confirmed.
    setup.db.create_slot(&setup.slot).await;
    let insert = |event_type: &'static str| {
        let t = t.clone();
        async move {
            let row = c
                .query_one(
                    "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
                     VALUES (gen_random_uuid(), $1, 'k', $2, '{\"n\": 1.50}') RETURNING id::text, payload::text",
                    &[&t, &event_type],
                )
                .await
                .unwrap();
            Written {
                id: row.get(0),
                aggregate_type: t,
                aggregate_id: "k".into(),
                event_type: event_type.into(),
                payload: row.get(1),
            }
        }
    };
    let mut written = vec![insert("BeforeTakeover").await];

    let dir = tempfile::tempdir().unwrap();
    let connector = dir.path().join("orders-connector.json");
    std::fs::write(
        &connector,
        serde_json::json!({
            "name": "orders-connector",
            "config": {
                "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                "tasks.max": "1",
                "database.hostname": "127.0.0.1",
                "database.port": setup.db.port(),
                "database.user": "postgres",
                "database.password": "not-printed",
                "database.dbname": setup.db.name,
                "topic.prefix": "orders",
                "plugin.name": "pgoutput",
                "slot.name": setup.slot,
                "publication.name": "outboxevent_pub",
                "table.include.list": "public.outboxevent",
                "transforms": "outbox",
                "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
                "transforms.outbox.route.topic.replacement": "${routedByValue}.events"
            }
        })
        .to_string(),
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["import-debezium".as_ref(), connector.as_os_str()])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    );
    assert!(output.status.success(), "{stderr}");
    assert!(
        !stdout.contains("not-printed") && !stderr.contains("not-printed"),
        "the password was printed"
    );
    for line in [
        "database.password: not copied: set ORDERS_CONNECTOR_DB_PASSWORD",
        "topic.prefix: not needed",
        "tasks.max: ",
    ] {
        assert!(
            stderr.contains(line),
            "{line:?} missing in stderr:\n{stderr}"
        );
    }
    let config = dir.path().join("relay.toml");
    std::fs::write(&config, &stdout).unwrap();
    let bootstrap = kafka().bootstrap();
    let relay = Relay::spawn_with_env(
        &[
            "run".into(),
            "--config".into(),
            config.display().to_string(),
        ],
        &[
            ("KAFKA_BOOTSTRAP_SERVERS", bootstrap.as_str()),
            ("ORDERS_CONNECTOR_DB_PASSWORD", "unused-with-trust"),
        ],
    );
    setup.wait_streaming().await;
    written.push(insert("AfterTakeover").await);
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
        .await;
    assert_delivered(&written, &consumed, true);
    drop(relay);
}

/// A grace period not longer than the server's wal_sender_timeout is not used: the server ends
/// a stale walsender by itself then, and one that outlives the timeout with its reply_time
/// standing still is busy decoding for a live relay (two relays with the option would
/// terminate each other's replays forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_takeover_with_a_grace_period_within_wal_sender_timeout() {
    let setup = Setup::new("grace_within", &["Order"], 1).await;
    setup
        .db
        .client
        .batch_execute(&format!(
            "ALTER DATABASE {} SET wal_sender_timeout = '60s'",
            setup.db.name
        ))
        .await
        .unwrap();
    let (stale, stale_pid) = stopped_holder(&setup).await;
    let mut waiting = Relay::spawn(&with_takeover(
        setup.relay_args(&kafka().bootstrap(), Auth::Trust),
    ));
    waiting
        .wait_for_log(
            "must exceed the server's wal_sender_timeout",
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(
        setup.db.slot_active_pid(&setup.slot).await,
        Some(stale_pid),
        "the walsender was terminated:\n{}",
        waiting.log()
    );
    assert!(
        !waiting
            .log()
            .contains("terminated the walsender holding the slot"),
        "{}",
        waiting.log()
    );
    drop(stale);
}

// ---------------------------------------------------------------------------------------------
// Exactly-once mode. tansu has no transactions, so these tests run the relay against
// librdkafka's mock cluster, created in the test process (it listens on loopback TCP ports).
//
// What the mock cluster does not model (librdkafka 2.12, rdkafka_mock_handlers.c): EndTxn
// writes no commit or abort markers and Fetch answers LastStableOffset = high watermark with no
// aborted transactions, so a read_committed consumer there sees the records of aborted and
// open transactions too. It does model the transactional producer's protocol (InitProducerId
// with epochs and fencing, AddPartitionsToTxn, EndTxn). So on the mock, a transaction counts
// as committed once its checkpoint record is in the log: the relay reading the checkpoint back
// sees exactly that. The tests check what follows from it: each PostgreSQL transaction is
// committed to Kafka once (one checkpoint each, strictly increasing), nothing is lost, and
// duplicates come only from the one Kafka transaction a kill leaves open (which a broker with
// transactions hides from read_committed consumers). Nor does the mock fence: each
// InitProducerId gets a new producer id and the old one stays valid, so a zombie relay being
// fenced cannot be shown here either.
// ---------------------------------------------------------------------------------------------

const CHECKPOINT_TOPIC: &str = "outbox-relay.checkpoints";

/// A mock Kafka cluster with the checkpoint topic (3 partitions) and `<type>.events` topics.
fn mock_cluster(
    types: &[String],
    partitions: i32,
) -> rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext> {
    let mock = rdkafka::mocking::MockCluster::new(1).expect("creating a librdkafka mock cluster");
    mock.create_topic(CHECKPOINT_TOPIC, 3, 1).unwrap();
    for t in types {
        mock.create_topic(&format!("{t}.events"), partitions, 1)
            .unwrap();
    }
    mock
}

/// The checkpoint LSNs of `pipeline` in the order the relay committed them (one key lives in
/// one partition, and consumed records are in offset order per partition).
async fn checkpoints(bootstrap: &str, pipeline: &str, expected: usize) -> Vec<u64> {
    let records = support::consume_with(
        bootstrap,
        &[CHECKPOINT_TOPIC],
        expected,
        Duration::from_secs(1),
        Duration::from_secs(60),
        &[("isolation.level", "read_committed")],
    )
    .await;
    records
        .iter()
        .filter(|r| r.key.as_deref() == Some(pipeline.as_bytes()))
        .map(|r| parse_lsn(&r.value_str().expect("checkpoint value")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_checkpoint_ahead_of_the_slot_passes_over_what_kafka_has() {
    let setup = Setup::new("eos_skip", &[], 1).await;
    let types = vec![format!("Order_{}", setup.db.name)];
    let mock = mock_cluster(&types, 2);
    let bootstrap = mock.bootstrap_servers();
    let mut args = setup.relay_args(&bootstrap, Auth::Trust);
    args.push("--exactly-once".into());
    let c = &setup.db.client;

    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (mut expected, before) = write_events(c, 2, 3, &types, 2, 0, Duration::ZERO).await;
    setup
        .wait_confirmed_past(
            before[1],
            "the first two transactions",
            Duration::from_secs(60),
        )
        .await;
    assert!(
        relay.log().contains("checkpoint_lsn=none"),
        "a first start finds no checkpoint"
    );
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());

    // While the relay is down: transactions A and B, a checkpoint at B's end (as if their
    // Kafka transactions committed and the relay died before confirming the slot), then C.
    let (skipped, _) = write_events(c, 2, 3, &types, 2, 6, Duration::ZERO).await;
    let checkpoint = setup.db.current_wal_insert_lsn().await;
    let (last, before_last) = write_events(c, 1, 3, &types, 2, 12, Duration::ZERO).await;
    expected.extend(last);
    // With the relay's partitioner, so that the key stays in one partition.
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("partitioner", "murmur2_random")
        .create()
        .unwrap();
    producer
        .send(
            rdkafka::producer::FutureRecord::to(CHECKPOINT_TOPIC)
                .key(&setup.slot)
                .payload(&support::pg::format_lsn(checkpoint)),
            Duration::from_secs(10),
        )
        .await
        .expect("writing the checkpoint");

    let relay = Relay::spawn(&args);
    setup
        .wait_confirmed_past(
            before_last[0],
            "confirmed_flush_lsn past transaction C",
            Duration::from_secs(60),
        )
        .await;
    let consumed = support::consume_with(
        &bootstrap,
        &[&format!("{}.events", types[0])],
        expected.len(),
        Duration::from_secs(2),
        Duration::from_secs(60),
        &[("isolation.level", "read_committed")],
    )
    .await;
    for s in &skipped {
        assert!(
            !consumed
                .iter()
                .any(|r| header(r, "id") == Some(s.id.as_bytes())),
            "event {} of a transaction at or below the checkpoint was published again",
            s.id
        );
    }
    assert_delivered(&expected, &consumed, true);
    assert!(
        relay.log().contains(&format!(
            "checkpoint_lsn={}",
            support::pg::format_lsn(checkpoint)
        )),
        "the start line names the checkpoint found:\n{}",
        relay.log()
    );
    // The first relay's two checkpoints, the test's, then C's.
    let lsns = checkpoints(&bootstrap, &setup.slot, 4).await;
    assert_eq!(lsns.len(), 4, "{lsns:?}");
    assert_eq!(lsns[2], checkpoint);
    assert!(lsns[3] > before_last[0] && lsns[3] > checkpoint, "{lsns:?}");

    // `check` reads the checkpoint as the relay does, and names a missing checkpoint topic.
    let mut check_args = args.clone();
    check_args[0] = "check".into();
    let mut check = Relay::spawn(&check_args);
    check.wait(Duration::from_secs(60));
    let out = check.log();
    assert!(
        out.lines().any(|l| l.starts_with("  ok    checkpoint")
            && l.ends_with(&format!(
                "{CHECKPOINT_TOPIC}: last checkpoint {} (the topic must have cleanup.policy=compact)",
                support::pg::format_lsn(lsns[3])
            ))),
        "{out}"
    );
    check_args.extend(["--checkpoint-topic".into(), "no.such.topic".into()]);
    let mut check = Relay::spawn(&check_args);
    assert!(!check.wait(Duration::from_secs(60)).success());
    let out = check.log();
    assert!(
        out.contains("checkpoint topic \"no.such.topic\" does not exist: create it with cleanup.policy=compact"),
        "{out}"
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_kill_9_at_random_moments_commits_each_transaction_once() {
    let setup = Setup::new("eos_kill9", &[], 1).await;
    let types: Vec<String> = ["Order", "Payment"]
        .iter()
        .map(|t| format!("{t}_{}", setup.db.name))
        .collect();
    let mock = mock_cluster(&types, 3);
    let bootstrap = mock.bootstrap_servers();
    let mut args = setup.relay_args(&bootstrap, Auth::Trust);
    args.push("--exactly-once".into());
    let mut rng = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("exactly-once kill -9 test seed {rng}");
    let mut random = move |below: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % below
    };

    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    // 200 transactions of 10 events (5 keys per type), written while the relay is killed.
    let writer_db = pg().connect(&setup.db.name, Auth::Trust).await;
    let writer_types = types.clone();
    let writer = tokio::spawn(async move {
        write_events(
            &writer_db,
            200,
            10,
            &writer_types,
            5,
            0,
            Duration::from_millis(10),
        )
        .await
    });
    let mut logs = Vec::new();
    let kills = 4;
    for round in 0..kills {
        tokio::time::sleep(Duration::from_millis(200 + random(600))).await;
        relay.kill();
        logs.push(relay.log());
        wait_for(
            &format!("the slot to be released after kill -9 number {round}"),
            Duration::from_secs(30),
            || async {
                setup
                    .db
                    .slot_active_pid(&setup.slot)
                    .await
                    .is_none()
                    .then_some(())
            },
        )
        .await;
        relay = Relay::spawn(&args);
        relay
            .wait_for_log("exactly-once mode", Duration::from_secs(60))
            .await;
    }
    let (written, before_commit) = writer.await.unwrap();
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "confirmed_flush_lsn past the last commit",
            Duration::from_secs(120),
        )
        .await;
    logs.push(relay.log());

    // Each PostgreSQL transaction was committed to Kafka once: one checkpoint each, in commit
    // order, between its COMMIT's start and the next transaction's.
    let lsns = checkpoints(&bootstrap, &setup.slot, before_commit.len()).await;
    assert!(
        lsns.windows(2).all(|w| w[0] < w[1]),
        "checkpoints not strictly increasing (a transaction committed twice): {lsns:?}"
    );
    assert_eq!(
        lsns.len(),
        before_commit.len(),
        "one checkpoint per transaction"
    );
    for (i, (lsn, before)) in lsns.iter().zip(&before_commit).enumerate() {
        let next = before_commit.get(i + 1).copied().unwrap_or(u64::MAX);
        assert!(
            *before < *lsn && *lsn <= next,
            "checkpoint {i} ({lsn:X}) is not transaction {i}'s end ({before:X}..{next:X})"
        );
    }

    let topics: Vec<String> = types.iter().map(|t| format!("{t}.events")).collect();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let consumed = support::consume_with(
        &bootstrap,
        &topics,
        written.len(),
        Duration::from_secs(2),
        Duration::from_secs(60),
        &[("isolation.level", "read_committed")],
    )
    .await;
    assert_delivered(&written, &consumed, false);
    // Duplicates only from the one Kafka transaction each kill left open (aborted; on a broker
    // with transactions invisible to this consumer).
    let txn_of: HashMap<&str, usize> = written
        .iter()
        .enumerate()
        .map(|(i, w)| (w.id.as_str(), i / 10))
        .collect();
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for r in &consumed {
        *copies
            .entry(std::str::from_utf8(header(r, "id").unwrap()).unwrap())
            .or_default() += 1;
    }
    let mut duplicated_txns: Vec<usize> = copies
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| txn_of[id])
        .collect();
    duplicated_txns.sort_unstable();
    duplicated_txns.dedup();
    assert!(
        duplicated_txns.len() <= kills,
        "events of {} transactions published twice after {kills} kills: {duplicated_txns:?}",
        duplicated_txns.len()
    );
    let uncommitted = support::consume_with(
        &bootstrap,
        &topics,
        written.len(),
        Duration::from_secs(2),
        Duration::from_secs(60),
        &[("isolation.level", "read_uncommitted")],
    )
    .await;
    let passed_over = logs
        .iter()
        .filter(|l| l.contains("checkpoint_lsn=") && !l.contains("checkpoint_lsn=none"))
        .count();
    eprintln!(
        "{} events; read_committed saw {} records, read_uncommitted {}; transactions with \
         duplicates (aborted on a real broker): {duplicated_txns:?}; restarts that found a \
         checkpoint: {passed_over} of {}",
        written.len(),
        consumed.len(),
        uncommitted.len(),
        logs.len()
    );
    assert!(
        logs.last().unwrap().contains("checkpoint_lsn=")
            && !logs.last().unwrap().contains("checkpoint_lsn=none"),
        "the last restart found a checkpoint"
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_slot_waits_for_the_kafka_commit_and_a_failed_commit_is_aborted() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let setup = Setup::new("eos_commit", &[], 1).await;
    let types = vec![format!("Order_{}", setup.db.name)];
    let topic = format!("{}.events", types[0]);
    let mock = mock_cluster(&types, 1);
    let bootstrap = mock.bootstrap_servers();
    let mut args = setup.relay_args(&bootstrap, Auth::Trust);
    args.push("--exactly-once".into());
    let c = &setup.db.client;
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    relay
        .wait_for_log("exactly-once mode", Duration::from_secs(60))
        .await;
    let (mut written, before) = write_events(c, 1, 3, &types, 1, 0, Duration::ZERO).await;
    setup
        .wait_confirmed_past(before[0], "the first transaction", Duration::from_secs(60))
        .await;

    // The coordinator answers the next commits "loading" for a while (librdkafka retries
    // twice per commit call, the relay calls again): the records are in the log, the slot
    // must stay before the transaction until the commit went through.
    mock.request_errors(
        RDKafkaApiKey::EndTxn,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS; 12],
    );
    let (more, before) = write_events(c, 1, 3, &types, 1, 3, Duration::ZERO).await;
    written.extend(more);
    support::consume_with(
        &bootstrap,
        &[&topic],
        6,
        Duration::ZERO,
        Duration::from_secs(30),
        &[("isolation.level", "read_uncommitted")],
    )
    .await;
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed < before[0],
        "slot confirmed at {confirmed:X}, past a transaction whose Kafka commit is pending ({:X})",
        before[0]
    );
    setup
        .wait_confirmed_past(
            before[0],
            "the slot to pass the transaction once its commit went through",
            Duration::from_secs(60),
        )
        .await;
    let lsns = checkpoints(&bootstrap, &setup.slot, 2).await;
    assert_eq!(
        lsns.len(),
        2,
        "one checkpoint per transaction, also when the commit was retried: {lsns:?}"
    );

    // A commit that fails for good (unknown producer id: abortable): the relay aborts the
    // Kafka transaction and starts a new session from the slot.
    mock.request_errors(
        RDKafkaApiKey::EndTxn,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID],
    );
    let (more, before) = write_events(c, 1, 3, &types, 1, 6, Duration::ZERO).await;
    written.extend(more);
    relay
        .wait_for_log("open kafka transaction aborted", Duration::from_secs(60))
        .await;
    setup
        .wait_confirmed_past(
            before[0],
            "the slot to pass the transaction after the abort and a new session",
            Duration::from_secs(60),
        )
        .await;
    let consumed = support::consume_with(
        &bootstrap,
        &[&topic],
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(30),
        &[("isolation.level", "read_committed")],
    )
    .await;
    assert_delivered(&written, &consumed, false);
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_cost_backlog_throughput_against_at_least_once_on_the_mock_cluster() {
    const TXNS: usize = 300;
    const PER_TXN: usize = 10;
    let mut rates = Vec::new();
    for exactly_once in [false, true] {
        let setup = Setup::new(if exactly_once { "eos_cost" } else { "alo_cost" }, &[], 1).await;
        let types = vec![format!("Order_{}", setup.db.name)];
        let mock = mock_cluster(&types, 3);
        let bootstrap = mock.bootstrap_servers();
        setup.db.create_slot(&setup.slot).await;
        let (written, before_commit) = write_events(
            &setup.db.client,
            TXNS,
            PER_TXN,
            &types,
            20,
            0,
            Duration::ZERO,
        )
        .await;
        let mut args = setup.relay_args(&bootstrap, Auth::Trust);
        if exactly_once {
            args.push("--exactly-once".into());
        }
        // EOS_COST_LINGER_MS=0 measures with linger.ms=0 (librdkafka's default is 5).
        if let Ok(linger) = std::env::var("EOS_COST_LINGER_MS") {
            args.extend(["--kafka-property".into(), format!("linger.ms={linger}")]);
        }
        let mut relay = Relay::spawn(&args);
        relay
            .wait_for_log("streaming", Duration::from_secs(60))
            .await;
        let start = std::time::Instant::now();
        setup
            .wait_confirmed_past(
                *before_commit.last().unwrap(),
                "the backlog to be confirmed",
                Duration::from_secs(300),
            )
            .await;
        let secs = start.elapsed().as_secs_f64();
        let consumed = support::consume_with(
            &bootstrap,
            &[&format!("{}.events", types[0])],
            written.len(),
            Duration::from_secs(1),
            Duration::from_secs(60),
            &[("isolation.level", "read_committed")],
        )
        .await;
        assert_delivered(&written, &consumed, true);
        if exactly_once {
            let lsns = checkpoints(&bootstrap, &setup.slot, TXNS).await;
            assert_eq!(
                lsns.len(),
                TXNS,
                "one Kafka transaction per PostgreSQL transaction"
            );
        }
        rates.push((
            exactly_once,
            written.len() as f64 / secs,
            secs * 1_000.0 / TXNS as f64,
        ));
        drop(relay);
    }
    for (exactly_once, events_per_sec, ms_per_txn) in &rates {
        eprintln!(
            "{}: {TXNS} transactions of {PER_TXN} events from a backlog: {events_per_sec:.0} events/s, {ms_per_txn:.1} ms per transaction",
            if *exactly_once { "exactly-once" } else { "at-least-once" }
        );
    }
}

// ---- issue 16 (supervisor) ----

/// Defect 4: a SIGTERM while the relay sets up its session, here creating its slot, which
/// waits for a transaction that stays open (the relay's SQL connection runs with
/// `statement_timeout = 0`), ends the process within seconds, well under the 30 s shutdown
/// timeout, with success and without ever streaming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_the_slot_creation_waits_for_an_open_transaction_ends_the_relay_within_seconds(
) {
    let name = unique_name("stop_in_setup");
    let db = pg().create_database(&name).await;
    let slot = format!("{name}_slot");
    // A transaction with an xid, left open: a logical slot's creation waits for it to end.
    let holder = pg().connect(&name, Auth::Trust).await;
    support::within(
        "opening the transaction that holds up the slot creation",
        Duration::from_secs(30),
        holder.batch_execute("BEGIN; SELECT txid_current();"),
    )
    .await
    .unwrap();
    // No broker: the session never gets as far as creating its producer.
    let bootstrap = format!("127.0.0.1:{}", support::free_port());
    // A Setup without topics (Setup::new would start the broker): its relay arguments.
    let setup = Setup {
        db,
        slot,
        types: Vec::new(),
    };
    let args = setup.relay_args(&bootstrap, Auth::Trust);
    let mut relay = Relay::spawn(&args);
    wait_for(
        "the relay's slot creation to wait for the open transaction",
        Duration::from_secs(30),
        || async {
            let waiting: i64 = setup
                .db
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()
                       AND query LIKE '%pg_create_logical_replication_slot%'
                       AND state = 'active' AND wait_event = 'transactionid'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            (waiting > 0).then_some(())
        },
    )
    .await;
    let signalled = std::time::Instant::now();
    relay.sigterm();
    // Panics (with the deadline) if the relay is still there after 10 s.
    let status = relay.wait(Duration::from_secs(10));
    let took = signalled.elapsed();
    let log = relay.log();
    assert!(
        status.success(),
        "relay exited with {status} after SIGTERM during set-up:\n{log}"
    );
    assert_eq!(status.code(), Some(0), "exit code:\n{log}");
    eprintln!("stopped {took:?} after SIGTERM during the slot creation");
    assert!(
        !log.contains(": streaming "),
        "the relay streamed although its slot creation never finished:\n{log}"
    );
    assert!(
        log.contains("stopped during session set-up"),
        "no log line saying the set-up was cancelled:\n{log}"
    );
    support::within(
        "committing the transaction that held up the slot creation",
        Duration::from_secs(30),
        holder.batch_execute("COMMIT"),
    )
    .await
    .unwrap();
}

/// The `delay_ms` of every "pipeline session ended; reconnecting" line of `log`, in order.
fn reconnect_delays_ms(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|line| line.contains("pipeline session ended; reconnecting"))
        .filter_map(|line| {
            let (_, rest) = line.split_once("delay_ms=")?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Defect 6: a session that fails right after every start (here: the broker is unreachable
/// and each record times out after 1 s, before anything is confirmed) is retried after a
/// growing delay, not about every second, and `/readyz` and
/// `outbox_relay_consecutive_failed_sessions` show the recurring error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_failing_after_every_start_backs_off_further_and_readyz_shows_it() {
    let name = unique_name("recurring");
    let setup = Setup {
        db: pg().create_database(&name).await,
        slot: format!("{name}_slot"),
        types: vec![format!("Order_{name}")],
    };
    let bootstrap = format!("127.0.0.1:{}", support::free_port());
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&bootstrap, Auth::Trust);
    args.extend(
        [
            "--metrics-listen",
            &metrics,
            "--kafka-property",
            "message.timeout.ms=1000",
        ]
        .map(String::from),
    );
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    write_events(&setup.db.client, 1, 1, &setup.types, 1, 0, Duration::ZERO).await;
    let delays = wait_for(
        "four restarts of the session that fails after every start",
        Duration::from_secs(90),
        || {
            let delays = reconnect_delays_ms(&relay.log());
            async move { (delays.len() >= 4).then_some(delays) }
        },
    )
    .await;
    // 1, 2, 4, 8 s plus up to as much again of jitter; reset at every start it was 1 to 2 s.
    for (i, least) in [1_000, 2_000, 4_000, 8_000].into_iter().enumerate() {
        assert!(
            delays[i] >= least,
            "restart {i} after {} ms, expected at least {least} ms (delays {delays:?}):\n{}",
            delays[i],
            relay.log()
        );
    }
    let series = format!(
        "outbox_relay_consecutive_failed_sessions{{pipeline=\"{}\"}}",
        setup.slot
    );
    let (_, text) = support::within(
        "GET /metrics",
        Duration::from_secs(10),
        http_get(&metrics, "/metrics"),
    )
    .await
    .expect("GET /metrics");
    assert!(
        metric_value(&text, &series) >= 4.0,
        "{series} after four failed sessions:\n{text}"
    );
    let (status, body) = support::within(
        "GET /readyz",
        Duration::from_secs(10),
        http_get(&metrics, "/readyz"),
    )
    .await
    .expect("GET /readyz");
    let json: serde_json::Value = serde_json::from_str(&body).expect("/readyz JSON");
    let pipeline = &json["pipelines"][&setup.slot];
    assert!(
        pipeline["consecutive_failed_sessions"].as_u64() >= Some(4),
        "/readyz ({status}) after four failed sessions: {body}"
    );
    assert!(
        pipeline["last_error"]
            .as_str()
            .is_some_and(|e| e.contains(&format!("{}.events", setup.types[0]))),
        "/readyz names the failing delivery: {body}"
    );
    relay.sigterm();
    let status = relay.wait(Duration::from_secs(40));
    assert!(
        status.success(),
        "relay exited with {status}:\n{}",
        relay.log()
    );
}
