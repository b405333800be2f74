//! PostgreSQL 17's failover slots: `setup --failover` creates one, `check` and `status` judge
//! it and the standby that keeps it, and a `synchronized_standby_slots` entry whose physical
//! slot is missing stalls it visibly (log and metric) until the setting is mended.

use std::time::Duration;

use crate::support::{
    self, http_get, kafka, metric_sum, metric_value, wait_for, Auth, PgCluster, Relay,
};
use crate::{as_command, assert_delivered, write_events, Setup};

/// Runs the relay binary with `args` to its end (at most a minute); returns whether it
/// succeeded and its output.
pub(crate) fn run_command(args: &[String]) -> (bool, String) {
    let mut command = Relay::spawn(args);
    let status = command.wait(Duration::from_secs(60));
    (status.success(), command.log())
}

/// Waits (up to 30 s) until the relay serving metrics on `metrics` shows `value` for the
/// gauge `series`.
async fn wait_gauge(metrics: &str, series: &str, value: f64) {
    wait_for(
        &format!("{series} to be {value}"),
        Duration::from_secs(30),
        || async {
            let (_, text) = http_get(metrics, "/metrics").await?;
            (metric_value(&text, series) == value).then_some(())
        },
    )
    .await;
}

/// Whether `slot` is a failover slot, as the primary of `setup` says.
async fn is_failover(setup: &Setup) -> bool {
    setup
        .db
        .query_one_value::<bool>(&format!(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = '{}'",
            setup.slot
        ))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_synchronized_standby_slot_stalls_the_failover_slot_visibly_until_mended() {
    // A cluster of its own: synchronized_standby_slots holds back every failover slot.
    let cluster = PgCluster::start_private_major("fslots_stall", 17);
    let setup = Setup::new_on(&cluster, "fstall", &["Order"], 1).await;
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.push("--failover".into());

    let (ok, log) = run_command(&as_command(&args, "setup"));
    assert!(ok, "setup --failover failed:\n{log}");
    assert!(
        log.contains("created failover slot"),
        "setup did not say it created a failover slot:\n{log}"
    );
    assert!(
        is_failover(&setup).await,
        "setup --failover created a slot without FAILOVER"
    );

    args.extend([
        "--no-create-slot".into(),
        "--metrics-listen".into(),
        metrics.clone(),
    ]);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (mut written, _) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 0, Duration::ZERO).await;
    let consumed = setup
        .consume_all(written.len(), Duration::ZERO, Duration::from_secs(60))
        .await;
    assert_delivered(&written, &consumed, false);

    // A physical slot named in synchronized_standby_slots, then dropped: the setting now names
    // a slot that does not exist (the check hook refuses a missing name up front).
    cluster.psql(
        "postgres",
        "SELECT pg_create_physical_replication_slot('fslots_gone')",
    );
    cluster.psql(
        "postgres",
        "ALTER SYSTEM SET synchronized_standby_slots = 'fslots_gone'",
    );
    cluster.psql("postgres", "SELECT pg_reload_conf()");
    cluster.psql("postgres", "SELECT pg_drop_replication_slot('fslots_gone')");
    let (stalled, before_commit) = write_events(
        &setup.db.client,
        2,
        2,
        &setup.types,
        2,
        written.len(),
        Duration::ZERO,
    )
    .await;

    relay
        .wait_for_log("failover slot stalled", Duration::from_secs(60))
        .await;
    let log = relay.log();
    let warning = log
        .lines()
        .find(|l| l.contains("failover slot stalled"))
        .unwrap_or_default();
    for part in [
        "synchronized_standby_slots = 'fslots_gone'",
        "\"fslots_gone\" does not exist",
    ] {
        assert!(
            warning.contains(part),
            "{part:?} missing in the warning {warning:?}"
        );
    }
    let stalled_series = format!(
        "outbox_relay_standby_slots_stalled{{pipeline=\"{}\"}}",
        setup.slot
    );
    wait_gauge(&metrics, &stalled_series, 1.0).await;
    // Held back by the walsender: nothing of the new transactions is published or confirmed.
    let (_, text) = http_get(&metrics, "/metrics")
        .await
        .expect("metrics answer");
    assert_eq!(
        metric_sum(&text, "outbox_relay_events_published_total"),
        Some(written.len() as f64),
        "events arrived through a stalled failover slot"
    );
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed <= before_commit[0],
        "the slot was confirmed at {confirmed:X}, past the first stalled commit (after {:X})",
        before_commit[0]
    );

    // The relay waits on it (another actor mends it: a standby starting again), so check
    // warns with the relay's sentence and does not fail.
    let (ok, log) = run_command(&as_command(&args[..args.len() - 3], "check"));
    assert!(ok, "check failed what the relay waits on:\n{log}");
    let line = log
        .lines()
        .find(|l| l.contains("standby_slots"))
        .unwrap_or_default();
    let from = warning
        .find("synchronized_standby_slots = '")
        .unwrap_or_else(|| panic!("the relay's warning {warning:?}"));
    let to = from
        + warning[from..]
            .find("pg_reload_conf())")
            .unwrap_or_else(|| panic!("the relay's warning {warning:?}"))
        + "pg_reload_conf())".len();
    let stall = &warning[from..to];
    assert!(
        line.trim_start().starts_with("WARN") && line.contains(stall),
        "check's standby_slots line {line:?} does not carry the relay's {stall:?}\n{log}"
    );
    assert!(
        log.lines().any(|l| l.contains("ok")
            && l.contains("failover slot")
            && l.contains("is a failover slot")),
        "check does not show the failover slot:\n{log}"
    );

    cluster.psql("postgres", "ALTER SYSTEM RESET synchronized_standby_slots");
    cluster.psql("postgres", "SELECT pg_reload_conf()");
    written.extend(stalled);
    let consumed = setup
        .consume_all(written.len(), Duration::ZERO, Duration::from_secs(60))
        .await;
    assert_delivered(&written, &consumed, false);
    wait_gauge(&metrics, &stalled_series, 0.0).await;
    relay
        .wait_for_log(
            "no longer holds the failover slot back",
            Duration::from_secs(30),
        )
        .await;
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_status_follow_a_standby_until_it_keeps_the_failover_slot() {
    let primary = PgCluster::start_private_major("fslots_primary", 17);
    let setup = Setup::new_on(&primary, "fsync", &["Order"], 1).await;
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.push("--failover".into());
    let (ok, log) = run_command(&as_command(&args, "setup"));
    assert!(ok, "setup --failover failed:\n{log}");

    // A standby streaming from physical slot fslots_standby, with sync_replication_slots, but
    // hot_standby_feedback turned off (slot synchronization needs it).
    let standby = primary.start_standby_of("fslots_standby", "fslots_standby");
    standby.psql("postgres", "ALTER SYSTEM SET hot_standby_feedback = off");
    standby.psql("postgres", "SELECT pg_reload_conf()");
    wait_for(
        "hot_standby_feedback to be off on the standby",
        Duration::from_secs(30),
        || async {
            (standby.psql("postgres", "SHOW hot_standby_feedback").trim() == "off").then_some(())
        },
    )
    .await;
    let standby_host = format!("127.0.0.1:{}", standby.port());
    args.extend([
        "--standby-url".into(),
        format!("postgres://postgres@{standby_host}/{}", setup.db.name),
    ]);
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
        line.starts_with("  FAIL")
            && line.contains("hot_standby_feedback")
            && line.contains(&standby_host),
        "check's standby feedback line: {line:?}\n{log}"
    );
    for check in ["standby sync", "standby primary slot", "standby conninfo"] {
        assert!(
            log.lines()
                .any(|l| l.starts_with("  ok") && l.contains(check)),
            "{check} is not ok:\n{log}"
        );
    }
    // PGTARGETSESSIONATTRS set for the source URL does not make the standby unfit (check
    // said it could not connect to standby_url and skipped the standby checks).
    let mut with_env = Relay::spawn_with_env(
        &as_command(&args, "check"),
        &[("PGTARGETSESSIONATTRS", "primary")],
    );
    assert!(!with_env.wait(Duration::from_secs(60)).success());
    let log = with_env.log();
    assert!(
        log.lines()
            .any(|l| l.starts_with("  FAIL") && l.contains("hot_standby_feedback")),
        "the standby checks ran with PGTARGETSESSIONATTRS=primary:\n{log}"
    );

    standby.psql("postgres", "ALTER SYSTEM SET hot_standby_feedback = on");
    standby.psql("postgres", "SELECT pg_reload_conf()");
    // The standby's copy stays temporary until the primary's slot moves past where the copy
    // began: the relay must confirm something.
    let mut run_args = as_command(&args[..args.len() - 2], "run");
    run_args.push("--no-create-slot".into());
    let relay = Relay::spawn(&run_args);
    setup.wait_streaming().await;
    let (written, _) =
        write_events(&setup.db.client, 3, 2, &setup.types, 2, 0, Duration::ZERO).await;
    let consumed = setup
        .consume_all(written.len(), Duration::ZERO, Duration::from_secs(60))
        .await;
    assert_delivered(&written, &consumed, false);
    let log = wait_for(
        "check to see the slot synced on the standby",
        Duration::from_secs(120),
        || async {
            // A running-transactions record lets the standby's slot sync catch up sooner.
            primary.psql("postgres", "SELECT pg_log_standby_snapshot()");
            let (ok, log) = run_command(&as_command(&args, "check"));
            let synced = ok
                && log
                    .lines()
                    .any(|l| l.starts_with("  ok") && l.contains("standby slot copy"));
            if !synced {
                let problems: Vec<&str> = log.lines().filter(|l| !l.starts_with("  ok")).collect();
                eprintln!("check, not yet synced: {problems:#?}");
            }
            synced.then_some(log)
        },
    )
    .await;
    let line = log
        .lines()
        .find(|l| l.contains("standby slot copy"))
        .unwrap_or_default();
    assert!(
        line.contains("synced") && line.contains(&standby_host),
        "check's standby slot copy line: {line:?}\n{log}"
    );

    drop(relay);
    let (ok, log) = run_command(&as_command(&args, "status"));
    assert!(ok, "status failed:\n{log}");
    let row = log
        .lines()
        .find(|l| l.contains(&setup.slot))
        .unwrap_or_default();
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert!(
        columns.contains(&"yes") && columns.contains(&"synced"),
        "status row {row:?} does not show a failover slot synced on the standby\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_turns_failover_on_for_a_free_slot_only() {
    let setup = Setup::new_on(support::pg::pg_major(17), "fturn", &["Order"], 1).await;
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let (ok, log) = run_command(&as_command(&args, "setup"));
    assert!(ok, "setup failed:\n{log}");
    assert!(
        !is_failover(&setup).await,
        "setup without --failover made a failover slot"
    );

    args.push("--no-create-slot".into());
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let pid = setup
        .db
        .slot_active_pid(&setup.slot)
        .await
        .expect("the relay holds the slot");
    let mut failover_setup = as_command(&args, "setup");
    failover_setup.push("--failover".into());
    let (ok, log) = run_command(&failover_setup);
    assert!(
        !ok,
        "setup --failover succeeded while a walsender held the slot:\n{log}"
    );
    assert!(
        log.contains("not a failover slot") && log.contains(&format!("pid {pid}")),
        "setup's error does not name the walsender holding the slot:\n{log}"
    );
    assert!(!is_failover(&setup).await);

    drop(relay);
    setup.wait_released("the relay was dropped").await;

    // The relay asked for failover on this slot: retrying cannot turn FAILOVER on, so it
    // stops at its start (exit code 3) with the sentence check fails the slot with, fix
    // included.
    let mut failover_run = args.clone();
    failover_run.push("--failover".into());
    let sentence =
        crate::start_checks::run_stops_with_checks_sentence(&failover_run, "failover slot", 3);
    assert!(
        sentence.contains("is not a failover slot") && sentence.contains("outbox-relay setup"),
        "{sentence}"
    );
    assert!(!is_failover(&setup).await);

    let (ok, log) = run_command(&failover_setup);
    assert!(ok, "setup --failover failed on a free slot:\n{log}");
    assert!(
        log.contains("turned FAILOVER on for slot"),
        "setup did not say what it did:\n{log}"
    );
    assert!(
        is_failover(&setup).await,
        "setup --failover left the slot without FAILOVER"
    );
    let (ok, log) = run_command(&failover_setup);
    assert!(
        ok && !log.contains("turned FAILOVER on"),
        "a second setup changed something:\n{log}"
    );
}

/// With `failover = true` and the relay managing its slot (`create_slot`, the default), a slot
/// made without FAILOVER (by an older relay, or by hand) is turned into a failover slot at the
/// start, which then streams; `check` warns until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_turns_failover_on_for_its_slot_and_check_warns_until_then() {
    let setup = Setup::new_on(support::pg::pg_major(17), "frun", &["Order"], 1).await;
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let (ok, log) = run_command(&as_command(&args, "setup"));
    assert!(ok, "setup failed:\n{log}");
    assert!(!is_failover(&setup).await);

    args.push("--failover".into());
    let (ok, log) = run_command(&as_command(&args, "check"));
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("failover slot")
            && l.contains("the relay's start turns FAILOVER on")),
        "check does not warn of the slot without FAILOVER (ok = {ok}):\n{log}"
    );

    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    assert!(
        is_failover(&setup).await,
        "the relay streams from a slot without FAILOVER although failover = true:\n{}",
        relay.log()
    );
    relay
        .wait_for_log("turned FAILOVER on", Duration::from_secs(10))
        .await;
    let (written, _) =
        write_events(&setup.db.client, 1, 2, &setup.types, 1, 0, Duration::ZERO).await;
    let consumed = setup
        .consume_all(written.len(), Duration::ZERO, Duration::from_secs(60))
        .await;
    assert_delivered(&written, &consumed, false);
}

/// A relay with `failover = true` meeting its slot without FAILOVER while another relay streams
/// from it stands by (PostgreSQL's ALTER_REPLICATION_SLOT would wait for the slot, holding the
/// start forever); it turns FAILOVER on once it takes the slot over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_held_by_another_relay_is_not_altered_and_the_failover_relay_stands_by() {
    let setup = Setup::new_on(support::pg::pg_major(17), "fheld", &["Order"], 1).await;
    let args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let active = Relay::spawn(&args);
    setup.wait_streaming().await;

    let mut failover_args = args.clone();
    failover_args.push("--failover".into());
    let mut standby = Relay::spawn(&failover_args);
    standby
        .wait_for_log("standing by", Duration::from_secs(30))
        .await;
    assert!(
        !is_failover(&setup).await,
        "the slot changed under the active relay"
    );

    drop(active);
    wait_for(
        "the standing-by relay to take the slot over and turn FAILOVER on",
        Duration::from_secs(60),
        || async { is_failover(&setup).await.then_some(()) },
    )
    .await;
    setup.wait_streaming().await;
    assert!(standby.is_running(), "{}", standby.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_on_postgresql_16_is_an_error_naming_the_version() {
    let setup = Setup::new_on(support::pg::pg_major(16), "fold", &["Order"], 1).await;
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.push("--failover".into());
    for command in ["setup", "run"] {
        let (ok, log) = run_command(&as_command(&args, command));
        assert!(
            !ok,
            "{command} --failover succeeded on PostgreSQL 16:\n{log}"
        );
        assert!(
            log.contains("failover = true")
                && log.contains("PostgreSQL 17")
                && log.contains("runs PostgreSQL 16"),
            "{command}'s error does not name the option and the version:\n{log}"
        );
    }
    assert_eq!(
        setup.db.confirmed_flush_lsn(&setup.slot).await,
        None,
        "a slot was created without the FAILOVER asked for"
    );
    let (ok, log) = run_command(&as_command(&args, "check"));
    assert!(!ok, "check passed failover = true on PostgreSQL 16:\n{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("FAIL") && l.contains("failover slot") && l.contains("16")),
        "check does not fail the failover slot on PostgreSQL 16:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_creates_its_slot_with_failover() {
    let setup = Setup::new_on(support::pg::pg_major(17), "fcreate", &["Order"], 1).await;
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.push("--failover".into());
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    assert!(
        is_failover(&setup).await,
        "the relay created its slot without FAILOVER"
    );
    let (written, _) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 0, Duration::ZERO).await;
    let consumed = setup
        .consume_all(written.len(), Duration::ZERO, Duration::from_secs(60))
        .await;
    assert_delivered(&written, &consumed, false);
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_warns_of_an_idle_slot_timeout_shorter_than_the_longest_wait_between_sessions() {
    // A cluster of its own: the timeout would invalidate other tests' idle slots.
    let cluster = PgCluster::start_private_major("fslots_idle", 18);
    let setup = Setup::new_on(&cluster, "fidle", &["Order"], 1).await;
    let args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let idle_line = |log: &str| {
        log.lines()
            .find(|l| l.contains("idle slot timeout"))
            .unwrap_or_else(|| panic!("no idle slot timeout finding:\n{log}"))
            .to_owned()
    };
    let (_, log) = run_command(&as_command(&args, "check"));
    let line = idle_line(&log);
    assert!(line.starts_with("  ok") && line.contains("off"), "{line}");

    cluster.psql(
        "postgres",
        "ALTER SYSTEM SET idle_replication_slot_timeout = '30s'",
    );
    cluster.psql("postgres", "SELECT pg_reload_conf()");
    let (_, log) = run_command(&as_command(&args, "check"));
    let line = idle_line(&log);
    // The 30 s longest backoff and its jitter: 60 s.
    assert!(
        line.starts_with("  WARN") && line.contains("= 30 s") && line.contains("60 s"),
        "{line}"
    );

    cluster.psql(
        "postgres",
        "ALTER SYSTEM SET idle_replication_slot_timeout = '1h'",
    );
    cluster.psql("postgres", "SELECT pg_reload_conf()");
    let (_, log) = run_command(&as_command(&args, "check"));
    let line = idle_line(&log);
    assert!(
        line.starts_with("  ok") && line.contains("3600 s"),
        "{line}"
    );
}
