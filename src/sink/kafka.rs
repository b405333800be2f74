//! The Kafka sink: an rdkafka idempotent producer with one delivery future per record.
//!
//! `enable.idempotence=true` with `acks=all` keeps each partition's records in send order
//! without duplicates across librdkafka's internal retries; the partition is chosen from the
//! key (the aggregate id), so one aggregate's events stay in commit order.
//!
//! In exactly-once mode the producer is transactional as well ([`Transactions`]): records
//! sent between [`Transactions::begin`] and [`Transactions::commit`] become visible to
//! `read_committed` consumers together with the checkpoint record that the commit adds, or not
//! at all. [`read_checkpoint`] reads the last committed checkpoint back at session start.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

use super::producer::{DeliveryContext, DeliveryFuture, DeliveryReport, PolledProducer};
use super::{Delivery, DeliveryError, InFlight, Record, Sink};
use crate::checkpoint::{Checkpoint, CheckpointError, EventToken};
use crate::config::KafkaConfig;
use crate::lsn::Lsn;

/// Kafka client setup failed (bad property, unknown security protocol, ...).
#[derive(Debug, thiserror::Error)]
#[error("cannot create the Kafka producer")]
pub struct ProducerError(#[source] pub KafkaError);

/// An rdkafka producer ([`PolledProducer`]) as a [`Sink`].
pub struct KafkaSink {
    producer: PolledProducer,
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
    /// With `transactional_id` the producer is transactional (exactly-once mode): records are
    /// sent only inside a transaction ([`KafkaSink::transactions`]), and a record that times
    /// out after `transaction.timeout.ms` (librdkafka's default for `message.timeout.ms` then)
    /// fails its transaction instead of waiting forever.
    ///
    /// Returns an error if librdkafka rejects the configuration. Connects to the broker in the background; never waits for it.
    pub fn new(
        config: &KafkaConfig,
        client_id: &str,
        queue_messages: usize,
        transactional_id: Option<&str>,
    ) -> Result<Self, ProducerError> {
        let client = producer_config(config, client_id, queue_messages, transactional_id);
        let message_max_bytes = client
            .get("message.max.bytes")
            .unwrap_or("1000000")
            .to_owned();
        Ok(KafkaSink {
            message_max_bytes,
            producer: PolledProducer::new(&client).map_err(ProducerError)?,
            pending: FuturesUnordered::new(),
            ready: Vec::new(),
            in_flight: InFlight::default(),
        })
    }
}

/// librdkafka's properties for the producer of [`KafkaSink::new`]: the relay's defaults, then
/// the operator's `properties`, then what the delivery guarantees rest on.
fn producer_config(
    config: &KafkaConfig,
    client_id: &str,
    queue_messages: usize,
    transactional_id: Option<&str>,
) -> ClientConfig {
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
    if let Some(id) = transactional_id {
        client.set("transactional.id", id);
    } else if client.get("message.timeout.ms").is_none()
        && client.get("delivery.timeout.ms").is_none()
    {
        client.set("message.timeout.ms", "0");
    }
    client
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("queue.buffering.max.messages", queue_messages.to_string());
    client
}

impl KafkaSink {
    /// The transaction calls of this sink's producer (created with a `transactional_id`), with
    /// checkpoint records keyed `pipeline` in `checkpoint_topic`.
    pub fn transactions(&self, checkpoint_topic: &str, pipeline: &str) -> Transactions {
        Transactions {
            producer: self.producer.clone(),
            checkpoint_topic: checkpoint_topic.to_owned(),
            pipeline: pipeline.to_owned(),
        }
    }
}

/// How long one blocking transaction call (init, commit, abort) may take. librdkafka's
/// `transaction.timeout.ms` defaults to 60 s too: a transaction the coordinator would abort
/// anyway is given up on by then.
const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long reading the checkpoint topic to its end may take at session start.
const CHECKPOINT_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A Kafka transaction call failed.
#[derive(Debug, thiserror::Error)]
#[error("kafka transaction {operation} failed")]
pub struct TransactionError {
    /// `init`, `begin`, `commit` or `abort`.
    pub operation: &'static str,
    #[source]
    pub source: KafkaError,
}

impl TransactionError {
    /// Whether another producer with the same `transactional.id` took over (a relay started
    /// since): this producer can do nothing more. The standby pattern: stop the session and
    /// retry as while the slot is in use.
    pub fn is_fenced(&self) -> bool {
        let code = match &self.source {
            KafkaError::Transaction(e) => Some(e.code()),
            other => other.rdkafka_error_code(),
        };
        matches!(
            code,
            Some(
                RDKafkaErrorCode::ProducerFenced
                    | RDKafkaErrorCode::InvalidProducerEpoch
                    | RDKafkaErrorCode::Fenced
            )
        )
    }

    /// Whether a new session (a new producer) may succeed; not for refused authorization or
    /// an invalid transaction timeout, which need the operator.
    pub fn is_transient(&self) -> bool {
        !matches!(
            self.source.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                    | RDKafkaErrorCode::ClusterAuthorizationFailed
                    | RDKafkaErrorCode::TopicAuthorizationFailed
                    | RDKafkaErrorCode::InvalidTransactionTimeout
            )
        )
    }
}

/// The transaction calls of a transactional [`KafkaSink`] (exactly-once mode).
///
/// librdkafka's transaction calls block: each runs on tokio's blocking pool (on a clone of the
/// producer), never on the runtime's threads. Not cancel-safe in the sense that a dropped
/// call still completes in the background.
pub struct Transactions {
    producer: PolledProducer,
    checkpoint_topic: String,
    pipeline: String,
}

impl Transactions {
    /// Registers the `transactional.id` with the transaction coordinator: fences any earlier
    /// producer with this id (a relay that lost its slot but still runs) and aborts its open
    /// transaction, so a `read_committed` read afterwards sees everything it committed.
    ///
    /// Returns an error if the coordinator cannot be reached within 60 s or refuses the id.
    pub async fn init(&self) -> Result<(), TransactionError> {
        self.call("init", |p| p.init_transactions(TRANSACTION_CALL_TIMEOUT))
            .await
    }

    /// Starts a Kafka transaction; the records sent until [`Transactions::commit`] or
    /// [`Transactions::abort`] belong to it.
    pub async fn begin(&self) -> Result<(), TransactionError> {
        self.call("begin", |p| p.begin_transaction()).await
    }

    /// Adds the checkpoint record (key = pipeline name, value = `end_lsn` as PostgreSQL prints
    /// it), waits for its acknowledgement and commits the transaction. Call it once every
    /// other record of the transaction was acknowledged: librdkafka's commit then has nothing
    /// left to flush (rdkafka's flush loop would otherwise sleep in 100 ms steps), and fails the
    /// commit if a record of the transaction failed (an abortable error).
    ///
    /// A commit that fails with a retriable error is tried again (without a second checkpoint).
    ///
    /// Returns an error if the transaction could not be committed within 60 s; then it is open
    /// or aborted, never committed without the checkpoint. The returned future owns what it
    /// needs, so it may be kept across `select!` iterations.
    pub fn commit(
        &self,
        end_lsn: Lsn,
    ) -> impl Future<Output = Result<(), TransactionError>> + Send + 'static {
        let producer = self.producer.clone();
        let topic = self.checkpoint_topic.clone();
        let key = self.pipeline.clone();
        let value = Checkpoint(end_lsn).encode();
        let commit = self.call("commit", |p| {
            // A retriable error (coordinator moving or loading, request timed out) leaves the
            // transaction open: commit again, as librdkafka's documentation says, until the
            // deadline.
            let deadline = std::time::Instant::now() + TRANSACTION_CALL_TIMEOUT;
            // The checkpoint's report reached us before librdkafka stopped counting the
            // record (rdkafka completes the future, then frees the report): commit's own
            // flush would then poll for a whole 100 ms. A flush without a timeout only looks.
            while p.flush(Duration::ZERO).is_err() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match p.commit_transaction(left) {
                    Err(KafkaError::Transaction(e)) if e.is_retriable() && !left.is_zero() => {
                        tracing::debug!(error = %e, "kafka commit failed with a retriable error; committing again");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    result => return result,
                }
            }
        });
        async move {
            let failed = |source| TransactionError {
                operation: "commit",
                source,
            };
            let (record, delivery) = PolledProducer::record(&topic);
            producer
                .send(record.key(key.as_bytes()).payload(value.as_bytes()))
                .map_err(|(e, _)| failed(e))?;
            match delivery.await {
                Ok(Ok(())) => {}
                Ok(Err((e, _))) => return Err(failed(e)),
                Err(_canceled) => return Err(failed(KafkaError::Canceled)),
            }
            commit.await
        }
    }

    /// Aborts the open transaction: its records are never shown to `read_committed`
    /// consumers.
    ///
    /// Returns an error if the producer is fenced or the coordinator does not answer in time.
    pub async fn abort(&self, timeout: Duration) -> Result<(), TransactionError> {
        self.call("abort", move |p| p.abort_transaction(timeout))
            .await
    }

    /// Runs `f` on the blocking pool with a clone of the producer; the future owns what it
    /// needs, so it may be kept across `select!` iterations.
    fn call<T: Send + 'static>(
        &self,
        operation: &'static str,
        f: impl FnOnce(&BaseProducer<DeliveryContext>) -> Result<T, KafkaError> + Send + 'static,
    ) -> impl Future<Output = Result<T, TransactionError>> + Send + 'static {
        let producer = self.producer.clone();
        async move {
            match tokio::task::spawn_blocking(move || f(producer.inner())).await {
                Ok(result) => result.map_err(|source| TransactionError { operation, source }),
                Err(join) => std::panic::resume_unwind(join.into_panic()),
            }
        }
    }
}

/// Client context of the checkpoint reader: the end of a partition is how it knows it is
/// done, not an error to log (rdkafka's default context logs it as one).
struct CheckpointReader;

impl rdkafka::ClientContext for CheckpointReader {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF) {
            tracing::error!(error = %error, reason, "librdkafka error while reading the checkpoint topic");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for CheckpointReader {}

/// Reads the exactly-once checkpoint of `pipeline` from `topic`: assigns every partition from
/// the beginning with a `read_committed` consumer, reads each to its end (the last stable
/// offset: records of open transactions wait, those of aborted ones are never seen) and
/// returns the last value under the key `pipeline` (the highest of the partitions' last
/// values, should the key be in several after partitions were added). Blocking work runs on
/// tokio's blocking pool.
///
/// Returns `Ok(None)` when the topic has no checkpoint for this pipeline (or its last value
/// is a tombstone), and an error if the topic does not exist, a value is not an LSN, or the
/// end is not reached within 60 s.
pub async fn read_checkpoint(
    config: &KafkaConfig,
    topic: &str,
    pipeline: &str,
) -> Result<Option<Lsn>, CheckpointError> {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", &config.bootstrap_servers);
    for (key, value) in &config.properties {
        client.set(key, value);
    }
    client
        .set("group.id", format!("outbox-relay-checkpoint-{pipeline}"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .set("allow.auto.create.topics", "false");
    let (topic, pipeline) = (topic.to_owned(), pipeline.to_owned());
    let read = move || -> Result<Option<Lsn>, CheckpointError> {
        let kafka = |source| CheckpointError::Kafka {
            topic: topic.clone(),
            source,
        };
        let consumer: BaseConsumer<CheckpointReader> = client
            .create_with_context(CheckpointReader)
            .map_err(kafka)?;
        let deadline = std::time::Instant::now() + CHECKPOINT_READ_TIMEOUT;
        let metadata = consumer
            .fetch_metadata(Some(&topic), CHECKPOINT_READ_TIMEOUT)
            .map_err(kafka)?;
        let partitions = match metadata.topics().iter().find(|t| t.name() == topic) {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => t.partitions().len(),
            _ => return Err(CheckpointError::MissingTopic(topic.clone())),
        };
        let mut assignment = TopicPartitionList::new();
        for partition in 0..partitions {
            let partition = i32::try_from(partition).expect("partition count fits i32");
            assignment
                .add_partition_offset(&topic, partition, Offset::Beginning)
                .map_err(kafka)?;
        }
        consumer.assign(&assignment).map_err(kafka)?;
        let mut at_end = vec![false; partitions];
        // The last value of each partition (records of one partition are in order); a key
        // lives in one partition unless partitions were added to the topic, and checkpoints
        // only grow, so the highest of them is the checkpoint.
        let mut last = vec![None; partitions];
        while at_end.contains(&false) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(CheckpointError::Timeout(topic.clone()));
            }
            match consumer.poll(left.min(Duration::from_millis(500))) {
                None => {}
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    if let Some(end) = usize::try_from(partition)
                        .ok()
                        .and_then(|p| at_end.get_mut(p))
                    {
                        *end = true;
                    }
                }
                Some(Err(e)) => return Err(kafka(e)),
                Some(Ok(message)) if message.key() == Some(pipeline.as_bytes()) => {
                    let Some(slot) = usize::try_from(message.partition())
                        .ok()
                        .and_then(|p| last.get_mut(p))
                    else {
                        continue;
                    };
                    *slot = match message.payload() {
                        None => None,
                        Some(value) => Some(Checkpoint::decode(value).map_err(|reason| {
                            CheckpointError::Value {
                                topic: topic.clone(),
                                partition: message.partition(),
                                offset: message.offset(),
                                reason,
                            }
                        })?),
                    };
                }
                // Another pipeline's checkpoint.
                Some(Ok(_)) => {}
            }
        }
        Ok(last.into_iter().flatten().map(|c: Checkpoint| c.0).max())
    };
    match tokio::task::spawn_blocking(read).await {
        Ok(result) => result,
        Err(join) => std::panic::resume_unwind(join.into_panic()),
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
        let (mut kafka_record, future) = PolledProducer::record(&record.topic);
        kafka_record = kafka_record.headers(headers);
        if let Some(key) = &record.key {
            kafka_record = kafka_record.key(key.as_ref());
        }
        if let Some(value) = &record.value {
            kafka_record = kafka_record.payload(value.as_ref());
        }
        if let Some(timestamp) = record.timestamp_ms {
            kafka_record = kafka_record.timestamp(timestamp);
        }
        if let Some(partition) = record.partition {
            kafka_record = kafka_record.partition(partition);
        }
        loop {
            match self.producer.send(kafka_record) {
                Ok(()) => {
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
                    kafka_record = returned;
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

type DeliveryOutcome = Result<DeliveryReport, futures::channel::oneshot::Canceled>;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka(properties: &[(&str, &str)]) -> KafkaConfig {
        KafkaConfig {
            bootstrap_servers: "k:9092".into(),
            properties: properties
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn producer_settings_keep_what_the_guarantees_rest_on() {
        let config = producer_config(&kafka(&[]), "c", 10_000, None);
        assert_eq!(config.get("enable.idempotence"), Some("true"));
        assert_eq!(config.get("acks"), Some("all"));
        assert_eq!(config.get("message.timeout.ms"), Some("0"));
        assert_eq!(config.get("queue.buffering.max.messages"), Some("100000"));
        assert_eq!(config.get("partitioner"), Some("murmur2_random"));
        // librdkafka's 5 ms batching wait stays unless set (README: Performance).
        assert_eq!(config.get("linger.ms"), None);

        let config = producer_config(
            &kafka(&[("linger.ms", "0"), ("message.timeout.ms", "30000")]),
            "c",
            200_000,
            Some("tx"),
        );
        assert_eq!(config.get("linger.ms"), Some("0"));
        assert_eq!(config.get("message.timeout.ms"), Some("30000"));
        assert_eq!(config.get("queue.buffering.max.messages"), Some("200000"));
        assert_eq!(config.get("transactional.id"), Some("tx"));
    }

    #[test]
    fn transaction_errors_are_classified() {
        let error = |operation, code| TransactionError {
            operation,
            source: KafkaError::MessageProduction(code),
        };
        let fenced = error("commit", RDKafkaErrorCode::ProducerFenced);
        assert!(fenced.is_fenced() && fenced.is_transient());
        assert!(error("begin", RDKafkaErrorCode::InvalidProducerEpoch).is_fenced());
        let loading = error("commit", RDKafkaErrorCode::CoordinatorLoadInProgress);
        assert!(!loading.is_fenced() && loading.is_transient());
        let refused = error("init", RDKafkaErrorCode::TransactionalIdAuthorizationFailed);
        assert!(!refused.is_fenced() && !refused.is_transient());
        assert!(crate::error::chain(&fenced).starts_with(
            "kafka transaction commit failed: Message production error: ProducerFenced"
        ));
    }
}
