//! The error of an event that cannot be routed, and its metric reason.

use std::borrow::Cow;

use super::render;
use crate::source::outbox::{OutboxEvent, Refusal};

/// An event that cannot be routed: bad input. The pipeline stops before confirming its
/// transaction, or dead-letters it (`on_bad_event`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouteError {
    #[error("event {event_id}: routing value {value:?} gives topic {topic:?}, which is not a legal {noun}: {reason}")]
    IllegalTopic {
        event_id: String,
        /// The aggregate type, or the `route.by_field` column's value.
        value: String,
        topic: String,
        /// What the sink's destinations are ([`crate::config::SinkConfig::destination_noun`]).
        noun: &'static str,
        reason: &'static str,
    },
    #[error("event {event_id}: destination {destination:?} is not in route.allowed_destinations")]
    NotAllowed {
        event_id: String,
        destination: String,
    },
    #[error("event {event_id}: destination {destination:?} is the pipeline's {field}, where rows never route")]
    Reserved {
        event_id: String,
        destination: String,
        /// `dead_letter_topic` or `checkpoint_topic`.
        field: &'static str,
    },
    #[error("event {event_id}: the headers column is not a JSON object: {reason}")]
    Headers { event_id: String, reason: String },
    #[error(
        "event {event_id}: routing value {value:?} does not match route.topic_regex {regex:?}"
    )]
    RegexMismatch {
        event_id: String,
        value: String,
        regex: String,
    },
    #[error("event {event_id}: column {column:?} used in route.topic_template is {problem}")]
    TemplateColumn {
        event_id: String,
        column: String,
        /// `NULL` or `missing`.
        problem: &'static str,
    },
    #[error("event {event_id}: partition column {column:?} has value {value:?}, which is not a partition number (an integer 0 to 2147483647)")]
    Partition {
        event_id: String,
        column: String,
        value: String,
    },
    #[error("event {event_id}: timestamp column {column:?} has value {value:?}, which is not a timestamp Kafka takes (ISO, e.g. 2026-11-29 23:24:30.123456+00, not before 1970)")]
    Timestamp {
        event_id: String,
        column: String,
        value: String,
    },
    #[error(
        "event {event_id}: column {column:?} is not UTF-8 text and cannot go in the JSON envelope"
    )]
    NotUtf8 { event_id: String, column: String },
    #[error("event {event_id}: bytea column {column:?} is not in PostgreSQL's hex form (\\x followed by pairs of hex digits)")]
    Bytea { event_id: String, column: String },
    #[error("event {event_id}: json_payload = \"debezium_expanded\", but Debezium's expansion fails on the payload: {reason}")]
    JsonExpansion { event_id: String, reason: String },
    #[error("event {event_id} (aggregate {aggregate}): {bytes} bytes, more than max_event_bytes = {limit} ({from}); refused before its values were copied: raise max_event_bytes if the sink takes records this large and the relay's memory allows, or set on_bad_event = \"dead_letter\" to dead-letter a reference to such rows")]
    TooLarge {
        event_id: String,
        /// The aggregate type and id, `type/id`.
        aggregate: String,
        bytes: usize,
        limit: usize,
        /// Where the limit comes from ([`crate::config::EventLimit::from`]).
        from: &'static str,
    },
    #[error("event {event_id}: column {column:?} of {relation} is not valid UTF-8: the database's encoding (SQL_ASCII) stores text as any bytes; store text as UTF-8 (a database created with ENCODING 'UTF8'), and binary data in a bytea column")]
    InvalidUtf8 {
        event_id: String,
        relation: String,
        column: String,
    },
    #[error("event {event_id}: not a CloudEvent: {reason}")]
    CloudEvents { event_id: String, reason: String },
}

impl RouteError {
    /// A low-cardinality name of the kind of problem, for the `reason` metric label.
    pub fn reason_label(&self) -> &'static str {
        match self {
            RouteError::IllegalTopic { .. } => "illegal_topic",
            RouteError::NotAllowed { .. } => "not_allowed",
            RouteError::Reserved { .. } => "reserved_destination",
            RouteError::Headers { .. } => "headers",
            RouteError::RegexMismatch { .. } => "topic_regex",
            RouteError::TemplateColumn { .. } => "template_column",
            RouteError::Partition { .. } => "partition",
            RouteError::Timestamp { .. } => "timestamp",
            RouteError::NotUtf8 { .. } => "not_utf8",
            RouteError::Bytea { .. } => "bytea",
            RouteError::JsonExpansion { .. } => "json_expansion",
            RouteError::TooLarge { .. } => "too_large",
            RouteError::InvalidUtf8 { .. } => "invalid_utf8",
            RouteError::CloudEvents { .. } => "cloudevents",
        }
    }
}

/// The routing error of an event the source refused.
pub(super) fn refused(event: &OutboxEvent, refusal: &Refusal) -> RouteError {
    let event_id = String::from_utf8_lossy(&event.id).into_owned();
    match refusal {
        Refusal::TooLarge { bytes, limit } => RouteError::TooLarge {
            event_id,
            aggregate: format!(
                "{}/{}",
                String::from_utf8_lossy(&event.aggregate_type),
                event
                    .aggregate_id
                    .as_deref()
                    .map_or(Cow::Borrowed("NULL"), String::from_utf8_lossy)
            ),
            bytes: *bytes,
            limit: limit.bytes,
            from: limit.from,
        },
        Refusal::NotUtf8 { relation, column } => RouteError::InvalidUtf8 {
            event_id,
            relation: relation.clone(),
            column: column.clone(),
        },
    }
}

/// The error for `column` of `event` that could not be rendered.
pub(super) fn unrenderable(
    event: &OutboxEvent,
    column: &str,
    problem: render::Unrenderable,
) -> RouteError {
    let event_id = String::from_utf8_lossy(&event.id).into_owned();
    let column = column.to_owned();
    match problem {
        render::Unrenderable::NotUtf8 => RouteError::NotUtf8 { event_id, column },
        render::Unrenderable::NotHex => RouteError::Bytea { event_id, column },
    }
}
