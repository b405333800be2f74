//! The dead-letter copy: what it keeps of the original, and that nothing a row holds can make
//! the copy undeliverable.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::lsn::Lsn;
use crate::source::outbox::ValueKind;

fn event() -> OutboxEvent {
    OutboxEvent {
        id: Bytes::from_static(b"e-1"),
        aggregate_type: Bytes::from_static(b"has space"),
        aggregate_id: Some(Bytes::from_static(b"42")),
        aggregate_id_kind: ValueKind::Text,
        event_type: Some(Bytes::from_static(b"CreditDisbursed")),
        payload: Some(Bytes::from_static(b"{\"amount\": 1500000.10}")),
        headers: Some(Bytes::from_static(b"{}")),
        routed_by: None,
        payload_kind: ValueKind::Json,
        columns: Vec::new(),
        lsn: Lsn(1),
        refused: None,
    }
}

fn record(id: &[u8], key: Option<&[u8]>, headers: Vec<Header>) -> Record {
    let mut all = vec![(Cow::Borrowed("id"), Some(Bytes::copy_from_slice(id)))];
    all.extend(headers);
    Record {
        topic: "Order.events".into(),
        key: key.map(Bytes::copy_from_slice),
        value: Some(Bytes::from_static(b"{\"a\":1}")),
        headers: all,
        timestamp_ms: Some(7),
        partition: None,
    }
}

fn refusal(too_large: bool) -> DeliveryError {
    DeliveryError {
        event_id: "e-1".into(),
        topic: "Order.events".into(),
        reason: "HTTP 431 Request Header Fields Too Large".into(),
        retryable: false,
        too_large,
        connection_lost: false,
        attempted: true,
        record: None,
    }
}

fn document(copy: &Record) -> Value {
    serde_json::from_slice(copy.value.as_deref().expect("a copy always has a value")).unwrap()
}

fn header_names(copy: &Record) -> Vec<&str> {
    copy.headers.iter().map(|(name, _)| name.as_ref()).collect()
}

#[test]
fn an_unroutable_event_s_copy_holds_the_event_in_its_value_and_names_the_reason() {
    let e = event();
    let error = Router::default().route(&e, 0).unwrap_err();
    let copy = Router::dead_letter(&e, &error, "outbox.dlq", 7);
    assert_eq!(copy.topic, "outbox.dlq");
    assert_eq!(copy.key.as_deref(), Some(&b"42"[..]));
    assert_eq!(copy.timestamp_ms, Some(7));
    assert_eq!(copy.partition, None);
    assert_eq!(header_names(&copy), ["id", ERROR_HEADER]);
    assert_eq!(
        copy.headers[1].1.as_deref(),
        Some(error.to_string().as_bytes())
    );
    assert_eq!(
        document(&copy),
        json!({
            "error": error.to_string(),
            "topic": null,
            "id": "e-1",
            "key": "42",
            "headers": [
                {"name": "id", "value": "e-1"},
                {"name": "event_type", "value": "CreditDisbursed"},
            ],
            "value": "{\"amount\": 1500000.10}",
        })
    );
    let mut e = event();
    e.event_type = None;
    e.payload = None;
    e.aggregate_id = None;
    let copy = Router::dead_letter(&e, &error, "outbox.dlq", 7);
    let doc = document(&copy);
    assert_eq!(doc["value"], Value::Null, "a NULL payload is null");
    assert_eq!(doc["key"], Value::Null);
    assert_eq!(copy.key, None);
    assert_eq!(
        doc["headers"].as_array().unwrap().len(),
        1,
        "no event_type when NULL"
    );
}

#[test]
fn a_refused_record_s_headers_go_in_the_copy_s_value_never_in_its_headers() {
    // A jsonb header with a newline (no HTTP or NATS header carries it), a name that is no
    // HTTP token, a NATS- name: the reasons sinks refuse a record for its headers.
    let original = record(
        b"e-1",
        Some(b"42"),
        vec![
            (Cow::Borrowed("trace"), Some(Bytes::from_static(b"a\nb"))),
            (
                Cow::Owned("bad name".into()),
                Some(Bytes::from_static(b"x")),
            ),
            (Cow::Borrowed("Nats-Expected-Stream"), None),
        ],
    );
    let copy = Router::dead_letter_refused(original.clone(), &refusal(false), "dlq");
    assert_eq!(copy.topic, "dlq");
    assert_eq!(copy.key.as_deref(), Some(&b"42"[..]));
    assert_eq!(copy.timestamp_ms, None, "the producer's clock");
    assert_eq!(header_names(&copy), ["id", ERROR_HEADER, TOPIC_HEADER]);
    assert_eq!(copy.headers[2].1.as_deref(), Some(&b"Order.events"[..]));
    assert_eq!(
        document(&copy),
        json!({
            "error": "HTTP 431 Request Header Fields Too Large",
            "topic": "Order.events",
            "id": "e-1",
            "key": "42",
            "headers": [
                {"name": "id", "value": "e-1"},
                {"name": "trace", "value": "a\nb"},
                {"name": "bad name", "value": "x"},
                {"name": "Nats-Expected-Stream", "value": null},
            ],
            "value": "{\"a\":1}",
        })
    );
}

#[test]
fn an_id_or_key_that_is_not_plain_text_stays_out_of_the_copy_s_headers_and_key() {
    let original = record(b"e\x1b[2J-1", Some(&[0xff, 0xfe]), Vec::new());
    let copy = Router::dead_letter_refused(original, &refusal(false), "dlq");
    assert_eq!(header_names(&copy), [ERROR_HEADER, TOPIC_HEADER]);
    assert_eq!(copy.key, None);
    let doc = document(&copy);
    assert_eq!(doc["id"], "e\u{1b}[2J-1");
    assert_eq!(doc["key"], json!({"base64": "//4="}));
    let long = vec![b'k'; PLAIN_BYTES + 1];
    let copy = Router::dead_letter_refused(
        record(&long, Some(&long), Vec::new()),
        &refusal(false),
        "dlq",
    );
    assert_eq!(copy.key, None, "longer than every sink's key limit");
    assert_eq!(header_names(&copy), [ERROR_HEADER, TOPIC_HEADER]);
}

#[test]
fn a_too_large_record_s_copy_leaves_out_its_value_and_headers_and_cuts_id_and_key() {
    let big = Bytes::from(vec![b'h'; 2_000_000]);
    let long_id = vec![b'i'; 5_000];
    let original = record(
        &long_id,
        Some(b"42"),
        vec![(Cow::Borrowed("blob"), Some(big))],
    );
    let copy = Router::dead_letter_refused(original, &refusal(true), "dlq");
    let doc = document(&copy);
    assert!(
        copy.size() < 4 * TOO_LARGE_FIELD_BYTES,
        "{} bytes",
        copy.size()
    );
    assert_eq!(doc.get("value"), None);
    assert_eq!(doc.get("headers"), None);
    assert_eq!(doc["id"].as_str().unwrap().len(), TOO_LARGE_FIELD_BYTES);
    assert_eq!(doc["key"], "42");
    assert_eq!(doc["truncated"], true);
    let copy = Router::dead_letter_refused(record(b"e-1", None, Vec::new()), &refusal(true), "dlq");
    assert_eq!(document(&copy).get("truncated"), None, "nothing was cut");
}

/// A copy refused as too large (its document escapes the value, so it can outgrow a record
/// refused for another reason) gets its too-large form: error, topic, id and key, no value.
#[test]
fn a_copy_refused_as_too_large_shrinks_to_its_too_large_form_once() {
    let mut original = record(b"e-1", Some(&[0xff]), Vec::new());
    original.value = Some(Bytes::from(vec![b'"'; 10_000]));
    let copy = Router::dead_letter_refused(original, &refusal(false), "dlq");
    let mut refused = refusal(true);
    refused.topic = "dlq".into();
    refused.reason = "Broker: Message size too large".into();
    let shrunk = Router::dead_letter_shrunk(&copy, &refused).expect("a full copy shrinks");
    assert!(
        shrunk.size() < 2 * HEADER_TEXT_BYTES,
        "{} bytes",
        shrunk.size()
    );
    assert_eq!(shrunk.topic, "dlq");
    let doc = document(&shrunk);
    assert_eq!(doc["id"], "e-1");
    assert_eq!(doc["key"], json!({"base64": "/w=="}));
    assert_eq!(doc["topic"], "Order.events");
    assert_eq!(doc.get("value"), None);
    assert!(
        doc["error"].as_str().unwrap().contains("HTTP 431")
            && doc["error"]
                .as_str()
                .unwrap()
                .contains("Message size too large"),
        "{doc}"
    );
    assert_eq!(
        Router::dead_letter_shrunk(&shrunk, &refused),
        None,
        "only once"
    );
}

#[test]
fn the_copy_s_header_text_is_printable_ascii_and_bounded() {
    assert_eq!(header_text("plain text"), "plain text");
    assert_eq!(header_text("a\r\nb é"), "a\\r\\nb \\u{e9}");
    let long = header_text(&"é".repeat(2_000));
    assert!(long.len() <= HEADER_TEXT_BYTES, "{}", long.len());
    assert!(long.ends_with(b"..."));
}

fn any_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..40),
        proptest::collection::vec(any::<u8>(), 250..300),
    ]
}

proptest! {
    /// Whatever the row held, the copy's key and headers are plain printable ASCII within the
    /// limits every sink takes, and its value holds the original losslessly.
    #[test]
    fn whatever_the_row_held_the_copy_carries_it_only_in_its_value(
        id in any_bytes(),
        key in proptest::option::of(any_bytes()),
        headers in proptest::collection::vec(("\\PC{0,20}|.*", proptest::option::of(any_bytes())), 0..4),
        reason in ".{0,2000}",
        too_large in any::<bool>(),
    ) {
        let headers: Vec<Header> = headers
            .into_iter()
            .map(|(name, value)| (Cow::Owned(name), value.map(Bytes::from)))
            .collect();
        let original = record(&id, key.as_deref(), headers);
        let mut error = refusal(too_large);
        error.reason = reason;
        let copy = Router::dead_letter_refused(original.clone(), &error, "dlq");
        for (name, value) in &copy.headers {
            prop_assert!(["id", ERROR_HEADER, TOPIC_HEADER].contains(&name.as_ref()));
            let value = value.as_deref().unwrap();
            prop_assert!(value.len() <= HEADER_TEXT_BYTES);
            prop_assert!(value.iter().all(|b| (b' '..=b'~').contains(b)), "{value:?}");
        }
        if let Some(key) = &copy.key {
            prop_assert!(plain(key));
        }
        let doc = document(&copy);
        let bytes = |v: &Value| match v {
            Value::String(text) => text.as_bytes().to_vec(),
            other => base64::engine::general_purpose::STANDARD
                .decode(other["base64"].as_str().unwrap())
                .unwrap(),
        };
        if !too_large {
            prop_assert_eq!(bytes(&doc["id"]), id);
            prop_assert_eq!(doc["key"].is_null(), key.is_none());
            if let Some(key) = &key {
                prop_assert_eq!(&bytes(&doc["key"]), key);
            }
            let docs = doc["headers"].as_array().unwrap();
            prop_assert_eq!(docs.len(), original.headers.len());
            for (d, (name, value)) in docs.iter().zip(&original.headers) {
                prop_assert_eq!(d["name"].as_str().unwrap(), name.as_ref());
                prop_assert_eq!(d["value"].is_null(), value.is_none());
                if let Some(value) = value {
                    prop_assert_eq!(&bytes(&d["value"]), value);
                }
            }
        }
    }
}

/// A row refused as too large routes to an error naming its id, aggregate, size and the
/// setting; its dead-letter copy is a reference: id, key, aggregate type, size, LSN, reason,
/// and no value or headers.
#[test]
fn a_row_over_max_event_bytes_is_dead_lettered_as_a_reference() {
    let limit = crate::config::EventLimit {
        bytes: 1_000_000,
        from: "the default: the Kafka producer's message.max.bytes",
    };
    let event = OutboxEvent {
        event_type: None,
        payload: None,
        headers: None,
        lsn: Lsn(0x1_0000_0042),
        refused: Some(Refusal::TooLarge {
            bytes: 251_658_240,
            limit,
        }),
        ..event()
    };
    let error = Router::default().route(&event, 7).unwrap_err();
    assert_eq!(
        error.to_string(),
        "event e-1 (aggregate has space/42): 251658240 bytes, more than max_event_bytes = 1000000 (the default: the Kafka producer's message.max.bytes); refused before its values were copied: raise max_event_bytes if the sink takes records this large and the relay's memory allows, or set on_bad_event = \"dead_letter\" to dead-letter a reference to such rows"
    );
    assert_eq!(error.reason_label(), "too_large");
    let copy = Router::dead_letter(&event, &error, "dlq", 7);
    assert_eq!(
        document(&copy),
        json!({
            "error": error.to_string(),
            "topic": null,
            "id": "e-1",
            "key": "42",
            "aggregate_type": "has space",
            "bytes": 251_658_240,
            "lsn": "1/42",
        })
    );
    assert_eq!(header_names(&copy), ["id", ERROR_HEADER]);
    // A polled row has no LSN.
    let polled = OutboxEvent {
        lsn: Lsn::ZERO,
        ..event
    };
    assert_eq!(
        document(&Router::dead_letter(&polled, &error, "dlq", 7)).get("lsn"),
        None
    );
}

/// A row with text that is not UTF-8 routes to an error naming the column and the fix; its
/// copy carries the values, base64 where they are not UTF-8.
#[test]
fn a_row_that_is_not_utf8_is_dead_lettered_with_its_values() {
    let event = OutboxEvent {
        payload: Some(Bytes::from_static(b"{\"s\": \"\xff\"}")),
        refused: Some(Refusal::NotUtf8 {
            relation: "public.outbox".into(),
            column: "payload".into(),
        }),
        ..event()
    };
    let error = Router::default().route(&event, 7).unwrap_err();
    let text = error.to_string();
    assert!(
        text.starts_with("event e-1: column \"payload\" of public.outbox is not valid UTF-8")
            && text.contains("ENCODING 'UTF8'")
            && text.contains("bytea"),
        "{text}"
    );
    let copy = Router::dead_letter(&event, &error, "dlq", 7);
    assert_eq!(
        document(&copy)["value"],
        json!({"base64": "eyJzIjogIv8ifQ=="})
    );
}
