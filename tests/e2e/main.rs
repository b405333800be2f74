//! End to end: a real PostgreSQL cluster in (15; 16, 17 and 18 in `versions`), a real
//! Kafka-protocol broker (tansu) out, the relay binary in between. One cluster and one broker per run of this binary
//! (tests/support); each test has its own database, slot, publication and topics.
//!
//! The tests are grouped by theme, one module each:
//! - `delivery`: what arrives and in which order (exact bytes, headers, commit order, rolled
//!   back work, big transactions in bounded memory, logical messages, idle WAL);
//! - `failures`: broker outages, SIGTERM and `kill -9`, events the broker refuses: nothing
//!   lost, nothing confirmed too early;
//! - `server_failures`: PostgreSQL's side: fast and immediate restarts, a short
//!   `wal_sender_timeout`, an invalidated slot;
//! - `supervision`: the supervisor seen from outside: a stop during set-up, the backoff of a
//!   session that fails after every start;
//! - `routing`: topic templates, routing options, the dead-letter topic;
//! - `bad_rows`: rows the relay refuses before routing them (over `max_event_bytes`, text
//!   that is not UTF-8 from a `SQL_ASCII` database), dead-lettered or halting;
//! - `records`: what a record carries for a column's type (bytea, placed columns) and for an
//!   empty payload;
//! - `tables`: outbox table shapes: mapped and quoted names, updates and deletes, ALTER TABLE;
//! - `connection`: authentication, TLS, libpq's environment, reconnects, hostile defaults,
//!   two relays on one slot;
//! - `takeover`: ending a stale walsender that holds the slot;
//! - `failover`: a PostgreSQL 17 primary and standby, a failover slot, the primary crashed and
//!   the standby promoted; `target_session_attrs` on a multi-host URL;
//! - `slot_loss`: a dropped slot is never re-created silently across restarts (the slot
//!   record), `setup --accept-slot-loss`;
//! - `json_expansion`: Debezium's JSON payload expansion, imported and run;
//! - `operations`: config files, `setup`, `check`, `status`, `probe`, the inbox example,
//!   `import-debezium`;
//! - `exactly_once`: the transactional mode on librdkafka's mock cluster;
//! - `failover_slots`: PostgreSQL 17's failover slots: `setup --failover`, `check` of a
//!   standby that keeps the slot, a `synchronized_standby_slots` stall seen and mended;
//! - `standby`: logical decoding from a PostgreSQL 16-18 standby (`target_session_attrs=standby`),
//!   a slot there invalidated by a catalog VACUUM on the primary, and PostgreSQL 18's
//!   `idle_replication_slot_timeout` invalidating an idle slot;
//! - `generated_columns`: routing and key from stored generated columns (PostgreSQL 18's
//!   `publish_generated_columns`), refused with a clear error where they are not published;
//! - `versions`: the main job, walsender termination, restarts and a large transaction on
//!   PostgreSQL 16, 17 and 18;
//! - `polling`: the polling source (`source_kind = "polling"`);
//! - `sinks`: the sink kinds other than Kafka, each against its real server, with the same
//!   scenarios (main job, server restart, `kill -9`, refusals, bad routing input).
//!
//! This file holds the fixtures the log-tailing modules share: a test's [`Setup`], writing
//! events and checking what the consumer saw.

#[path = "../support/mod.rs"]
mod support;

mod bad_rows;
mod cloudevents;
mod connection;
mod delivery;
mod exactly_once;
mod failover;
mod failover_slots;
mod failures;
mod generated_columns;
mod json_expansion;
mod kafka_tls;
mod operations;
mod polling;
mod records;
mod routing;
mod server_failures;
mod sinks;
mod slot_loss;
mod standby;
mod start_checks;
mod supervision;
mod tables;
mod takeover;
mod teardown;
mod topics;
mod versions;

use std::collections::HashMap;
use std::time::Duration;

use support::{
    consume, kafka, parse_lsn, pg, unique_name, wait_for, within, Auth, Consumed, TestDb,
    QUERY_DEADLINE,
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
        writer_statement(client, "BEGIN").await;
        for e in 0..per_txn {
            let n = offset + t * per_txn + e;
            let aggregate_type = types[n % types.len()].clone();
            let aggregate_id = format!(
                "{}-{}",
                aggregate_type.to_lowercase(),
                (n / types.len()) % keys
            );
            let event_type = format!("Event{}", n % 7);
            let row = within(
                &format!("INSERT of event {n}"),
                QUERY_DEADLINE,
                client.query_one(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                     VALUES ($1, $2, $3, $4::text::jsonb) RETURNING id::text, payload::text",
                    &[&aggregate_type, &aggregate_id, &event_type, &payload(n)],
                ),
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
        before_commit.push(insert_lsn(client).await);
        writer_statement(client, "COMMIT").await;
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    (written, before_commit)
}

/// Runs `statement` (e.g. BEGIN or COMMIT) for a writer, with the harness's statement deadline.
async fn writer_statement(client: &tokio_postgres::Client, statement: &str) {
    within(statement, QUERY_DEADLINE, client.batch_execute(statement))
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
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
    /// Writes one event of the first type and asserts it arrives (its `id` header, within
    /// 60 s).
    async fn one_event_flows(&self) {
        let id = self
            .db
            .insert_event(&self.types[0], "1", "Created", Some("{}"), None)
            .await;
        let consumed = self
            .consume_all(1, Duration::ZERO, Duration::from_secs(60))
            .await;
        assert_eq!(consumed[0].header_str("id").as_deref(), Some(id.as_str()));
    }

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

    /// Reads this test's first topic until `written.len()` records came (with `exactly_once`,
    /// and 1 s more without another, to see copies), within 60 s, and asserts them
    /// ([`assert_delivered`]).
    async fn assert_first_topic(&self, written: &[Written], exactly_once: bool) {
        let settle = if exactly_once {
            Duration::from_secs(1)
        } else {
            Duration::ZERO
        };
        let topics = self.topics();
        let consumed = consume(
            &kafka().bootstrap(),
            &[topics[0].as_str()],
            written.len(),
            settle,
            Duration::from_secs(60),
        )
        .await;
        assert_delivered(written, &consumed, exactly_once);
    }

    /// Waits until the slot's `confirmed_flush_lsn` is past `lsn` (a commit's start).
    async fn wait_confirmed_past(&self, lsn: u64, what: &str, deadline: Duration) {
        wait_for(what, deadline, || async {
            (self.confirmed_flush().await > lsn).then_some(())
        })
        .await;
    }

    async fn new(prefix: &str, types: &[&str], partitions: i32) -> Setup {
        Setup::new_on(pg(), prefix, types, partitions).await
    }

    /// Like [`Setup::new`], the database created with `options` (`ENCODING ...`).
    async fn new_with(prefix: &str, types: &[&str], partitions: i32, options: &str) -> Setup {
        let name = unique_name(prefix);
        let db = pg().create_database_with(&name, options).await;
        Setup::with_db(db, name, types, partitions)
    }

    /// Like [`Setup::new`], with the database on `cluster` (another major's, a private one).
    async fn new_on(
        cluster: &support::PgCluster,
        prefix: &str,
        types: &[&str],
        partitions: i32,
    ) -> Setup {
        let name = unique_name(prefix);
        let db = cluster.create_database(&name).await;
        Setup::with_db(db, name, types, partitions)
    }

    fn with_db(db: TestDb, name: String, types: &[&str], partitions: i32) -> Setup {
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

    /// Creates a witness slot for the transactions written next (see
    /// [`TestDb::create_witness_slot`]); returns its name for [`Setup::commit_end_of`].
    async fn witness(&self) -> String {
        let witness = format!("{}_witness", self.slot);
        self.db.create_witness_slot(&witness).await;
        witness
    }

    /// The end LSN of the commit of the transaction that wrote event `id` (what the relay
    /// confirms once it delivered it), read from `witness`, which is then dropped. The insert
    /// LSN before COMMIT is only a lower bound of it: other databases' WAL may come between,
    /// and the relay may rightly confirm that WAL before it decodes the transaction.
    async fn commit_end_of(&self, witness: &str, id: &str) -> u64 {
        let lsn = self.db.commit_end_lsn(witness, id).await;
        self.db.drop_slot(witness).await;
        lsn
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

    /// Waits until no walsender holds the slot (after a relay ended, before the next one can
    /// stream); `after` says after what, for the timeout's message.
    async fn wait_released(&self, after: &str) {
        wait_for(
            &format!("the slot to be released after {after}"),
            Duration::from_secs(30),
            || async {
                self.db
                    .slot_active_pid(&self.slot)
                    .await
                    .is_none()
                    .then_some(())
            },
        )
        .await;
    }
}

/// `args` (a `run ...` command line) as the command `name` (`setup`, `check`, `status`,
/// `teardown`, `run`) takes it: without the flags of `run` that `name` does not read, which
/// it refuses (they are the ones its `--help` hides), as an operator would write it.
fn as_command(args: &[String], name: &str) -> Vec<String> {
    use clap::CommandFactory;
    let mut cli = outbox_relay::cli::Cli::command();
    cli.build();
    let command = cli
        .find_subcommand(name)
        .unwrap_or_else(|| panic!("no command {name}"));
    let run = cli.find_subcommand("run").expect("a run command");
    let find = |c: &clap::Command, long: &str| {
        c.get_arguments()
            .find(|a| a.get_long() == Some(long))
            .map(|a| (a.is_hide_set(), a.get_action().takes_values()))
    };
    // Some(whether it takes a value) for a flag of run's that `name` does not read.
    let unread = |long: &str| match (find(run, long), find(command, long)) {
        (Some((false, takes_value)), Some((true, _))) => Some(takes_value),
        _ => None,
    };
    let mut out = vec![name.to_string()];
    let mut rest = args[1..].iter();
    while let Some(arg) = rest.next() {
        let long = arg
            .strip_prefix("--")
            .map(|flag| flag.split_once('=').map_or(flag, |(flag, _)| flag));
        match long.and_then(unread) {
            Some(takes_value) => {
                if takes_value && !arg.contains('=') {
                    rest.next();
                }
            }
            None => out.push(arg.clone()),
        }
    }
    out
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

/// Inserts one event per statement in the current transaction of `client`; returns what was written.
async fn insert(
    client: &tokio_postgres::Client,
    aggregate_type: &str,
    aggregate_id: &str,
    payload: &str,
) -> Written {
    let row = within(
        "INSERT of an outbox row",
        QUERY_DEADLINE,
        client.query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             VALUES ($1, $2, 'Test', $3::text::jsonb) RETURNING id::text, payload::text",
            &[&aggregate_type, &aggregate_id, &payload],
        ),
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

/// `pg_current_wal_insert_lsn()` as seen by `client` (inside its transaction, if any).
async fn insert_lsn(client: &tokio_postgres::Client) -> u64 {
    let lsn: String = within(
        "pg_current_wal_insert_lsn()",
        QUERY_DEADLINE,
        client.query_one("SELECT pg_current_wal_insert_lsn()::text", &[]),
    )
    .await
    .unwrap()
    .get(0);
    parse_lsn(&lsn)
}
