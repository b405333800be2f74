use std::collections::HashMap;
use std::time::Duration;

use super::{assert_delivered, id_of, payload, write_events, Setup};
use crate::insert;
use crate::support::{self, consume, http_get, kafka, metric_sum, pg, wait_for, Auth, Relay};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_broker_outage_keeps_rows_pending_with_backed_off_retries_then_delivers() {
    let setup = Setup::new("poll_outage", &["Order", "Invoice"], 2).await;
    let port = support::free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    // Each retry as the server saw it: when the server began executing its UPDATE
    // (statement_timestamp()) and the next_retry_at it set. The relay computes next_retry_at
    // from the clock while the UPDATE runs, which is never before that and at most the
    // executor's time to reach the row after it; an AFTER trigger's own clock is later by an
    // amount a busy server makes large.
    setup
        .db
        .client
        .batch_execute(
            "CREATE TABLE retry_history (id uuid, retry_count int, marked_at timestamptz, next_retry_at timestamptz);
             -- Qualified: the relay runs with a search_path of its own.
             CREATE FUNCTION record_retry() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.retry_count IS DISTINCT FROM OLD.retry_count THEN
                 INSERT INTO public.retry_history VALUES (NEW.id, NEW.retry_count, statement_timestamp(), NEW.next_retry_at);
               END IF;
               RETURN NULL;
             END $$;
             CREATE TRIGGER record_retry AFTER UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION record_retry();",
        )
        .await
        .unwrap();
    let relay = Relay::spawn(&setup.relay_args(
        "poller",
        &bootstrap,
        "retry_min_ms = 500\nretry_max_ms = 2000\nmax_attempts = 1000\nmin_interval_ms = 5\nmax_interval_ms = 100",
        "\"message.timeout.ms\" = \"1000\"",
        None,
    ));
    let written = write_events(&setup.db.client, 10, 4, &setup.types, 3).await;

    // Attempts: at 0 s (fails at ~1 s), then after 0.5 s, 1 s, 2 s, 2 s ... each taking 1 s
    // to time out. Without backoff (polls every 5-100 ms) a row would be retried before it is
    // due, or be due at once.
    let outage = std::time::Instant::now();
    wait_for(
        "rows to be retried four times",
        Duration::from_secs(90),
        || async {
            let n: i32 = setup
                .db
                .query_one_value("SELECT min(retry_count) FROM outbox")
                .await;
            (n >= 4).then_some(())
        },
    )
    .await;
    let max_retries: i32 = setup
        .db
        .query_one_value("SELECT max(retry_count) FROM outbox")
        .await;
    eprintln!(
        "{max_retries} attempts in {:.1} s of outage",
        outage.elapsed().as_secs_f64()
    );
    // Per row and retry: the delay until the next attempt is retry_min_ms doubled per earlier
    // retry, at most retry_max_ms (500, 1000, 2000, 2000 ... ms), plus at most the time the
    // UPDATE took to reach the row (SLACK_MS, generous for a busy machine and far below the
    // 500 ms steps), and no attempt came before the row was due.
    const SLACK_MS: f64 = 250.0;
    let backoff = setup
        .db
        .client
        .query_one(
            "WITH h AS (
               SELECT id, retry_count, marked_at, next_retry_at,
                      extract(epoch FROM next_retry_at - marked_at)::float8 * 1000 AS delay_ms,
                      least(500 * power(2, retry_count - 1), 2000)::float8 AS backoff_ms,
                      lag(next_retry_at) OVER (PARTITION BY id ORDER BY retry_count) AS previous_due
               FROM retry_history),
             wrong AS (
               SELECT *, delay_ms IS NULL OR delay_ms < backoff_ms OR delay_ms > backoff_ms + $1 AS off_backoff,
                         marked_at < previous_due AS early
               FROM h)
             SELECT count(*),
                    count(*) FILTER (WHERE off_backoff),
                    count(*) FILTER (WHERE early),
                    coalesce(string_agg(format('%s #%s marked %s due %s (%s ms, backoff %s ms)',
                                               id, retry_count, marked_at, next_retry_at,
                                               round(delay_ms::numeric, 1), backoff_ms), '; ')
                      FILTER (WHERE off_backoff OR early), '')
             FROM wrong",
            &[&SLACK_MS],
        )
        .await
        .unwrap();
    let (retries, off_backoff, early, offenders): (i64, i64, i64, String) = (
        backoff.get(0),
        backoff.get(1),
        backoff.get(2),
        backoff.get(3),
    );
    assert!(retries >= 40 * 4, "{retries} retries recorded for 40 rows");
    assert_eq!(
        (off_backoff, early),
        (0, 0),
        "retries do not back off (delays other than 500, 1000, 2000, 2000 ... ms; attempts before due): {offenders}"
    );
    let statuses = setup.statuses().await;
    assert_eq!(
        statuses.get("PENDING"),
        Some(&40),
        "every row stays pending: {statuses:?}"
    );
    let future: i64 = setup
        .db
        .query_one_value("SELECT count(*) FROM outbox WHERE next_retry_at IS NOT NULL")
        .await;
    assert_eq!(future, 40, "every row has a next_retry_at");

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
    assert_eq!(
        assert_delivered(&written, &consumed, 1),
        0,
        "nothing was delivered twice"
    );
    wait_for(
        "every row to be marked PUBLISHED",
        Duration::from_secs(30),
        || async { (setup.statuses().await.get("PUBLISHED") == Some(&40)).then_some(()) },
    )
    .await;
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_poison_event_is_failed_at_once_its_aggregate_waits_and_others_flow() {
    let mut setup = Setup::new("poll_poison", &["Order", "Invoice"], 2).await;
    // Above the producer's limit: the record reaches Kafka's refusal.
    setup.pipeline_keys = "max_event_bytes = 100000".into();
    let (order, invoice) = (setup.types[0].clone(), setup.types[1].clone());
    let listen = format!("127.0.0.1:{}", support::free_port());
    let mut relay = Relay::spawn(&setup.relay_args(
        "poller",
        &kafka().bootstrap(),
        "max_attempts = 3\nstats_interval_ms = 100\npurge_published_after_secs = 1\npurge_interval_secs = 1",
        "\"message.max.bytes\" = \"10000\"",
        Some(&listen),
    ));
    let client = &setup.db.client;
    let before = insert(client, &order, "k1", r#"{"n": 0}"#).await;
    let poison = insert(
        client,
        &order,
        "k1",
        &format!(r#"{{"blob": "{}"}}"#, "x".repeat(20_000)),
    )
    .await;
    let behind = insert(client, &order, "k1", r#"{"n": 2}"#).await;
    let mut flowing = vec![before.clone()];
    for n in 0..20 {
        flowing.push(insert(client, &invoice, &format!("k{}", n % 4), &payload(n)).await);
        flowing.push(insert(client, &order, "k2", &payload(n)).await);
    }

    let consumed = setup
        .consume_all(
            flowing.len(),
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(assert_delivered(&flowing, &consumed, 1), 0);
    assert!(
        consumed
            .iter()
            .all(|r| id_of(r) != behind.id && id_of(r) != poison.id),
        "neither the poison event nor the event behind it was published"
    );
    wait_for(
        "the poison event to be FAILED",
        Duration::from_secs(30),
        || async { (setup.status_of(&poison.id).await.0 == "FAILED").then_some(()) },
    )
    .await;
    // Not retryable: FAILED at the first attempt, not after max_attempts.
    assert_eq!(setup.status_of(&poison.id).await, ("FAILED".to_string(), 1));
    assert_eq!(
        setup.status_of(&behind.id).await,
        ("PENDING".to_string(), 0),
        "the next event of k1 waits behind the failed one"
    );
    let log = relay.log();
    assert!(
        log.lines().any(|l| l.contains(&poison.id)
            && l.contains("FAILED")
            && l.contains("message.max.bytes = 10000")),
        "the log names the failed event and the reason:\n{log}"
    );
    wait_for(
        "the gauges and the purge",
        Duration::from_secs(30),
        || async {
            let text = http_get(&listen, "/metrics").await.map(|(_, body)| body)?;
            let ok = metric_sum(&text, "outbox_relay_failed_rows") == Some(1.0)
                && metric_sum(&text, "outbox_relay_pending_rows") == Some(1.0)
                && metric_sum(&text, "outbox_relay_oldest_pending_age_seconds")
                    .is_some_and(|s| s > 0.0)
                && metric_sum(&text, "outbox_relay_events_failed_total") == Some(1.0)
                && metric_sum(&text, "outbox_relay_rows_purged_total").is_some_and(|n| n >= 41.0);
            ok.then_some(())
        },
    )
    .await;
    let statuses = setup.statuses().await;
    assert_eq!(
        statuses,
        HashMap::from([("FAILED".to_string(), 1), ("PENDING".to_string(), 1)]),
        "published rows purged; the failed and the waiting one kept"
    );

    // The operator removes the poison event: its aggregate moves on.
    client
        .execute(
            "DELETE FROM outbox WHERE id = $1::text::uuid",
            &[&poison.id],
        )
        .await
        .unwrap();
    let consumed = setup
        .consume_all(
            flowing.len() + 1,
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
        .await;
    assert!(consumed.iter().any(|r| id_of(r) == behind.id));
    assert!(
        relay.is_running(),
        "a FAILED event does not stop the pipeline"
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_retryable_failures_end_failed_after_max_attempts() {
    let setup = Setup::new("poll_attempts", &["Order"], 1).await;
    let bootstrap = format!("127.0.0.1:{}", support::free_port());
    let relay = Relay::spawn(&setup.relay_args(
        "poller",
        &bootstrap,
        "max_attempts = 2\nretry_min_ms = 200\nretry_max_ms = 200",
        "\"message.timeout.ms\" = \"500\"",
        None,
    ));
    let first = insert(&setup.db.client, &setup.types[0], "k1", r#"{"n": 1}"#).await;
    let second = insert(&setup.db.client, &setup.types[0], "k2", r#"{"n": 2}"#).await;
    for w in [&first, &second] {
        wait_for(
            "the event to be FAILED",
            Duration::from_secs(30),
            || async { (setup.status_of(&w.id).await.0 == "FAILED").then_some(()) },
        )
        .await;
        assert_eq!(setup.status_of(&w.id).await, ("FAILED".to_string(), 2));
    }
    let log = relay.log();
    assert!(
        log.lines()
            .any(|l| l.contains(&first.id) && l.contains("FAILED after its last attempt")),
        "{log}"
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_kill_9_between_publish_and_mark_duplicates_only_that_batch() {
    let setup = Setup::new("poll_kill", &["Order"], 3).await;
    let t = setup.types[0].clone();
    let client = &setup.db.client;
    // Marking waits while the test holds advisory lock 7: the pollers publish their batch,
    // then block before their UPDATE can commit.
    client
        .batch_execute(
            "CREATE FUNCTION hold_marks() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_advisory_lock_shared(7); PERFORM pg_advisory_unlock_shared(7); RETURN NULL; END $$;
             CREATE TRIGGER hold_marks BEFORE UPDATE ON outbox FOR EACH STATEMENT EXECUTE FUNCTION hold_marks();",
        )
        .await
        .unwrap();
    let holder = pg().connect(&setup.db.name, Auth::Trust).await;
    holder
        .batch_execute("SELECT pg_advisory_lock(7)")
        .await
        .unwrap();
    let mut written = Vec::new();
    for n in 0..300 {
        written.push(insert(client, &t, &format!("k{}", n % 10), &payload(n)).await);
    }

    let polling = "batch_size = 50";
    let mut relays: Vec<Relay> = ["poller_a", "poller_b"]
        .iter()
        .map(|name| Relay::spawn(&setup.relay_args(name, &kafka().bootstrap(), polling, "", None)))
        .collect();
    // The poller that got the first batch published it and now waits to mark it (the other
    // one finds every aggregate's next event behind that batch).
    let waiting: String = wait_for("a poller to publish a batch and wait to mark it", Duration::from_secs(60), || async {
        client
            .query_opt(
                "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'poller_%' AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
                &[],
            )
            .await
            .unwrap()
            .map(|r| r.get(0))
    })
    .await;
    // What the blocked poller(s) published: normally the first 50 rows, all from the poller
    // that locked them (the other one finds every aggregate's next row behind them).
    let before_kill: std::collections::HashSet<String> = consume(
        &kafka().bootstrap(),
        &[&format!("{t}.events")],
        1,
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
    .await
    .iter()
    .map(id_of)
    .collect();
    let mut killed = relays.remove(if waiting == "poller_a" { 0 } else { 1 });
    killed.kill();
    holder
        .batch_execute("SELECT pg_advisory_unlock(7)")
        .await
        .unwrap();

    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(3),
            Duration::from_secs(120),
        )
        .await;
    let duplicates = assert_delivered(&written, &consumed, 2);
    let mut copies: HashMap<String, usize> = HashMap::new();
    for record in &consumed {
        *copies.entry(id_of(record)).or_default() += 1;
    }
    let duplicated: Vec<&String> = copies
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| id)
        .collect();
    eprintln!(
        "{waiting} killed; {} records published before the kill, {duplicates} duplicates",
        before_kill.len()
    );
    assert!(
        (1..=50).contains(&duplicates),
        "the killed poller's batch (at most 50 events) is published again: {duplicates} duplicates"
    );
    assert!(
        duplicated.iter().all(|id| before_kill.contains(*id)),
        "only events published before the kill and never marked are published again"
    );
    wait_for(
        "every row to be marked PUBLISHED",
        Duration::from_secs(30),
        || async { (setup.statuses().await.get("PUBLISHED") == Some(&300)).then_some(()) },
    )
    .await;
    drop(relays);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_bad_input_halts_naming_the_event_after_marking_what_went_before() {
    let setup = Setup::new("poll_bad", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let client = &setup.db.client;
    let good = insert(client, &t, "k1", r#"{"n": 1}"#).await;
    let bad = insert(client, "not a topic", "k2", r#"{"n": 2}"#).await;
    let after = insert(client, &t, "k3", r#"{"n": 3}"#).await;
    let mut relay = Relay::spawn(&setup.relay_args("poller", &kafka().bootstrap(), "", "", None));
    let status = relay.wait(Duration::from_secs(30));
    assert!(!status.success(), "bad input stops the pipeline");
    let log = relay.log();
    assert!(
        log.contains(&bad.id) && log.contains("not a topic"),
        "the error names the event:\n{log}"
    );
    // A polled row has no LSN: none is named (0/0 would be a wrong one).
    assert!(
        !log.contains("LSN 0/0"),
        "a polled row named at LSN 0/0:\n{log}"
    );
    assert_eq!(
        setup.status_of(&good.id).await.0,
        "PUBLISHED",
        "what was acknowledged before is marked"
    );
    assert_eq!(
        setup.status_of(&bad.id).await.0,
        "PENDING",
        "the bad event is not skipped"
    );
    assert_eq!(setup.status_of(&after.id).await.0, "PENDING");
    let consumed = setup
        .consume_all(1, Duration::from_secs(1), Duration::from_secs(30))
        .await;
    assert_eq!(consumed.len(), 1);
    assert_eq!(id_of(&consumed[0]), good.id);
}

/// `on_bad_event = "dead_letter"` with the polling source: the bad row goes to the
/// dead-letter topic and is marked, the rows after it flow, and the warning names the event
/// but no LSN (a polled row has none; it said `lsn=0/0`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_bad_input_is_dead_lettered_and_marked() {
    let mut setup = Setup::new("poll_dlq", &["Order"], 1).await;
    let dlq = format!("{}.dlq", setup.name);
    kafka().create_topic(&dlq, 1);
    setup.pipeline_keys = format!("on_bad_event = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"");
    let t = setup.types[0].clone();
    let client = &setup.db.client;
    let good = insert(client, &t, "k1", r#"{"n": 1}"#).await;
    let bad = insert(client, "not a topic", "k2", r#"{"n": 2}"#).await;
    let after = insert(client, &t, "k3", r#"{"n": 3}"#).await;
    let relay = Relay::spawn(&setup.relay_args("poller", &kafka().bootstrap(), "", "", None));

    let dead = consume(
        &kafka().bootstrap(),
        &[&dlq],
        1,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(dead.len(), 1, "one record in the dead-letter topic");
    assert_eq!(id_of(&dead[0]), bad.id);
    let document: serde_json::Value =
        serde_json::from_slice(dead[0].value.as_deref().expect("the copy's document")).unwrap();
    assert_eq!(
        document["value"], r#"{"n": 2}"#,
        "the raw payload: {document}"
    );
    let consumed = setup
        .consume_all(2, Duration::from_secs(1), Duration::from_secs(30))
        .await;
    let ids: Vec<String> = consumed.iter().map(id_of).collect();
    assert_eq!(ids, [good.id.clone(), after.id.clone()]);
    for row in [&good, &bad, &after] {
        wait_for(
            "every row marked PUBLISHED",
            Duration::from_secs(30),
            || async { (setup.status_of(&row.id).await.0 == "PUBLISHED").then_some(()) },
        )
        .await;
    }
    let log = relay.log();
    let warning = log
        .lines()
        .find(|l| l.contains("dead-letter topic") && l.contains(&bad.id))
        .unwrap_or_else(|| panic!("a warning names the dead-lettered event:\n{log}"));
    assert!(
        !warning.contains("lsn="),
        "a polled row has no LSN to name: {warning}"
    );
}

/// A partitioned outbox table, or a view, is refused with a reason, by `check` and at start:
/// rows are marked by ctid, which the partitions repeat, so a mark would also hit another
/// partition's row at the same place (published without being sent, or deleted); a view has
/// none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_refuses_a_partitioned_outbox_naming_why() {
    let setup = Setup::new("poll_parts", &["Order"], 1).await;
    setup
        .db
        .client
        .batch_execute(
            "CREATE TABLE outbox_parts (LIKE outbox INCLUDING DEFAULTS) PARTITION BY LIST (aggregate_type);
             CREATE TABLE outbox_parts_rest PARTITION OF outbox_parts DEFAULT;
             CREATE VIEW outbox_view AS SELECT * FROM outbox;",
        )
        .await
        .unwrap();
    let bootstrap = kafka().bootstrap();
    for (table, command, says) in [
        ("public.outbox_parts", "check", "is not a plain table"),
        ("public.outbox_parts", "run", "is not a plain table"),
        ("public.outbox_view", "check", "is not a plain table"),
        ("public.outbox_gone", "run", "does not exist"),
    ] {
        let mut args = setup.relay_args_for(table, "parts", &bootstrap, "", "", None);
        args = crate::as_command(&args, command);
        let mut relay = Relay::spawn(&args);
        let status = relay.wait(Duration::from_secs(60));
        let log = relay.log();
        assert!(!status.success(), "{command} passed {table}:\n{log}");
        if command == "run" {
            // What the database is set up with: the configuration exit code, as for log tailing.
            assert_eq!(status.code(), Some(3), "{command} {table}:\n{log}");
        }
        assert!(
            log.contains(says),
            "{command} names why:\n{}",
            support::tail_lines(&log, 20)
        );
    }
}

/// Rows held behind a FAILED predecessor do not fill the batch: with `batch_size = 2`, one
/// aggregate's first event FAILED and two more behind it, another aggregate's later event is
/// still published (the held rows were taken by the LIMIT first, every cycle).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_behind_a_failed_event_do_not_keep_other_aggregates_out_of_the_batch() {
    let setup = Setup::new("poll_held", &["Order"], 1).await;
    let (client, order) = (&setup.db.client, &setup.types[0]);
    let x1 = insert(client, order, "x", r#"{"n": 1}"#).await;
    client
        .execute(
            "UPDATE outbox SET status = 'FAILED' WHERE id = $1::text::uuid",
            &[&x1.id],
        )
        .await
        .unwrap();
    let x2 = insert(client, order, "x", r#"{"n": 2}"#).await;
    let x3 = insert(client, order, "x", r#"{"n": 3}"#).await;
    let y1 = insert(client, order, "y", r#"{"n": 1}"#).await;
    let bootstrap = kafka().bootstrap();
    let relay = Relay::spawn(&setup.relay_args(
        "poller",
        &bootstrap,
        "batch_size = 2\nmin_interval_ms = 5\nmax_interval_ms = 100",
        "",
        None,
    ));
    wait_for(
        "the other aggregate's event to be published",
        Duration::from_secs(30),
        || async { (setup.status_of(&y1.id).await.0 == "PUBLISHED").then_some(()) },
    )
    .await;
    for held in [&x2, &x3] {
        assert_eq!(
            setup.status_of(&held.id).await.0,
            "PENDING",
            "an event behind the FAILED one was published"
        );
    }
    let consumed = setup
        .consume_all(1, Duration::from_secs(1), Duration::from_secs(30))
        .await;
    assert_eq!(
        consumed.iter().map(id_of).collect::<Vec<_>>(),
        std::slice::from_ref(&y1.id)
    );
    drop(relay);
}

/// A row over `max_event_bytes` leaves the server as a reference: dead-lettered with its id,
/// key, aggregate type and size and no payload, marked, and the rows after it flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_a_row_over_max_event_bytes_is_dead_lettered_as_a_reference_and_marked() {
    let mut setup = Setup::new("poll_big", &["Order"], 1).await;
    let dlq = format!("{}.dlq", setup.name);
    kafka().create_topic(&dlq, 1);
    setup.pipeline_keys = format!(
        "max_event_bytes = 2000\non_bad_event = \"dead_letter\"\ndead_letter_topic = \"{dlq}\""
    );
    let t = setup.types[0].clone();
    let client = &setup.db.client;
    let big = insert(
        client,
        &t,
        "k1",
        &format!(r#"{{"blob": "{}"}}"#, "x".repeat(5_000)),
    )
    .await;
    let after = insert(client, &t, "k1", r#"{"n": 2}"#).await;
    let bytes: i32 = client
        .query_one(
            "SELECT octet_length(id::text) + octet_length(aggregate_type) + octet_length(aggregate_id)
                    + octet_length(event_type) + octet_length(payload::text) + octet_length(headers::text)
             FROM outbox WHERE id = $1::text::uuid",
            &[&big.id],
        )
        .await
        .unwrap()
        .get(0);
    let relay = Relay::spawn(&setup.relay_args("poller", &kafka().bootstrap(), "", "", None));

    let dead = consume(
        &kafka().bootstrap(),
        &[&dlq],
        1,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(dead.len(), 1, "one reference in the dead-letter topic");
    assert_eq!(id_of(&dead[0]), big.id);
    let document: serde_json::Value =
        serde_json::from_slice(dead[0].value.as_deref().expect("the reference")).unwrap();
    assert_eq!(document["key"].as_str(), Some("k1"), "{document}");
    assert_eq!(document["aggregate_type"].as_str(), Some(t.as_str()));
    assert_eq!(
        document["bytes"].as_i64(),
        Some(i64::from(bytes)),
        "{document}"
    );
    assert!(
        document.get("value").is_none() && document.get("lsn").is_none(),
        "no payload, and no LSN for a polled row: {document}"
    );
    let consumed = setup
        .consume_all(1, Duration::from_secs(1), Duration::from_secs(30))
        .await;
    let ids: Vec<String> = consumed.iter().map(id_of).collect();
    assert_eq!(ids, std::slice::from_ref(&after.id));
    for row in [&big, &after] {
        wait_for(
            "both rows marked PUBLISHED",
            Duration::from_secs(30),
            || async { (setup.status_of(&row.id).await.0 == "PUBLISHED").then_some(()) },
        )
        .await;
    }
    drop(relay);
}

/// A database whose encoding (`SQL_ASCII`) stores text as any bytes.
const SQL_ASCII: &str = "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0";

/// Inserts a pending row whose event type is `Caf` and the byte 0xe9 (Latin-1's é, not
/// UTF-8); returns its id.
async fn insert_latin1(setup: &Setup, aggregate_type: &str) -> String {
    setup
        .db
        .client
        .query_one(
            r"INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
              VALUES ($1, 'k1', E'Caf\xe9', '{}') RETURNING id::text",
            &[&aggregate_type],
        )
        .await
        .unwrap()
        .get(0)
}

/// From a `SQL_ASCII` database, a pending row with text that is not UTF-8 stops the poller
/// with an error naming the row's id, the table, the column and the fix: not retried
/// forever, and nothing marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_text_that_is_not_utf8_halts_naming_the_row_the_column_and_the_fix() {
    let setup = Setup::new_with("poll_ascii", &["Order"], 1, SQL_ASCII).await;
    let t = setup.types[0].clone();
    let bad = insert_latin1(&setup, &t).await;
    let mut relay = Relay::spawn(&setup.relay_args("poller", &kafka().bootstrap(), "", "", None));
    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert_eq!(status.code(), Some(4), "stopped, not retried:\n{log}");
    let error = log
        .lines()
        .find(|line| {
            line.contains(&format!(
                "event {bad}: column \"event_type\" of public.outbox is not valid UTF-8"
            ))
        })
        .unwrap_or_else(|| panic!("no error naming the row, the table and the column:\n{log}"));
    assert!(
        error.contains("ENCODING 'UTF8'") && error.contains("bytea"),
        "the error names the fix: {error}"
    );
    assert_eq!(
        setup.status_of(&bad).await.0,
        "PENDING",
        "nothing is marked"
    );
}

/// A role that may read the outbox rows but not mark them (no UPDATE): the start stops with
/// exit code 4 and the GRANT `check` prints, instead of failing the first cycle with the
/// server's bare "permission denied".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_without_update_privilege_stops_at_start_with_checks_grant() {
    let setup = Setup::new("poll_grant", &["Order"], 1).await;
    let role = format!("{}_reader", setup.name);
    setup
        .db
        .client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT SELECT ON public.outbox TO {role}"
        ))
        .await
        .unwrap();
    let args = setup.relay_args("poller", &kafka().bootstrap(), "", "", None);
    let path = &args[2];
    let toml = std::fs::read_to_string(path).unwrap().replace(
        &setup.db.url(Auth::Trust),
        &format!(
            "postgres://{role}@127.0.0.1:{}/{}",
            setup.db.port(),
            setup.name
        ),
    );
    std::fs::write(path, toml).unwrap();
    let sentence = format!(
        "role \"{role}\" may not read and mark the rows of public.outbox (mark = \"status\"): GRANT UPDATE ON \"public\".\"outbox\" TO \"{role}\""
    );
    let mut relay = Relay::spawn(&args);
    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert_eq!(status.code(), Some(4), "stopped, not retried:\n{log}");
    assert!(log.contains(&sentence), "{log}");
    let mut check_args = args.clone();
    check_args = crate::as_command(&check_args, "check");
    let mut check = Relay::spawn(&check_args);
    assert!(!check.wait(Duration::from_secs(60)).success());
    assert!(check.log().contains(&sentence), "{}", check.log());
}

/// With `on_bad_event = "dead_letter"`, such a row is dead-lettered (its values as they are
/// stored, the error naming its column) and marked, and the rows after it flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_text_that_is_not_utf8_is_dead_lettered_and_the_next_row_flows() {
    let mut setup = Setup::new_with("poll_ascii_dlq", &["Order"], 1, SQL_ASCII).await;
    let dlq = format!("{}.dlq", setup.name);
    kafka().create_topic(&dlq, 1);
    setup.pipeline_keys = format!("on_bad_event = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"");
    let t = setup.types[0].clone();
    let bad = insert_latin1(&setup, &t).await;
    let after = insert(&setup.db.client, &t, "k1", r#"{"n": 2}"#).await;
    let relay = Relay::spawn(&setup.relay_args("poller", &kafka().bootstrap(), "", "", None));

    let dead = consume(
        &kafka().bootstrap(),
        &[&dlq],
        1,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(dead.len(), 1, "one copy in the dead-letter topic");
    assert_eq!(id_of(&dead[0]), bad);
    let document: serde_json::Value =
        serde_json::from_slice(dead[0].value.as_deref().expect("the copy's document")).unwrap();
    assert!(
        document["error"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!(
                "event {bad}: column \"event_type\" of public.outbox is not valid UTF-8"
            )),
        "{document}"
    );
    let consumed = setup
        .consume_all(1, Duration::from_secs(1), Duration::from_secs(30))
        .await;
    let ids: Vec<String> = consumed.iter().map(id_of).collect();
    assert_eq!(ids, std::slice::from_ref(&after.id));
    for id in [&bad, &after.id] {
        wait_for(
            "both rows marked PUBLISHED",
            Duration::from_secs(30),
            || async { (setup.status_of(id).await.0 == "PUBLISHED").then_some(()) },
        )
        .await;
    }
    drop(relay);
}
