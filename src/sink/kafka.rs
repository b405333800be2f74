//! The Kafka sink: an rdkafka idempotent producer with one delivery future per record.
//!
//! `enable.idempotence=true` with `acks=all` keeps each partition's records in send order
//! without duplicates across librdkafka's internal retries; the partition is chosen from the
//! key (the aggregate id), so one aggregate's events stay in commit order.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::Message;

use super::{Delivery, DeliveryError, InFlight, Record, Sink};
use crate::checkpoint::EventToken;
use crate::config::KafkaConfig;

/// Kafka client setup failed (bad property, unknown security protocol, ...).
#[derive(Debug, thiserror::Error)]
#[error("cannot create the Kafka producer")]
pub struct ProducerError(#[source] pub KafkaError);

/// An rdkafka [`FutureProducer`] as a [`Sink`].
pub struct KafkaSink {
    /// `None` only while being dropped.
    producer: Option<FutureProducer>,
    pending: FuturesUnordered<PendingDelivery>,
    /// Outcomes taken while waiting for queue space, not yet handed out (still in flight
    /// for the accounting), with their sizes.
    ready: Vec<(Delivery, usize)>,
    in_flight: InFlight,
    /// librdkafka's `message.max.bytes`, named in size errors.
    message_max_bytes: String,
}

impl KafkaSink {
    /// Creates the idempotent producer for `config`, with `queue_messages` as librdkafka's
    /// local queue limit (at least the pipeline's in-flight limit, so the relay's own limit
    /// is what applies).
    ///
    /// Returns an error if librdkafka rejects the configuration. Does not contact the broker.
    pub fn new(
        config: &KafkaConfig,
        client_id: &str,
        queue_messages: usize,
    ) -> Result<Self, ProducerError> {
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &config.bootstrap_servers)
            .set("client.id", client_id)
            // The Java client's partitioner (Debezium, Kafka Connect, Kafka Streams): an
            // aggregate keeps the partition it had before the switch to this relay.
            .set("partitioner", "murmur2_random");
        for (key, value) in &config.properties {
            client.set(key, value);
        }
        // What the delivery guarantees rest on, after the user's properties so nothing
        // weakens them (validation already rejects conflicting values).
        let queue_messages = client
            .get("queue.buffering.max.messages")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0)
            .max(queue_messages)
            .max(100_000);
        // A record that times out can leave a gap that later records of its partition fill
        // ahead of it. Unless the operator sets a timeout, librdkafka retries in order for
        // as long as the broker is away, and the relay waits (reading no WAL beyond its
        // in-flight limits, still answering the walsender).
        if client.get("message.timeout.ms").is_none() && client.get("delivery.timeout.ms").is_none()
        {
            client.set("message.timeout.ms", "0");
        }
        client
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("queue.buffering.max.messages", queue_messages.to_string());
        let message_max_bytes = client
            .get("message.max.bytes")
            .unwrap_or("1000000")
            .to_owned();
        Ok(KafkaSink {
            message_max_bytes,
            producer: Some(client.create().map_err(ProducerError)?),
            pending: FuturesUnordered::new(),
            ready: Vec::new(),
            in_flight: InFlight::default(),
        })
    }
}

impl Drop for KafkaSink {
    /// Dropping a producer joins librdkafka's threads and may wait for in-flight requests:
    /// do it off the async runtime.
    fn drop(&mut self) {
        if let Some(producer) = self.producer.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(move || drop(producer))),
                Err(_) => drop(producer),
            }
        }
    }
}

impl Sink for KafkaSink {
    async fn send(&mut self, record: Record, token: EventToken) -> Result<(), DeliveryError> {
        let size = record.size();
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (key, value) in &record.headers {
            headers = headers.insert(Header {
                key: key.as_ref(),
                value: value.as_deref(),
            });
        }
        let mut future_record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&record.topic).headers(headers);
        if let Some(key) = &record.key {
            future_record = future_record.key(key.as_ref());
        }
        if let Some(value) = &record.value {
            future_record = future_record.payload(value.as_ref());
        }
        if let Some(timestamp) = record.timestamp_ms {
            future_record = future_record.timestamp(timestamp);
        }
        if let Some(partition) = record.partition {
            future_record = future_record.partition(partition);
        }
        loop {
            let producer = self.producer.as_ref().expect("producer present until drop");
            match producer.send_result(future_record) {
                Ok(future) => {
                    let meta = RecordMeta {
                        token,
                        topic: record.topic,
                        size,
                        sent: Instant::now(),
                        timestamp_ms: record.timestamp_ms,
                    };
                    self.pending.push(PendingDelivery { future, meta });
                    self.in_flight.events += 1;
                    self.in_flight.bytes += size;
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    // librdkafka's queue is full: wait for one outcome, keep it, try again.
                    future_record = returned;
                    match self.pending.next().await {
                        Some((meta, outcome)) => {
                            let size = meta.size;
                            let delivery = self.describe_outcome(meta, outcome);
                            self.ready.push((delivery, size));
                        }
                        None => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
                Err((error, _)) => return Err(self.refused(&error, size, record)),
            }
        }
    }

    async fn next_delivery(&mut self) -> Option<Delivery> {
        let (delivery, size) = match self.ready.pop() {
            Some(ready) => ready,
            None => {
                let (meta, outcome) = self.pending.next().await?;
                let size = meta.size;
                (self.describe_outcome(meta, outcome), size)
            }
        };
        self.in_flight.events -= 1;
        self.in_flight.bytes -= size;
        Some(delivery)
    }

    fn in_flight(&self) -> InFlight {
        self.in_flight
    }

    fn oldest_in_flight(&self) -> Option<Instant> {
        // Outcomes in `ready` arrived already: only the pending ones are still waiting.
        self.pending.iter().map(|p| p.meta.sent).min()
    }
}

impl KafkaSink {
    fn describe(&self, error: &KafkaError, size: usize) -> String {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::MessageSizeTooLarge) => format!(
                "{error}: record of {size} bytes (key, value and headers) exceeds the limit (producer message.max.bytes = {}; the broker's and topic's max.message.bytes apply too)",
                self.message_max_bytes
            ),
            _ => format!("{error} (record of {size} bytes)"),
        }
    }

    /// The error for `record` (`size` bytes) that the client refused or failed to deliver.
    fn refused(&self, error: &KafkaError, size: usize, record: Record) -> DeliveryError {
        DeliveryError {
            event_id: record.event_id(),
            topic: record.topic.clone(),
            retryable: is_retryable(error),
            too_large: is_too_large(error),
            reason: self.describe(error, size),
            record: Some(Box::new(record)),
        }
    }

    fn describe_outcome(&self, meta: RecordMeta, outcome: DeliveryOutcome) -> Delivery {
        let size = meta.size;
        let result = match outcome {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((error, message))) => {
                Err(self.refused(&error, size, returned_record(&message, meta.timestamp_ms)))
            }
            Err(_canceled) => Err(DeliveryError {
                event_id: String::new(),
                topic: String::new(),
                retryable: true,
                too_large: false,
                reason: "the producer was dropped before the delivery report".into(),
                record: None,
            }),
        };
        Delivery {
            token: meta.token,
            topic: meta.topic,
            result,
            latency: meta.sent.elapsed(),
            timestamp_ms: meta.timestamp_ms,
        }
    }
}

type DeliveryOutcome = Result<OwnedDeliveryResult, futures::channel::oneshot::Canceled>;

/// A delivery future tagged with the record's token and size.
struct PendingDelivery {
    future: DeliveryFuture,
    meta: RecordMeta,
}

/// What the sink keeps of a record while it is in flight.
#[derive(Clone)]
struct RecordMeta {
    token: EventToken,
    topic: String,
    size: usize,
    sent: Instant,
    timestamp_ms: Option<i64>,
}

impl Future for PendingDelivery {
    type Output = (RecordMeta, DeliveryOutcome);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let outcome = std::task::ready!(Pin::new(&mut self.future).poll(cx));
        // Polled to completion once (FuturesUnordered drops it then): take the meta.
        let meta = RecordMeta {
            topic: std::mem::take(&mut self.meta.topic),
            ..self.meta.clone()
        };
        Poll::Ready((meta, outcome))
    }
}

/// A record librdkafka gave back with a failed delivery report, as a [`Record`].
fn returned_record(message: &OwnedMessage, timestamp_ms: Option<i64>) -> Record {
    let headers = message
        .headers()
        .map(|headers| {
            headers
                .iter()
                .map(|h| {
                    (
                        Cow::Owned(h.key.to_owned()),
                        h.value.map(Bytes::copy_from_slice),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Record {
        topic: message.topic().to_owned(),
        key: message.key().map(Bytes::copy_from_slice),
        value: message.payload().map(Bytes::copy_from_slice),
        headers,
        timestamp_ms,
        partition: None,
    }
}

/// The record exceeds a size limit of the producer, broker or topic.
fn is_too_large(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize)
    )
}

/// Errors that publishing the same record again cannot fix.
fn is_retryable(error: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    !matches!(
        error.rdkafka_error_code(),
        Some(
            MessageSizeTooLarge
                | InvalidMessageSize
                | InvalidMessage
                | InvalidTopic
                | UnknownTopic
                | TopicAuthorizationFailed
                | ClusterAuthorizationFailed
                | InvalidRecord
                | InvalidArgument
                | InvalidTimestamp
                | PolicyViolation
                // A partition placement beyond the topic's partitions.
                | UnknownPartition
        )
    )
}
