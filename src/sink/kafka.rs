//! The Kafka sink: an rdkafka idempotent producer whose delivery reports come into one queue per
//! sink ([`ReportQueue`]).
//!
//! `enable.idempotence=true` with `acks=all` keeps each partition's records in send order
//! without duplicates across librdkafka's internal retries; the partition is chosen from the
//! key (the aggregate id), so one aggregate's events stay in commit order.
//!
//! In exactly-once mode the producer is transactional as well: its transaction calls and the
//! checkpoint's read-back are in [`crate::exactly_once`].
//!
//! At-least-once pipelines with the same Kafka settings share one producer
//! ([`SharedProducers`], `shared.rs`).

pub mod log;
mod refusals;
mod settings;
mod shared;
pub mod topics;

pub(crate) use refusals::is_refused;
use refusals::{is_retryable, is_too_large};
use settings::producer_config;
pub(crate) use settings::DEFAULT_MESSAGE_MAX_BYTES;
pub use shared::SharedProducers;

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use rdkafka::Message;

use super::producer::{DeliveryReport, PolledProducer, RecordMeta, ReportQueue, ReportTo};
use super::{Delivery, DeliveryError, InFlight, Record, SendError, Sink};
use crate::ack::EventToken;
use crate::config::{CreateTopics, KafkaConfig};

/// Kafka client setup failed (bad property, unknown security protocol, ...).
#[derive(Debug, thiserror::Error)]
#[error("cannot create the Kafka producer")]
pub struct ProducerError(#[source] pub KafkaError);

impl ProducerError {
    /// Whether creating the producer again may succeed: a thread that could not start (ours,
    /// or librdkafka's "Failed to create thread") is the process running short of resources,
    /// not a configuration retrying cannot fix.
    pub fn is_transient(&self) -> bool {
        match &self.0 {
            KafkaError::ClientCreation(reason) => reason.to_ascii_lowercase().contains("thread"),
            _ => false,
        }
    }
}

/// An rdkafka producer ([`PolledProducer`]) as a [`Sink`].
pub struct KafkaSink {
    producer: PolledProducer,
    /// Where the delivery reports of this sink's records come.
    reports: Arc<ReportQueue>,
    /// Reports taken from `reports`, not yet returned by [`Sink::next_delivery`].
    taken: Vec<(RecordMeta, DeliveryReport)>,
    /// Accept times by `seq`, in send order, `None` once reported (reports come in any order
    /// across partitions). Reported entries at the front go at once, the others once they
    /// outnumber the records in flight: never more than twice those (plus [`SENT_SLACK`]).
    sent: VecDeque<(u64, Option<Instant>)>,
    /// The next record's `seq`.
    next_seq: u64,
    /// The topic of the record being sent (librdkafka copies it): its `RecordMeta` owns the
    /// record's.
    topic: String,
    in_flight: InFlight,
    /// librdkafka's `message.max.bytes`, named in size errors.
    message_max_bytes: String,
    /// The producer's settings, for a fresh producer.
    client: ClientConfig,
    /// A record failed with a retryable error (it timed out): librdkafka may have reset the
    /// partition's sequence, so the next record goes through a fresh producer once nothing is
    /// in flight. Never set for a transactional producer (its transactions hold it).
    renew: bool,
    /// The pipeline's part of a shared producer ([`shared`]); `None`: the producer is the
    /// sink's own.
    share: Option<Arc<shared::Share>>,
    /// Which topics exist: a record for one not known to yet waits ([`topics`]).
    topics: topics::TopicGate,
}

impl KafkaSink {
    /// Creates the idempotent producer for `config`, with `queue_messages` and `queue_bytes`
    /// as the least of librdkafka's local queue limits (`queue.buffering.max.messages` and
    /// `queue.buffering.max.kbytes`; give the pipeline's in-flight limits, so the relay's own
    /// limits are what applies and the queue is full only when they are).
    ///
    /// With `transactional_id` the producer is transactional (exactly-once mode): records are
    /// sent only inside a transaction ([`crate::exactly_once::TransactionalSink::transactions`]), and a record that times
    /// out after `transaction.timeout.ms` (librdkafka's default for `message.timeout.ms` then)
    /// fails its transaction instead of waiting forever.
    ///
    /// Returns an error if librdkafka rejects the configuration. Connects to the broker in the background; never waits for it.
    pub fn new(
        config: &KafkaConfig,
        client_id: &str,
        queue_messages: usize,
        queue_bytes: usize,
        transactional_id: Option<&str>,
    ) -> Result<Self, ProducerError> {
        let client = producer_config(
            config,
            client_id,
            queue_messages,
            queue_bytes,
            transactional_id,
        );
        let producer = PolledProducer::new(&client).map_err(ProducerError)?;
        Ok(KafkaSink::with_producer(producer, client, None)
            .creating_topics(config.create_topics.clone()))
    }

    /// The same sink, letting the records of a missing topic go on to librdkafka once the topic
    /// was checked (and named), instead of holding them ([`topics`]): for the polling source,
    /// whose cycle's transaction must end.
    pub fn not_holding_missing_topics(mut self) -> Self {
        self.topics = self.topics.clone().not_holding();
        self
    }

    /// The same sink, refusing for good the records of a topic found missing (with
    /// `on_bad_event = "dead_letter"`, so that they are dead-lettered instead of holding the
    /// pipeline).
    pub fn refusing_missing_topics(mut self) -> Self {
        self.topics = self.topics.clone().refusing();
        self
    }

    /// The same sink, creating missing topics as `create` says (`kafka.create_topics`).
    pub fn creating_topics(mut self, create: Option<CreateTopics>) -> Self {
        let mut admin = self.client.clone();
        admin.remove("transactional.id");
        self.topics = topics::TopicGate::new(create, admin);
        self
    }

    /// A session's sink on the producer pipeline `name` shares with others (see
    /// [`SharedProducers`]), creating missing topics as `create_topics` says, or
    /// [`KafkaSink::new`]'s own producer when it shares none.
    ///
    /// Returns an error if librdkafka rejects the configuration.
    pub fn new_or_shared(
        producers: &SharedProducers,
        name: &str,
        create_topics: Option<CreateTopics>,
        own: impl FnOnce() -> Result<KafkaSink, ProducerError>,
    ) -> Result<Self, ProducerError> {
        let Some(share) = producers.share(name) else {
            return own();
        };
        let (producer, renew) = share.producer().map_err(ProducerError)?;
        let client = share.group.client.clone();
        let mut sink =
            KafkaSink::with_producer(producer, client, Some(share)).creating_topics(create_topics);
        sink.renew = renew;
        Ok(sink)
    }

    fn with_producer(
        producer: PolledProducer,
        client: ClientConfig,
        share: Option<Arc<shared::Share>>,
    ) -> Self {
        KafkaSink {
            message_max_bytes: client
                .get("message.max.bytes")
                .unwrap_or("1000000")
                .to_owned(),
            producer,
            reports: Arc::default(),
            taken: Vec::new(),
            sent: VecDeque::new(),
            next_seq: 0,
            topic: String::new(),
            in_flight: InFlight::default(),
            topics: topics::TopicGate::new(None, client.clone()),
            client,
            renew: false,
            share,
        }
    }

    /// A fresh producer after a failure, once nothing is in flight (see `renew`): the sink's
    /// own, or the group's.
    fn renew_producer(&mut self) {
        let fresh = match &self.share {
            None => Some(PolledProducer::new(&self.client)),
            // Records of an ended session still in the producer: not yet.
            Some(share) => share.renew(&self.producer),
        };
        match fresh {
            None => return,
            Some(Ok(producer)) => self.producer = producer,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot create a fresh producer after a timed-out record; keeping the old one")
            }
        }
        self.renew = false;
    }

    /// Whether records of the pipeline's ended sessions, still in a shared producer, leave no
    /// room under its in-flight limits for another record.
    fn left_over_fills_the_limits(&self) -> bool {
        let Some(share) = &self.share else {
            return false;
        };
        let left_over = share.left_over();
        left_over != InFlight::default()
            && (self.in_flight.events + left_over.events >= share.limit.events
                || self.in_flight.bytes + left_over.bytes >= share.limit.bytes)
    }
}

impl Drop for KafkaSink {
    /// A shared producer outlives the session: what is still in flight in it counts against
    /// the pipeline's limits until its reports come, and a fresh producer the session wanted
    /// goes to the next one.
    fn drop(&mut self) {
        // A producer of its own goes within a second (its delivery thread destroys it, purging
        // what it holds) and a record of it that fails in that second must not have the ones
        // behind it go out first: withdrawn now. A shared one's records are withdrawn if a
        // failure the session did not handle is among them (taken, not returned yet; those
        // still in the queue go to the share, which withdraws on a failure).
        if self.share.is_none() || self.taken.iter().any(|(_, report)| report.is_err()) {
            self.withdraw_in_flight();
        }
        if let Some(share) = &self.share {
            // Reports taken already came: what is left is the records without one.
            let mut left = self.in_flight;
            for (meta, _) in &self.taken {
                left.events -= 1;
                left.bytes -= meta.size;
            }
            share.adopt(&self.reports, left, self.oldest_in_flight(), self.renew);
        }
    }
}

/// Reported entries of [`KafkaSink`]'s accept times that may wait behind an unreported one
/// beyond the records in flight before they are swept out.
const SENT_SLACK: usize = 1024;

impl KafkaSink {
    /// The producer, for the transaction calls of exactly-once mode.
    pub(crate) fn producer(&self) -> &PolledProducer {
        &self.producer
    }
}

impl Sink for KafkaSink {
    fn waiting(&self) -> Option<String> {
        self.topics.waiting()
    }

    fn send(&mut self, mut record: Record, token: EventToken) -> Result<(), SendError> {
        // Retired after a failed delivery of a pipeline sharing it: a fresh one, once nothing
        // of this pipeline's is in the old one (its records must not overtake each other).
        let retired = self.producer.is_retired();
        if retired {
            self.renew = true;
        }
        if self.renew && self.in_flight.events == 0 {
            self.renew_producer();
        }
        if !self.topics.admits(&record.topic, &self.producer) {
            if let Some(why) = self.topics.refusal(&record.topic) {
                return Err(SendError::Refused(DeliveryError {
                    event_id: record.event_id(),
                    topic: record.topic.clone(),
                    retryable: false,
                    too_large: false,
                    connection_lost: false,
                    attempted: true,
                    reason: why,
                    record: Some(Box::new(record)),
                }));
            }
            return Err(SendError::Full(Box::new(record)));
        }
        if (retired && self.producer.is_retired()) || self.left_over_fills_the_limits() {
            return Err(SendError::Full(Box::new(record)));
        }
        let size = record.size();
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (key, value) in &record.headers {
            headers = headers.insert(Header {
                key: key.as_ref(),
                value: value.as_deref(),
            });
        }
        let seq = self.next_seq;
        let sent = Instant::now();
        self.topic.clear();
        self.topic.push_str(&record.topic);
        let meta = RecordMeta {
            token,
            topic: std::mem::take(&mut record.topic),
            size,
            sent,
            timestamp_ms: record.timestamp_ms,
            seq,
        };
        let mut kafka_record = PolledProducer::queued_record(&self.topic, &self.reports, meta);
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
        match self.producer.send(kafka_record) {
            Ok(()) => {
                self.sent.push_back((seq, Some(sent)));
                self.next_seq += 1;
                self.in_flight.events += 1;
                self.in_flight.bytes += size;
                Ok(())
            }
            Err((error, kafka_record)) => {
                // The record's topic back from its metadata.
                if let ReportTo::Queue(_, meta) = *kafka_record.delivery_opaque {
                    record.topic = meta.topic;
                }
                match error {
                    KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) => {
                        return Err(SendError::Full(Box::new(record)));
                    }
                    // Retired since the check above (`PolledProducer::send`).
                    KafkaError::MessageProduction(RDKafkaErrorCode::PurgeQueue) => {
                        self.renew = true;
                        return Err(SendError::Full(Box::new(record)));
                    }
                    _ => {}
                }
                let refused = self.refused(&error, size, record);
                // A producer that refuses every record (a fatal idempotence error) is replaced,
                // as after a timed-out record: a source that records the failure and goes on
                // (polling) would otherwise meet the same refusal for every later row.
                if refused.retryable && self.client.get("transactional.id").is_none() {
                    self.renew = true;
                }
                Err(SendError::Refused(refused))
            }
        }
    }

    async fn next_delivery(&mut self) -> Option<Delivery> {
        if self.in_flight.events == 0 {
            return None;
        }
        if self.taken.is_empty() {
            let (reports, taken) = (&self.reports, &mut self.taken);
            std::future::poll_fn(|cx| reports.poll_take(cx, taken)).await;
            // Oldest first: the front is the next to return.
            self.taken.reverse();
        }
        let (meta, report) = self.taken.pop()?;
        self.reported(meta.seq);
        let size = meta.size;
        let delivery = self.describe_outcome(meta, report);
        if delivery.result.as_ref().is_err_and(|e| e.retryable)
            && self.client.get("transactional.id").is_none()
        {
            self.renew = true;
        }
        self.in_flight.events -= 1;
        self.in_flight.bytes -= size;
        Some(delivery)
    }

    fn in_flight(&self) -> InFlight {
        self.in_flight
    }

    fn left_over(&self) -> InFlight {
        self.share
            .as_ref()
            .map_or_else(InFlight::default, |share| share.left_over())
    }

    fn oldest_left_over(&self) -> Option<Instant> {
        self.share
            .as_ref()
            .and_then(|share| share.oldest_left_over())
    }

    /// Constant time: the first accepted without a report.
    fn oldest_in_flight(&self) -> Option<Instant> {
        self.sent.front().and_then(|(_, sent)| *sent)
    }

    /// Retires the producer ([`PolledProducer::retire`]) when records of this session are
    /// still in it: its own producer would go on sending them until its delivery thread
    /// destroys it (up to a second later), a shared one for as long as it lives. A shared
    /// producer's other pipelines lose their records in it too: each of their sessions meets
    /// a failed delivery (`PurgeQueue` or `PurgeInflight`, retryable) and starts again from
    /// its confirmed LSN, on the group's fresh producer. A transactional producer is left as
    /// it is: its transaction is aborted.
    fn withdraw_in_flight(&mut self) {
        let unreported = self.in_flight.events - self.taken.len();
        if unreported == 0 || self.client.get("transactional.id").is_some() {
            return;
        }
        match &self.share {
            Some(share) if share.group.withdraws && !self.producer.is_retired() => {
                tracing::warn!(
                    records = unreported,
                    "withdrawing the records queued behind a failed delivery from the producer shared with other pipelines; their records queued there fail too, and their sessions start again from their confirmed LSN"
                );
                share.group.retire(&self.producer);
            }
            // Another pipeline's failed delivery retired it already, or a polling group's.
            Some(_) => {}
            None => self.producer.retire(),
        }
    }
}

impl KafkaSink {
    fn describe(&self, error: &KafkaError, size: usize) -> String {
        match error.rdkafka_error_code() {
            // Only a retired producer purges while its sink awaits the outcome (shared).
            Some(RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight) => format!(
                "{error}: withdrawn from the producer this pipeline shares after a failed delivery of a pipeline sharing it (record of {size} bytes)"
            ),
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
            connection_lost: false,
            attempted: true,
            reason: self.describe(error, size),
            record: Some(Box::new(record)),
        }
    }

    /// Record `seq` has its report: it no longer counts for [`Sink::oldest_in_flight`].
    fn reported(&mut self, seq: u64) {
        if let Ok(i) = self.sent.binary_search_by_key(&seq, |(seq, _)| *seq) {
            self.sent[i].1 = None;
        }
        while self.sent.front().is_some_and(|(_, sent)| sent.is_none()) {
            self.sent.pop_front();
        }
        if self.sent.len() > 2 * self.in_flight.events + SENT_SLACK {
            self.sent.retain(|(_, sent)| sent.is_some());
        }
    }

    fn describe_outcome(&self, meta: RecordMeta, report: DeliveryReport) -> Delivery {
        let size = meta.size;
        let result = match report {
            Ok(()) => Ok(()),
            Err((error, message)) => {
                Err(self.refused(&error, size, returned_record(&message, meta.timestamp_ms)))
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use settings::tests::kafka;

    #[tokio::test]
    async fn a_producer_that_refuses_every_record_is_replaced_once_nothing_is_in_flight() {
        let mut sink = KafkaSink::new(&kafka(&[]), "fatal-test", 10, 1 << 20, None).unwrap();
        // What librdkafka does when the idempotent producer meets an unrecoverable error.
        let reason = std::ffi::CString::new("test").unwrap();
        let code = unsafe {
            rdkafka::bindings::rd_kafka_test_fatal_error(
                rdkafka::producer::Producer::client(sink.producer.inner()).native_ptr(),
                rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                reason.as_ptr(),
            )
        };
        assert_eq!(
            code,
            rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
        );
        let mut tracker = crate::ack::AckTracker::new(crate::lsn::Lsn(0x100));
        tracker.begin().unwrap();
        match sink.send(record(), tracker.track_event().unwrap()) {
            Err(SendError::Refused(e)) => assert!(e.retryable, "{e}"),
            other => panic!("a fatal producer accepted a record: {other:?}"),
        }
        // Nothing is in flight: the next record goes through a fresh producer.
        assert!(
            sink.send(record(), tracker.track_event().unwrap()).is_ok(),
            "the producer that refuses every record was kept"
        );
        assert_eq!(sink.in_flight().events, 1);
    }

    /// The oldest record in flight is the first one accepted that has no report yet, whatever
    /// order the reports come in (they come per partition), and what is kept for it is bounded
    /// by the records in flight (a review found a queue of accept times that one record
    /// without a report made grow with every later one).
    #[test]
    fn the_oldest_in_flight_is_the_first_accepted_without_a_report() {
        // No broker: the records stay queued in librdkafka.
        let mut sink = KafkaSink::new(&kafka(&[]), "oldest-test", 10, 1 << 20, None).unwrap();
        let mut tracker = crate::ack::AckTracker::new(crate::lsn::Lsn(0x100));
        tracker.begin().unwrap();
        let mut accepted = Vec::new();
        for _ in 0..3 {
            let record = Record {
                topic: "t".into(),
                key: Some(bytes::Bytes::from_static(b"k")),
                value: None,
                headers: vec![],
                timestamp_ms: None,
                partition: None,
            };
            sink.send(record, tracker.track_event().unwrap()).unwrap();
            accepted.push(sink.sent.back().and_then(|(_, sent)| *sent).unwrap());
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(sink.oldest_in_flight(), Some(accepted[0]));
        sink.reported(0);
        assert_eq!(sink.oldest_in_flight(), Some(accepted[1]));
        // Out of order: the third's report before the second's.
        sink.reported(2);
        assert_eq!(sink.oldest_in_flight(), Some(accepted[1]));
        sink.reported(1);
        assert_eq!(sink.oldest_in_flight(), None);
        // One record without a report, many after it reported: what is kept stays within
        // twice the records in flight (plus the slack), the stuck one still the oldest.
        let stuck = sink.next_seq;
        let count = 10 * SENT_SLACK as u64;
        for seq in stuck..stuck + count {
            sink.sent.push_back((seq, Some(Instant::now())));
        }
        sink.next_seq += count;
        sink.in_flight.events = count as usize;
        for seq in stuck + 1..stuck + count {
            // As next_delivery does: the report, then the count.
            sink.reported(seq);
            sink.in_flight.events -= 1;
            assert!(
                sink.sent.len() <= 2 * sink.in_flight.events + SENT_SLACK + 2,
                "{} kept for {} in flight",
                sink.sent.len(),
                sink.in_flight.events
            );
        }
        assert!(
            sink.sent.len() <= SENT_SLACK + 3,
            "{} kept",
            sink.sent.len()
        );
        assert_eq!(sink.sent.front().map(|(seq, _)| *seq), Some(stuck));
        assert!(sink.oldest_in_flight().is_some());
        sink.reported(stuck);
        assert_eq!(sink.oldest_in_flight(), None);
        sink.in_flight.events = 0;
    }

    /// A session ending on a failed delivery withdraws what its own producer still queues at
    /// once: the producer is destroyed only when its delivery thread next wakes (up to a
    /// second later, the clone below standing for its reference), and went on sending until
    /// then (review).
    #[tokio::test]
    async fn withdrawn_records_of_its_own_producer_are_purged_at_once() {
        // No broker: the records stay queued in librdkafka.
        let mut sink = KafkaSink::new(&kafka(&[]), "withdraw-test", 10, 1 << 20, None).unwrap();
        let mut tracker = crate::ack::AckTracker::new(crate::lsn::Lsn(0x100));
        tracker.begin().unwrap();
        for _ in 0..2 {
            sink.send(record(), tracker.track_event().unwrap()).unwrap();
        }
        let (reports, kept) = (Arc::clone(&sink.reports), sink.producer.clone());
        sink.withdraw_in_flight();
        drop(sink);
        let deadline = std::time::Duration::from_secs(30);
        let mut taken = Vec::new();
        while taken.len() < 2 {
            let mut more = Vec::new();
            tokio::time::timeout(
                deadline,
                std::future::poll_fn(|cx| reports.poll_take(cx, &mut more)),
            )
            .await
            .unwrap_or_else(|_| panic!("{} of 2 reports within {deadline:?}", taken.len()));
            taken.append(&mut more);
        }
        for (_, report) in &taken {
            let code = report
                .as_ref()
                .err()
                .and_then(|(e, _)| e.rdkafka_error_code());
            assert_eq!(code, Some(RDKafkaErrorCode::PurgeQueue));
        }
        let (record, _) = PolledProducer::record("t");
        let refused = kept
            .send(record.payload(b"v".as_slice()))
            .map_err(|(e, _)| e);
        assert!(
            matches!(
                refused,
                Err(KafkaError::MessageProduction(RDKafkaErrorCode::PurgeQueue))
            ),
            "a retired producer took a record: {refused:?}"
        );
    }

    /// A session that ends (its source failed, say) with a record's failure still in its
    /// queue retires its own producer, as one that ends on the failure does (review: the
    /// records behind it went on until the delivery thread destroyed the producer).
    #[tokio::test]
    async fn a_failure_left_untaken_withdraws_the_records_behind_it() {
        let mock = rdkafka::mocking::MockCluster::new(1).expect("a librdkafka mock cluster");
        mock.create_topic("t", 1, 1).unwrap();
        mock.partition_leader("t", 0, None).unwrap();
        let config = KafkaConfig {
            bootstrap_servers: mock.bootstrap_servers(),
            ..kafka(&[("message.timeout.ms", "1000")])
        };
        let mut sink = KafkaSink::new(&config, "untaken-test", 10, 1 << 20, None).unwrap();
        let mut tracker = crate::ack::AckTracker::new(crate::lsn::Lsn(0x100));
        tracker.begin().unwrap();
        sink.send(record(), tracker.track_event().unwrap()).unwrap();
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while sink.reports.is_empty() {
            assert!(
                Instant::now() < deadline,
                "the record did not time out in 30 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        sink.send(record(), tracker.track_event().unwrap()).unwrap();
        let kept = sink.producer.clone();
        drop(sink);
        assert!(
            kept.is_retired(),
            "the producer went on with a record behind a failure"
        );
    }

    /// A record for topic `t` with key `k` and value `v`.
    fn record() -> Record {
        Record {
            topic: "t".into(),
            key: Some(bytes::Bytes::from_static(b"k")),
            value: Some(bytes::Bytes::from_static(b"v")),
            headers: vec![],
            timestamp_ms: None,
            partition: None,
        }
    }

    /// librdkafka is built with OpenSSL (rdkafka's `ssl` feature): TLS and the SASL mechanisms
    /// that need it are accepted settings. Without it, creating the producer fails with
    /// "OpenSSL not available at build time" / "No provider for SASL mechanism".
    #[tokio::test]
    async fn tls_and_sasl_scram_and_oauthbearer_are_accepted_settings() {
        for properties in [
            vec![("security.protocol", "SSL")],
            vec![
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.username", "relay"),
                ("sasl.password", "secret"),
            ],
            vec![
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "SCRAM-SHA-256"),
                ("sasl.username", "relay"),
                ("sasl.password", "secret"),
            ],
            vec![
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "PLAIN"),
                ("sasl.username", "relay"),
                ("sasl.password", "secret"),
            ],
            vec![
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "OAUTHBEARER"),
                ("sasl.oauthbearer.config", "principal=relay"),
                ("enable.sasl.oauthbearer.unsecure.jwt", "true"),
            ],
        ] {
            if let Err(e) = KafkaSink::new(&kafka(&properties), "tls-test", 10, 1 << 20, None) {
                panic!("{properties:?}: {e}");
            }
        }
    }
}
