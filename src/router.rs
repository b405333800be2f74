//! Routes outbox events to Kafka records: topic, key, value and headers.
//!
//! - Topic: the template (default `${routedByValue}.events`, Debezium's
//!   `route.topic.replacement`) with the routing value: the aggregate type, or the column
//!   configured as `route.by_field` (Debezium's `route.by.field`). Case preserved by default
//!   (Kafka topic names are case-sensitive, so folding would merge distinct aggregates);
//!   `lower` and `upper` are options. A value that makes an illegal topic name is an error,
//!   never a silent rename.
//! - Key: the aggregate id bytes; SQL NULL gives a null key.
//! - Value: the payload bytes exactly as PostgreSQL printed them; SQL NULL gives a tombstone.
//! - Headers: `id` (the event id, as Debezium's outbox router), `event_type`, then every
//!   entry of the row's `headers` jsonb object in its order: a string as its text, any other
//!   JSON value as its JSON text, `null` as a null header value. Entries named `id` or
//!   `event_type` are left out: the relay's own headers are the ones consumers dedupe by.
//! - Timestamp: the transaction's commit time.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::config::{RouteConfig, TopicCase};
use crate::sink::Record;
use crate::source::outbox::OutboxEvent;

/// Where the routing value goes in a topic template.
pub const ROUTED_BY_VALUE: &str = "${routedByValue}";
/// Kafka's limit on topic name length.
const MAX_TOPIC_LEN: usize = 249;

/// An event that cannot be routed; the pipeline stops before confirming its transaction.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouteError {
    #[error("event {event_id}: routing value {value:?} gives topic {topic:?}, which is not a legal Kafka topic name: {reason}")]
    IllegalTopic {
        event_id: String,
        /// The aggregate type, or the `route.by_field` column's value.
        value: String,
        topic: String,
        reason: &'static str,
    },
    #[error("event {event_id}: the headers column is not a JSON object: {reason}")]
    Headers { event_id: String, reason: String },
}

/// Turns events into records.
#[derive(Debug, Clone)]
pub struct Router {
    /// The topic with `${routedByValue}` where the routing value goes.
    template: String,
    case: TopicCase,
}

impl Default for Router {
    fn default() -> Self {
        Router::new(&RouteConfig::default())
    }
}

impl Router {
    pub fn new(config: &RouteConfig) -> Self {
        Router {
            template: config.topic_template.clone(),
            case: config.topic_case,
        }
    }

    /// Routes `event`, committed at `commit_time_ms` (Unix epoch, ms).
    ///
    /// Returns an error if the routing value is empty or does not make a legal topic name,
    /// or the headers column is not a JSON object.
    pub fn route(&self, event: OutboxEvent, commit_time_ms: i64) -> Result<Record, RouteError> {
        let raw = event.routed_by.as_ref().unwrap_or(&event.aggregate_type);
        let value = String::from_utf8_lossy(raw);
        let cased = match self.case {
            TopicCase::Preserve => Cow::Borrowed(value.as_ref()),
            // ASCII only: Unicode folding could turn an illegal name into a legal one that
            // another aggregate already uses ("K" Kelvin sign -> "k").
            TopicCase::Lower => Cow::Owned(value.to_ascii_lowercase()),
            TopicCase::Upper => Cow::Owned(value.to_ascii_uppercase()),
        };
        let topic = self.template.replace(ROUTED_BY_VALUE, &cased);
        let valid = if value.is_empty() {
            Err("the routing value is empty")
        } else {
            validate_topic(&topic)
        };
        if let Err(reason) = valid {
            return Err(RouteError::IllegalTopic {
                event_id: String::from_utf8_lossy(&event.id).into_owned(),
                value: value.into_owned(),
                topic,
                reason,
            });
        }
        let mut headers: Vec<(Cow<'static, str>, Option<Bytes>)> = Vec::with_capacity(2);
        if let Some(row_headers) = event.headers.as_deref().filter(|h| *h != b"{}") {
            let entries =
                row_headers_to_kafka(row_headers).map_err(|reason| RouteError::Headers {
                    event_id: String::from_utf8_lossy(&event.id).into_owned(),
                    reason,
                })?;
            headers.reserve(entries.len());
            headers.extend(entries);
        }
        headers.insert(0, (Cow::Borrowed("id"), Some(event.id)));
        if let Some(event_type) = event.event_type {
            headers.insert(1, (Cow::Borrowed("event_type"), Some(event_type)));
        }
        Ok(Record {
            topic,
            key: event.aggregate_id,
            value: event.payload,
            headers,
            timestamp_ms: Some(commit_time_ms),
        })
    }
}

/// Turns a jsonb object's text into headers, in the object's order.
fn row_headers_to_kafka(json: &[u8]) -> Result<Vec<(Cow<'static, str>, Option<Bytes>)>, String> {
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let entries = deserializer
        .deserialize_map(EntriesVisitor)
        .map_err(|e| e.to_string())?;
    deserializer.end().map_err(|e| e.to_string())?;
    let mut headers = Vec::with_capacity(entries.len());
    for (key, raw) in entries {
        if key == "id" || key == "event_type" {
            continue;
        }
        let text = raw.get();
        let value = match text.as_bytes().first() {
            Some(b'"') => Some(Bytes::from(
                serde_json::from_str::<String>(text).map_err(|e| e.to_string())?,
            )),
            _ if text == "null" => None,
            _ => Some(Bytes::copy_from_slice(text.as_bytes())),
        };
        headers.push((Cow::Owned(key), value));
    }
    Ok(headers)
}

/// A JSON object's entries in order, values as their raw JSON text.
struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Vec<(String, Box<RawValue>)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(entry) = map.next_entry::<String, Box<RawValue>>()? {
            entries.push(entry);
        }
        Ok(entries)
    }
}

/// Checks Kafka's rules for topic names: 1-249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic(topic: &str) -> Result<(), &'static str> {
    if topic.is_empty() {
        return Err("empty");
    }
    if topic.len() > MAX_TOPIC_LEN {
        return Err("longer than 249 characters");
    }
    if topic == "." || topic == ".." {
        return Err("'.' and '..' are reserved");
    }
    if !topic
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("only ASCII letters, digits, '.', '_' and '-' are allowed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsn::Lsn;

    fn event(aggregate_type: &str) -> OutboxEvent {
        OutboxEvent {
            id: Bytes::from_static(b"00000000-0000-0000-0000-000000000001"),
            aggregate_type: Bytes::copy_from_slice(aggregate_type.as_bytes()),
            aggregate_id: Some(Bytes::from_static(b"42")),
            event_type: Some(Bytes::from_static(b"CreditDisbursed")),
            payload: Some(Bytes::from_static(b"{\"amount\": 1500000.10}")),
            headers: Some(Bytes::from_static(b"{}")),
            routed_by: None,
            lsn: Lsn(1),
        }
    }

    #[test]
    fn routes_by_aggregate_type_preserving_case_and_bytes() {
        let record = Router::default().route(event("Order"), 1234).unwrap();
        assert_eq!(record.topic, "Order.events");
        assert_eq!(record.key.as_deref(), Some(&b"42"[..]));
        assert_eq!(
            record.value.as_deref(),
            Some(&b"{\"amount\": 1500000.10}"[..])
        );
        assert_eq!(
            record.headers,
            vec![
                (
                    Cow::Borrowed("id"),
                    Some(Bytes::from_static(b"00000000-0000-0000-0000-000000000001"))
                ),
                (
                    Cow::Borrowed("event_type"),
                    Some(Bytes::from_static(b"CreditDisbursed"))
                ),
            ]
        );
        assert_eq!(record.timestamp_ms, Some(1234));
    }

    #[test]
    fn row_headers_follow_in_order_with_json_text_for_non_strings() {
        let mut e = event("Order");
        e.headers = Some(Bytes::from_static(
            br#"{"n": 12.50, "id": "spoofed", "trace": "t-\"1\" \u00e9", "none": null, "obj": {"a": [1, 2]}}"#,
        ));
        let record = Router::default().route(e, 0).unwrap();
        let headers: Vec<(&str, Option<&[u8]>)> = record
            .headers
            .iter()
            .map(|(k, v)| (k.as_ref(), v.as_deref()))
            .collect();
        assert_eq!(
            headers,
            vec![
                ("id", Some(&b"00000000-0000-0000-0000-000000000001"[..])),
                ("event_type", Some(&b"CreditDisbursed"[..])),
                ("n", Some(&b"12.50"[..])),
                ("trace", Some("t-\"1\" é".as_bytes())),
                ("none", None),
                ("obj", Some(&br#"{"a": [1, 2]}"#[..])),
            ]
        );
    }

    #[test]
    fn headers_that_are_not_an_object_are_an_error_naming_the_event() {
        for bad in [&b"[1]"[..], b"\"x\"", b"{\"a\": ", b"{} trailing"] {
            let mut e = event("Order");
            e.headers = Some(Bytes::copy_from_slice(bad));
            let err = Router::default().route(e, 0).unwrap_err();
            assert!(
                matches!(&err, RouteError::Headers { event_id, .. } if event_id == "00000000-0000-0000-0000-000000000001"),
                "{err}"
            );
        }
    }

    #[test]
    fn templates_case_and_route_by_field() {
        let router = |template: &str, case| {
            Router::new(&RouteConfig {
                by_field: None,
                topic_template: template.into(),
                topic_case: case,
            })
        };
        assert_eq!(
            router("outbox.${routedByValue}", TopicCase::Lower)
                .route(event("OrderLine"), 0)
                .unwrap()
                .topic,
            "outbox.orderline"
        );
        assert_eq!(
            router("${routedByValue}-v1", TopicCase::Upper)
                .route(event("order"), 0)
                .unwrap()
                .topic,
            "ORDER-v1"
        );
        assert_eq!(
            router("all.events", TopicCase::Preserve)
                .route(event("x"), 0)
                .unwrap()
                .topic,
            "all.events"
        );
        let mut e = event("Order");
        e.routed_by = Some(Bytes::from_static(b"tenant-7"));
        assert_eq!(
            Router::default().route(e, 0).unwrap().topic,
            "tenant-7.events"
        );
        let kelvin = router("${routedByValue}", TopicCase::Lower).route(event("\u{212A}unde"), 0);
        assert!(
            kelvin.is_err(),
            "a non-ASCII name must not fold into a legal one"
        );
        let mut e = event("Order");
        e.routed_by = Some(Bytes::new());
        assert!(
            matches!(
                Router::default().route(e, 0),
                Err(RouteError::IllegalTopic { .. })
            ),
            "an empty routing value is bad input"
        );
    }

    #[test]
    fn null_payload_is_a_tombstone_and_null_id_a_null_key() {
        let mut e = event("order");
        e.payload = None;
        e.aggregate_id = None;
        let record = Router::default().route(e, 0).unwrap();
        assert_eq!(record.value, None);
        assert_eq!(record.key, None);
    }

    #[test]
    fn illegal_topic_names_are_errors_naming_the_event() {
        for bad in ["", "has space", "ünicode", "a/b", &"x".repeat(250)] {
            let err = Router::default().route(event(bad), 0).unwrap_err();
            assert!(
                matches!(&err, RouteError::IllegalTopic { event_id, value, .. } if event_id == "00000000-0000-0000-0000-000000000001" && value == bad)
            );
            assert!(err
                .to_string()
                .contains("00000000-0000-0000-0000-000000000001"));
        }
        assert!(validate_topic("..").is_err());
        assert!(validate_topic("a-b_c.D9").is_ok());
    }
}
