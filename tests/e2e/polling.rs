use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::{
    self, consume, http_get, kafka, metric_sum, pg, unique_name, wait_for, within, Auth, Consumed,
    Relay, TestDb, QUERY_DEADLINE,
};
use crate::{insert, Written};

/// A test's database (polling schema), topics, and config files for its relays.
struct Setup {
    db: TestDb,
    name: String,
    types: Vec<String>,
    dir: tempfile::TempDir,
}

impl Setup {
    async fn new(prefix: &str, types: &[&str], partitions: i32) -> Setup {
        let name = unique_name(prefix);
        let db = pg().create_database(&name).await;
        // create_database applies the log-tailing sql/outbox.sql; replace its table.
        let kit = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sql/outbox_polling.sql"),
        )
        .unwrap();
        db.client
            .batch_execute("DROP PUBLICATION outbox_pub; DROP TABLE outbox;")
            .await
            .unwrap();
        db.client.batch_execute(&kit).await.unwrap();
        let types: Vec<String> = types.iter().map(|t| format!("{t}_{name}")).collect();
        for t in &types {
            kafka().create_topic(&format!("{t}.events"), partitions);
        }
        Setup {
            db,
            name,
            types,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn topics(&self) -> Vec<String> {
        self.types.iter().map(|t| format!("{t}.events")).collect()
    }

    /// Writes a config file for one polling relay and returns the `run` arguments, with
    /// metrics on `metrics` when given. `polling` and `kafka_properties` are TOML lines.
    fn relay_args(
        &self,
        relay: &str,
        bootstrap: &str,
        polling: &str,
        kafka_properties: &str,
        metrics: Option<&str>,
    ) -> Vec<String> {
        self.relay_args_for(
            "public.outbox",
            relay,
            bootstrap,
            polling,
            kafka_properties,
            metrics,
        )
    }

    /// [`Setup::relay_args`] for another outbox table.
    fn relay_args_for(
        &self,
        table: &str,
        relay: &str,
        bootstrap: &str,
        polling: &str,
        kafka_properties: &str,
        metrics: Option<&str>,
    ) -> Vec<String> {
        let url = format!("{}?application_name={relay}", self.db.url(Auth::Trust));
        let path = self.dir.path().join(format!("{relay}.toml"));
        std::fs::write(
            &path,
            format!(
                r#"
[kafka]
bootstrap_servers = "{bootstrap}"
[kafka.properties]
{kafka_properties}

[[pipelines]]
name = "{name}"
source_url = "{url}"
source_kind = "polling"
table = "{table}"
shutdown_timeout_secs = 5
[pipelines.polling]
{polling}
"#,
                name = self.name
            ),
        )
        .unwrap();
        let mut args = vec![
            "run".to_string(),
            "--config".to_string(),
            path.display().to_string(),
        ];
        if let Some(listen) = metrics {
            args.extend(["--metrics-listen".to_string(), listen.to_string()]);
        }
        args
    }

    async fn consume_all(
        &self,
        expected: usize,
        settle: Duration,
        deadline: Duration,
    ) -> Vec<Consumed> {
        let topics = self.topics();
        let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
        consume(&kafka().bootstrap(), &topics, expected, settle, deadline).await
    }

    /// Rows by status.
    async fn statuses(&self) -> HashMap<String, i64> {
        self.db
            .client
            .query("SELECT status, count(*) FROM outbox GROUP BY status", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    async fn status_of(&self, id: &str) -> (String, i32) {
        let row = self
            .db
            .client
            .query_one(
                "SELECT status, retry_count FROM outbox WHERE id = $1::text::uuid",
                &[&id],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }
}

/// A payload with many digits, unicode and escapes (plainer than the log-tailing suite's).
fn payload(n: usize) -> String {
    format!(r#"{{"n": {n}, "amount": 1234567890.12345678901234567890, "s": "é😀 \"q\" {n}"}}"#)
}

/// `txns` transactions of `per_txn` events, cycling through `types` and `keys` ids per type.
async fn write_events(
    client: &tokio_postgres::Client,
    txns: usize,
    per_txn: usize,
    types: &[String],
    keys: usize,
) -> Vec<Written> {
    let mut written = Vec::with_capacity(txns * per_txn);
    for t in 0..txns {
        within(
            "BEGIN of a writer's transaction",
            QUERY_DEADLINE,
            client.batch_execute("BEGIN"),
        )
        .await
        .unwrap();
        for e in 0..per_txn {
            let n = t * per_txn + e;
            let aggregate_type = &types[n % types.len()];
            let aggregate_id = format!("k{}", (n / types.len()) % keys);
            written.push(insert(client, aggregate_type, &aggregate_id, &payload(n)).await);
        }
        within(
            "COMMIT of a writer's transaction",
            QUERY_DEADLINE,
            client.batch_execute("COMMIT"),
        )
        .await
        .unwrap();
    }
    written
}

fn id_of(record: &Consumed) -> String {
    record.header_str("id").expect("id header")
}

/// Every written event arrived (at most `max_copies` times each), in its topic with its key
/// and value byte for byte, and per key the first arrivals are in write order. Returns the
/// number of records beyond the first copy of each event.
fn assert_delivered(written: &[Written], consumed: &[Consumed], max_copies: usize) -> usize {
    let by_id: HashMap<&str, &Written> = written.iter().map(|w| (w.id.as_str(), w)).collect();
    let mut copies: HashMap<String, usize> = HashMap::new();
    let mut first_order: HashMap<(String, String), Vec<String>> = HashMap::new();
    for record in consumed {
        let id = id_of(record);
        let w = by_id
            .get(id.as_str())
            .unwrap_or_else(|| panic!("record with unknown id {id} in {}", record.topic));
        assert_eq!(
            record.topic,
            format!("{}.events", w.aggregate_type),
            "topic of {id}"
        );
        assert_eq!(
            record.key_str().as_deref(),
            Some(w.aggregate_id.as_str()),
            "key of {id}"
        );
        assert_eq!(
            record.value_str().as_deref(),
            Some(w.payload.as_str()),
            "value of {id}"
        );
        let n = copies.entry(id.clone()).or_default();
        *n += 1;
        if *n == 1 {
            first_order
                .entry((w.aggregate_type.clone(), w.aggregate_id.clone()))
                .or_default()
                .push(id);
        }
    }
    let missing: Vec<&str> = written
        .iter()
        .filter(|w| !copies.contains_key(&w.id))
        .map(|w| w.id.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} events never arrived, e.g. {:?}",
        missing.len(),
        written.len(),
        &missing[..missing.len().min(3)]
    );
    let too_many: Vec<_> = copies.iter().filter(|(_, n)| **n > max_copies).collect();
    assert!(
        too_many.is_empty(),
        "{} events arrived more than {max_copies} time(s), e.g. {:?}",
        too_many.len(),
        too_many.first()
    );
    let mut expected: HashMap<(String, String), Vec<String>> = HashMap::new();
    for w in written {
        expected
            .entry((w.aggregate_type.clone(), w.aggregate_id.clone()))
            .or_default()
            .push(w.id.clone());
    }
    for (key, ids) in &expected {
        assert_eq!(
            first_order.get(key),
            Some(ids),
            "order of events for {key:?}"
        );
    }
    consumed.len() - copies.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_two_pollers_publish_ten_thousand_events_once_in_key_order() {
    let setup = Setup::new("poll_two", &["Order", "customer", "PAYMENT"], 3).await;
    let listen = [
        format!("127.0.0.1:{}", support::free_port()),
        format!("127.0.0.1:{}", support::free_port()),
    ];
    let polling = "batch_size = 200\nnotify_channel = \"outbox_relay\"";
    let relays: Vec<Relay> = ["poller_a", "poller_b"]
        .iter()
        .zip(&listen)
        .map(|(name, addr)| {
            Relay::spawn(&setup.relay_args(name, &kafka().bootstrap(), polling, "", Some(addr)))
        })
        .collect();
    let started = std::time::Instant::now();
    let written = write_events(&setup.db.client, 1_000, 10, &setup.types, 25).await;
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(3),
            Duration::from_secs(180),
        )
        .await;
    eprintln!(
        "10,000 events written and consumed through two pollers in {:?}",
        started.elapsed()
    );
    assert_eq!(assert_delivered(&written, &consumed, 1), 0, "no duplicates");
    assert_eq!(consumed.len(), written.len());
    wait_for(
        "every row to be marked PUBLISHED",
        Duration::from_secs(30),
        || async {
            let statuses = setup.statuses().await;
            (statuses.get("PUBLISHED") == Some(&10_000) && statuses.len() == 1).then_some(())
        },
    )
    .await;
    let unset: i64 = setup
        .db
        .query_one_value("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        .await;
    assert_eq!(unset, 0, "published_at is set on every published row");
    // Both pollers took part: the order check did not serialise everything onto one.
    let mut per_poller = Vec::new();
    for addr in &listen {
        let text = http_get(addr, "/metrics")
            .await
            .map(|(_, body)| body)
            .expect("metrics endpoint answers");
        let published = metric_sum(&text, "outbox_relay_events_published_total").unwrap_or(0.0);
        assert!(
            metric_sum(&text, "outbox_relay_pending_rows").is_some(),
            "{text}"
        );
        per_poller.push(published);
    }
    eprintln!("published per poller: {per_poller:?}");
    assert!(
        per_poller.iter().all(|n| *n > 0.0),
        "both pollers published: {per_poller:?}"
    );
    assert_eq!(per_poller.iter().sum::<f64>(), 10_000.0);
    drop(relays);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_broker_outage_keeps_rows_pending_with_backed_off_retries_then_delivers() {
    let setup = Setup::new("poll_outage", &["Order", "Invoice"], 2).await;
    let port = support::free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    // Each retry as the server saw it: when it was marked and when it was next due.
    setup
        .db
        .client
        .batch_execute(
            "CREATE TABLE retry_history (id uuid, retry_count int, marked_at timestamptz, next_retry_at timestamptz);
             CREATE FUNCTION record_retry() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.retry_count IS DISTINCT FROM OLD.retry_count THEN
                 INSERT INTO retry_history VALUES (NEW.id, NEW.retry_count, now(), NEW.next_retry_at);
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
    // Per row and retry: the delay until the next attempt is within [retry_min_ms,
    // retry_max_ms] and never shrinks, and no attempt came before the row was due.
    let backoff = setup
        .db
        .client
        .query_one(
            "WITH h AS (
               SELECT id, retry_count, marked_at, next_retry_at,
                      extract(epoch FROM next_retry_at - marked_at) * 1000 AS delay_ms,
                      lag(next_retry_at) OVER w AS previous_due,
                      lag(extract(epoch FROM next_retry_at - marked_at) * 1000) OVER w AS previous_delay_ms
               FROM retry_history WINDOW w AS (PARTITION BY id ORDER BY retry_count))
             SELECT count(*),
                    count(*) FILTER (WHERE delay_ms IS NULL OR delay_ms < 499 OR delay_ms > 2001),
                    count(*) FILTER (WHERE marked_at < previous_due),
                    count(*) FILTER (WHERE delay_ms < previous_delay_ms - 1),
                    coalesce(string_agg(format('%s #%s marked %s due %s', id, retry_count, marked_at, next_retry_at), '; ')
                      FILTER (WHERE delay_ms IS NULL OR delay_ms < 499 OR delay_ms > 2001
                              OR marked_at < previous_due OR delay_ms < previous_delay_ms - 1), '')
             FROM h",
            &[],
        )
        .await
        .unwrap();
    let (retries, out_of_range, early, shrinking, offenders): (i64, i64, i64, i64, String) = (
        backoff.get(0),
        backoff.get(1),
        backoff.get(2),
        backoff.get(3),
        backoff.get(4),
    );
    assert!(retries >= 40 * 4, "{retries} retries recorded for 40 rows");
    assert_eq!(
        (out_of_range, early, shrinking),
        (0, 0, 0),
        "retries do not back off (delays out of [500, 2000] ms, attempts before due, shrinking delays): {offenders}"
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
    let setup = Setup::new("poll_poison", &["Order", "Invoice"], 2).await;
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
async fn polling_flag_and_delete_modes_mark_rows_and_check_reports_what_is_missing() {
    let setup = Setup::new("poll_modes", &["Order"], 2).await;
    let t = setup.types[0].clone();
    let client = &setup.db.client;
    client
        .batch_execute(
            "CREATE TABLE outbox_flag (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
               aggregate_id text, event_type text, payload jsonb, created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
               published boolean NOT NULL DEFAULT false);
             CREATE TABLE outbox_delete (LIKE outbox_flag INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
             ALTER TABLE outbox_delete DROP COLUMN published, ADD PRIMARY KEY (id);",
        )
        .await
        .unwrap();
    let mut written = Vec::new();
    for (table, n) in [("outbox_flag", 0), ("outbox_delete", 1)] {
        for i in 0..5 {
            let row = client
                .query_one(
                    &format!("INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, 'E', $3::text::jsonb) RETURNING id::text, payload::text"),
                    &[&t, &format!("k{n}"), &payload(i)],
                )
                .await
                .unwrap();
            written.push(Written {
                id: row.get(0),
                aggregate_type: t.clone(),
                aggregate_id: format!("k{n}"),
                event_type: "E".into(),
                payload: row.get(1),
            });
        }
    }
    let bootstrap = kafka().bootstrap();
    let flag = Relay::spawn(&setup.relay_args_for(
        "public.outbox_flag",
        "flag",
        &bootstrap,
        "mark = \"flag\"",
        "",
        None,
    ));
    let delete = Relay::spawn(&setup.relay_args_for(
        "public.outbox_delete",
        "delete",
        &bootstrap,
        "mark = \"delete\"",
        "",
        None,
    ));
    let consumed = setup
        .consume_all(10, Duration::from_secs(2), Duration::from_secs(60))
        .await;
    assert_eq!(assert_delivered(&written, &consumed, 1), 0);
    wait_for("rows to be marked", Duration::from_secs(30), || async {
        let flagged: i64 = setup
            .db
            .query_one_value("SELECT count(*) FROM outbox_flag WHERE published")
            .await;
        let left: i64 = setup
            .db
            .query_one_value("SELECT count(*) FROM outbox_delete")
            .await;
        (flagged == 5 && left == 0).then_some(())
    })
    .await;
    drop((flag, delete));

    // check: a table without the status columns, and a role that may not mark rows.
    let check = |args: Vec<String>| async move {
        let mut args = args;
        args[0] = "check".into();
        let mut relay = Relay::spawn(&args);
        let status = relay.wait(Duration::from_secs(60));
        (status.success(), relay.log())
    };
    let (ok, out) = check(setup.relay_args(
        "good",
        &bootstrap,
        "notify_channel = \"outbox_relay\"",
        "",
        None,
    ))
    .await;
    assert!(ok, "{out}");
    assert!(
        out.contains("polling: needs no REPLICATION")
            && out.contains("0 pending")
            && !out.contains("wal senders"),
        "{out}"
    );
    let (ok, out) =
        check(setup.relay_args_for("public.outbox_flag", "missing", &bootstrap, "", "", None))
            .await;
    assert!(!ok, "{out}");
    assert!(
        out.contains("FAIL") && out.contains("no column \"status\""),
        "{out}"
    );
    client
        .batch_execute(&format!(
            "CREATE ROLE reader_{0} LOGIN; GRANT SELECT ON outbox TO reader_{0};",
            setup.name
        ))
        .await
        .unwrap();
    let mut args = setup.relay_args("reader", &bootstrap, "", "", None);
    let path = args[2].clone();
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "postgres://postgres@",
        &format!("postgres://reader_{}@", setup.name),
    );
    std::fs::write(&path, text).unwrap();
    args[0] = "check".into();
    let mut relay = Relay::spawn(&args);
    assert!(!relay.wait(Duration::from_secs(60)).success());
    let out = relay.log();
    assert!(
        out.contains(&format!(
            "GRANT UPDATE ON \"public\".\"outbox\" TO reader_{}",
            setup.name
        )),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_hostile_database_defaults_do_not_break_the_poller() {
    let setup = Setup::new("poll_defaults", &["Order"], 1).await;
    for setting in [
        "statement_timeout = '1ms'",
        "lock_timeout = '1ms'",
        "idle_in_transaction_session_timeout = '1s'",
        "idle_session_timeout = '1s'",
        "search_path = nowhere",
        "default_transaction_isolation = 'repeatable read'",
        "default_transaction_read_only = on",
        "TimeZone = 'America/Bogota'",
    ] {
        setup
            .db
            .client
            .batch_execute(&format!("ALTER DATABASE {} SET {setting}", setup.name))
            .await
            .unwrap();
    }
    // linger.ms keeps each batch's transaction open past idle_in_transaction_session_timeout.
    let relay = Relay::spawn(&setup.relay_args(
        "poller",
        &kafka().bootstrap(),
        "max_interval_ms = 100\nstats_interval_ms = 100",
        "\"linger.ms\" = \"1500\"",
        None,
    ));
    let mut written = write_events(&setup.db.client, 2, 5, &setup.types, 3).await;
    // Idle past idle_session_timeout, then more.
    tokio::time::sleep(Duration::from_secs(3)).await;
    written.extend(write_events(&setup.db.client, 2, 5, &setup.types, 3).await);
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(assert_delivered(&written, &consumed, 1), 0);
    wait_for(
        "every row to be marked PUBLISHED",
        Duration::from_secs(30),
        || async { (setup.statuses().await.get("PUBLISHED") == Some(&20)).then_some(()) },
    )
    .await;
    assert!(
        !relay.log().contains("reconnecting"),
        "no session ended:\n{}",
        relay.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_sigterm_mid_stream_then_restart_publishes_each_event_once() {
    let setup = Setup::new("poll_term", &["Order", "Shipment"], 2).await;
    let args = setup.relay_args("poller", &kafka().bootstrap(), "batch_size = 20", "", None);
    let mut relay = Relay::spawn(&args);
    let writer_db = pg().connect(&setup.db.name, Auth::Trust).await;
    let types = setup.types.clone();
    let writer = tokio::spawn(async move {
        let mut written = Vec::new();
        for n in 0..400 {
            let t = &types[n % types.len()];
            written.push(insert(&writer_db, t, &format!("k{}", n % 7), &payload(n)).await);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        written
    });
    wait_for(
        "some events to be published",
        Duration::from_secs(30),
        || async {
            setup
                .statuses()
                .await
                .contains_key("PUBLISHED")
                .then_some(())
        },
    )
    .await;
    relay.sigterm();
    let status = relay.wait(Duration::from_secs(30));
    assert!(
        status.success(),
        "exit after SIGTERM: {status}\n{}",
        relay.log()
    );
    assert!(!writer.is_finished(), "stopped mid-stream");
    let relay = Relay::spawn(&args);
    let written = within("the writer's 400 events", Duration::from_secs(120), writer)
        .await
        .unwrap();
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(3),
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(
        assert_delivered(&written, &consumed, 1),
        0,
        "a graceful stop publishes nothing twice"
    );
    drop(relay);
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
