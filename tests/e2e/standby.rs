//! Logical decoding from a physical standby (PostgreSQL 16+): the relay on a multi-host URL
//! with `target_session_attrs=standby` picks the standby, creates its slot there and streams
//! what is written on the primary; `check` and `status` work there; with
//! `hot_standby_feedback` off, a catalog VACUUM on the primary invalidates the standby's slot
//! and the relay and `check` name that cause; so they do for PostgreSQL 18's
//! `idle_replication_slot_timeout`. A primary below `wal_level = logical` is named by `check`
//! and the relay.

use std::time::Duration;

use crate::as_command;
use crate::failover_slots::run_command;
use crate::support::{
    kafka, parse_lsn, unique_name, wait_for, within, Auth, PgCluster, Relay, TestDb, QUERY_DEADLINE,
};
use crate::{assert_delivered, write_events, Setup};

/// A primary and its hot standby of one major, the outbox database on the primary (and so on
/// the standby), and a [`Setup`] whose database is the standby's copy: its slot is the
/// standby's.
struct StandbyPair {
    primary: PgCluster,
    standby: PgCluster,
    /// The outbox database on the primary, where events are written.
    written_on: TestDb,
    /// On the standby.
    setup: Setup,
}

impl StandbyPair {
    async fn start(prefix: &str, major: u32) -> StandbyPair {
        Self::start_with(prefix, major, |_| {}).await
    }

    /// Like [`StandbyPair::start`], with `configure` run on the primary before the standby is
    /// made from it.
    async fn start_with(
        prefix: &str,
        major: u32,
        configure: impl FnOnce(&PgCluster),
    ) -> StandbyPair {
        let name = unique_name(prefix);
        let primary = PgCluster::start_private_major(&format!("{name}_primary"), major);
        configure(&primary);
        let written_on = primary.create_database(&name).await;
        let standby =
            primary.start_standby_of(&format!("{name}_standby"), &format!("{name}_physical"));
        wait_for(
            "the database to reach the standby",
            Duration::from_secs(60),
            || async {
                let found = standby.psql(
                    "postgres",
                    &format!("SELECT count(*) FROM pg_database WHERE datname = '{name}'"),
                );
                (found.trim() == "1").then_some(())
            },
        )
        .await;
        let types = vec![format!("Order_{name}"), format!("Refund_{name}")];
        for t in &types {
            kafka().create_topic(&format!("{t}.events"), 2);
        }
        let setup = Setup {
            db: standby.database(&name).await,
            slot: format!("{name}_slot"),
            types,
        };
        StandbyPair {
            primary,
            standby,
            written_on,
            setup,
        }
    }

    /// `host:port` of the standby, as findings name it.
    fn standby_host(&self) -> String {
        format!("127.0.0.1:{}", self.standby.port())
    }

    /// `run` arguments for a relay on a URL listing the primary first, then the standby, with
    /// `target_session_attrs=standby`.
    fn relay_args(&self) -> Vec<String> {
        let url = format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{}?target_session_attrs=standby",
            self.primary.port(),
            self.standby.port(),
            self.setup.db.name
        );
        let mut args = self.setup.relay_args(&kafka().bootstrap(), Auth::Trust);
        assert_eq!(args[1], "--source-url");
        args[2] = url;
        args
    }

    /// Writes `txns` transactions of `per_txn` events on the primary (as many keys per type
    /// as events per transaction) and asserts that they arrive at least once in per-key order
    /// (see [`assert_delivered`]); returns each transaction's WAL insert LSN before COMMIT.
    async fn deliver(&self, txns: usize, per_txn: usize) -> Vec<u64> {
        let setup = &self.setup;
        let (written, before_commit) = write_events(
            &self.written_on.client,
            txns,
            per_txn,
            &setup.types,
            per_txn,
            0,
            Duration::ZERO,
        )
        .await;
        let consumed = setup
            .consume_all(written.len(), Duration::ZERO, Duration::from_secs(60))
            .await;
        assert_delivered(&written, &consumed, false);
        before_commit
    }

    /// Sets `setting` to `value` on the standby and waits until it is in force.
    async fn set_on_standby(&self, setting: &str, value: &str) {
        self.standby
            .psql("postgres", &format!("ALTER SYSTEM SET {setting} = {value}"));
        self.standby.psql("postgres", "SELECT pg_reload_conf()");
        wait_for(
            &format!("{setting} to be {value} on the standby"),
            Duration::from_secs(30),
            || async {
                (self
                    .standby
                    .psql("postgres", &format!("SHOW {setting}"))
                    .trim()
                    == value)
                    .then_some(())
            },
        )
        .await;
    }

    /// Starts a relay creating its slot on the standby and waits until it streams from it.
    /// While the creation waits for a running-transactions record from the primary, the
    /// relay must say so, naming `pg_log_standby_snapshot()`; the test then logs one on the
    /// primary (the primary's background writer also does every 15 s when WAL was written).
    async fn start_relay(&self, args: &[String]) -> Relay {
        let mut relay = Relay::spawn(args);
        let slot = &self.setup.slot;
        wait_for(
            "the relay to stream from its slot on the standby",
            Duration::from_secs(90),
            || {
                let waiting = relay.log().contains("pg_log_standby_snapshot()");
                async move {
                    if waiting {
                        self.primary
                            .psql("postgres", "SELECT pg_log_standby_snapshot()");
                    }
                    let row = within(
                        "reading the standby's walsenders",
                        QUERY_DEADLINE,
                        self.setup.db.client.query_opt(
                            "SELECT 1 FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1",
                            &[slot],
                        ),
                    )
                    .await
                    .unwrap();
                    row.map(|_| ())
                }
            },
        )
        .await;
        assert!(relay.is_running(), "the relay stopped:\n{}", relay.log());
        relay
    }
}

/// The relay on the standby: events written on the primary arrive at least once in per-key
/// order, the standby's slot advances past them, the primary has no slot, and `check` and
/// `status` work on the standby.
pub(crate) async fn relay_decodes_from_a_standby_on(major: u32) {
    let pair = StandbyPair::start(&format!("standby{major}"), major).await;
    let setup = &pair.setup;
    let args = pair.relay_args();
    let relay = pair.start_relay(&args).await;
    let log = relay.log();
    if log.contains("pg_log_standby_snapshot()") {
        let line = log
            .lines()
            .find(|l| l.contains("pg_log_standby_snapshot()"))
            .unwrap_or_default();
        eprintln!("the relay waited for its slot: {line}");
        assert!(
            line.contains("running-transactions") && line.contains("primary"),
            "the waiting message does not say what it waits for: {line}"
        );
    }

    let before_commit = pair.deliver(4, 3).await;
    let last = *before_commit.last().unwrap();
    setup
        .wait_confirmed_past(
            last,
            "the standby's slot to be confirmed past the last commit",
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(
        pair.written_on.confirmed_flush_lsn(&setup.slot).await,
        None,
        "the relay created its slot on the primary, not on the standby"
    );

    let (ok, log) = run_command(&as_command(&args, "status"));
    assert!(ok, "status failed on the standby:\n{log}");
    let row = log
        .lines()
        .find(|l| l.contains(&setup.slot))
        .unwrap_or_default();
    let lag = row.split_whitespace().nth(4).unwrap_or_default();
    assert!(
        lag.parse::<i64>().is_ok_and(|lag| lag >= 0),
        "status shows no lag on the standby: {row:?}\n{log}"
    );
    let confirmed = row.split_whitespace().nth(3).unwrap_or_default();
    assert!(
        parse_lsn(confirmed) > last,
        "status shows confirmed LSN {confirmed}, before the last commit {last:X}"
    );

    let host = pair.standby_host();
    let (ok, log) = run_command(&as_command(&args, "check"));
    assert!(ok, "check failed on the standby:\n{log}");
    for (check, parts) in [
        ("standby feedback", vec!["hot_standby_feedback = on", &host]),
        ("primary wal_level", vec!["wal_level = logical", "primary"]),
    ] {
        let line = log
            .lines()
            .find(|l| l.contains(check))
            .unwrap_or_else(|| panic!("check has no {check} line:\n{log}"));
        assert!(line.starts_with("  ok"), "{line}\n{log}");
        for part in parts {
            assert!(line.contains(part), "{part:?} missing in {line}");
        }
    }
    drop(relay);

    if major >= 17 {
        // failover = true for the standby's slot, which is no failover slot: the start stops
        // with check's sentence, which does not send the operator to `setup` (PostgreSQL
        // refuses ALTER_REPLICATION_SLOT ... FAILOVER on a standby).
        let mut failover = args.clone();
        failover.push("--failover".into());
        let sentence =
            crate::start_checks::run_stops_with_checks_sentence(&failover, "failover slot", 3);
        assert!(
            sentence.contains("a standby") && !sentence.contains("outbox-relay setup"),
            "{sentence}"
        );
    }

    pair.set_on_standby("hot_standby_feedback", "off").await;
    let (ok, log) = run_command(&as_command(&args, "check"));
    assert!(
        !ok,
        "check passed with hot_standby_feedback off on the standby:\n{log}"
    );
    let line = log
        .lines()
        .find(|l| l.contains("standby feedback"))
        .unwrap_or_default();
    assert!(
        line.starts_with("  FAIL") && line.contains("hot_standby_feedback") && line.contains(&host),
        "check's standby feedback line: {line:?}\n{log}"
    );

    // Without the slot, check learns the primary's wal_level from a probe slot.
    setup.db.drop_slot(&setup.slot).await;
    let (_, log) = run_command(&as_command(&args, "check"));
    let line = log
        .lines()
        .find(|l| l.contains("primary wal_level"))
        .unwrap_or_default();
    assert!(
        line.starts_with("  ok") && line.contains("accepts a slot") && line.contains(&host),
        "check's primary wal_level line without the slot: {line:?}\n{log}"
    );
    assert_eq!(
        pair.standby
            .psql(
                "postgres",
                "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'"
            )
            .trim(),
        "0",
        "check left its probe slot behind"
    );
}

/// Removes dead catalog rows on the primary: a table created and dropped, then `VACUUM
/// pg_class` in the outbox database (the slot's, whose catalog the conflict is about). The
/// drop has a transaction of its own: rows a transaction inserted and deleted itself conflict
/// with no snapshot.
async fn vacuum_catalog(db: &TestDb) {
    for sql in [
        "CREATE TABLE conflict_test (x int)",
        "DROP TABLE conflict_test",
        "VACUUM pg_class",
    ] {
        within(sql, QUERY_DEADLINE, db.client.batch_execute(sql))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// With `hot_standby_feedback` turned off under a streaming relay, a catalog VACUUM on the
/// primary invalidates the standby's slot: the relay stops with an error naming the reason PostgreSQL gives
/// (`rows_removed` from 17, `conflicting` on 16) instead of blaming `max_slot_wal_keep_size`,
/// and `check` and `status` name it too.
pub(crate) async fn a_catalog_vacuum_invalidates_a_standby_slot_without_feedback_on(major: u32) {
    let pair = StandbyPair::start(&format!("sbinval{major}"), major).await;
    let setup = &pair.setup;
    let args = pair.relay_args();
    let relay = pair.start_relay(&args).await;
    // Turned off under a streaming relay: a start refuses it (see
    // `a_standby_the_pipeline_cannot_decode_on_stops_run_with_checks_sentence`).
    pair.set_on_standby("hot_standby_feedback", "off").await;
    pair.deliver(2, 2).await;

    let slot = &setup.slot;
    wait_for(
        "the standby to invalidate the slot after a catalog VACUUM on the primary",
        Duration::from_secs(60),
        || async {
            vacuum_catalog(&pair.written_on).await;
            let row = within(
                "reading the standby's slot",
                QUERY_DEADLINE,
                setup.db.client.query_opt(
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND wal_status = 'lost'",
                    &[slot],
                ),
            )
            .await
            .unwrap();
            row.map(|_| ())
        },
    )
    .await;
    let reason = match major {
        16 => "conflict:",
        _ => "rows_removed",
    };
    assert_invalidation_named(relay, &args, slot, reason, "hot_standby_feedback");
}

/// The relay stops (within a minute, exit code 4: a lost slot) with an error naming `reason`
/// and `advice` and not `max_slot_wal_keep_size`; `check` fails the slot and `status` shows it lost, both naming
/// `reason`.
fn assert_invalidation_named(
    mut relay: Relay,
    args: &[String],
    slot: &str,
    reason: &str,
    advice: &str,
) {
    let status = relay.wait(Duration::from_secs(60));
    assert_eq!(
        status.code(),
        Some(4),
        "the relay went on from an invalidated slot, or not with a lost slot's exit code:\n{}",
        relay.log()
    );
    let log = relay.log();
    let error = log
        .lines()
        .rev()
        .find(|l| l.contains("is invalidated"))
        .unwrap_or_else(|| panic!("the relay did not say its slot is invalidated:\n{log}"));
    assert!(
        error.contains(reason)
            && error.contains(advice)
            && !error.contains("max_slot_wal_keep_size"),
        "the relay's error does not name {reason} and {advice}: {error}"
    );

    let (ok, log) = run_command(&as_command(args, "check"));
    assert!(!ok, "check passed an invalidated slot:\n{log}");
    let line = log
        .lines()
        .find(|l| l.contains("FAIL") && l.contains("is invalidated"))
        .unwrap_or_else(|| panic!("check does not fail the invalidated slot:\n{log}"));
    assert!(line.contains(reason), "check's slot line: {line}");
    let sentence = &line[line.find("replication slot").unwrap_or(0)..];
    assert!(
        error.contains(sentence),
        "check's slot sentence {sentence:?} is not the relay's: {error}"
    );
    let (_, log) = run_command(&as_command(args, "status"));
    let row = log.lines().find(|l| l.contains(slot)).unwrap_or_default();
    assert!(
        row.contains("lost") && row.contains(reason),
        "status row {row:?} does not name {reason}\n{log}"
    );
}

/// PostgreSQL 18's `idle_replication_slot_timeout` (1 min, its least) invalidates a slot
/// nobody read for that long at the next checkpoint: a relay started then names
/// `idle_timeout`, and so do `check` and `status`.
async fn an_idle_slot_timeout_invalidation_is_named() {
    // A cluster of its own: the timeout would invalidate other tests' idle slots.
    let cluster = PgCluster::start_private_major("standby_idle_timeout", 18);
    let setup = Setup::new_on(&cluster, "idletime", &["Order"], 1).await;
    let args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    drop(relay);
    cluster.psql(
        "postgres",
        "ALTER SYSTEM SET idle_replication_slot_timeout = '1min'",
    );
    cluster.psql("postgres", "SELECT pg_reload_conf()");
    let slot = &setup.slot;
    wait_for(
        "a checkpoint to invalidate the slot idle for 1 min",
        Duration::from_secs(100),
        || async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            cluster.psql("postgres", "CHECKPOINT");
            let reason: Option<String> = within(
                "reading the slot",
                QUERY_DEADLINE,
                setup.db.client.query_opt(
                    "SELECT invalidation_reason FROM pg_replication_slots WHERE slot_name = $1",
                    &[slot],
                ),
            )
            .await
            .unwrap()
            .and_then(|row| row.get(0));
            reason.filter(|r| r == "idle_timeout")
        },
    )
    .await;
    let mut no_create = args.clone();
    no_create.push("--no-create-slot".into());
    let relay = Relay::spawn(&no_create);
    assert_invalidation_named(
        relay,
        &args,
        slot,
        "idle_timeout",
        "idle_replication_slot_timeout",
    );
}

/// A standby whose primary runs with `wal_level = replica` (the standby's own is `logical`):
/// `check` fails `primary wal_level` naming the standby, and the relay stops at its slot
/// creation with an error naming the setting and the standby instead of PostgreSQL's.
pub(crate) async fn a_primary_below_wal_level_logical_is_named() {
    let pair = StandbyPair::start_with("sbwal", 16, |primary| {
        primary.psql("postgres", "ALTER SYSTEM SET wal_level = replica");
        primary.restart("fast");
    })
    .await;
    pair.standby
        .psql("postgres", "ALTER SYSTEM SET wal_level = logical");
    pair.standby.restart("fast");
    let host = pair.standby_host();
    let args = pair.relay_args();
    let (ok, log) = run_command(&as_command(&args, "check"));
    assert!(
        !ok,
        "check passed a primary with wal_level = replica:\n{log}"
    );
    let line = log
        .lines()
        .find(|l| l.contains("primary wal_level"))
        .unwrap_or_else(|| panic!("check has no primary wal_level line:\n{log}"));
    assert!(
        line.starts_with("  FAIL")
            && line.contains("wal_level below logical")
            && line.contains(&host),
        "check's primary wal_level line: {line}"
    );

    let sentence =
        crate::start_checks::run_stops_with_checks_sentence(&args, "primary wal_level", 3);
    assert!(
        sentence.contains(&format!("the standby {host}"))
            && sentence.contains("wal_level = logical on the primary"),
        "{sentence}"
    );
}

/// A standby the pipeline cannot decode on stops the start (exit code 3) with the sentence
/// `check` fails it with, fix included, before any slot is made there: PostgreSQL 15, which
/// cannot decode on a standby; `hot_standby_feedback` off (16), with which a VACUUM on the
/// primary invalidates the slot; `failover = true` (17+), which PostgreSQL refuses for a
/// slot made on a standby.
pub(crate) async fn a_standby_the_pipeline_cannot_decode_on_stops_run_with_checks_sentence(
    major: u32,
) {
    let pair = StandbyPair::start(&format!("sbrefuse{major}"), major).await;
    let mut args = pair.relay_args();
    let finding = match major {
        15 => "standby decoding",
        16 => {
            pair.set_on_standby("hot_standby_feedback", "off").await;
            "standby feedback"
        }
        _ => {
            args.push("--failover".into());
            "failover slot"
        }
    };
    let sentence = crate::start_checks::run_stops_with_checks_sentence(&args, finding, 3);
    assert!(sentence.contains(&pair.standby_host()), "{sentence}");
    let slots = pair.standby.psql(
        "postgres",
        &format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}'",
            pair.setup.slot
        ),
    );
    assert_eq!(slots.trim(), "0", "the refused start created its slot");
}

/// Runs the relay with `args` and asserts that it stops within a minute, its last error
/// naming each of `parts`.
pub(crate) fn assert_relay_stops_naming(args: &[String], parts: &[&str]) {
    let mut relay = Relay::spawn(args);
    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert!(!status.success(), "the relay ran:\n{log}");
    let error = log
        .lines()
        .rev()
        .find(|l| l.contains("ERROR"))
        .unwrap_or_else(|| panic!("the relay logged no error:\n{log}"));
    for part in parts {
        assert!(
            error.contains(part),
            "{part:?} missing in the relay's {error}"
        );
    }
}

/// For each `module = major`, the standby tests on that major.
macro_rules! on_major {
    ($($module:ident = $major:literal),* $(,)?) => {$(
        mod $module {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_relay_decodes_from_a_standby_picked_by_target_session_attrs() {
                super::relay_decodes_from_a_standby_on($major).await;
            }
        }
    )*};
}

on_major!(pg16 = 16, pg17 = 17, pg18 = 18);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg15_a_standby_stops_run_with_checks_sentence() {
    a_standby_the_pipeline_cannot_decode_on_stops_run_with_checks_sentence(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg16_a_standby_without_hot_standby_feedback_stops_run_with_checks_sentence() {
    a_standby_the_pipeline_cannot_decode_on_stops_run_with_checks_sentence(16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg17_failover_on_a_standby_stops_run_with_checks_sentence() {
    a_standby_the_pipeline_cannot_decode_on_stops_run_with_checks_sentence(17).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg16_a_primary_below_wal_level_logical_is_named() {
    a_primary_below_wal_level_logical_is_named().await;
}

/// Invalidation reasons other than `wal_removed` (`server_failures` has that one): a catalog
/// conflict on a standby on 16 (`conflicting`, no reason column) and on 18 (`rows_removed`,
/// as on 17, whose reading is the same), and 18's `idle_timeout`.
mod invalidated {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pg18_an_idle_slot_timeout_invalidation_is_named() {
        super::an_idle_slot_timeout_invalidation_is_named().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pg16_a_catalog_vacuum_invalidates_a_standby_slot_without_feedback() {
        super::a_catalog_vacuum_invalidates_a_standby_slot_without_feedback_on(16).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pg18_a_catalog_vacuum_invalidates_a_standby_slot_without_feedback() {
        super::a_catalog_vacuum_invalidates_a_standby_slot_without_feedback_on(18).await;
    }
}
