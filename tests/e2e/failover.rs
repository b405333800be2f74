//! A database failover on PostgreSQL 17: a primary, a physical standby that keeps the relay's
//! failover slot in sync (`sync_replication_slots`), and the relay on a multi-host URL with
//! `target_session_attrs=primary`. The primary is stopped as in a crash (`-m immediate`), the
//! standby promoted: the relay must find the new primary by itself and go on from the synced
//! slot, losing nothing that was committed and publishing nothing that was not.

use std::time::{Duration, Instant};

use crate::support::{kafka, unique_name, wait_for, within, PgCluster, Relay, QUERY_DEADLINE};
use crate::{assert_delivered, write_events, Setup, Written};

/// A primary and its hot standby (PostgreSQL 17), the outbox database on the primary, and the
/// names a relay needs.
struct Pair {
    primary: PgCluster,
    standby: PgCluster,
    /// On the primary.
    setup: Setup,
    /// The standby's physical slot on the primary.
    physical_slot: String,
}

impl Pair {
    /// Starts both clusters and creates the database (replicated to the standby).
    async fn start(prefix: &str) -> Pair {
        let name = unique_name(prefix);
        let primary = PgCluster::start_private_major(&format!("{name}_primary"), 17);
        let physical_slot = format!("{name}_standby");
        let standby = primary.start_standby_of(&format!("{name}_standby"), &physical_slot);
        let db = primary.create_database(&name).await;
        let types = vec![format!("Order_{name}"), format!("Refund_{name}")];
        for t in &types {
            kafka().create_topic(&format!("{t}.events"), 2);
        }
        let setup = Setup {
            db,
            slot: format!("{name}_slot"),
            types,
        };
        Pair {
            primary,
            standby,
            setup,
            physical_slot,
        }
    }

    /// `run` arguments for a relay on both hosts, the standby first or last, with
    /// `target_session_attrs` when given, and `--no-create-slot`.
    fn relay_args(&self, standby_first: bool, target: Option<&str>) -> Vec<String> {
        let (first, second) = match standby_first {
            true => (self.standby.port(), self.primary.port()),
            false => (self.primary.port(), self.standby.port()),
        };
        let mut url = format!(
            "postgres://postgres@127.0.0.1:{first},127.0.0.1:{second}/{}",
            self.setup.db.name
        );
        if let Some(target) = target {
            url.push_str(&format!("?target_session_attrs={target}"));
        }
        let mut args = self
            .setup
            .relay_args(&kafka().bootstrap(), crate::support::Auth::Trust);
        assert_eq!(args[1], "--source-url");
        args[2] = url;
        args.push("--no-create-slot".into());
        args
    }

    /// Waits until the standby has replayed all WAL the primary has flushed, so that every
    /// transaction committed so far survives a failover.
    async fn wait_standby_caught_up(&self) {
        let flushed = self.setup.db.current_wal_flush_lsn().await;
        let standby = self.standby.database("postgres").await;
        wait_for(
            "the standby to replay the primary's WAL",
            Duration::from_secs(60),
            || async {
                let replayed: String = standby
                    .query_one_value("SELECT pg_last_wal_replay_lsn()::text")
                    .await;
                (crate::support::parse_lsn(&replayed) >= flushed).then_some(())
            },
        )
        .await;
    }

    /// Waits until the standby holds the relay's slot as a synced, persistent slot (one that
    /// survives a promotion).
    async fn wait_slot_synced(&self) {
        let standby = self.standby.database(&self.setup.db.name).await;
        let slot = &self.setup.slot;
        wait_for(
            "the standby to hold the failover slot synced and not temporary",
            Duration::from_secs(120),
            || async {
                let row = within(
                    "reading the standby's slot",
                    QUERY_DEADLINE,
                    standby.client.query_opt(
                        "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = $1",
                        &[slot],
                    ),
                )
                .await
                .unwrap();
                row.filter(|row| row.get::<_, bool>(0)).map(|_| ())
            },
        )
        .await;
    }
}

/// Runs one rolled-back transaction with an outbox row on `client`: it must never arrive.
async fn rolled_back(client: &tokio_postgres::Client, aggregate_type: &str) {
    within(
        "a rolled-back outbox insert",
        QUERY_DEADLINE,
        client.batch_execute(&format!(
            "BEGIN; INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('{aggregate_type}', 'never', 'RolledBack', '{{}}'); ROLLBACK"
        )),
    )
    .await
    .unwrap();
}

/// The failover: events before, the primary stopped with `-m immediate`, the standby
/// promoted, events after; every committed event arrives, in per-key order, nothing else, and
/// the relay streams from the new primary.
async fn relay_survives_a_failover(standby_first: bool) {
    let pair = Pair::start(if standby_first {
        "failover_standby_first"
    } else {
        "failover_standby_last"
    })
    .await;
    let setup = &pair.setup;
    // The failover slot, by `setup --failover` (through the multi-host URL, on the primary).
    let mut args = pair.relay_args(standby_first, Some("primary"));
    args.push("--failover".into());
    let mut created = Relay::spawn(&crate::as_command(&args, "setup"));
    let status = created.wait(Duration::from_secs(60));
    assert!(
        status.success(),
        "setup --failover failed:\n{}",
        created.log()
    );
    // Logical walsenders of failover slots wait for the standby to confirm: nothing reaches
    // Kafka that a failover could lose. Set only on the primary (after the base backup), so
    // the promoted standby does not wait for a slot it does not have.
    pair.primary.psql(
        "postgres",
        &format!(
            "ALTER SYSTEM SET synchronized_standby_slots = '{}'",
            pair.physical_slot
        ),
    );
    pair.primary.psql("postgres", "SELECT pg_reload_conf()");

    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (mut written, before_commit) =
        write_events(&setup.db.client, 20, 3, &setup.types, 4, 0, Duration::ZERO).await;
    rolled_back(&setup.db.client, &setup.types[0]).await;
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "the relay to confirm the events written on the primary",
            Duration::from_secs(60),
        )
        .await;
    pair.wait_standby_caught_up().await;
    pair.wait_slot_synced().await;

    pair.primary.stop("immediate");
    // Until the promotion, no host fits: the relay passes over the standby and retries.
    relay
        .wait_for_log(
            &format!(
                "127.0.0.1:{} is a standby (in_hot_standby=on), target_session_attrs=primary",
                pair.standby.port()
            ),
            Duration::from_secs(60),
        )
        .await;
    pair.standby.promote();
    let promoted = Instant::now();
    let new_primary = Setup {
        db: pair.standby.database(&setup.db.name).await,
        slot: setup.slot.clone(),
        types: setup.types.clone(),
    };
    let (after, before_commit) = write_events(
        &new_primary.db.client,
        20,
        3,
        &new_primary.types,
        4,
        written.len(),
        Duration::ZERO,
    )
    .await;
    rolled_back(&new_primary.db.client, &new_primary.types[1]).await;
    written.extend(after);

    new_primary.wait_streaming().await;
    eprintln!(
        "streaming from the promoted standby {:?} after promotion",
        promoted.elapsed()
    );
    new_primary
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "the relay to confirm the events written on the new primary",
            Duration::from_secs(60),
        )
        .await;
    let consumed = new_primary
        .consume_all(
            written.len(),
            Duration::from_secs(3),
            Duration::from_secs(60),
        )
        .await;
    assert_delivered(&written, &consumed, false);
    assert!(relay.is_running(), "the relay stopped during the failover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_survives_a_failover_with_the_standby_listed_first() {
    relay_survives_a_failover(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_survives_a_failover_with_the_standby_listed_last() {
    relay_survives_a_failover(false).await;
}

/// With the standby listed first, `target_session_attrs=primary` (here from
/// `PGTARGETSESSIONATTRS`) takes the primary; without it (`any`, the default) the relay takes
/// the standby, where the (not synced) slot does not exist, and stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_session_attrs_primary_passes_over_a_standby_listed_first() {
    let pair = Pair::start("standby_first").await;
    let setup = &pair.setup;
    setup.db.create_slot(&setup.slot).await;
    pair.wait_standby_caught_up().await;

    let mut on_standby = Relay::spawn(&pair.relay_args(true, None));
    let status = on_standby.wait(Duration::from_secs(60));
    assert!(!status.success(), "{status}");
    let log = on_standby.log();
    assert!(
        log.contains(&format!("replication slot {:?} does not exist", setup.slot)),
        "the default (any) connects to the first host, the standby:\n{log}"
    );

    // From the environment this time (the failover tests set it in the URL).
    let mut relay = Relay::spawn_with_env(
        &pair.relay_args(true, None),
        &[("PGTARGETSESSIONATTRS", "primary")],
    );
    setup.wait_streaming().await;
    let (written, before_commit): (Vec<Written>, Vec<u64>) =
        write_events(&setup.db.client, 5, 2, &setup.types, 3, 0, Duration::ZERO).await;
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "the relay to confirm the events",
            Duration::from_secs(60),
        )
        .await;
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
        .await;
    assert_delivered(&written, &consumed, false);
    assert!(relay.is_running());
}

/// With the default `any` and the standby listed first, a standby that holds the failover
/// slot's synchronized copy is not streamed from (PostgreSQL refuses: 55000, which the relay
/// retried forever): the relay exits naming the copy and `target_session_attrs=primary`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synced_failover_slot_on_a_standby_listed_first_is_refused_naming_it() {
    let pair = Pair::start("synced_first").await;
    let mut args = pair.relay_args(true, Some("primary"));
    args.push("--failover".into());
    let mut created = Relay::spawn(&crate::as_command(&args, "setup"));
    let status = created.wait(Duration::from_secs(60));
    assert!(
        status.success(),
        "setup --failover failed:\n{}",
        created.log()
    );
    // The standby keeps a synced copy once the slot has moved on the primary (as in
    // relay_survives_a_failover).
    pair.primary.psql(
        "postgres",
        &format!(
            "ALTER SYSTEM SET synchronized_standby_slots = '{}'",
            pair.physical_slot
        ),
    );
    pair.primary.psql("postgres", "SELECT pg_reload_conf()");
    let setup = &pair.setup;
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (_, before_commit) =
        write_events(&setup.db.client, 2, 1, &setup.types, 1, 0, Duration::ZERO).await;
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "the relay on the primary to confirm",
            Duration::from_secs(60),
        )
        .await;
    pair.wait_standby_caught_up().await;
    pair.wait_slot_synced().await;
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());

    let mut args = pair.relay_args(true, None);
    args.push("--failover".into());
    let mut on_standby = Relay::spawn(&args);
    let status = on_standby.wait(Duration::from_secs(60));
    assert!(!status.success(), "{status}");
    let log = on_standby.log();
    assert!(
        log.contains(&format!(
            "replication slot {:?} on this server is a copy synchronized from the primary",
            pair.setup.slot
        )) && log.contains("target_session_attrs=primary"),
        "the relay names the synced copy and the way out:\n{log}"
    );
    // `check` fails on it as the start does (it said "slot ... ok").
    let mut check = Relay::spawn(&crate::as_command(&args, "check"));
    let status = check.wait(Duration::from_secs(60));
    let log = check.log();
    assert!(!status.success(), "check passed:\n{log}");
    assert!(
        log.lines().any(|l| l.contains("FAIL")
            && l.contains("slot")
            && l.contains("is a copy synchronized from the primary")),
        "{log}"
    );
}
