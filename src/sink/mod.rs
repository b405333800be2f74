//! Where records go: the [`Sink`] trait, its Kafka implementation and the other sink kinds.
//!
//! Kafka ([`kafka`]) pipelines with per-partition sequence numbers of its own; every other kind
//! is a [`ordered::Publisher`] (one record, one acknowledgement) behind
//! [`ordered::OrderedSink`], which keeps each key's records in order. [`AnySink`] is the one
//! the pipeline configured.
//!
//! A sink separates accepting a record ([`Sink::send`], which never waits: a full queue gives
//! the record back) from its delivery outcome ([`Sink::next_delivery`]): the pipeline confirms
//! an LSN only from outcomes, never from acceptance. The exactly-once capability of a sink is
//! [`crate::exactly_once::TransactionalSink`].

mod any;
pub mod http;
pub mod kafka;
pub mod nats;
pub mod ordered;
pub mod producer;
pub mod rabbitmq;
pub mod redis;

#[cfg(test)]
pub(crate) use any::hold_on_refusal;
pub use any::{AnySink, ConnectError};

use std::future::Future;

use std::borrow::Cow;

use bytes::Bytes;

use crate::ack::EventToken;

/// A record header: name and value (`None`: a null value).
pub type Header = (Cow<'static, str>, Option<Bytes>);

/// A message for the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    /// `None`: a null key.
    pub key: Option<Bytes>,
    /// `None`: a tombstone.
    pub value: Option<Bytes>,
    /// Name and value (`None`: a null header value), in order.
    pub headers: Vec<Header>,
    /// Unix epoch, ms.
    pub timestamp_ms: Option<i64>,
    /// `None`: chosen by the producer's partitioner from the key.
    pub partition: Option<i32>,
}

impl Record {
    /// Bytes of key, value and headers: what the in-flight byte limit counts.
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Bytes::len)
            + self.value.as_ref().map_or(0, Bytes::len)
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Bytes::len))
                .sum::<usize>()
    }

    /// The `id` header, for error messages.
    pub fn event_id(&self) -> String {
        self.headers
            .iter()
            .find(|(k, _)| k == "id")
            .and_then(|(_, v)| v.as_deref())
            .map_or_else(String::new, |v| String::from_utf8_lossy(v).into_owned())
    }
}

/// Why a record was not delivered.
#[derive(Debug, thiserror::Error)]
#[error("delivery of event {event_id} to topic {topic:?} failed: {reason}")]
pub struct DeliveryError {
    pub event_id: String,
    pub topic: String,
    pub reason: String,
    /// Whether publishing again may succeed (broker down, timeout) or not (record too large,
    /// invalid topic, not authorized).
    pub retryable: bool,
    /// The record is larger than the producer's or the broker's limit.
    pub too_large: bool,
    /// The client's connection is gone and it will not reconnect by itself (a closed RabbitMQ
    /// connection, a Redis server that turned replica or lost its credentials): the session
    /// must end so the next one connects again, even where its source records the failure.
    /// Implies `retryable`.
    pub connection_lost: bool,
    /// Whether the record was sent to the server at all: an ordered sink fails the records of
    /// a key queued behind a failed one without sending them. A source that counts attempts
    /// (polling: `retry_count`) charges none to such a record.
    pub attempted: bool,
    /// The refused record as the client gave it back (`None` when it did not), for a
    /// dead-letter copy.
    pub record: Option<Box<Record>>,
}

impl DeliveryError {
    /// The same error without the record, as a source keeps it.
    pub fn without_record(&self) -> DeliveryError {
        DeliveryError {
            event_id: self.event_id.clone(),
            topic: self.topic.clone(),
            reason: self.reason.clone(),
            record: None,
            ..*self
        }
    }
}

/// Why [`Sink::send`] did not accept a record.
#[derive(Debug)]
pub enum SendError {
    /// The client's queue has no room: the record, to send again once an outcome freed some.
    Full(Box<Record>),
    /// The client refused the record outright (e.g. larger than its limit).
    Refused(DeliveryError),
}

/// The outcome of one record.
#[derive(Debug)]
pub struct Delivery {
    pub token: EventToken,
    /// The record's topic.
    pub topic: String,
    pub result: Result<(), DeliveryError>,
    /// From acceptance to outcome.
    pub latency: std::time::Duration,
    /// The record's timestamp (the commit time, Unix ms).
    pub timestamp_ms: Option<i64>,
}

/// Records and bytes accepted but without an outcome yet.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    pub events: usize,
    pub bytes: usize,
}

/// A destination for records with per-record delivery outcomes.
pub trait Sink: Send {
    /// Accepts `record` for delivery; its outcome later comes from [`Sink::next_delivery`]
    /// with `token`. Never waits, so the caller stays free to answer its source and shutdown.
    ///
    /// Returns [`SendError::Full`] with the record when the client's own queue has no room,
    /// [`SendError::Refused`] if the record is refused outright (e.g. larger than the
    /// client's limit).
    fn send(&mut self, record: Record, token: EventToken) -> Result<(), SendError>;

    /// The next delivery outcome, in no particular order; `None` when nothing is in flight.
    ///
    /// Cancel-safe.
    fn next_delivery(&mut self) -> impl Future<Output = Option<Delivery>> + Send;

    /// What was accepted and has no outcome yet.
    fn in_flight(&self) -> InFlight;

    /// What the pipeline's ended sessions left in a client this sink shares (a shared Kafka
    /// producer's records that have no report yet): not this sink's to await, but counted
    /// against the pipeline's limits until their reports come. None for other sinks.
    fn left_over(&self) -> InFlight {
        InFlight::default()
    }

    /// Why records wait before the sink takes them, when they do for a reason an operator must
    /// mend (a Kafka topic that does not exist); `None` otherwise. Called on a timer, and in
    /// exactly-once mode whenever a record waits for room.
    fn waiting(&self) -> Option<String> {
        None
    }

    /// When the oldest of the records [`Sink::left_over`] counts was accepted (kept until the
    /// last of them has its report); `None` when there are none. None for other sinks.
    fn oldest_left_over(&self) -> Option<std::time::Instant> {
        None
    }

    /// When the oldest record that has no outcome yet was accepted; `None` when nothing is
    /// awaiting its outcome. May take time linear in the records in flight: call it on a
    /// timer, not per record.
    fn oldest_in_flight(&self) -> Option<std::time::Instant>;

    /// The session ends on a failed delivery: the records still in flight may be behind the
    /// failed one, of its key, and must not reach the destination before its second copy
    /// (DESIGN.md, I3). A client that would still send them once the session has ended (a
    /// Kafka producer: shared with other pipelines, or destroyed only later) withdraws them:
    /// it sends and retries nothing more, and their outcomes, if anyone awaits them, are
    /// failures. A record already on its way may still be written.
    ///
    /// Does nothing by default: the other sinks hold one record of a key at a time, and their
    /// clients end with the session.
    fn withdraw_in_flight(&mut self) {}
}
