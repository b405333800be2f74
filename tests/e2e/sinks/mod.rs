//! Sinks other than Kafka: the same scenarios run against each real server (one module per
//! kind implements [`SinkServer`] for it and instantiates the scenarios with
//! [`sink_scenarios!`]).
//!
//! The scenarios: the main job (every event once, byte for byte, per-key order, the slot
//! confirmed), the server stopped and started again mid-stream, `kill -9` of the relay
//! mid-stream, a record the server refuses (halt: nothing confirmed past it; dead letter: the
//! rest flows), an aggregate type the sink cannot route to, and the polling source's main job.

mod http;
mod nats;
mod rabbitmq;
mod redis;

use std::time::{Duration, Instant};

use crate::support::{pg, unique_name, wait_for, Auth, Consumed, Relay};
use crate::{assert_delivered, insert, run_with_config, write_events, Setup, Written};

/// A sink server, as the scenarios drive it.
pub(crate) trait SinkServer: Sync {
    /// The `kind` of the pipeline's sink table.
    fn kind(&self) -> &'static str;
    /// The rest of the `[pipelines.sink]` table, as TOML lines (`url = "..."`, ...).
    fn sink_settings(&self) -> String;
    /// Makes `destinations` ready before the relay starts (a stream covering a subject, a
    /// queue bound to a routing key: what the operator creates).
    async fn prepare(&self, destinations: &[String]);
    /// Every record that reached `destinations` so far, per destination in arrival order;
    /// `topic` is the destination.
    async fn read(&self, destinations: &[String]) -> Vec<Consumed>;
    /// Makes the server refuse every record for `destination` from now on (for good, not a
    /// retryable failure).
    async fn refuse(&self, destination: &str);
    /// Stops the server (SIGTERM: it keeps what it persisted).
    fn stop(&self);
    /// Starts it again on the same port with the same data.
    fn start(&self);
    /// An aggregate type whose destination this sink cannot take (bad routing input).
    fn invalid_aggregate_type(&self) -> &'static str;
}

/// A test's database and slot, with aggregate types unique to it (no Kafka topics).
async fn setup(prefix: &str, types: &[&str]) -> Setup {
    let name = unique_name(prefix);
    let db = pg().create_database(&name).await;
    Setup {
        db,
        slot: format!("{name}_slot"),
        types: types.iter().map(|t| format!("{t}_{name}")).collect(),
    }
}

/// `run --config` for one pipeline on `setup` publishing to `server`, with `extra` pipeline
/// keys (TOML lines).
fn relay_args(
    setup: &Setup,
    server: &impl SinkServer,
    extra: &str,
) -> (tempfile::TempDir, Vec<String>) {
    let toml = format!(
        "[[pipelines]]\nname = \"{slot}\"\nsource_url = \"{url}\"\nslot = \"{slot}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\n{extra}\n[pipelines.sink]\nkind = \"{kind}\"\n{settings}\n",
        slot = setup.slot,
        url = setup.db.url(Auth::Trust),
        kind = server.kind(),
        settings = server.sink_settings(),
    );
    run_with_config(&toml)
}

/// The pipeline keys that send refused events to `destination` (`on_bad_event = "dead_letter"`).
fn dead_letter_to(destination: &str) -> String {
    format!("on_bad_event = \"dead_letter\"\ndead_letter_topic = \"{destination}\"")
}

/// Reads `destinations` until at least `expected` records arrived, then once more after
/// `settle` (to see duplicates). Panics at `deadline` with how many arrived.
async fn read_until(
    server: &impl SinkServer,
    destinations: &[String],
    expected: usize,
    settle: Duration,
    deadline: Duration,
) -> Vec<Consumed> {
    let start = Instant::now();
    loop {
        let got = server.read(destinations).await;
        if got.len() >= expected {
            break;
        }
        assert!(
            start.elapsed() < deadline,
            "{} of {expected} records reached {destinations:?} on the {} sink within {deadline:?}",
            got.len(),
            server.kind()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(settle).await;
    server.read(destinations).await
}

/// Every event once, byte for byte, per key in commit order; the slot confirmed past the last
/// commit.
pub(crate) async fn main_job(server: &impl SinkServer) {
    let setup = setup(&format!("{}_main", server.kind()), &["Order", "Customer"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let (_dir, args) = relay_args(&setup, server, "");
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (written, before_commit) =
        write_events(&setup.db.client, 30, 4, &setup.types, 5, 0, Duration::ZERO).await;
    let got = read_until(
        server,
        &destinations,
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &got, true);
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "the slot to be confirmed past the last commit",
            Duration::from_secs(30),
        )
        .await;
    drop(relay);
}

/// The server stopped for a few seconds while events are written: every event arrives at
/// least once, per key in commit order, and nothing is confirmed while the server is down
/// past what it acknowledged.
pub(crate) async fn server_restart_mid_stream(server: &impl SinkServer) {
    let setup = setup(&format!("{}_restart", server.kind()), &["Order"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let (_dir, args) = relay_args(&setup, server, "");
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (mut written, _) =
        write_events(&setup.db.client, 10, 2, &setup.types, 3, 0, Duration::ZERO).await;
    read_until(
        server,
        &destinations,
        written.len(),
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;

    server.stop();
    let witness = setup.witness().await;
    let (during, _) = write_events(
        &setup.db.client,
        20,
        2,
        &setup.types,
        3,
        20,
        Duration::from_millis(50),
    )
    .await;
    let first_commit = setup.commit_end_of(&witness, &during[0].id).await;
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed < first_commit,
        "confirmed_flush_lsn {confirmed:X} passed a commit (ending at {first_commit:X}) written while the {} server was down",
        server.kind()
    );
    written.extend(during);
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.start();
    let (after, before_commit) =
        write_events(&setup.db.client, 5, 2, &setup.types, 3, 60, Duration::ZERO).await;
    written.extend(after);
    let got = read_until(
        server,
        &destinations,
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(120),
    )
    .await;
    assert_delivered(&written, &got, false);
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "the slot to be confirmed once the server is back",
            Duration::from_secs(60),
        )
        .await;
    drop(relay);
}

/// `kill -9` of the relay at moments of a stream of transactions, five times: every event
/// arrives at least once, per key in commit order. Returns the records that arrived and the
/// events written.
pub(crate) async fn kill_9_mid_stream(server: &impl SinkServer) -> (usize, usize) {
    let setup = setup(&format!("{}_kill9", server.kind()), &["Order"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let (_dir, args) = relay_args(&setup, server, "");
    let mut written = Vec::new();
    for round in 0..5 {
        let mut relay = Relay::spawn(&args);
        setup.wait_streaming().await;
        let (w, _) = write_events(
            &setup.db.client,
            40,
            5,
            &setup.types,
            7,
            written.len(),
            Duration::ZERO,
        )
        .await;
        written.extend(w);
        tokio::time::sleep(Duration::from_millis(37 * round)).await;
        relay.kill();
        setup
            .wait_released(&format!("kill -9 in round {round}"))
            .await;
    }
    let relay = Relay::spawn(&args);
    let got = read_until(
        server,
        &destinations,
        written.len(),
        Duration::from_secs(2),
        Duration::from_secs(120),
    )
    .await;
    eprintln!(
        "{} records for {} events after 5 kill -9s",
        got.len(),
        written.len()
    );
    assert_delivered(&written, &got, false);
    drop(relay);
    (got.len(), written.len())
}

/// The server refuses one destination: with `on_bad_event = "halt"` the relay stops naming
/// the event, and the slot stays before its commit; with `"dead_letter"` the refused event
/// goes to the dead-letter destination and the rest flows.
pub(crate) async fn refused_record(server: &impl SinkServer) {
    let setup = setup(&format!("{}_refused", server.kind()), &["Order", "Refused"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    server.refuse(&destinations[1]).await;
    let (good_type, bad_type) = (setup.types[0].clone(), setup.types[1].clone());

    // Halt.
    let (_dir, args) = relay_args(&setup, server, "");
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let client = &setup.db.client;
    let before = insert(client, &good_type, "k1", r#"{"n": 1}"#).await;
    let witness = setup.witness().await;
    let refused = insert(client, &bad_type, "k1", r#"{"n": 2}"#).await;
    let refused_commit = setup.commit_end_of(&witness, &refused.id).await;
    let status = relay.wait(Duration::from_secs(60));
    assert!(
        !status.success(),
        "the relay exited with {status} after a refusal"
    );
    let log = relay.log();
    assert!(
        log.contains(&refused.id) && log.contains(&destinations[1]),
        "the error names the event {} and its destination {}:\n{}",
        refused.id,
        destinations[1],
        crate::support::tail_lines(&log, 30)
    );
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed < refused_commit,
        "confirmed_flush_lsn {confirmed:X} passed the refused event's commit ({refused_commit:X})"
    );
    let got = server.read(&destinations[..1]).await;
    assert_delivered(std::slice::from_ref(&before), &got, true);

    // Dead letter.
    let dead_letter = format!("{}.dead-letter", setup.slot);
    server.prepare(std::slice::from_ref(&dead_letter)).await;
    let (_dir, args) = relay_args(&setup, server, &dead_letter_to(&dead_letter));
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let after = insert(client, &good_type, "k1", r#"{"n": 3}"#).await;
    let got = read_until(
        server,
        &destinations[..1],
        2,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&[before, after], &got, false);
    let dead = read_until(
        server,
        std::slice::from_ref(&dead_letter),
        1,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    let ids: Vec<String> = dead.iter().filter_map(|r| r.header_str("id")).collect();
    assert!(
        ids.contains(&refused.id),
        "dead-letter destination holds {ids:?}, not {}",
        refused.id
    );
    let reason = dead[0].header_str("outbox_relay_error").unwrap_or_default();
    assert!(
        !reason.is_empty(),
        "the dead-letter copy says why: {:?}",
        dead[0].headers
    );
    drop(relay);
}

/// The polling source (`sql/outbox_polling.sql`'s table): every event once, per key in order,
/// each row marked PUBLISHED only after the sink acknowledged it.
pub(crate) async fn polling_main_job(server: &impl SinkServer) {
    let setup = setup(&format!("{}_polling", server.kind()), &["Order"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let (_dir, args) = polling_relay_args(&setup, server, "").await;
    let client = &setup.db.client;
    let relay = Relay::spawn(&args);
    let (written, _) = write_events(client, 20, 3, &setup.types, 4, 0, Duration::ZERO).await;
    let got = read_until(
        server,
        &destinations,
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &got, true);
    wait_for(
        "every outbox row to be marked PUBLISHED",
        Duration::from_secs(30),
        || async {
            let pending: i64 = client
                .query_one(
                    "SELECT count(*) FROM outbox WHERE status <> 'PUBLISHED'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            (pending == 0).then_some(())
        },
    )
    .await;
    drop(relay);
}

/// The server stopped for a few seconds under a polling pipeline: the relay connects again once
/// it is back (a client that does not reconnect by itself, as lapin's, gets a new session), every
/// event arrives, and every row ends PUBLISHED, none FAILED.
pub(crate) async fn polling_server_restart(server: &impl SinkServer) {
    let setup = setup(&format!("{}_pollrestart", server.kind()), &["Order"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let (_dir, args) = polling_relay_args(&setup, server, "").await;
    let client = &setup.db.client;
    let relay = Relay::spawn(&args);
    let (mut written, _) = write_events(client, 5, 2, &setup.types, 3, 0, Duration::ZERO).await;
    read_until(
        server,
        &destinations,
        written.len(),
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;

    server.stop();
    let (during, _) =
        write_events(client, 5, 2, &setup.types, 3, 10, Duration::from_millis(50)).await;
    written.extend(during);
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.start();
    let (after, _) = write_events(client, 5, 2, &setup.types, 3, 20, Duration::ZERO).await;
    written.extend(after);
    let got = read_until(
        server,
        &destinations,
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(120),
    )
    .await;
    assert_delivered(&written, &got, false);
    wait_for(
        "every outbox row to be marked PUBLISHED once the server is back",
        Duration::from_secs(60),
        || async {
            let row = client
                .query_one(
                    "SELECT count(*) FILTER (WHERE status <> 'PUBLISHED'),
                            count(*) FILTER (WHERE status = 'FAILED')
                     FROM outbox",
                    &[],
                )
                .await
                .unwrap();
            let (pending, failed): (i64, i64) = (row.get(0), row.get(1));
            assert_eq!(failed, 0, "rows marked FAILED while the server was down");
            (pending == 0).then_some(())
        },
    )
    .await;
    drop(relay);
}

/// A row whose headers the sink cannot carry (`headers`, a jsonb object), then an ordinary row
/// of the same aggregate, with `on_bad_event = "dead_letter"`: the first goes to the
/// dead-letter destination as a copy the sink takes, with the row's headers in its value, the
/// second to its destination, and the slot is confirmed past both. (The copy kept the row's
/// headers, was refused again, and the relay stopped on that row for good.)
pub(crate) async fn hostile_headers_are_dead_lettered(server: &impl SinkServer, headers: &str) {
    let setup = setup(&format!("{}_hostile", server.kind()), &["Order"]).await;
    let destinations = setup.topics();
    let dead_letter = format!("{}.dead-letter", setup.slot);
    server
        .prepare(&[destinations[0].clone(), dead_letter.clone()])
        .await;
    let (_dir, args) = relay_args(&setup, server, &dead_letter_to(&dead_letter));
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let client = &setup.db.client;
    let row = client
        .query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
             VALUES ($1, 'k1', 'Test', '{\"n\": 1}', $2::text::jsonb) RETURNING id::text",
            &[&setup.types[0], &headers],
        )
        .await
        .unwrap();
    let hostile_id: String = row.get(0);
    let witness = setup.witness().await;
    let after = insert(client, &setup.types[0], "k1", r#"{"n": 2}"#).await;
    let after_commit = setup.commit_end_of(&witness, &after.id).await;
    let got = read_until(
        server,
        &destinations[..1],
        1,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(std::slice::from_ref(&after), &got, true);
    let dead = read_until(
        server,
        std::slice::from_ref(&dead_letter),
        1,
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    let document: serde_json::Value =
        serde_json::from_slice(dead[0].value.as_deref().expect("the copy has a value")).unwrap();
    assert_eq!(document["id"], hostile_id.as_str(), "{document}");
    assert_eq!(document["topic"], destinations[0].as_str(), "{document}");
    let expected: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(headers).unwrap();
    for (name, value) in &expected {
        let carried = document["headers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["name"] == name.as_str())
            .unwrap_or_else(|| panic!("header {name:?} not in the copy's value: {document}"));
        assert_eq!(&carried["value"], value, "{document}");
    }
    assert!(
        !dead[0]
            .header_str("outbox_relay_error")
            .unwrap_or_default()
            .is_empty(),
        "the copy says why: {:?}",
        dead[0].headers
    );
    setup
        .wait_confirmed_past(
            after_commit - 1,
            "the slot to be confirmed past the ordinary row after the dead-lettered one",
            Duration::from_secs(30),
        )
        .await;
    drop(relay);
}

/// Replaces the test database's outbox with the polling source's (`sql/outbox_polling.sql`)
/// and returns `run --config` for a polling pipeline on it publishing to `server`, with
/// `sink_extra` lines in its sink table.
pub(crate) async fn polling_relay_args(
    setup: &Setup,
    server: &impl SinkServer,
    sink_extra: &str,
) -> (tempfile::TempDir, Vec<String>) {
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
    let toml = format!(
        "[[pipelines]]\nname = \"{name}\"\nsource_url = \"{url}\"\nsource_kind = \"polling\"\ntable = \"public.outbox\"\n[pipelines.sink]\nkind = \"{kind}\"\n{settings}\n{sink_extra}\n",
        name = setup.slot,
        url = setup.db.url(Auth::Trust),
        kind = server.kind(),
        settings = server.sink_settings(),
    );
    run_with_config(&toml)
}

/// An aggregate type the sink cannot route to stops the relay with an error naming the
/// event, before anything after it is confirmed.
pub(crate) async fn bad_routing_input(server: &impl SinkServer) {
    let invalid = server.invalid_aggregate_type();
    let setup = setup(&format!("{}_badroute", server.kind()), &["Order"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let (_dir, args) = relay_args(&setup, server, "");
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let client = &setup.db.client;
    let good: Written = insert(client, &setup.types[0], "k1", r#"{"n": 1}"#).await;
    let witness = setup.witness().await;
    let bad = insert(client, invalid, "k1", r#"{"n": 2}"#).await;
    let bad_commit = setup.commit_end_of(&witness, &bad.id).await;
    let status = relay.wait(Duration::from_secs(60));
    assert!(
        !status.success(),
        "the relay exited with {status} on bad routing input"
    );
    let log = relay.log();
    assert!(
        log.contains(&bad.id),
        "the error names the event {}:\n{}",
        bad.id,
        crate::support::tail_lines(&log, 30)
    );
    assert!(setup.confirmed_flush().await < bad_commit);
    let got = server.read(&destinations).await;
    assert_delivered(&[good], &got, true);
}

/// The scenarios as `#[tokio::test]`s for one sink: `$shared` is the run's server (an
/// expression of type `&'static S`), `$private` builds one of the test's own (the restart
/// test stops it). With `bad_routing_input` after them, that scenario too (for a sink whose
/// destinations have rules of their own).
macro_rules! sink_scenarios {
    ($shared:expr, $private:expr, bad_routing_input) => {
        crate::sinks::sink_scenarios!($shared, $private);

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bad_routing_input() {
            crate::sinks::bad_routing_input($shared).await;
        }
    };
    ($shared:expr, $private:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn main_job() {
            crate::sinks::main_job($shared).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn server_restart_mid_stream() {
            crate::sinks::server_restart_mid_stream(&$private).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn kill_9_mid_stream() {
            crate::sinks::kill_9_mid_stream($shared).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn refused_record() {
            crate::sinks::refused_record($shared).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn polling_main_job() {
            crate::sinks::polling_main_job($shared).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn polling_server_restart() {
            crate::sinks::polling_server_restart(&$private).await;
        }
    };
}
pub(crate) use sink_scenarios;
