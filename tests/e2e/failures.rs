use std::time::Duration;

use crate::support::{
    self, consume, http_get, kafka, metric_value, parse_lsn, pg, unique_name, wait_for, within,
    Auth, Relay,
};
use crate::{assert_delivered, insert, insert_lsn, write_events, Setup, Written};

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

    let writing_began = std::time::Instant::now();
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
    // The records have waited at least 10 s for a broker: the age gauge says so, and it never
    // exceeds the time since the first of them was written (however slow the machine).
    let age_series = format!(
        "outbox_relay_oldest_unacked_event_age_seconds{{pipeline=\"{}\"}}",
        setup.slot
    );
    wait_for(
        "the oldest unacked event age to reach 8 s without a broker",
        Duration::from_secs(60),
        || async {
            let (_, text) = http_get(&metrics, "/metrics").await?;
            let age = metric_value(&text, &age_series);
            let since_write = writing_began.elapsed().as_secs_f64();
            assert!(
                age <= since_write + 1.0,
                "oldest unacked event age {age} s, but the first event was written {since_write} s ago"
            );
            (age >= 8.0).then_some(())
        },
    )
    .await;

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
    let (more, _) = within(
        "the writer's 1,000 events",
        Duration::from_secs(120),
        writer,
    )
    .await
    .unwrap();
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
    let status = relay.wait(Duration::from_secs(40));
    assert!(
        status.success(),
        "restarted relay exited with {status} after SIGTERM:\n{}",
        relay.log()
    );
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
