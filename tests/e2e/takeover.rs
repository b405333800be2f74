use std::time::Duration;

use crate::support::{self, http_get, kafka, pg, unique_name, wait_for, Auth, Relay};
use crate::Setup;

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

/// The grace period [`with_takeover`] gives.
const TAKEOVER_GRACE: Duration = Duration::from_secs(5);

/// `args` with `--terminate-stale-walsender-after-secs 5`.
fn with_takeover(mut args: Vec<String>) -> Vec<String> {
    args.extend([
        "--terminate-stale-walsender-after-secs".into(),
        TAKEOVER_GRACE.as_secs().to_string(),
    ]);
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
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut standby_args = with_takeover(setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    standby_args.extend(["--metrics-listen".to_owned(), metrics.clone()]);
    let mut standby = Relay::spawn(&standby_args);
    standby
        .wait_for_log("is active for PID", Duration::from_secs(30))
        .await;
    // Watch the standby retry for twice the grace period, and at least 4 times: long enough
    // that a stale holder would have been terminated.
    let first_refusal = std::time::Instant::now();
    wait_for(
        "the standby to retry the slot 4 times over 10 s",
        Duration::from_secs(120),
        || async {
            let log = standby.log();
            assert!(
                !log.contains("terminated the walsender")
                    && !log.contains("cannot terminate")
                    && !log.contains("streaming"),
                "the standby fought the live relay:\n{log}"
            );
            (log.matches("is active for PID").count() >= 4
                && first_refusal.elapsed() >= 2 * TAKEOVER_GRACE)
                .then_some(())
        },
    )
    .await;

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
    // A standby is ready (it takes over within seconds), says so in its state, and logs it
    // once at INFO however often it retries.
    let (status, body) = http_get(&metrics, "/readyz").await.expect("GET /readyz");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"standing_by\""), "{body}");
    assert_eq!(
        log.lines()
            .filter(|l| l.contains(" INFO ") && l.contains("standing by"))
            .count(),
        1,
        "{log}"
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
    // What sql/roles.sql grants on the slot record, which the relay writes once it streams.
    setup
        .db
        .client
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA outbox_relay TO {role}; GRANT SELECT, INSERT, UPDATE ON outbox_relay.streamed_slots TO {role}"
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
    // Once the holder has been silent for longer than the grace period, the taker looks again.
    wait_for(
        "the stopped holder's reply_time to be older than the grace period",
        Duration::from_secs(60),
        || async {
            let stale_secs: Option<f64> = setup
                .db
                .client
                .query_opt(
                    "SELECT extract(epoch FROM now() - coalesce(reply_time, backend_start))::float8 FROM pg_stat_replication WHERE pid = $1",
                    &[&stale_pid],
                )
                .await
                .unwrap()
                .map(|r| r.get(0));
            (stale_secs? > TAKEOVER_GRACE.as_secs_f64()).then_some(())
        },
    )
    .await;
    let attempts = taker.log().matches("GRANT pg_read_all_stats").count();
    wait_for(
        "the taker to try again while the holder is stale",
        Duration::from_secs(60),
        || async {
            (taker.log().matches("GRANT pg_read_all_stats").count() > attempts).then_some(())
        },
    )
    .await;
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
