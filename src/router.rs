//! Routes outbox events to Kafka records: topic, key, value and headers.
//!
//! - Topic: `<aggregate_type>.events`, case preserved (Kafka topic names are case-sensitive,
//!   so folding would merge distinct aggregates). A value that makes an illegal topic name is
//!   an error, never a silent rename.
//! - Key: the aggregate id bytes; SQL NULL gives a null key.
//! - Value: the payload bytes exactly as PostgreSQL printed them; SQL NULL gives a tombstone.
//! - Headers: `id` (the event id, as Debezium's outbox router) and `event_type`.
//! - Timestamp: the transaction's commit time.

use bytes::Bytes;

use crate::sink::Record;
use crate::source::outbox::OutboxEvent;

/// Appended to the aggregate type to name the topic.
pub const TOPIC_SUFFIX: &str = ".events";
/// Kafka's limit on topic name length.
const MAX_TOPIC_LEN: usize = 249;

/// An event that cannot be routed; the pipeline stops before confirming its transaction.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("event {event_id}: aggregate type {aggregate_type:?} gives topic {topic:?}, which is not a legal Kafka topic name: {reason}")]
pub struct RouteError {
    pub event_id: String,
    pub aggregate_type: String,
    pub topic: String,
    pub reason: &'static str,
}

/// Turns events into records.
#[derive(Debug, Default, Clone)]
pub struct Router;

impl Router {
    /// Routes `event`, committed at `commit_time_ms` (Unix epoch, ms).
    ///
    /// Returns an error if the aggregate type does not make a legal topic name.
    pub fn route(&self, event: OutboxEvent, commit_time_ms: i64) -> Result<Record, RouteError> {
        let aggregate_type = String::from_utf8_lossy(&event.aggregate_type);
        let topic = format!("{aggregate_type}{TOPIC_SUFFIX}");
        let valid = if aggregate_type.is_empty() {
            Err("the aggregate type is empty")
        } else {
            validate_topic(&topic)
        };
        if let Err(reason) = valid {
            return Err(RouteError {
                event_id: String::from_utf8_lossy(&event.id).into_owned(),
                aggregate_type: aggregate_type.into_owned(),
                topic,
                reason,
            });
        }
        let mut headers: Vec<(&'static str, Bytes)> = Vec::with_capacity(2);
        headers.push(("id", event.id));
        if let Some(event_type) = event.event_type {
            headers.push(("event_type", event_type));
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
    if !topic.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
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
            lsn: Lsn(1),
        }
    }

    #[test]
    fn routes_by_aggregate_type_preserving_case_and_bytes() {
        let record = Router.route(event("Order"), 1234).unwrap();
        assert_eq!(record.topic, "Order.events");
        assert_eq!(record.key.as_deref(), Some(&b"42"[..]));
        assert_eq!(record.value.as_deref(), Some(&b"{\"amount\": 1500000.10}"[..]));
        assert_eq!(
            record.headers,
            vec![
                ("id", Bytes::from_static(b"00000000-0000-0000-0000-000000000001")),
                ("event_type", Bytes::from_static(b"CreditDisbursed")),
            ]
        );
        assert_eq!(record.timestamp_ms, Some(1234));
    }

    #[test]
    fn null_payload_is_a_tombstone_and_null_id_a_null_key() {
        let mut e = event("order");
        e.payload = None;
        e.aggregate_id = None;
        let record = Router.route(e, 0).unwrap();
        assert_eq!(record.value, None);
        assert_eq!(record.key, None);
    }

    #[test]
    fn illegal_topic_names_are_errors_naming_the_event() {
        for bad in ["", "has space", "ünicode", "a/b", &"x".repeat(250)] {
            let err = Router.route(event(bad), 0).unwrap_err();
            assert_eq!(err.event_id, "00000000-0000-0000-0000-000000000001");
            assert!(err.to_string().contains("00000000-0000-0000-0000-000000000001"));
        }
        assert!(validate_topic("..").is_err());
        assert!(validate_topic("a-b_c.D9").is_ok());
    }
}
