//! CloudEvents on Kafka (structured and binary mode, the Kafka protocol binding) and W3C trace
//! context from outbox columns, read back with a Kafka consumer, byte for byte.

use std::time::Duration;

use crate::support::{kafka, Auth, Consumed, Relay};
use crate::{run_with_config, Setup};

/// The time of every row: `columns.timestamp` makes it the record's, and CloudEvents' `time`.
const CREATED_AT: &str = "2026-12-06 11:26:51.123+00";
const TIME: &str = "2026-12-06T11:26:51.123Z";
const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// `run --config` for one Kafka pipeline of `setup` with the `extra` pipeline keys.
fn args(setup: &Setup, extra: &str) -> (tempfile::TempDir, Vec<String>) {
    run_with_config(&format!(
        r#"[kafka]
bootstrap_servers = "{bootstrap}"
[[pipelines]]
name = "{slot}"
source_url = "{url}"
slot = "{slot}"
publication = "outbox_pub"
table = "public.outbox"
{extra}
"#,
        bootstrap = kafka().bootstrap(),
        url = setup.db.url(Auth::Trust),
        slot = setup.slot,
    ))
}

/// Inserts a row of aggregate type `t` with `payload` (jsonb text or NULL); returns its id.
async fn insert(setup: &Setup, t: &str, key: &str, payload: Option<&str>, headers: &str) -> String {
    setup
        .db
        .client
        .query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, created_at)
             VALUES ($1, $2, 'OrderCreated', $3::text::jsonb, $4::text::jsonb, $5::text::timestamptz) RETURNING id::text",
            &[&t, &key, &payload, &headers, &CREATED_AT],
        )
        .await
        .unwrap()
        .get(0)
}

fn by_id<'a>(consumed: &'a [Consumed], id: &str) -> &'a Consumed {
    let found: Vec<&Consumed> = consumed
        .iter()
        .filter(|r| crate::header(r, "id") == Some(id.as_bytes()))
        .collect();
    assert_eq!(found.len(), 1, "event {id} once in {consumed:#?}");
    found[0]
}

fn text_headers(r: &Consumed) -> Vec<(String, String)> {
    r.headers
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                String::from_utf8(v.clone().unwrap_or_default()).unwrap(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_cloudevents_carry_the_json_payload_as_data_byte_for_byte() {
    let setup = Setup::new("ce_structured", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let (_dir, args) = args(
        &setup,
        "value_format = \"cloudevents\"\ncolumns = { timestamp = \"created_at\" }",
    );
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    // jsonb prints keys sorted by length then bytes, with ", " and ": ": those bytes are data.
    let with_data = insert(
        &setup,
        &t,
        "o-1",
        Some(r#"{"total": 12.50, "items": [1, 2]}"#),
        r#"{"ce_id": "forged", "tenant": "acme"}"#,
    )
    .await;
    let without_data = insert(&setup, &t, "o-2", None, "{}").await;
    let consumed = setup
        .consume_all(2, Duration::from_secs(1), Duration::from_secs(60))
        .await;
    let source = format!("/outbox-relay/{}/public.outbox", setup.db.name);
    let r = by_id(&consumed, &with_data);
    assert_eq!(r.key.as_deref(), Some(&b"o-1"[..]));
    assert_eq!(
        r.value_str().unwrap(),
        format!(
            r#"{{"specversion":"1.0","id":"{with_data}","source":"{source}","type":"OrderCreated","subject":"o-1","time":"{TIME}","datacontenttype":"application/json","data":{{"items": [1, 2], "total": 12.50}}}}"#
        )
    );
    assert_eq!(
        text_headers(r),
        pairs(&[
            ("id", &with_data),
            ("event_type", "OrderCreated"),
            (
                "content-type",
                "application/cloudevents+json; charset=UTF-8"
            ),
            ("tenant", "acme"),
        ])
    );
    // A NULL payload: the event without data, still a record with a value (not a tombstone).
    let r = by_id(&consumed, &without_data);
    assert_eq!(
        r.value_str().unwrap(),
        format!(
            r#"{{"specversion":"1.0","id":"{without_data}","source":"{source}","type":"OrderCreated","subject":"o-2","time":"{TIME}"}}"#
        )
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_cloudevents_carry_ce_headers_and_the_payload_as_the_value() {
    let setup = Setup::new("ce_binary", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let (_dir, args) = args(
        &setup,
        r#"value_format = "cloudevents"
columns = { timestamp = "created_at" }
cloudevents = { mode = "binary", source = "urn:shop:orders" }"#,
    );
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let with_data = insert(&setup, &t, "o-1", Some(r#"{"total": 12.50}"#), "{}").await;
    let without_data = insert(&setup, &t, "o-1", None, "{}").await;
    let consumed = setup
        .consume_all(2, Duration::from_secs(1), Duration::from_secs(60))
        .await;
    let expected = |id: &str, content_type: Option<&str>| {
        let mut list = vec![
            ("id", id),
            ("event_type", "OrderCreated"),
            ("ce_specversion", "1.0"),
            ("ce_id", id),
            ("ce_source", "urn:shop:orders"),
            ("ce_type", "OrderCreated"),
            ("ce_subject", "o-1"),
            ("ce_time", TIME),
        ];
        list.extend(content_type.map(|c| ("content-type", c)));
        pairs(&list)
    };
    let r = by_id(&consumed, &with_data);
    assert_eq!(r.value.as_deref(), Some(&br#"{"total": 12.50}"#[..]));
    assert_eq!(
        text_headers(r),
        expected(&with_data, Some("application/json"))
    );
    // The binding's event without data: a record without value, the attributes in headers.
    let r = by_id(&consumed, &without_data);
    assert_eq!(r.value, None);
    assert_eq!(text_headers(r), expected(&without_data, None));
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_column_and_debeziums_span_context_become_trace_headers() {
    let setup = Setup::new("trace", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let c = &setup.db.client;
    c.batch_execute(
        "ALTER TABLE outbox ADD COLUMN traceparent text, ADD COLUMN tracestate text,
                            ADD COLUMN tracingspancontext text",
    )
    .await
    .unwrap();
    let (_dir, args) = args(
        &setup,
        r#"columns = { traceparent = "traceparent", tracestate = "tracestate", tracing_span_context = "tracingspancontext" }"#,
    );
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let properties = format!("#Sun Dec 06 11:26:51 UTC 2026\ntraceparent={PARENT}\n");
    // (traceparent, tracestate, tracingspancontext) of each row.
    let rows: [(Option<&str>, Option<&str>, Option<&str>); 4] = [
        (Some(PARENT), Some("rojo=00f067aa0ba902b7"), None),
        (None, None, Some(&properties)),
        // Not a traceparent: left out with its tracestate, and the event still goes.
        (Some("00-not-a-trace"), Some("rojo=1"), None),
        (None, None, None),
    ];
    let mut ids = Vec::new();
    for (parent, state, context) in rows {
        let id: String = c
            .query_one(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers,
                     traceparent, tracestate, tracingspancontext)
                 VALUES ($1, 'k', 'Created', '{}', '{\"traceparent\": \"forged\"}', $2, $3, $4)
                 RETURNING id::text",
                &[&t, &parent, &state, &context],
            )
            .await
            .unwrap()
            .get(0);
        ids.push(id);
    }
    let consumed = setup
        .consume_all(rows.len(), Duration::from_secs(1), Duration::from_secs(60))
        .await;
    let trace = |id: &str| -> Vec<(String, String)> {
        text_headers(by_id(&consumed, id))
            .into_iter()
            .skip(2)
            .collect()
    };
    assert_eq!(
        trace(&ids[0]),
        pairs(&[
            ("traceparent", PARENT),
            ("tracestate", "rojo=00f067aa0ba902b7")
        ])
    );
    assert_eq!(trace(&ids[1]), pairs(&[("traceparent", PARENT)]));
    assert_eq!(trace(&ids[2]), Vec::new());
    assert_eq!(trace(&ids[3]), Vec::new());
    drop(relay);
}
