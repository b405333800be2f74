//! How the supervisor restarts and stops sessions, seen from outside: a stop while a session
//! is still being set up ends the process at once, and a session that fails right after
//! every start is retried after growing delays, with the recurring error in `/readyz`.

use std::time::Duration;

use crate::support::{self, http_get, metric_value, pg, unique_name, wait_for, Auth, Relay};
use crate::{write_events, Setup};

/// A SIGTERM while the relay sets up its session, here creating its slot, which
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

/// A session that fails right after every start (here: the broker is unreachable
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
    let text = support::scrape_metrics(&metrics).await;
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
