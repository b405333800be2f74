use std::time::Duration;

use crate::support::{self, consume, kafka, parse_lsn, pg, unique_name, wait_for, Auth, Relay};
use crate::{assert_delivered, write_events, Setup};

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
    server_restarts_fast_and_immediate_lose_nothing_and_publish_nothing_uncommitted_on(15).await;
}

/// Restarts (`immediate` with a transaction open, then `fast`) of a private cluster of
/// PostgreSQL `major` lose nothing and publish nothing uncommitted.
pub(crate) async fn server_restarts_fast_and_immediate_lose_nothing_and_publish_nothing_uncommitted_on(
    major: u32,
) {
    // A cluster of its own: this test restarts it.
    let cluster = support::PgCluster::start_private_major(&unique_name("restartable"), major);
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

/// A fast shutdown of an idle source is not held up by the relay. Before it exits, a walsender
/// waits for its client to confirm everything it sent, the shutdown checkpoint included; the
/// relay confirms only as far as a check of the publication verified, and no check can connect
/// to a server shutting down. The relay ends its session instead, and streams again once the
/// server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_shutdown_of_an_idle_source_is_not_held_up_by_the_relay() {
    // A cluster of its own: this test stops it.
    let cluster = support::PgCluster::start_private(&unique_name("shutdown"));
    let name = unique_name("fastshutdown");
    let db = cluster.create_database(&name).await;
    let types = vec![format!("Order_{name}")];
    let topic = format!("{}.events", types[0]);
    kafka().create_topic(&topic, 1);
    let slot = format!("{name}_slot");
    let mut relay = Relay::spawn(&private_cluster_args(&db, &slot));
    wait_slot_streaming(&db.client, &slot).await;
    // Idle, the relay confirms the end of WAL once a check of the publication verified it.
    let idle_end = db.current_wal_lsn().await;
    wait_for(
        "the idle relay to confirm the end of WAL",
        Duration::from_secs(30),
        || async { (db.confirmed_flush_lsn_u64(&slot).await >= Some(idle_end)).then_some(()) },
    )
    .await;
    drop(db);

    // Panics unless the server has stopped within 60 s.
    let stopping = std::time::Instant::now();
    cluster.stop("fast");
    eprintln!("stopped in {:?}", stopping.elapsed());
    relay
        .wait_for_log("pipeline session ended", Duration::from_secs(10))
        .await;

    cluster.restart("fast");
    let db = cluster.database(&name).await;
    wait_slot_streaming(&db.client, &slot).await;
    let (written, _) = write_events(&db.client, 1, 1, &types, 1, 0, Duration::ZERO).await;
    let consumed = consume(
        &kafka().bootstrap(),
        &[topic.as_str()],
        written.len(),
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &consumed, true);
    drop(relay);
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
    // Every row of the transaction arrived, with its key, and per key in insert order.
    let mut seqs_by_key: std::collections::HashMap<String, Vec<u64>> = Default::default();
    for record in &consumed {
        let value = record.value_str().expect("a value");
        let seq = serde_json::from_str::<serde_json::Value>(&value)
            .ok()
            .and_then(|v| v["seq"].as_u64())
            .unwrap_or_else(|| panic!("value {value:?} is not the {{\"seq\": n}} written"));
        assert_eq!(
            record.key_str(),
            Some(format!("k-{}", seq % 10)),
            "key of seq {seq}"
        );
        seqs_by_key
            .entry(format!("k-{}", seq % 10))
            .or_default()
            .push(seq);
    }
    for (key, seqs) in &mut seqs_by_key {
        // First arrivals only: an at-least-once redelivery may repeat a record later.
        let mut seen = std::collections::HashSet::new();
        seqs.retain(|seq| seen.insert(*seq));
        let expected: Vec<u64> = (1..=20_000u64)
            .filter(|g| format!("k-{}", g % 10) == *key)
            .collect();
        assert_eq!(
            *seqs, expected,
            "rows of {key} missing or out of insert order"
        );
    }
    assert_eq!(seqs_by_key.len(), 10, "keys seen: {:?}", seqs_by_key.keys());
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
    let (_, lost_commit) = write_events(
        &db.client,
        1,
        1,
        std::slice::from_ref(&aggregate),
        1,
        10,
        Duration::ZERO,
    )
    .await;
    let confirmed = db.confirmed_flush_lsn_u64(&slot).await.unwrap_or(0);
    assert!(
        confirmed <= lost_commit[0],
        "the slot confirmed {confirmed:X}, past the event committed at {:X} while no relay ran",
        lost_commit[0]
    );
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
    let log = relay.log();
    assert_eq!(
        status.code(),
        Some(4),
        "the relay ran on an invalidated slot, or exited without a lost slot's code:\n{log}"
    );
    assert!(
        log.contains("invalidated") && log.contains("pg_drop_replication_slot"),
        "{log}"
    );
    // PostgreSQL 15 has no invalidation_reason: removed WAL is the only cause there.
    assert!(
        log.contains("wal_removed") && log.contains("max_slot_wal_keep_size"),
        "the error does not say why the slot was invalidated: {log}"
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
    let status_args = crate::as_command(&args, "status");
    let mut report = Relay::spawn(&status_args);
    let exit = report.wait(Duration::from_secs(30));
    let log = report.log();
    assert!(exit.success(), "status exited with {exit}:\n{log}");
    let row = log
        .lines()
        .find(|l| l.contains(&slot))
        .unwrap_or_else(|| panic!("status printed no row for slot {slot}:\n{log}"));
    assert!(
        row.split_whitespace().any(|column| column == "lost"),
        "status row of {slot} has no wal_status lost: {row}"
    );
    assert!(
        row.contains("wal_removed"),
        "status row of {slot} does not say why it was invalidated: {row}"
    );
}
