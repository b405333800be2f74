use std::time::Duration;

use crate::support::{self, consume, kafka, metric_sum, metric_value, pg, wait_for, Auth, Relay};
use crate::{assert_delivered, header, insert, insert_lsn, write_events, Setup, Written};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_events_arrive_once_in_order_and_the_slot_catches_up() {
    ten_thousand_events_arrive_once_in_order_and_the_slot_catches_up_on(pg()).await;
}

/// The main job on `cluster`: 10,000 events in 1,000 transactions arrive once, byte for byte, in
/// per-key order, and the slot is confirmed past the last commit.
pub(crate) async fn ten_thousand_events_arrive_once_in_order_and_the_slot_catches_up_on(
    cluster: &support::PgCluster,
) {
    let setup = Setup::new_on(cluster, "roundtrip", &["Order", "customer", "PAYMENT"], 3).await;
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.extend(["--metrics-listen".to_owned(), metrics.clone()]);
    let relay = Relay::spawn(&args);
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
    assert_counted(&setup, &metrics, 10_000, 1_000).await;
    drop(relay);
}

/// The relay's metrics after it delivered `events` in `transactions` without a failure: each
/// counted once, nothing in flight, no failure or null key counted, status updates sent, and
/// the confirmed flush LSN it reports the slot's (read until the two agree: idle progress may
/// move both in between).
async fn assert_counted(setup: &Setup, metrics: &str, events: u64, transactions: u64) {
    let pipeline = format!("{{pipeline=\"{}\"}}", setup.slot);
    let text = wait_for(
        "outbox_relay_confirmed_flush_lsn_bytes to be the slot's confirmed_flush_lsn",
        Duration::from_secs(10),
        || async {
            let text = support::scrape_metrics(metrics).await;
            let slot = setup.db.confirmed_flush_lsn_u64(&setup.slot).await?;
            let reported = metric_value(
                &text,
                &format!("outbox_relay_confirmed_flush_lsn_bytes{pipeline}"),
            );
            (reported == slot as f64).then_some(text)
        },
    )
    .await;
    let sum = |name| metric_sum(&text, name).unwrap_or(0.0);
    assert_eq!(
        sum("outbox_relay_events_published_total"),
        events as f64,
        "{text}"
    );
    assert_eq!(
        metric_value(&text, &format!("outbox_relay_transactions_total{pipeline}")),
        transactions as f64,
        "{text}"
    );
    assert_eq!(sum("outbox_relay_in_flight_events"), 0.0, "{text}");
    assert_eq!(sum("outbox_relay_in_flight_bytes"), 0.0, "{text}");
    assert_eq!(sum("outbox_relay_delivery_failures_total"), 0.0, "{text}");
    assert_eq!(sum("outbox_relay_events_null_key_total"), 0.0, "{text}");
    assert!(
        sum("outbox_relay_status_updates_sent_total") >= 1.0,
        "{text}"
    );
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
    rolled_back_work_is_never_published_and_the_lsn_moves_past_it_on(pg()).await;
}

/// Rolled-back transactions and subtransactions on `cluster` are never published.
pub(crate) async fn rolled_back_work_is_never_published_and_the_lsn_moves_past_it_on(
    cluster: &support::PgCluster,
) {
    let setup = Setup::new_on(cluster, "rollback", &["Order"], 1).await;
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
    a_100k_row_transaction_streams_through_bounded_memory_in_key_order_on(pg()).await;
}

/// A 100,000-row transaction on `cluster` streams through the in-flight limits in key order.
pub(crate) async fn a_100k_row_transaction_streams_through_bounded_memory_in_key_order_on(
    cluster: &support::PgCluster,
) {
    let setup = Setup::new_on(cluster, "bulk", &["Order"], 3).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_tombstones_headers_and_case_are_published_as_postgres_printed_them() {
    let setup = Setup::new("fidelity", &["OrderLine", "orderline"], 1).await;
    let (upper, lower) = (setup.types[0].clone(), setup.types[1].clone());
    let c = &setup.db.client;
    // A team's outbox may allow a NULL aggregate id (sql/outbox.sql does not).
    c.batch_execute("ALTER TABLE outbox ALTER COLUMN aggregate_id DROP NOT NULL")
        .await
        .unwrap();
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.extend(["--metrics-listen".to_owned(), metrics.clone()]);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;

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
    let keyless: String = c
        .query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             VALUES ($1, NULL, 'T', '{\"key\": null}') RETURNING id::text",
            &[&lower],
        )
        .await
        .unwrap()
        .get(0);

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
        2,
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(lower_topic.len(), 2, "{lower_topic:?}");
    assert_delivered(&[other], &lower_topic[..1], true);
    // A NULL aggregate id: a null key, counted, and a warning naming the event.
    assert_eq!(header(&lower_topic[1], "id"), Some(keyless.as_bytes()));
    assert_eq!(
        lower_topic[1].key, None,
        "a NULL aggregate id is a null key"
    );
    let text = support::scrape_metrics(&metrics).await;
    let series = format!(
        "outbox_relay_events_null_key_total{{pipeline=\"{}\"}}",
        setup.slot
    );
    assert_eq!(metric_value(&text, &series), 1.0, "{series}:\n{text}");
    let log = relay.log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("null key") && l.contains(&keyless)),
        "{log}"
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_messages_with_the_prefix_are_published_in_commit_order() {
    let setup = Setup::new("messages", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.extend(["--message-prefix".to_string(), "outbox".to_string()]);
    args.extend(["--metrics-listen".to_owned(), metrics.clone()]);
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
    // Without an id: the cluster's system identifier, the timeline and the LSN name it.
    c.execute(
        "SELECT pg_logical_emit_message(true, 'outbox', $1)",
        &[&format!(
            r#"{{"aggregate_type": "{t}", "aggregate_id": "k", "payload": 3}}"#
        )],
    )
    .await
    .unwrap();
    let system_id: String = c
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await
        .unwrap()
        .get(0);

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
        4,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        consumed.len(),
        4,
        "only the three committed outbox messages and the row: {consumed:?}"
    );
    let default_id = String::from_utf8_lossy(header(&consumed[3], "id").unwrap()).into_owned();
    let lsn = default_id
        .strip_prefix(&format!("pg-{system_id}-1-"))
        .unwrap_or_else(|| panic!("default id {default_id:?}, system identifier {system_id}"));
    assert!(support::parse_lsn(lsn) > 0, "{default_id}");
    assert_delivered(&expected, &consumed[..2], true);
    assert_eq!(header(&consumed[1], "via"), Some(&b"message"[..]));
    assert_eq!(header(&consumed[2], "id"), Some(&b"m-2"[..]));
    assert_eq!(consumed[2].value, None, "a null payload is a tombstone");
    assert!(
        relay.log().contains("non-transactional logical message"),
        "{}",
        relay.log()
    );
    // Each message passed over is counted by why: another prefix, not transactional.
    let text = support::scrape_metrics(&metrics).await;
    for kind in ["message", "message_non_transactional"] {
        let series = format!(
            "outbox_relay_messages_skipped_total{{kind=\"{kind}\",pipeline=\"{}\"}}",
            setup.slot
        );
        assert_eq!(metric_value(&text, &series), 1.0, "{series}:\n{text}");
    }
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
    let witness = setup.witness().await;
    let (written, _) =
        write_events(&setup.db.client, 1, 1, &setup.types, 1, 0, Duration::ZERO).await;
    let event_commit = setup.commit_end_of(&witness, &written[0].id).await;
    let start = setup.db.current_wal_insert_lsn().await;
    while setup.db.current_wal_insert_lsn().await - start < NOISE_BYTES {
        setup.db.client
            .batch_execute("INSERT INTO noise (filler) SELECT repeat(md5(g::text), 32) FROM generate_series(1, 4000) g")
            .await
            .unwrap();
    }
    let end_of_noise = setup.db.current_wal_insert_lsn().await;
    // The walsender has read past the noise (its keepalives report WAL far past the event)
    // and the relay has sent a status update since; Kafka has not acknowledged the event.
    let read_past_noise: String = wait_for(
        "the walsender to read past the WAL outside the publication",
        Duration::from_secs(120),
        || async {
            let row = setup
                .db
                .client
                .query_opt(
                    "SELECT now()::text FROM pg_stat_replication r JOIN pg_replication_slots s ON r.pid = s.active_pid
                     WHERE s.slot_name = $1 AND r.sent_lsn >= $2::text::pg_lsn",
                    &[&setup.slot, &support::pg::format_lsn(end_of_noise)],
                )
                .await
                .unwrap();
            row.map(|r| r.get(0))
        },
    )
    .await;
    wait_for(
        "a status update from the relay after the walsender read past the noise",
        Duration::from_secs(60),
        || async {
            let row = setup
                .db
                .client
                .query_opt(
                    "SELECT 1 FROM pg_stat_replication r JOIN pg_replication_slots s ON r.pid = s.active_pid
                     WHERE s.slot_name = $1 AND r.reply_time > $2::text::timestamptz",
                    &[&setup.slot, &read_past_noise],
                )
                .await
                .unwrap();
            row.map(|_| ())
        },
    )
    .await;
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed < event_commit,
        "confirmed_flush_lsn {confirmed:X} reached the unacknowledged event's commit (ends at {event_commit:X})"
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
