//! Exactly-once on Kafka: the transactional producer's calls ([`KafkaTransactions`]) and the
//! checkpoint's read-back ([`read_checkpoint`]) with a `read_committed` consumer.
//!
//! Records sent between [`Transactions::begin`] and [`Transactions::commit`] become visible to
//! `read_committed` consumers together with the checkpoint record that the commit adds, or not
//! at all.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

use super::checkpoint::{self, Read};
use super::{
    Checkpoint, CheckpointError, Origin, StoredCheckpoint, TransactionalSink, Transactions,
};
use crate::config::KafkaConfig;
use crate::lsn::Lsn;
use crate::sink::kafka::KafkaSink;
use crate::sink::producer::{DeliveryContext, PolledProducer};

impl TransactionalSink for KafkaSink {
    fn transactions(
        &self,
        checkpoint_topic: &str,
        pipeline: &str,
        transactional_id: &str,
        origin: Origin,
    ) -> Box<dyn Transactions> {
        Box::new(KafkaTransactions {
            producer: self.producer().clone(),
            checkpoint_topic: checkpoint_topic.to_owned(),
            pipeline: pipeline.to_owned(),
            transactional_id: transactional_id.to_owned(),
            origin,
        })
    }
}

/// How long one blocking transaction call (init, commit, abort) may take. librdkafka's
/// `transaction.timeout.ms` defaults to 60 s too: a transaction the coordinator would abort
/// anyway is given up on by then.
const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long reading the checkpoint topic to its end may take at session start, after the
/// wait for open transactions.
const CHECKPOINT_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the checkpoint read waits for transactions open in the checkpoint topic when it
/// begins: longer than an abandoned one lives with the defaults (the broker aborts it after
/// its producer's `transaction.timeout.ms`, librdkafka's 60 s, checking every 10 s by
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms`).
const OPEN_TRANSACTION_WAIT: Duration = Duration::from_secs(90);

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

    /// Whether a new session (a new producer) may succeed; not for a refused authorization
    /// (`sink::kafka::is_refused`, as for the checkpoint read; a failed authentication is
    /// retried) or an invalid transaction timeout, which need the operator.
    pub fn is_transient(&self) -> bool {
        !self.source.rdkafka_error_code().is_some_and(|code| {
            crate::sink::kafka::is_refused(code)
                || code == RDKafkaErrorCode::InvalidTransactionTimeout
        })
    }
}

/// The transaction calls of a transactional [`KafkaSink`] (created with a `transactional_id`),
/// with checkpoint records keyed by the pipeline name in the checkpoint topic.
///
/// librdkafka's transaction calls block: `begin`, `commit` and `abort` run on tokio's
/// blocking pool (on a clone of the producer), never on the runtime's threads; `init`, which
/// can take up to a minute at session start, runs on a detached thread of its own (see
/// `detached`). Not cancel-safe in the sense that a dropped call still completes in the
/// background.
#[derive(Clone)]
pub struct KafkaTransactions {
    producer: PolledProducer,
    checkpoint_topic: String,
    pipeline: String,
    /// Marks each checkpoint as this pipeline's ([`checkpoint::mark`]).
    transactional_id: String,
    /// Written with each checkpoint: where its LSN comes from.
    origin: Origin,
}

impl KafkaTransactions {
    /// Registers the `transactional.id` with the transaction coordinator: fences any earlier
    /// producer with this id (a relay that lost its slot but still runs) and aborts its open
    /// transaction, so a `read_committed` read afterwards sees everything it committed.
    ///
    /// Returns an error if the coordinator cannot be reached within 60 s or refuses the id.
    async fn init_call(&self) -> Result<(), TransactionError> {
        let producer = self.producer.clone();
        detached("init-transactions", move || {
            producer.inner().init_transactions(TRANSACTION_CALL_TIMEOUT)
        })
        .await
        .map_err(|source| TransactionError {
            operation: "init",
            source,
        })
    }

    /// Starts a Kafka transaction; the records sent until [`Transactions::commit`] or
    /// [`Transactions::abort`] belong to it.
    async fn begin_call(&self) -> Result<(), TransactionError> {
        self.call("begin", |p| p.begin_transaction()).await
    }

    /// Adds the checkpoint record (key = pipeline name, value = `end_lsn` with this session's
    /// origin, [`StoredCheckpoint::encode`], headers = [`checkpoint::mark`]), waits for its acknowledgement and commits the transaction. Call it once every
    /// other record of the transaction was acknowledged: librdkafka's commit then has nothing
    /// left to flush (rdkafka's flush loop would otherwise sleep in 100 ms steps), and fails the
    /// commit if a record of the transaction failed (an abortable error).
    ///
    /// A commit that fails with a retriable error is tried again (without a second checkpoint).
    ///
    /// Returns an error if the transaction could not be committed within 60 s; then it is open
    /// or aborted, never committed without the checkpoint. The returned future owns what it
    /// needs, so it may be kept across `select!` iterations.
    fn commit_call(
        &self,
        end_lsn: Lsn,
    ) -> impl Future<Output = Result<(), TransactionError>> + Send + 'static {
        let producer = self.producer.clone();
        let topic = self.checkpoint_topic.clone();
        let key = self.pipeline.clone();
        let value = StoredCheckpoint::encode(end_lsn, &self.origin);
        let headers = checkpoint::mark(&self.transactional_id).iter().fold(
            OwnedHeaders::new(),
            |headers, (key, value)| {
                headers.insert(Header {
                    key,
                    value: Some(value.as_str()),
                })
            },
        );
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
                .send(
                    record
                        .key(key.as_bytes())
                        .payload(value.as_bytes())
                        .headers(headers),
                )
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
    async fn abort_call(&self, timeout: Duration) -> Result<(), TransactionError> {
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

impl Transactions for KafkaTransactions {
    fn init(&self) -> BoxFuture<'static, Result<(), TransactionError>> {
        let this = self.clone();
        async move { this.init_call().await }.boxed()
    }

    fn begin(&self) -> BoxFuture<'static, Result<(), TransactionError>> {
        let this = self.clone();
        async move { this.begin_call().await }.boxed()
    }

    fn commit(&self, checkpoint: Checkpoint) -> BoxFuture<'static, Result<(), TransactionError>> {
        self.commit_call(checkpoint.0).boxed()
    }

    fn abort(&self, timeout: Duration) -> BoxFuture<'static, Result<(), TransactionError>> {
        let this = self.clone();
        async move { this.abort_call(timeout).await }.boxed()
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

/// Reads the exactly-once checkpoint of `pipeline` from `topic`: first waits until, in every
/// partition, the last stable offset has reached the high watermark the read began with (see
/// `wait_for_open_transactions`), then assigns every partition from the beginning with a
/// `read_committed` consumer, reads each to its end (records of aborted transactions are
/// never seen) and returns the last checkpoint under the key `pipeline` (the highest of the
/// partitions' last values, should the key be in several after partitions were added). The
/// blocking work runs on a thread of its own (`detached`).
///
/// Only records marked with `transactional_id` are checkpoints ([`checkpoint::classify`]);
/// any other record under the key is ignored with a warning naming its partition and offset.
/// An unmarked record of the format before the mark is taken only while the topic holds no
/// marked checkpoint of the pipeline (the first start after an upgrade).
///
/// Returns `Ok(None)` when the topic has no checkpoint for this pipeline (or its last value
/// is a tombstone), and an error if the topic does not exist, a marked value is not a
/// checkpoint, a transaction stays open for `OPEN_TRANSACTION_WAIT` (90 s) or the end is not
/// reached within `CHECKPOINT_READ_TIMEOUT` (60 s) after it.
pub async fn read_checkpoint(
    config: &KafkaConfig,
    topic: &str,
    pipeline: &str,
    transactional_id: &str,
) -> Result<Option<StoredCheckpoint>, CheckpointError> {
    let client = reader_config(config, pipeline);
    // The same client reading uncommitted records: its watermark query gives the high
    // watermark, the read_committed one's the last stable offset.
    let mut uncommitted = client.clone();
    uncommitted.set("isolation.level", "read_uncommitted");
    let (topic, pipeline) = (topic.to_owned(), pipeline.to_owned());
    let transactional_id = transactional_id.to_owned();
    let read = move || -> Result<Option<StoredCheckpoint>, CheckpointError> {
        let kafka = |source| CheckpointError::Kafka {
            topic: topic.clone(),
            source,
        };
        let consumer: BaseConsumer<CheckpointReader> = client
            .create_with_context(CheckpointReader)
            .map_err(kafka)?;
        let uncommitted: BaseConsumer<CheckpointReader> = uncommitted
            .create_with_context(CheckpointReader)
            .map_err(kafka)?;
        let metadata = consumer
            .fetch_metadata(Some(&topic), CHECKPOINT_READ_TIMEOUT)
            .map_err(kafka)?;
        let found = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .map(|t| (t.error().map(RDKafkaErrorCode::from), t.partitions().len()));
        let partitions = checkpoint_partitions(&topic, found)?;
        let waiting = std::time::Instant::now() + OPEN_TRANSACTION_WAIT;
        wait_for_open_transactions(&consumer, &uncommitted, &topic, partitions, waiting)?;
        let deadline = std::time::Instant::now() + CHECKPOINT_READ_TIMEOUT;
        let mut assignment = TopicPartitionList::new();
        for partition in 0..partitions {
            let partition = i32::try_from(partition).expect("partition count fits i32");
            assignment
                .add_partition_offset(&topic, partition, Offset::Beginning)
                .map_err(kafka)?;
        }
        consumer.assign(&assignment).map_err(kafka)?;
        let mut at_end = vec![false; partitions];
        // The last checkpoint or tombstone of each partition for the key (records of one
        // partition are in order), with its timestamp; see `latest`. Marked checkpoints and
        // unmarked ones apart: the unmarked count only when there is no marked one.
        let mut last: Vec<Option<Last>> = vec![None; partitions];
        let mut last_unmarked: Vec<Option<Last>> = vec![None; partitions];
        let mut marked_seen = false;
        // Where each partition's last unmarked checkpoint is, to name it when it is ignored.
        let mut unmarked_at: Vec<Option<i64>> = vec![None; partitions];
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
                    let Some(p) = usize::try_from(message.partition())
                        .ok()
                        .filter(|p| *p < partitions)
                    else {
                        continue;
                    };
                    let headers: Vec<(&str, Option<&[u8]>)> = message
                        .headers()
                        .map(|h| h.iter().map(|h| (h.key, h.value)).collect())
                        .unwrap_or_default();
                    let read = checkpoint::classify(message.payload(), &headers, &transactional_id)
                        .map_err(|reason| CheckpointError::Value {
                            topic: topic.clone(),
                            partition: message.partition(),
                            offset: message.offset(),
                            reason,
                        })?;
                    let timestamp_ms = message.timestamp().to_millis().unwrap_or(i64::MIN);
                    match read {
                        Read::Tombstone => {
                            last[p] = Some((timestamp_ms, None));
                            last_unmarked[p] = Some((timestamp_ms, None));
                        }
                        Read::Checkpoint(c) if c.marked => {
                            marked_seen = true;
                            last[p] = Some((timestamp_ms, Some(c)));
                        }
                        Read::Checkpoint(c) => {
                            unmarked_at[p] = Some(message.offset());
                            last_unmarked[p] = Some((timestamp_ms, Some(c)));
                        }
                        Read::Ignored(reason) => {
                            tracing::warn!(pipeline = %pipeline, checkpoint_topic = %topic, partition = message.partition(), offset = message.offset(), %reason, "a record under the pipeline's key in the checkpoint topic is not its checkpoint; ignored");
                        }
                    }
                }
                // Another pipeline's checkpoint.
                Some(Ok(_)) => {}
            }
        }
        if !marked_seen {
            return Ok(latest(last_unmarked.into_iter().flatten()));
        }
        for (partition, offset) in unmarked_at.iter().enumerate() {
            if let Some(offset) = offset {
                tracing::warn!(pipeline = %pipeline, checkpoint_topic = %topic, partition, offset, "an unmarked checkpoint record (the format before version 2) under the pipeline's key is ignored: the pipeline has marked checkpoints");
            }
        }
        Ok(latest(last.into_iter().flatten()))
    };
    detached("read-checkpoint", read).await
}

/// The checkpoint reader's client settings: the pipeline's Kafka settings (security,
/// timeouts) but `client.rack`, then those of a `read_committed` reader of every partition.
/// With `client.rack` a broker may send the fetches to a follower in the same rack
/// (KIP-392), whose end may lag the leader's: the read would end there and return an older
/// checkpoint, and the transactions after it would be committed again.
fn reader_config(config: &KafkaConfig, pipeline: &str) -> ClientConfig {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", &config.bootstrap_servers);
    for (key, value) in &config.properties {
        if key != "client.rack" {
            client.set(key, value);
        }
    }
    client
        .set("group.id", format!("outbox-relay-checkpoint-{pipeline}"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .set("allow.auto.create.topics", "false");
    client
}

/// A partition's last record for the pipeline's key: its timestamp (Unix ms) and its
/// checkpoint, `None` for a tombstone.
type Last = (i64, Option<StoredCheckpoint>);

/// The checkpoint among the partitions' last records for the key. A key lives in one
/// partition unless partitions were added to the topic, or a tool with another partitioner
/// than the relay's (murmur2, the Java client's) wrote to it, e.g. an operator's tombstone.
/// Checkpoints only grow, so of the values the highest is the checkpoint; a tombstone later
/// than that value's record (by timestamp; at the same millisecond too, since passing over
/// events by a deleted checkpoint would lose them) deletes it.
fn latest(last: impl Iterator<Item = Last>) -> Option<StoredCheckpoint> {
    let (mut value, mut tombstone): (Option<(i64, StoredCheckpoint)>, Option<i64>) = (None, None);
    for (timestamp_ms, checkpoint) in last {
        match checkpoint {
            None => tombstone = tombstone.max(Some(timestamp_ms)),
            Some(c) if value.as_ref().is_none_or(|(_, v)| c.lsn > v.lsn) => {
                value = Some((timestamp_ms, c))
            }
            Some(_) => {}
        }
    }
    match (value, tombstone) {
        (Some((at, _)), Some(deleted)) if deleted >= at => None,
        (value, _) => value.map(|(_, c)| c),
    }
}

/// Waits until every partition's last stable offset (`committed`'s watermark query, a
/// `read_committed` client) has reached its high watermark as `uncommitted` (the same client,
/// `read_uncommitted`) first saw it: until every transaction open when the read began has
/// committed or aborted. The checkpoint topic is shared by pipelines and relays, and another
/// producer's open transaction holds the last stable offset, where a `read_committed` read
/// ends, before this pipeline's later checkpoints: without the wait the read would return an
/// older one and the transactions after it would be committed to Kafka again.
///
/// Returns [`CheckpointError::OpenTransaction`], naming the partition and its offsets, when
/// a transaction is still open at `deadline` (it lasts at most its producer's
/// `transaction.timeout.ms`, 60 s by default, and the broker's check that aborts it), and
/// [`CheckpointError::Kafka`] if a query fails.
fn wait_for_open_transactions(
    committed: &BaseConsumer<CheckpointReader>,
    uncommitted: &BaseConsumer<CheckpointReader>,
    topic: &str,
    partitions: usize,
    deadline: std::time::Instant,
) -> Result<(), CheckpointError> {
    let kafka = |source| CheckpointError::Kafka {
        topic: topic.to_owned(),
        source,
    };
    let begun = std::time::Instant::now();
    let left = || deadline.saturating_duration_since(std::time::Instant::now());
    for partition in 0..partitions {
        let partition = i32::try_from(partition).expect("partition count fits i32");
        let (_, high) = uncommitted
            .fetch_watermarks(topic, partition, left())
            .map_err(kafka)?;
        loop {
            let (_, stable) = committed
                .fetch_watermarks(topic, partition, left())
                .map_err(kafka)?;
            if stable >= high {
                break;
            }
            if left() < Duration::from_millis(100) {
                return Err(CheckpointError::OpenTransaction {
                    topic: topic.to_owned(),
                    partition,
                    last_stable_offset: stable,
                    high_watermark: high,
                    waited_secs: begun.elapsed().as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// Runs the blocking `f` on a thread of its own and returns its result. Dropping the future
/// leaves the thread to finish by itself and drop the result: unlike tokio's blocking pool,
/// which the runtime waits for when it is dropped, so a stop during the exactly-once start
/// (a coordinator that does not answer: up to a minute) would hold the process that long.
///
/// # Panics
/// If the thread cannot be spawned, or `f` panicked.
async fn detached<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            // The receiver is gone when the session was dropped meanwhile: nothing to tell.
            let _ = sender.send(f());
        })
        .unwrap_or_else(|e| panic!("cannot spawn the {name} thread: {e}"));
    receiver
        .await
        .unwrap_or_else(|_| panic!("the {name} thread panicked"))
}

/// The checkpoint topic's partition count from its metadata (`found`: its error and partition
/// count, `None` when the broker left it out).
///
/// Returns [`CheckpointError::MissingTopic`] when the broker does not know the topic, and
/// [`CheckpointError::Topic`] for any other error it names.
fn checkpoint_partitions(
    topic: &str,
    found: Option<(Option<RDKafkaErrorCode>, usize)>,
) -> Result<usize, CheckpointError> {
    match found {
        None | Some((None, 0)) | Some((Some(RDKafkaErrorCode::UnknownTopicOrPartition), _)) => {
            Err(CheckpointError::MissingTopic(topic.to_owned()))
        }
        Some((Some(code), _)) => Err(CheckpointError::Topic {
            topic: topic.to_owned(),
            code,
        }),
        Some((None, partitions)) => Ok(partitions),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detached_call_returns_its_result_and_a_dropped_one_does_not_hold_the_runtime() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        assert_eq!(runtime.block_on(detached("test-call", || 7)), 7);
        // A call still blocked when its runtime is dropped (a stop during set-up).
        runtime.spawn(detached("test-call", || {
            std::thread::sleep(Duration::from_secs(30))
        }));
        runtime.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
        let start = std::time::Instant::now();
        drop(runtime);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "dropping the runtime waited {:?} for a detached call",
            start.elapsed()
        );
    }

    #[test]
    fn a_checkpoint_topic_without_a_leader_is_retried_and_a_missing_or_refused_one_stops() {
        use rdkafka::mocking::MockCluster;
        use rdkafka::producer::DefaultProducerContext;
        use rdkafka::types::RDKafkaRespErr::*;

        let mock: MockCluster<'static, DefaultProducerContext> =
            MockCluster::new(1).expect("a librdkafka mock cluster");
        mock.create_topic("checkpoints", 1, 1).unwrap();
        let config = KafkaConfig {
            bootstrap_servers: mock.bootstrap_servers(),
            properties: Vec::new(),
            properties_file: None,
            create_topics: None,
        };
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let read = |topic| {
            runtime.block_on(read_checkpoint(
                &config,
                topic,
                "orders",
                "outbox-relay-orders",
            ))
        };

        let missing = read("no-such-topic").unwrap_err();
        assert!(
            matches!(missing, CheckpointError::MissingTopic(_)) && !missing.is_transient(),
            "{missing:?}"
        );
        mock.topic_error("checkpoints", RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE)
            .unwrap();
        let no_leader = read("checkpoints").unwrap_err();
        assert!(
            matches!(
                no_leader,
                CheckpointError::Topic {
                    code: RDKafkaErrorCode::LeaderNotAvailable,
                    ..
                }
            ) && no_leader.is_transient(),
            "{no_leader:?}"
        );
        assert_eq!(
            crate::error::Error::Checkpoint(no_leader).recovery(),
            crate::error::Recovery::Retry
        );
        mock.topic_error("checkpoints", RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)
            .unwrap();
        let refused = read("checkpoints").unwrap_err();
        assert!(
            matches!(refused, CheckpointError::Topic { .. }) && !refused.is_transient(),
            "{refused:?}"
        );
        assert!(
            refused.to_string().contains("\"checkpoints\"")
                && refused.to_string().contains("Topic authorization failed"),
            "{refused}"
        );
        // Refused at the fetch (the topic described, not readable); librdkafka's local
        // authentication error also stands for a handshake a broker restart cut short.
        for (code, transient) in [
            (RDKafkaErrorCode::TopicAuthorizationFailed, false),
            (RDKafkaErrorCode::GroupAuthorizationFailed, false),
            (RDKafkaErrorCode::SaslAuthenticationFailed, false),
            (RDKafkaErrorCode::Authentication, true),
            (RDKafkaErrorCode::BrokerTransportFailure, true),
            (RDKafkaErrorCode::NotLeaderForPartition, true),
        ] {
            let fetched = CheckpointError::Kafka {
                topic: "checkpoints".into(),
                source: KafkaError::MessageConsumption(code),
            };
            assert_eq!(fetched.is_transient(), transient, "{code:?}");
        }
        mock.topic_error("checkpoints", RD_KAFKA_RESP_ERR_NO_ERROR)
            .unwrap();
        assert!(matches!(read("checkpoints"), Ok(None)));

        // Another producer's transaction outlasting the wait: the next session tries again,
        // and the error says where the read is held.
        let open = || CheckpointError::OpenTransaction {
            topic: "checkpoints".into(),
            partition: 2,
            last_stable_offset: 41,
            high_watermark: 57,
            waited_secs: 90,
        };
        assert_eq!(
            crate::error::Error::Checkpoint(open()).recovery(),
            crate::error::Recovery::Retry
        );
        let text = open().to_string();
        assert!(
            text.starts_with("checkpoint topic \"checkpoints\" partition 2: a transaction is still open after 90 s (last stable offset 41, high watermark 57)"),
            "{text}"
        );
    }

    /// A mock cluster with a 3-partition topic `checkpoints`, a plain producer writing to it
    /// and the reader of pipeline `orders` (transactional id `outbox-relay-orders`).
    struct Topic {
        _mock: rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
        producer: rdkafka::producer::BaseProducer,
        config: KafkaConfig,
        runtime: tokio::runtime::Runtime,
    }

    impl Topic {
        fn new() -> Topic {
            let mock = rdkafka::mocking::MockCluster::new(1).expect("a librdkafka mock cluster");
            mock.create_topic("checkpoints", 3, 1).unwrap();
            let producer = ClientConfig::new()
                .set("bootstrap.servers", mock.bootstrap_servers())
                .create()
                .unwrap();
            let config = KafkaConfig {
                bootstrap_servers: mock.bootstrap_servers(),
                properties: Vec::new(),
                properties_file: None,
                create_topics: None,
            };
            Topic {
                _mock: mock,
                producer,
                config,
                runtime: tokio::runtime::Runtime::new().unwrap(),
            }
        }

        /// Writes a record keyed `key` to `partition` with `headers`.
        fn write(
            &self,
            partition: i32,
            timestamp_ms: i64,
            key: &str,
            value: Option<&str>,
            headers: &[(&str, &str)],
        ) {
            use rdkafka::producer::BaseRecord;
            let mut record = BaseRecord::<str, str>::to("checkpoints")
                .key(key)
                .partition(partition)
                .timestamp(timestamp_ms)
                .headers(headers.iter().fold(OwnedHeaders::new(), |h, (key, value)| {
                    h.insert(Header {
                        key,
                        value: Some(*value),
                    })
                }));
            if let Some(value) = value {
                record = record.payload(value);
            }
            self.producer.send(record).map_err(|(e, _)| e).unwrap();
            self.producer.flush(Duration::from_secs(10)).unwrap();
        }

        /// Writes a checkpoint at `lsn` as the relay of `transactional_id` does.
        fn checkpoint(&self, partition: i32, timestamp_ms: i64, lsn: u64, transactional_id: &str) {
            let value = StoredCheckpoint::encode(Lsn(lsn), &origin());
            let mark = checkpoint::mark(transactional_id);
            let headers: Vec<(&str, &str)> = mark.iter().map(|(k, v)| (*k, v.as_str())).collect();
            self.write(partition, timestamp_ms, "orders", Some(&value), &headers);
        }

        fn read(&self) -> Option<StoredCheckpoint> {
            self.runtime
                .block_on(read_checkpoint(
                    &self.config,
                    "checkpoints",
                    "orders",
                    "outbox-relay-orders",
                ))
                .unwrap()
        }

        fn read_lsn(&self) -> Option<String> {
            self.read().map(|c| c.lsn.to_string())
        }
    }

    fn origin() -> Origin {
        Origin {
            system_id: "73".into(),
            timeline: 1,
            slot: "s".into(),
        }
    }

    /// The key in several partitions (partitions added, or a tombstone written by a tool
    /// with another partitioner): the highest value, unless a later tombstone deletes it.
    #[test]
    fn a_tombstone_in_another_partition_deletes_the_checkpoint() {
        let topic = Topic::new();
        topic.checkpoint(0, 1_000, 0x100, "outbox-relay-orders");
        topic.write(0, 1_500, "billing", Some("0/900"), &[]);
        assert_eq!(topic.read_lsn().as_deref(), Some("0/100"));
        // A higher LSN in another partition, its clock behind: checkpoints only grow.
        topic.checkpoint(2, 500, 0x200, "outbox-relay-orders");
        assert_eq!(topic.read_lsn().as_deref(), Some("0/200"));
        // An operator's tombstone, without a mark.
        topic.write(1, 2_000, "orders", None, &[]);
        assert_eq!(
            topic.read_lsn(),
            None,
            "the later tombstone deleted the checkpoint"
        );
        topic.checkpoint(2, 3_000, 0x300, "outbox-relay-orders");
        assert_eq!(
            topic.read_lsn().as_deref(),
            Some("0/300"),
            "written after the tombstone"
        );
    }

    /// What a routed row (or any producer without the relay's mark) writes under the
    /// pipeline's key is passed over, whatever its LSN and partition.
    #[test]
    fn a_forged_checkpoint_is_ignored() {
        let topic = Topic::new();
        topic.checkpoint(0, 1_000, 0x100, "outbox-relay-orders");
        let forged = StoredCheckpoint::encode(Lsn(0xFF << 32), &origin());
        topic.write(0, 2_000, "orders", Some("FF/0"), &[]);
        topic.write(1, 2_000, "orders", Some(&forged), &[]);
        topic.write(
            2,
            2_000,
            "orders",
            Some(&forged.replace("\"version\":2", "\"version\":1")),
            &[],
        );
        topic.write(
            2,
            2_000,
            "orders",
            Some("not a checkpoint"),
            &[("trace", "x")],
        );
        topic.checkpoint(1, 2_000, 0xFF << 32, "outbox-relay-billing");
        topic.write(
            1,
            2_000,
            "orders",
            Some(&forged),
            &[(checkpoint::FORMAT_HEADER, "2")],
        );
        let read = topic.read().unwrap();
        assert_eq!((read.lsn, read.marked), (Lsn(0x100), true));
    }

    /// The first start after the upgrade takes the last unmarked checkpoint; once a marked one
    /// is there, unmarked ones are passed over.
    #[test]
    fn an_unmarked_checkpoint_counts_until_the_first_marked_one() {
        let topic = Topic::new();
        let unmarked = |lsn| {
            StoredCheckpoint::encode(Lsn(lsn), &origin()).replace("\"version\":2", "\"version\":1")
        };
        topic.write(0, 1_000, "orders", Some(&unmarked(0x100)), &[]);
        topic.write(0, 1_100, "orders", Some(&unmarked(0x180)), &[]);
        let read = topic.read().unwrap();
        assert_eq!((read.lsn, read.marked), (Lsn(0x180), false));
        topic.checkpoint(0, 1_200, 0x200, "outbox-relay-orders");
        topic.write(0, 1_300, "orders", Some(&unmarked(0xFF << 32)), &[]);
        let read = topic.read().unwrap();
        assert_eq!((read.lsn, read.marked), (Lsn(0x200), true));
    }

    #[test]
    fn the_checkpoint_reader_reads_from_leaders() {
        let config = KafkaConfig {
            bootstrap_servers: "k:9092".into(),
            properties: vec![
                ("client.rack".into(), "eu-west-1a".into()),
                ("security.protocol".into(), "SASL_SSL".into()),
                ("isolation.level".into(), "read_uncommitted".into()),
            ],
            properties_file: None,
            create_topics: None,
        };
        let reader = reader_config(&config, "orders");
        assert_eq!(reader.get("client.rack"), None, "a follower's end may lag");
        assert_eq!(reader.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(reader.get("isolation.level"), Some("read_committed"));
        assert_eq!(
            reader.get("group.id"),
            Some("outbox-relay-checkpoint-orders")
        );
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
        // The same refusals as the checkpoint read's: credentials a retry cannot mend.
        for code in [
            RDKafkaErrorCode::SaslAuthenticationFailed,
            RDKafkaErrorCode::GroupAuthorizationFailed,
            RDKafkaErrorCode::InvalidTransactionTimeout,
        ] {
            assert!(!error("init", code).is_transient(), "{code:?}");
        }
        // librdkafka's own: a broker restart mid-handshake, a token refresh, a KDC outage.
        assert!(error("init", RDKafkaErrorCode::Authentication).is_transient());
        assert!(crate::error::chain(&fenced).starts_with(
            "kafka transaction commit failed: Message production error: ProducerFenced"
        ));
    }
}
