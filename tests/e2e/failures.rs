use std::time::Duration;

use crate::support::{
    self, consume, http_get, kafka, metric_value, pg, wait_for, within, Auth, Relay,
};
use crate::{assert_delivered, insert, write_events, Setup, Written};

/// The broker is unreachable while events are written: nothing is confirmed past them, and
/// once a record has waited longer than `max_event_wait_secs` the pipeline reads `degraded`
/// and `/readyz` fails; when the broker comes, everything is delivered and it is ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_lsn_waits_for_an_unreachable_broker_and_readyz_says_degraded() {
    let setup = Setup::new("outage", &["Order", "Invoice"], 2).await;
    let port = support::free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&bootstrap, Auth::Trust);
    args.extend(["--metrics-listen", &metrics, "--max-event-wait-secs", "5"].map(String::from));
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    let witness = setup.witness().await;
    let writing_began = std::time::Instant::now();
    let (written, before_commit) =
        write_events(&setup.db.client, 20, 5, &setup.types, 4, 0, Duration::ZERO).await;
    let first_commit = setup.commit_end_of(&witness, &written[0].id).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let confirmed = setup.confirmed_flush().await;
        assert!(
            confirmed < first_commit,
            "confirmed_flush_lsn {confirmed:X} reached an unacknowledged commit (ends at {first_commit:X})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The records have waited at least 10 s for a broker: the age gauge says so, and it never
    // exceeds the time since the first of them was written (however slow the machine).
    let age_series = format!(
        "outbox_relay_oldest_unacked_event_age_seconds{{pipeline=\"{}\",sink=\"kafka\"}}",
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
    let (status, body) = http_get(&metrics, "/readyz").await.expect("GET /readyz");
    let readiness: serde_json::Value = serde_json::from_str(&body).expect("/readyz JSON");
    let pipeline = &readiness["pipelines"][&setup.slot];
    assert_eq!(
        (status, pipeline["state"].as_str()),
        (503, Some("degraded")),
        "/readyz with records waiting 8 s for an unreachable broker: {body}"
    );
    assert!(
        pipeline["reason"]
            .as_str()
            .is_some_and(|r| r.contains("max_event_wait_secs = 5")),
        "{body}"
    );
    let (_, text) = http_get(&metrics, "/metrics").await.unwrap();
    let degraded = format!(
        "outbox_relay_pipeline_state{{pipeline=\"{}\",state=\"degraded\"}}",
        setup.slot
    );
    assert_eq!(metric_value(&text, &degraded), 1.0, "{text}");
    // The log says it too, once, with /readyz's reason.
    relay
        .wait_for_log("pipeline degraded", Duration::from_secs(15))
        .await;
    // librdkafka reports the refused connection at every reconnect, as a log line and as a
    // global error: each distinct line is told once (then once a minute), not every time.
    let log = relay.log();
    let loud: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("librdkafka") && (l.contains(" ERROR ") || l.contains(" WARN ")))
        .collect();
    assert!(
        (1..=3).contains(&loud.len()),
        "{} librdkafka lines at WARN or ERROR in the outage:\n{}",
        loud.len(),
        loud.join("\n")
    );

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
    wait_for(
        "/readyz to say streaming again once the broker acknowledged everything",
        Duration::from_secs(10),
        || async {
            http_get(&metrics, "/readyz")
                .await
                .filter(|(status, body)| *status == 200 && body.contains("\"streaming\""))
        },
    )
    .await;
    relay
        .wait_for_log("pipeline no longer degraded", Duration::from_secs(15))
        .await;
    let log = relay.log();
    let entered = log
        .lines()
        .filter(|l| {
            l.contains("pipeline degraded") && l.contains("for the kafka sink's acknowledgement")
        })
        .count();
    assert_eq!(entered, 1, "the degraded state is logged once:\n{log}");
    drop(relay);
}

/// A shutdown while records wait for an unreachable broker drains without saying the sink
/// takes records again: nothing was acknowledged, the pipeline only began to drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_while_degraded_does_not_log_that_the_sink_recovered() {
    let setup = Setup::new("outage_stop", &["Order"], 1).await;
    let bootstrap = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&bootstrap, Auth::Trust);
    args.extend(["--max-event-wait-secs", "1", "--shutdown-timeout-secs", "2"].map(String::from));
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    write_events(&setup.db.client, 1, 1, &setup.types, 1, 0, Duration::ZERO).await;
    relay
        .wait_for_log("pipeline degraded", Duration::from_secs(30))
        .await;
    relay.sigterm();
    let status = relay.wait(Duration::from_secs(30));
    let log = relay.log();
    assert!(status.success(), "exited with {status}:\n{log}");
    assert!(
        log.contains("draining before shutdown"),
        "no drain in the log:\n{log}"
    );
    assert!(
        !log.contains("no longer degraded"),
        "the drain was logged as a recovery:\n{log}"
    );
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
    let witness = setup.witness().await;
    let (bad, _) = write_events(&setup.db.client, 1, 1, &bad_types, 1, 1, Duration::ZERO).await;
    let bad_lsn = setup.db.change_lsn(&witness, &bad[0].id).await;
    let bad_commit_end = setup.commit_end_of(&witness, &bad[0].id).await;

    let status = relay.wait(Duration::from_secs(30));
    assert!(
        !status.success(),
        "relay must stop on an illegal topic name"
    );
    let log = relay.log();
    assert!(
        log.contains(&format!("at LSN {bad_lsn}, event {}", bad[0].id)),
        "error names the event's LSN {bad_lsn} and id {}:\n{log}",
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
        confirmed < bad_commit_end,
        "confirmed_flush_lsn {confirmed:X} reached the bad event's commit (ends at {bad_commit_end:X})"
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
    let witness = setup.witness().await;

    let client = &setup.db.client;
    let big_payload = format!(r#"{{"blob": "{}"}}"#, "x".repeat(5_000));
    client.batch_execute("BEGIN").await.unwrap();
    let big = insert(client, &t, "k1", &big_payload).await;
    client.batch_execute("COMMIT").await.unwrap();
    let big_commit_end = setup.commit_end_of(&witness, &big.id).await;
    let after_same_key = insert(client, &t, "k1", r#"{"n": 2}"#).await;
    let other_key = insert(client, &t, "k2", r#"{"n": 3}"#).await;

    let status = relay.wait(Duration::from_secs(30));
    assert!(
        !status.success(),
        "relay must halt on a record it cannot publish"
    );
    let log = relay.log();
    // max_event_bytes defaults to the producer's message.max.bytes.
    for needle in [
        big.id.as_str(),
        "more than max_event_bytes = 2000 (the default: kafka.properties message.max.bytes)",
        "bytes",
    ] {
        assert!(log.contains(needle), "the error names {needle:?}:\n{log}");
    }
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed < big_commit_end,
        "confirmed_flush_lsn {confirmed:X} reached the oversized event's commit (ends at {big_commit_end:X})"
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
    // Once delivered, the relay confirms exactly that commit: the witness named the right LSN.
    setup
        .wait_confirmed_past(
            big_commit_end - 1,
            "confirmed_flush_lsn to reach the oversized event's commit once it is delivered",
            Duration::from_secs(30),
        )
        .await;
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
        setup
            .wait_released(&format!("kill -9 in round {round}"))
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

/// The broker hangs longer than the producer's message timeout. librdkafka
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
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&broker.bootstrap(), Auth::Trust);
    args.extend(["--kafka-property", "message.timeout.ms=2000"].map(String::from));
    args.extend(["--metrics-listen".to_owned(), metrics.clone()]);
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
    let witness = setup.witness().await;
    let (during, before_commit) =
        write_events(&setup.db.client, 10, 1, &setup.types, 3, 1, Duration::ZERO).await;
    let first_commit = setup.commit_end_of(&witness, &during[0].id).await;
    written.extend(during);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        let confirmed = setup.confirmed_flush().await;
        assert!(
            confirmed < first_commit,
            "confirmed_flush_lsn {confirmed:X} reached an unacknowledged commit (ends at {first_commit:X})"
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
    // Counted as failures publishing again may mend, on the events' topic.
    let text = support::scrape_metrics(&metrics).await;
    let series = format!(
        "outbox_relay_delivery_failures_total{{pipeline=\"{}\",retryable=\"true\",sink=\"kafka\",topic=\"{}\"}}",
        setup.slot, topics[0]
    );
    assert!(metric_value(&text, &series) >= 1.0, "{series}:\n{text}");
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("outbox_relay_delivery_failures_total{")
                && l.contains("retryable=\"false\"")),
        "a timeout counted as a failure retrying cannot mend:\n{text}"
    );
}
