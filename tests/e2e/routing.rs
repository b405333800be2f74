use std::time::Duration;

use crate::support::{self, consume, http_get, kafka, Auth, Consumed, Relay};
use crate::{assert_delivered, header, insert, insert_lsn, run_with_config, Setup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_by_another_column_with_a_topic_template_and_lower_case() {
    let setup = Setup::new("routing", &["Order"], 1).await;
    setup
        .db
        .client
        .batch_execute("ALTER TABLE outbox ADD COLUMN tenant_id text")
        .await
        .unwrap();
    let tenant = format!("Tenant_{}", setup.db.name);
    let topic = format!("tenant.{}", tenant.to_lowercase());
    kafka().create_topic(&topic, 1);
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.extend(
        [
            "--route-by-field",
            "tenant_id",
            "--topic-template",
            "tenant.${routedByValue}",
            "--topic-case",
            "lower",
        ]
        .map(String::from),
    );
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let id: String = setup
        .db
        .client
        .query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, tenant_id) VALUES ('Order', 'k', 'T', '{}', $1) RETURNING id::text",
            &[&tenant],
        )
        .await
        .unwrap()
        .get(0);
    let consumed = consume(
        &kafka().bootstrap(),
        &[topic.as_str()],
        1,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(header(&consumed[0], "id"), Some(id.as_bytes()));
    drop(relay);
}

/// One row of the routing-options test as written, with what PostgreSQL printed.
struct Routed {
    id: String,
    aggregate_id: String,
    /// `payload::text`.
    payload: String,
    /// `created_at` as Unix ms.
    created_ms: i64,
}

async fn insert_routed(
    client: &tokio_postgres::Client,
    aggregate_type: &str,
    aggregate_id: &str,
    tenant: &str,
    shard: Option<i32>,
    created_at: &str,
) -> Routed {
    let row = client
        .query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, tenant_id, shard, created_at)
             VALUES ($1, $2, 'Routed', '{\"amount\": 1500000.10, \"s\": \"é\"}', $3, $4, $5::text::timestamptz)
             RETURNING id::text, payload::text, (extract(epoch FROM created_at) * 1000)::int8",
            &[&aggregate_type, &aggregate_id, &tenant, &shard, &created_at],
        )
        .await
        .unwrap();
    Routed {
        id: row.get(0),
        aggregate_id: aggregate_id.to_owned(),
        payload: row.get(1),
        created_ms: row.get(2),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_options_timestamp_regex_column_placements_envelope_and_dead_letter() {
    let setup = Setup::new("mapping", &[], 1).await;
    let c = &setup.db.client;
    c.batch_execute("ALTER TABLE outbox ADD COLUMN tenant_id text, ADD COLUMN shard int4")
        .await
        .unwrap();
    // The test's database name is unique: it is the tenant, and so in every topic name.
    let tenant = setup.db.name.clone();
    let billing = format!("{tenant}.billing.v2.events");
    let orders = format!("{tenant}.orders.v1.events");
    let dlq = format!("{tenant}.dlq");
    kafka().create_topic(&billing, 4);
    kafka().create_topic(&orders, 4);
    kafka().create_topic(&dlq, 1);
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let toml = format!(
        r#"[kafka]
bootstrap_servers = "{bootstrap}"
[metrics]
listen = "{metrics}"
[[pipelines]]
name = "mapping"
source_url = "{url}"
slot = "{slot}"
publication = "outbox_pub"
table = "public.outbox"
columns = {{ timestamp = "created_at" }}
route = {{ topic_regex = "(?P<domain>.+)_(v[0-9]+)", topic_template = "${{column:tenant_id}}.${{domain}}.${{2}}.events" }}
additional_placement = [
  {{ field = "tenant_id", placement = "header", alias = "tenant" }},
  {{ field = "shard", placement = "partition" }},
  {{ field = "tenant_id", placement = "envelope", alias = "tenant" }},
  {{ field = "shard", placement = "envelope" }},
]
value_format = "envelope"
on_bad_event = "dead_letter"
dead_letter_topic = "{dlq}"
"#,
        bootstrap = kafka().bootstrap(),
        url = setup.db.url(Auth::Trust),
        slot = setup.slot,
    );
    let (_dir, args) = run_with_config(&toml);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    c.batch_execute("BEGIN").await.unwrap();
    let first = insert_routed(
        c,
        "billing_v2",
        "b-1",
        &tenant,
        Some(1),
        "2026-01-02 03:04:05.678+05:30",
    )
    .await;
    // "bad domain" makes an illegal topic name: dead-lettered, and the events after it flow.
    let bad = insert_routed(
        c,
        "bad domain_v2",
        "x-1",
        &tenant,
        Some(2),
        "2026-01-02 03:04:05-03",
    )
    .await;
    let by_key = insert_routed(
        c,
        "orders_v1",
        "o-1",
        &tenant,
        None,
        "2026-01-02 03:04:05.5+00",
    )
    .await;
    c.batch_execute("COMMIT").await.unwrap();
    c.batch_execute("BEGIN").await.unwrap();
    let last = insert_routed(
        c,
        "billing_v2",
        "b-2",
        &tenant,
        Some(3),
        "1999-12-31 23:59:59.999-12",
    )
    .await;
    let before_last_commit = insert_lsn(c).await;
    c.batch_execute("COMMIT").await.unwrap();

    let consumed = consume(
        &kafka().bootstrap(),
        &[billing.as_str(), orders.as_str(), dlq.as_str()],
        4,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    let record = |id: &str| {
        let found: Vec<&Consumed> = consumed
            .iter()
            .filter(|r| header(r, "id") == Some(id.as_bytes()))
            .collect();
        assert_eq!(found.len(), 1, "event {id} once in {consumed:#?}");
        found[0]
    };
    for (event, topic, partition, shard) in [
        (&first, &billing, Some(1), "1"),
        (&last, &billing, Some(3), "3"),
        (&by_key, &orders, None, "null"),
    ] {
        let r = record(&event.id);
        assert_eq!(
            &r.topic, topic,
            "topic from the tenant column and the regex groups"
        );
        if let Some(partition) = partition {
            assert_eq!(r.partition, partition, "partition from the shard column");
        }
        assert_eq!(
            r.timestamp_ms,
            Some(event.created_ms),
            "timestamp from created_at"
        );
        assert_eq!(r.key.as_deref(), Some(event.aggregate_id.as_bytes()));
        let headers: Vec<(&str, Option<&[u8]>)> = r
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref()))
            .collect();
        assert_eq!(
            headers,
            vec![
                ("id", Some(event.id.as_bytes())),
                ("event_type", Some(&b"Routed"[..])),
                ("tenant", Some(tenant.as_bytes())),
            ],
            "built-in headers, then the header placement under its alias"
        );
        assert_eq!(
            r.value_str().unwrap(),
            format!(
                r#"{{"payload":{},"tenant":"{tenant}","shard":{shard}}}"#,
                event.payload
            ),
            "envelope with the jsonb payload byte for byte"
        );
    }
    assert_eq!(
        first.payload, r#"{"s": "é", "amount": 1500000.10}"#,
        "the payload as jsonb printed it"
    );
    assert_eq!(first.created_ms, 1_767_303_245_678);
    assert_eq!(last.created_ms, 946_727_999_999);

    let dead = record(&bad.id);
    assert_eq!(dead.topic, dlq);
    assert_eq!(dead.key.as_deref(), Some(&b"x-1"[..]), "the original key");
    let document: serde_json::Value =
        serde_json::from_slice(dead.value.as_deref().expect("the copy's document")).unwrap();
    assert_eq!(
        document["value"].as_str(),
        Some(bad.payload.as_str()),
        "the raw payload, byte for byte, in the copy's document: {document}"
    );
    assert_eq!(document["id"].as_str(), Some(bad.id.as_str()));
    assert_eq!(document["topic"], serde_json::Value::Null, "{document}");
    assert!(
        document["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["name"] == "event_type" && h["value"] == "Routed"),
        "{document}"
    );
    assert_eq!(
        header(dead, "event_type"),
        None,
        "row data stays out of the copy's headers"
    );
    let reason = dead.header_str("outbox_relay_error").unwrap();
    assert!(
        reason.contains(&bad.id)
            && reason.contains("bad domain")
            && reason.contains("not a legal Kafka topic name"),
        "{reason}"
    );

    setup
        .wait_confirmed_past(
            before_last_commit,
            "confirmed_flush_lsn past the last commit",
            Duration::from_secs(30),
        )
        .await;
    let (_, text) = http_get(&metrics, "/metrics").await.unwrap();
    assert!(
        text.contains(
            "outbox_relay_events_dead_lettered_total{pipeline=\"mapping\",reason=\"illegal_topic\"} 1"
        ),
        "{text}"
    );
    assert!(
        relay.log().contains(&bad.id),
        "the warning names the dead-lettered event"
    );
    drop(relay);
}

/// `on_bad_event = "dead_letter"` also covers records Kafka refuses for good: an event over
/// the producer's size limit goes to the dead-letter topic (key and headers, no value, the
/// reason with size and limit, the topic it was meant for), the events after it flow in
/// order, and the slot passes the last commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_event_is_dead_lettered_and_the_rest_flows() {
    let setup = Setup::new("dlqsize", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let dlq = format!("{}.dead-letter", setup.slot);
    kafka().create_topic(&dlq, 1);
    let toml = format!(
        r#"
[kafka]
bootstrap_servers = "{bootstrap}"

[[pipelines]]
name = "dlqsize"
source_url = "{url}"
slot = "{slot}"
publication = "outbox_pub"
table = "public.outbox"
on_bad_event = "dead_letter"
dead_letter_topic = "{dlq}"
# Above the producer's limit: the record reaches Kafka's refusal.
max_event_bytes = 100000
[pipelines.kafka.properties]
"message.max.bytes" = "2000"
"#,
        bootstrap = kafka().bootstrap(),
        url = setup.db.url(Auth::Trust),
        slot = setup.slot,
    );
    let (_dir, args) = run_with_config(&toml);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    let client = &setup.db.client;
    let before = insert(client, &t, "k1", r#"{"n": 1}"#).await;
    let big = insert(
        client,
        &t,
        "k1",
        &format!(r#"{{"blob": "{}"}}"#, "x".repeat(5_000)),
    )
    .await;
    let after_same_key = insert(client, &t, "k1", r#"{"n": 3}"#).await;
    let other_key = insert(client, &t, "k2", r#"{"n": 4}"#).await;
    let last_commit = setup.db.current_wal_insert_lsn().await;

    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        3,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&[before, after_same_key, other_key], &consumed, true);
    let dead = consume(
        &kafka().bootstrap(),
        &[dlq.as_str()],
        1,
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(dead.len(), 1);
    let dead = &dead[0];
    assert_eq!(dead.key_str().as_deref(), Some("k1"));
    let document: serde_json::Value =
        serde_json::from_slice(dead.value.as_deref().expect("the copy's document")).unwrap();
    assert_eq!(
        document.get("value"),
        None,
        "an oversized record's copy holds no value, which would be refused too: {document}"
    );
    assert_eq!(document["id"].as_str(), Some(big.id.as_str()));
    assert_eq!(dead.header_str("id").as_deref(), Some(big.id.as_str()));
    assert_eq!(
        dead.header_str("outbox_relay_topic").as_deref(),
        Some(topics[0].as_str())
    );
    let reason = dead.header_str("outbox_relay_error").unwrap_or_default();
    assert!(
        reason.contains("message.max.bytes = 2000") && reason.contains("bytes"),
        "{reason}"
    );
    setup
        .wait_confirmed_past(
            last_commit,
            "confirmed_flush_lsn to pass the last commit",
            Duration::from_secs(30),
        )
        .await;
    assert!(relay.log().contains(&big.id), "{}", relay.log());
}

/// With `route.allowed_destinations`, a row routed outside the list, or to the dead-letter
/// topic itself, is dead-lettered (never published there) and the rows after it flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_outside_the_allowed_destinations_is_dead_lettered() {
    let setup = Setup::new("allowlist", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let topic = setup.topics()[0].clone();
    // The template `${routedByValue}.events` reaches them with these routing values.
    let (dlq_value, outside_value) = (
        format!("{}.dead-letter", setup.slot),
        format!("{}.elsewhere", setup.slot),
    );
    let dlq = format!("{dlq_value}.events");
    kafka().create_topic(&dlq, 1);
    let outside = format!("{outside_value}.events");
    let toml = format!(
        r#"
[kafka]
bootstrap_servers = "{bootstrap}"

[[pipelines]]
name = "allowlist"
source_url = "{url}"
slot = "{slot}"
publication = "outbox_pub"
table = "public.outbox"
on_bad_event = "dead_letter"
dead_letter_topic = "{dlq}"
[pipelines.route]
allowed_destinations = ["{topic}"]
"#,
        bootstrap = kafka().bootstrap(),
        url = setup.db.url(Auth::Trust),
        slot = setup.slot,
    );
    let (_dir, args) = run_with_config(&toml);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    let client = &setup.db.client;
    let before = insert(client, &t, "k1", r#"{"n": 1}"#).await;
    let not_allowed = insert(client, &outside_value, "k1", r#"{"n": 2}"#).await;
    let into_dlq = insert(client, &dlq_value, "k2", r#"{"n": 3}"#).await;
    let after = insert(client, &t, "k1", r#"{"n": 4}"#).await;
    let last_commit = setup.db.current_wal_insert_lsn().await;

    let consumed = consume(
        &kafka().bootstrap(),
        &[topic.as_str()],
        2,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&[before, after], &consumed, true);
    let dead = consume(
        &kafka().bootstrap(),
        &[dlq.as_str()],
        2,
        Duration::from_secs(2),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        dead.len(),
        2,
        "only the two copies reach the dead-letter topic"
    );
    let reasons: Vec<(String, String)> = dead
        .iter()
        .map(|d| {
            (
                d.header_str("id").unwrap_or_default(),
                d.header_str("outbox_relay_error").unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(reasons[0].0, not_allowed.id);
    assert!(
        reasons[0].1.contains(&not_allowed.id)
            && reasons[0].1.contains(&format!(
                "destination {outside:?} is not in route.allowed_destinations"
            )),
        "{reasons:?}"
    );
    assert_eq!(reasons[1].0, into_dlq.id);
    assert!(
        reasons[1].1.contains(&format!(
            "destination {dlq:?} is the pipeline's dead_letter_topic"
        )),
        "{reasons:?}"
    );
    setup
        .wait_confirmed_past(
            last_commit,
            "confirmed_flush_lsn to pass the last commit",
            Duration::from_secs(30),
        )
        .await;
    let metrics = relay.log();
    assert!(
        metrics.contains("event sent to the dead-letter topic"),
        "{metrics}"
    );
}
