//! One producer for the at-least-once pipelines of a process that have the same Kafka settings
//! (and source kind).
//!
//! Each librdkafka producer costs a main thread, a thread per broker, an internal broker thread
//! and the relay's delivery report thread, and each wakes up on its own timers: with 50
//! pipelines that was most of the process's threads and half its idle CPU
//! (docs/performance.md). Pipelines whose `kafka` settings are equal share one producer instead, and
//! keep what separate producers gave them:
//!
//! - **Queue space.** librdkafka's queue limits are the sum of the members' in-flight limits
//!   (plus one record each), and each member is held to its own: its session to
//!   `max_in_flight_events` / `max_in_flight_bytes` as before, and records an earlier session
//!   left in the producer (a session that ended with records in flight no longer destroys its
//!   producer) count against the pipeline's limits until their delivery reports come
//!   ([`Share`]). So one pipeline's backlog, or a pipeline whose records are stuck, never
//!   takes another's room.
//! - **A stuck partition or topic.** librdkafka queues per partition: records of a partition
//!   without a leader, or of a topic without metadata, wait without holding up other
//!   partitions' records, whichever pipeline sent them.
//! - **Order.** A pipeline changes producer only with nothing of its own in flight or left
//!   over, so its records of one partition never go through two producers at once. When a
//!   member renews its producer (a polling member's timed-out record, a fatal idempotence
//!   error, a retired producer), the fresh
//!   producer becomes the group's; the other members keep the one they use until they renew
//!   too (a fatal error makes every member's next record fail, so all do) or until their next
//!   session has nothing left over in it.
//! - **Records behind a failed one.** A log-tailing member's record that fails (a broker's
//!   refusal) with records of its pipeline behind it that no session will wait for (its
//!   session ends on the failure, or ended before it) retires the producer
//!   ([`Group::retire`]): they must not reach the broker before the failed record's second
//!   copy. librdkafka purges only a whole producer, so the other members' records in it go too
//!   (their sessions fail and start again from their confirmed LSN) and the group moves on to
//!   a fresh producer: isolation gives way to order. So log-tailing pipelines whose records
//!   can time out or run out of retries (an operator's `message.timeout.ms` or `retries`)
//!   share no producer: each such failure would do the same.
//!
//! Polling pipelines share in the same way, among themselves: they are grouped by their
//! effective settings (with the polling source's `message.timeout.ms` default applied), and a
//! polling member's part of the queue is max(`max_in_flight_events`, `polling.batch_size`).
//! A polling and a log-tailing pipeline never share a producer: a timed-out record ends a
//! log-tailing session but is only recorded by the polling source, which goes on (and whose
//! failures withdraw nothing: it gave up their order when it recorded them).
//!
//! Exactly-once pipelines keep their own transactional producer, and a pipeline alone with its
//! settings keeps a producer of its own per session (as before: destroyed, and its queue
//! purged, when the session ends).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;

use super::{producer_config, DEFAULT_MESSAGE_MAX_BYTES};
use crate::config::{KafkaConfig, PipelineConfig, SinkConfig, SourceKind};
use crate::sink::producer::{DeliveryReport, PolledProducer, RecordMeta, ReportQueue};
use crate::sink::InFlight;
use crate::source::polling;

/// `client.id` of a shared producer: it speaks for several pipelines (an operator's
/// `client.id` property still wins).
pub const SHARED_CLIENT_ID: &str = "outbox-relay";

/// The producers the pipelines of one process share, by pipeline name. Cheap to clone.
#[derive(Clone, Default)]
pub struct SharedProducers {
    shares: Arc<Vec<(String, Arc<Share>)>>,
}

impl SharedProducers {
    /// Groups the at-least-once Kafka pipelines of `pipelines` by source kind and equal
    /// effective `kafka` settings (a polling pipeline's with its `message.timeout.ms` default,
    /// `polling::kafka_settings`); each group of two or more gets one producer (created at
    /// its first session), with queue limits that hold every member's limits at once.
    ///
    /// Polling and log-tailing pipelines never share one: a polling source records a
    /// timed-out record's failure and goes on, a log-tailing session ends on it. A log-tailing
    /// pipeline whose records can time out or run out of retries (an operator's
    /// `message.timeout.ms` or `retries`) shares none: at each such failure its session
    /// withdraws what it has behind the record, which in a shared producer takes every
    /// member's records (module docs).
    pub fn for_pipelines(pipelines: &[PipelineConfig]) -> SharedProducers {
        SharedProducers::grouping(pipelines.iter().filter(|p| shares_its_producer(p)))
    }

    /// [`SharedProducers::for_pipelines`] without its choice of who may share.
    fn grouping<'a>(pipelines: impl Iterator<Item = &'a PipelineConfig>) -> SharedProducers {
        let mut groups: Vec<(SourceKind, KafkaConfig, Vec<&PipelineConfig>)> = Vec::new();
        for pipeline in pipelines {
            let kafka = effective_kafka(pipeline);
            match groups
                .iter_mut()
                .find(|(kind, k, _)| *kind == pipeline.source_kind && *k == kafka)
            {
                Some((_, _, members)) => members.push(pipeline),
                None => groups.push((pipeline.source_kind, kafka, vec![pipeline])),
            }
        }
        let mut shares = Vec::new();
        for (kind, kafka, members) in groups.into_iter().filter(|(_, _, m)| m.len() > 1) {
            let group = Arc::new(Group::new(kind, &kafka, &members));
            for member in members {
                shares.push((
                    member.name.clone(),
                    Arc::new(Share {
                        group: Arc::clone(&group),
                        limit: InFlight {
                            events: member.max_in_flight_events,
                            bytes: member.max_in_flight_bytes,
                        },
                        state: Mutex::new(ShareState::default()),
                    }),
                ));
            }
        }
        SharedProducers {
            shares: Arc::new(shares),
        }
    }

    /// The share of pipeline `name`; `None` when it has a producer of its own.
    pub(crate) fn share(&self, name: &str) -> Option<Arc<Share>> {
        self.shares
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, share)| Arc::clone(share))
    }
}

/// Whether a pipeline's sessions may use a shared producer: at-least-once, Kafka, polling or
/// log tailing whose records librdkafka never gives up on.
fn shares_its_producer(pipeline: &PipelineConfig) -> bool {
    pipeline.sink == SinkConfig::Kafka
        && !pipeline.exactly_once
        && (pipeline.source_kind == SourceKind::Polling || !gives_up(&pipeline.kafka))
}

/// Whether a producer with these settings can fail a record over a passing broker problem:
/// `message.timeout.ms` or its alias `delivery.timeout.ms` set to anything but 0 (the relay
/// sets 0 when neither is set), or `message.send.max.retries` or its alias `retries` set below
/// librdkafka's default (no limit, 2147483647).
fn gives_up(kafka: &KafkaConfig) -> bool {
    kafka
        .properties
        .iter()
        .any(|(key, value)| match key.as_str() {
            "message.timeout.ms" | "delivery.timeout.ms" => value.trim() != "0",
            "message.send.max.retries" | "retries" => value.trim() != "2147483647",
            _ => false,
        })
}

/// The Kafka settings a pipeline's own producer would get from its source.
fn effective_kafka(pipeline: &PipelineConfig) -> KafkaConfig {
    match pipeline.source_kind {
        SourceKind::LogTailing => pipeline.kafka.clone(),
        SourceKind::Polling => polling::kafka_settings(pipeline),
    }
}

/// Records librdkafka's queue holds for a member: its `max_in_flight_events`, for a polling
/// pipeline at least its `polling.batch_size` ([`polling::queue_events`]).
fn queue_events(pipeline: &PipelineConfig) -> usize {
    match pipeline.source_kind {
        SourceKind::LogTailing => pipeline.max_in_flight_events,
        SourceKind::Polling => polling::queue_events(pipeline),
    }
}

/// Pipelines with equal Kafka settings and their producer.
pub(crate) struct Group {
    /// librdkafka's properties, queue limits summed over the members.
    pub(crate) client: ClientConfig,
    /// The producer new members' sessions get; `None` until the first session.
    current: Mutex<Option<PolledProducer>>,
    /// Log tailing: a member's failed record with records behind it retires the producer
    /// ([`Group::retire`]). Polling sources record a failure and go on, their order already
    /// given up for it (`source::polling`), so theirs never withdraw.
    pub(crate) withdraws: bool,
}

impl Group {
    fn new(kind: SourceKind, kafka: &KafkaConfig, members: &[&PipelineConfig]) -> Group {
        let message_max_bytes = kafka
            .properties
            .iter()
            .rev()
            .find(|(key, _)| key == "message.max.bytes")
            .and_then(|(_, v)| v.parse::<usize>().ok())
            .unwrap_or(DEFAULT_MESSAGE_MAX_BYTES);
        let events = members
            .iter()
            .map(|m| queue_events(m).saturating_add(1))
            .fold(0usize, usize::saturating_add);
        // Each member may go one record past its byte limit (KafkaSink::new's docs).
        let bytes = members
            .iter()
            .map(|m| m.max_in_flight_bytes.saturating_add(message_max_bytes))
            .fold(0usize, usize::saturating_add);
        Group {
            client: producer_config(kafka, SHARED_CLIENT_ID, events, bytes, None),
            current: Mutex::new(None),
            withdraws: kind == SourceKind::LogTailing,
        }
    }

    /// The group's producer, created on first use.
    ///
    /// Returns an error if librdkafka rejects the configuration.
    fn current(&self) -> Result<PolledProducer, KafkaError> {
        let mut current = lock(&self.current);
        if let Some(producer) = &*current {
            return Ok(producer.clone());
        }
        let producer = PolledProducer::new(&self.client)?;
        *current = Some(producer.clone());
        Ok(producer)
    }

    /// A fresh producer in place of `old`, or the group's current one if a member renewed
    /// `old` already (one fresh producer per failure, not one per member).
    ///
    /// Returns an error if librdkafka rejects the configuration.
    fn renew(&self, old: &PolledProducer) -> Result<PolledProducer, KafkaError> {
        let mut current = lock(&self.current);
        if let Some(producer) = current.as_ref().filter(|p| !p.same(old)) {
            return Ok(producer.clone());
        }
        let producer = PolledProducer::new(&self.client)?;
        *current = Some(producer.clone());
        Ok(producer)
    }
}

impl Group {
    /// Retires `old` ([`PolledProducer::retire`]) for a member whose record failed with
    /// records behind it that no session will wait for: the next producer any member gets is
    /// a fresh one. Each member moves to it once nothing of its own is left in `old`. Does
    /// nothing for a polling group (`withdraws`).
    pub(crate) fn retire(&self, old: &PolledProducer) {
        if !self.withdraws {
            return;
        }
        old.retire();
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|p| p.same(old)) {
            *current = None;
        }
    }
}

/// One pipeline's part of a [`Group`]: its limits and what it has in the producer.
pub(crate) struct Share {
    pub(crate) group: Arc<Group>,
    /// The pipeline's `max_in_flight_events` and `max_in_flight_bytes`.
    pub(crate) limit: InFlight,
    state: Mutex<ShareState>,
}

#[derive(Default)]
struct ShareState {
    /// The producer the pipeline's sessions use; `None` before the first.
    producer: Option<PolledProducer>,
    /// Records of ended sessions still in `producer`, without a delivery report yet.
    left_over: InFlight,
    /// When the oldest of them was accepted; kept until the last has its report (an age
    /// that errs on the old side while they drain, never on the young one).
    left_over_since: Option<Instant>,
    /// The last session ended wanting a fresh producer (a timed-out record, a fatal error):
    /// the next one gets it, as a session of its own producer would.
    renew: bool,
}

impl Share {
    /// The producer for a new session: the one the pipeline used last, unless nothing of its
    /// own is left in it and the group moved on to a fresh one; and whether the session is to
    /// renew it still (the last session wanted a fresh one, which records of its own left in
    /// the old one hold back: [`Share::renew`] gives it once they are gone).
    ///
    /// Returns an error if librdkafka rejects the configuration.
    pub(crate) fn producer(&self) -> Result<(PolledProducer, bool), KafkaError> {
        let mut state = lock(&self.state);
        let (producer, renew) = match &state.producer {
            Some(used) if state.left_over != InFlight::default() => {
                (used.clone(), state.renew || used.is_retired())
            }
            Some(used) if state.renew => (self.group.renew(used)?, false),
            _ => (self.group.current()?, false),
        };
        state.renew = renew;
        state.producer = Some(producer.clone());
        Ok((producer, renew))
    }

    /// A fresh producer in place of `old` ([`Group::renew`]); `None` while records of an
    /// ended session are still in `old` (they must not be overtaken).
    ///
    /// Returns an error if librdkafka rejects the configuration.
    pub(crate) fn renew(&self, old: &PolledProducer) -> Option<Result<PolledProducer, KafkaError>> {
        let mut state = lock(&self.state);
        if state.left_over != InFlight::default() {
            return None;
        }
        let renewed = self.group.renew(old);
        if let Ok(producer) = &renewed {
            state.producer = Some(producer.clone());
            state.renew = false;
        }
        Some(renewed)
    }

    /// Records of ended sessions still in the producer.
    pub(crate) fn left_over(&self) -> InFlight {
        lock(&self.state).left_over
    }

    /// When the oldest record of ended sessions still in the producer was accepted.
    pub(crate) fn oldest_left_over(&self) -> Option<Instant> {
        lock(&self.state).left_over_since
    }

    /// Takes over the records a dropped session left in flight (`left`, whose reports come into
    /// `reports`): they count against the pipeline's limits until their delivery reports come
    /// (with `message.timeout.ms = 0`, for as long as the broker keeps them).
    /// `oldest`: when the oldest of them was accepted. `renew`: the session wanted a fresh
    /// producer, which the next one then gets.
    pub(crate) fn adopt(
        self: &Arc<Self>,
        reports: &ReportQueue,
        left: InFlight,
        oldest: Option<Instant>,
        renew: bool,
    ) {
        {
            let mut state = lock(&self.state);
            state.renew |= renew;
            state.left_over.events += left.events;
            state.left_over.bytes += left.bytes;
            if left.events > 0 {
                state.left_over_since = match (state.left_over_since, oldest) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        let share = Arc::clone(self);
        reports.close(Box::new(move |meta: &RecordMeta, report: &DeliveryReport| {
            let mut state = lock(&share.state);
            state.left_over.events -= 1;
            state.left_over.bytes -= meta.size;
            if state.left_over.events == 0 {
                state.left_over_since = None;
            }
            // A record no session awaits failed (it timed out): the pipeline's next session
            // publishes it again from the slot, and its records behind it must not go first.
            if share.group.withdraws && report.is_err() && state.left_over != InFlight::default()
            {
                if let Some(producer) = state.producer.clone().filter(|p| !p.is_retired()) {
                    tracing::warn!(
                        records = state.left_over.events,
                        "a record of an ended session failed in the producer shared with other pipelines; withdrawing the records queued behind it"
                    );
                    drop(state);
                    share.group.retire(&producer);
                }
            }
        }));
    }
}

/// Locks `mutex`; a panic elsewhere while it was held leaves plain counters, still usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use futures::FutureExt;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::DefaultProducerContext;

    use super::*;
    use crate::ack::{AckTracker, EventToken};
    use crate::lsn::Lsn;
    use crate::sink::kafka::{KafkaSink, ProducerError};
    use crate::sink::{Delivery, Record, SendError, Sink};
    use crate::source::polling::DELIVERY_TIMEOUT_MS;

    /// Within it every delivery report of a healthy partition on the mock cluster comes.
    const DEADLINE: Duration = Duration::from_secs(30);

    fn pipeline(name: &str, bootstrap: &str, properties: &[(&str, &str)]) -> PipelineConfig {
        let mut config = PipelineConfig::test_pipeline();
        config.name = name.into();
        config.kafka = KafkaConfig {
            bootstrap_servers: bootstrap.into(),
            properties: properties
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            create_topics: None,
        };
        config.max_in_flight_events = 5;
        config.max_in_flight_bytes = 1 << 20;
        config
    }

    fn polling_pipeline(
        name: &str,
        bootstrap: &str,
        properties: &[(&str, &str)],
    ) -> PipelineConfig {
        let mut config = pipeline(name, bootstrap, properties);
        config.source_kind = SourceKind::Polling;
        config
    }

    /// Polling pipelines share by their effective settings (the polling source's timeout
    /// default applied), among themselves only: a log-tailing pipeline whose settings equal a
    /// polling group's effective ones still keeps its own producer.
    #[test]
    fn polling_pipelines_share_a_producer_among_themselves_only() {
        let mut p = polling_pipeline("p", "k:9092", &[]);
        p.max_in_flight_events = 200_000;
        p.polling.batch_size = 300_000;
        let mut q = polling_pipeline("q", "k:9092", &[]);
        q.max_in_flight_events = 250_000;
        q.polling.batch_size = 10;
        // Its own timeout equals the default the others get: the same effective settings.
        let timeout = DELIVERY_TIMEOUT_MS.to_string();
        let mut s = polling_pipeline("s", "k:9092", &[("message.timeout.ms", &timeout)]);
        s.max_in_flight_events = 5;
        s.polling.batch_size = 1_000;
        let log_tailing_same_settings =
            pipeline("r", "k:9092", &[("message.timeout.ms", &timeout)]);
        let (a, b) = (pipeline("a", "k:9092", &[]), pipeline("b", "k:9092", &[]));
        let polling_other_settings = polling_pipeline("t", "k:9092", &[("linger.ms", "0")]);
        let producers = SharedProducers::for_pipelines(&[
            p,
            a,
            q,
            log_tailing_same_settings,
            b,
            s,
            polling_other_settings,
        ]);
        let share = |name: &str| {
            producers
                .share(name)
                .unwrap_or_else(|| panic!("{name} shares no producer"))
        };
        let (p, q, s, a, b) = (share("p"), share("q"), share("s"), share("a"), share("b"));
        assert!(Arc::ptr_eq(&p.group, &q.group));
        assert!(Arc::ptr_eq(&p.group, &s.group));
        assert!(Arc::ptr_eq(&a.group, &b.group));
        assert!(
            !Arc::ptr_eq(&p.group, &a.group),
            "polling and log-tailing pipelines share a producer"
        );
        for name in ["r", "t"] {
            assert!(producers.share(name).is_none(), "{name}");
        }
        let polling = &p.group.client;
        assert_eq!(polling.get("message.timeout.ms"), Some(timeout.as_str()));
        assert_eq!(a.group.client.get("message.timeout.ms"), Some("0"));
        // max(max_in_flight_events, batch_size) + 1 each: 300,001 + 250,001 + 1,001.
        assert_eq!(polling.get("queue.buffering.max.messages"), Some("551003"));
        // Each session is still held to its pipeline's own in-flight limit.
        assert_eq!(p.limit.events, 200_000);
        assert_eq!(s.limit.events, 5);
    }

    /// Two polling pipelines on one producer: a partition without a leader times out only the
    /// record sent to it, the other pipeline's records are delivered meanwhile, and the
    /// pipeline that saw the timeout sends its next record (the polling source goes on)
    /// through a fresh producer while the other keeps the one it uses.
    #[tokio::test]
    async fn a_polling_pipeline_renews_the_shared_producer_after_its_timed_out_record() {
        let mock = cluster();
        let producers = timing_out_pair(&mock, polling_pipeline);
        let (mut a, mut b) = (sink(&producers, "a"), sink(&producers, "b"));
        let old = a.producer.clone();
        assert!(b.producer.same(&old), "the pipelines share no producer");
        mock.partition_leader("a", 0, None).unwrap();
        let mut tracker = tracker();
        a.send(record("a"), token(&mut tracker)).unwrap();
        for _ in 0..3 {
            b.send(record("b"), token(&mut tracker)).unwrap();
        }
        for i in 0..3 {
            let delivery = next(&mut b, "pipeline b").await;
            assert!(
                delivery.result.is_ok(),
                "record {i} of b: {:?}",
                delivery.result
            );
        }
        assert_timed_out(next(&mut a, "pipeline a").await);
        mock.partition_leader("a", 0, Some(1)).unwrap();
        a.send(record("a"), token(&mut tracker)).unwrap();
        assert!(
            !a.producer.same(&old),
            "a kept the producer its record timed out in"
        );
        assert!(b.producer.same(&old), "b was moved");
        let retried = next(&mut a, "pipeline a").await;
        assert!(retried.result.is_ok(), "{:?}", retried.result);
        b.send(record("b"), token(&mut tracker)).unwrap();
        assert!(next(&mut b, "pipeline b").await.result.is_ok());
    }

    /// A mock cluster with topics `a` and `b`, one partition each.
    fn cluster() -> MockCluster<'static, DefaultProducerContext> {
        let mock = MockCluster::new(1).expect("a librdkafka mock cluster");
        mock.create_topic("a", 1, 1).unwrap();
        mock.create_topic("b", 1, 1).unwrap();
        mock
    }

    fn sink(producers: &SharedProducers, name: &str) -> KafkaSink {
        KafkaSink::new_or_shared(producers, name, None, || {
            Err(ProducerError(KafkaError::ClientCreation(format!(
                "{name} shares no producer"
            ))))
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn record(topic: &str) -> Record {
        Record {
            topic: topic.into(),
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"v")),
            headers: vec![],
            timestamp_ms: None,
            partition: Some(0),
        }
    }

    /// A tracker with one open transaction, for the records' tokens.
    fn tracker() -> AckTracker {
        let mut tracker = AckTracker::new(Lsn(0x100));
        tracker.begin().unwrap();
        tracker
    }

    fn token(tracker: &mut AckTracker) -> EventToken {
        tracker.track_event().unwrap()
    }

    /// Pipelines `a` and `b` (made by `kind`) sharing a producer on `mock` whose records time
    /// out after 1 s: long enough for a fresh producer's first record (about 50 ms here) on a
    /// loaded machine, and for a test thread to get on between two steps.
    ///
    /// Log-tailing pipelines whose records can time out share no producer
    /// ([`SharedProducers::for_pipelines`]); grouped here all the same, a timeout is how these
    /// tests make a record fail with others behind it or a member renew, which in the product
    /// a broker's refusal or a fatal idempotence error does.
    fn timing_out_pair(
        mock: &MockCluster<'static, DefaultProducerContext>,
        kind: fn(&str, &str, &[(&str, &str)]) -> PipelineConfig,
    ) -> SharedProducers {
        timing_out_pair_after(mock, kind, "1000")
    }

    /// [`timing_out_pair`] with a timeout of `timeout_ms`.
    fn timing_out_pair_after(
        mock: &MockCluster<'static, DefaultProducerContext>,
        kind: fn(&str, &str, &[(&str, &str)]) -> PipelineConfig,
        timeout_ms: &str,
    ) -> SharedProducers {
        let bootstrap = mock.bootstrap_servers();
        let settings = [("message.timeout.ms", timeout_ms)];
        let pair = [
            kind("a", &bootstrap, &settings),
            kind("b", &bootstrap, &settings),
        ];
        SharedProducers::grouping(pair.iter())
    }

    fn assert_timed_out(delivery: Delivery) {
        assert!(
            delivery.result.as_ref().is_err_and(|e| e.retryable),
            "{:?}",
            delivery.result
        );
    }

    /// Waits until the report of the first record `a` sent has come, not taken yet.
    async fn first_report_waits(a: &KafkaSink) {
        let deadline = Instant::now() + DEADLINE;
        while a.reports.is_empty() {
            assert!(
                Instant::now() < deadline,
                "the first record did not time out within {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn next(sink: &mut KafkaSink, what: &str) -> Delivery {
        tokio::time::timeout(DEADLINE, sink.next_delivery())
            .await
            .unwrap_or_else(|_| panic!("{what}: no delivery report within {DEADLINE:?}"))
            .unwrap_or_else(|| panic!("{what}: nothing in flight"))
    }

    /// A log-tailing pipeline whose records can time out, or run out of retries, keeps a
    /// producer of its own: each such failure ends its session, which withdraws its records
    /// behind the failed one, and in a shared producer that takes every member's records
    /// (review: a partition without a leader restarted the other pipelines' sessions at every
    /// timeout). Polling ones still share.
    #[test]
    fn log_tailing_pipelines_whose_records_can_time_out_share_no_producer() {
        for (key, value) in [
            ("message.timeout.ms", "30000"),
            ("delivery.timeout.ms", "1"),
            ("retries", "3"),
            ("message.send.max.retries", "10"),
        ] {
            let producers = SharedProducers::for_pipelines(&[
                pipeline("a", "k:9092", &[(key, value)]),
                pipeline("b", "k:9092", &[(key, value)]),
                polling_pipeline("c", "k:9092", &[(key, value)]),
                polling_pipeline("d", "k:9092", &[(key, value)]),
            ]);
            assert!(producers.share("a").is_none(), "{key} = {value}");
            assert!(producers.share("b").is_none(), "{key} = {value}");
            assert!(producers.share("c").is_some(), "{key} = {value}");
        }
        let no_limit = [("message.timeout.ms", "0"), ("retries", "2147483647")];
        let producers = SharedProducers::for_pipelines(&[
            pipeline("a", "k:9092", &no_limit),
            pipeline("b", "k:9092", &no_limit),
        ]);
        assert!(
            producers.share("a").is_some(),
            "no timeout, no retry limit: shared"
        );
    }

    #[test]
    fn at_least_once_pipelines_with_the_same_kafka_settings_share_a_producer() {
        let mut a = pipeline("a", "k:9092", &[]);
        a.max_in_flight_events = 200_000;
        a.max_in_flight_bytes = 64 << 20;
        let mut b = pipeline("b", "k:9092", &[]);
        b.max_in_flight_events = 300_000;
        b.max_in_flight_bytes = 32 << 20;
        let other_settings = pipeline("c", "k:9092", &[("linger.ms", "0")]);
        let mut exactly_once = pipeline("d", "k:9092", &[]);
        exactly_once.exactly_once = true;
        let polling = polling_pipeline("e", "k:9092", &[]);
        let producers =
            SharedProducers::for_pipelines(&[a, b, other_settings, exactly_once, polling]);
        let (a, b) = (producers.share("a").unwrap(), producers.share("b").unwrap());
        assert!(Arc::ptr_eq(&a.group, &b.group));
        // Alone with its settings, or a producer of its own.
        for name in ["c", "d", "e"] {
            assert!(producers.share(name).is_none(), "{name}");
        }
        // librdkafka's queue holds both pipelines' limits at once (plus a record each).
        let client = &a.group.client;
        assert_eq!(client.get("queue.buffering.max.messages"), Some("500002"));
        let kbytes: usize = client
            .get("queue.buffering.max.kbytes")
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            kbytes * 1024 >= (96 << 20) + 2 * DEFAULT_MESSAGE_MAX_BYTES,
            "{kbytes}"
        );
        assert_eq!(client.get("client.id"), Some(SHARED_CLIENT_ID));
        assert_eq!(client.get("enable.idempotence"), Some("true"));
    }

    /// One pipeline's partition without a leader holds its records, and only its records:
    /// the other pipeline on the same producer gets its deliveries, up to its own limit.
    #[tokio::test]
    async fn a_stuck_partition_holds_up_only_the_pipeline_that_sends_to_it() {
        let mock = cluster();
        let bootstrap = mock.bootstrap_servers();
        let producers = SharedProducers::for_pipelines(&[
            pipeline("a", &bootstrap, &[]),
            pipeline("b", &bootstrap, &[]),
        ]);
        let (mut a, mut b) = (sink(&producers, "a"), sink(&producers, "b"));
        assert!(
            a.producer.same(&b.producer),
            "the pipelines share no producer"
        );
        mock.partition_leader("a", 0, None).unwrap();
        let mut tracker = tracker();
        for _ in 0..5 {
            a.send(record("a"), token(&mut tracker)).unwrap();
        }
        for _ in 0..5 {
            b.send(record("b"), token(&mut tracker)).unwrap();
        }
        for i in 0..5 {
            let delivery = next(&mut b, "pipeline b").await;
            assert!(
                delivery.result.is_ok(),
                "record {i} of b: {:?}",
                delivery.result
            );
        }
        assert!(
            a.next_delivery().now_or_never().is_none(),
            "a record went to a partition without a leader"
        );
        assert_eq!(a.in_flight().events, 5);
    }

    /// A session that ends with records stuck in the shared producer leaves them there; they
    /// count against its pipeline's limits (the next session's records wait: `Full`) and
    /// nobody else's, until their reports come.
    #[tokio::test]
    async fn records_an_ended_session_left_in_flight_count_against_its_pipeline_only() {
        let mock = cluster();
        let bootstrap = mock.bootstrap_servers();
        let producers = SharedProducers::for_pipelines(&[
            pipeline("a", &bootstrap, &[]),
            pipeline("b", &bootstrap, &[]),
        ]);
        mock.partition_leader("a", 0, None).unwrap();
        let mut tracker = tracker();
        let mut a = sink(&producers, "a");
        for _ in 0..5 {
            a.send(record("a"), token(&mut tracker)).unwrap();
        }
        drop(a);
        let mut a = sink(&producers, "a");
        assert_eq!(
            a.left_over().events,
            5,
            "the next session sees what is left over"
        );
        assert!(
            matches!(
                a.send(record("a"), token(&mut tracker)),
                Err(SendError::Full(_))
            ),
            "the next session of a took room its last session's records still hold"
        );
        let mut b = sink(&producers, "b");
        for _ in 0..5 {
            b.send(record("b"), token(&mut tracker)).unwrap();
        }
        for _ in 0..5 {
            assert!(next(&mut b, "pipeline b").await.result.is_ok());
        }
        // The partition gets its leader: the left-over records are delivered, which frees a's room.
        mock.partition_leader("a", 0, Some(1)).unwrap();
        let deadline = Instant::now() + DEADLINE;
        while let Err(e) = a.send(record("a"), token(&mut tracker)) {
            assert!(matches!(e, SendError::Full(_)), "{e:?}");
            assert!(
                Instant::now() < deadline,
                "the left-over records of a were not delivered within {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(next(&mut a, "pipeline a").await.result.is_ok());
    }

    /// A timed-out record renews its pipeline's producer; the other pipeline keeps the old one
    /// while it has records in flight there (two producers on one partition could reorder
    /// them), and its next session, after its own timed-out record, adopts the group's fresh
    /// one instead of making another.
    #[tokio::test]
    async fn a_renewed_producer_moves_the_others_only_when_they_renew() {
        let mock = cluster();
        let producers = timing_out_pair(&mock, pipeline);
        let (mut a, mut b) = (sink(&producers, "a"), sink(&producers, "b"));
        let old = a.producer.clone();
        mock.partition_leader("a", 0, None).unwrap();
        let mut tracker = tracker();
        a.send(record("a"), token(&mut tracker)).unwrap();
        assert_timed_out(next(&mut a, "pipeline a").await);
        // b has a record in flight on the old producer when a renews.
        b.send(record("a"), token(&mut tracker)).unwrap();
        a.send(record("b"), token(&mut tracker)).unwrap();
        assert!(
            !a.producer.same(&old),
            "a kept the producer its record timed out in"
        );
        assert!(b.producer.same(&old), "b was moved with a record in flight");
        assert!(b.send(record("b"), token(&mut tracker)).is_ok());
        assert!(b.producer.same(&old));
        // b's record times out too; its next one goes through the group's fresh producer.
        loop {
            if next(&mut b, "pipeline b").await.result.is_err() {
                break;
            }
        }
        while b.in_flight().events > 0 {
            next(&mut b, "pipeline b").await;
        }
        // b's session ends on it (log tailing): the next one gets the group's fresh producer.
        drop(b);
        let mut b = sink(&producers, "b");
        assert!(
            b.producer.same(&a.producer),
            "b's renewal made another producer"
        );
        mock.partition_leader("a", 0, Some(1)).unwrap();
        b.send(record("b"), token(&mut tracker)).unwrap();
        assert!(next(&mut b, "pipeline b").await.result.is_ok());
    }

    /// A session that ended on a timed-out record while another of its records was still in
    /// the producer: the next session keeps that producer while the record is there, and moves
    /// to a fresh one once it is not (review: the wish for a fresh producer was dropped when the
    /// left-over record made the next session keep the old one, and it stayed for good).
    #[tokio::test]
    async fn a_renewal_waits_for_the_left_over_records_and_is_not_forgotten() {
        let mock = cluster();
        let producers = timing_out_pair(&mock, pipeline);
        let mut a = sink(&producers, "a");
        let old = a.producer.clone();
        mock.partition_leader("a", 0, None).unwrap();
        let mut tracker = tracker();
        a.send(record("a"), token(&mut tracker)).unwrap();
        // The first record times out; while its report waits untaken the sink wants no fresh
        // producer yet, so the second goes into the same one and has its whole 1 s timeout left
        // when the session ends (a fixed sleep between the two sends left too little on a
        // loaded machine: in CI both reports came before the session ended).
        first_report_waits(&a).await;
        a.send(record("a"), token(&mut tracker)).unwrap();
        assert!(a.producer.same(&old), "a renewed before taking its report");
        assert_timed_out(next(&mut a, "pipeline a").await);
        drop(a);
        let share = producers.share("a").unwrap();
        assert_eq!(share.left_over().events, 1);
        assert!(
            share.oldest_left_over().is_some(),
            "the left-over record's age is not counted"
        );
        let mut a = sink(&producers, "a");
        assert!(
            a.producer.same(&old),
            "a moved with a left-over record in the old producer"
        );
        let deadline = Instant::now() + DEADLINE;
        while share.left_over().events > 0 {
            assert!(
                Instant::now() < deadline,
                "the left-over record got no report within {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(share.oldest_left_over(), None);
        mock.partition_leader("a", 0, Some(1)).unwrap();
        a.send(record("b"), token(&mut tracker)).unwrap();
        assert!(
            !a.producer.same(&old),
            "a kept the producer its record timed out in after the left-over record was gone"
        );
        let delivery = next(&mut a, "pipeline a").await;
        assert!(delivery.result.is_ok(), "{:?}", delivery.result);
    }

    /// A log-tailing session ends on a timed-out record; its pipeline's next session gets a
    /// fresh producer, as it did when each session had its own; the other pipeline stays.
    #[tokio::test]
    async fn the_session_after_a_timed_out_record_gets_a_fresh_producer() {
        let mock = cluster();
        let producers = timing_out_pair(&mock, pipeline);
        let (mut a, b) = (sink(&producers, "a"), sink(&producers, "b"));
        let old = a.producer.clone();
        mock.partition_leader("a", 0, None).unwrap();
        let mut tracker = tracker();
        a.send(record("a"), token(&mut tracker)).unwrap();
        assert!(next(&mut a, "pipeline a").await.result.is_err());
        drop(a);
        let a = sink(&producers, "a");
        assert!(!a.producer.same(&old), "the next session kept the producer");
        assert!(b.producer.same(&old), "b was moved");
    }

    /// A session that ends on a failed delivery withdraws its records queued behind the failed
    /// one from the shared producer (review: they stayed there and went out after the session
    /// had ended, before the failed record's second copy, or for good after a halt). The other
    /// member's record queued there fails with them, unsent, and its next one goes through the
    /// group's fresh producer.
    #[tokio::test]
    async fn a_failed_delivery_withdraws_the_records_queued_behind_it() {
        let mock = cluster();
        // Long enough that the records sent after the first one's timeout do not time out
        // themselves before the session withdraws them on a loaded machine.
        let producers = timing_out_pair_after(&mock, pipeline, "5000");
        let (mut a, mut b) = (sink(&producers, "a"), sink(&producers, "b"));
        let old = a.producer.clone();
        mock.partition_leader("a", 0, None).unwrap();
        let mut tracker = tracker();
        a.send(valued("a", "failed"), token(&mut tracker)).unwrap();
        // The next record goes in after the first failed and before the session learns of it.
        first_report_waits(&a).await;
        a.send(valued("a", "behind"), token(&mut tracker)).unwrap();
        b.send(valued("a", "of b"), token(&mut tracker)).unwrap();
        assert_timed_out(next(&mut a, "pipeline a").await);
        a.withdraw_in_flight();
        drop(a);
        let withdrawn = next(&mut b, "pipeline b").await;
        let error = withdrawn
            .result
            .expect_err("b's queued record was not withdrawn");
        assert!(
            error.retryable && error.reason.contains("withdrawn"),
            "{error:?}"
        );
        mock.partition_leader("a", 0, Some(1)).unwrap();
        b.send(valued("a", "after"), token(&mut tracker)).unwrap();
        assert!(!b.producer.same(&old), "b kept the retired producer");
        let delivered = next(&mut b, "pipeline b").await;
        assert!(delivered.result.is_ok(), "{:?}", delivered.result);
        assert_eq!(
            values_up_to(&mock, "a", "after"),
            ["after"],
            "a withdrawn record reached the partition"
        );
        left_over_goes(&producers, "a").await;
        let a = sink(&producers, "a");
        assert!(
            a.producer.same(&b.producer),
            "a made another fresh producer"
        );
    }

    /// A session that ends (here: its source failed) with a failed report it has not taken
    /// withdraws what is behind it all the same, and so does a record that fails once no
    /// session awaits it (review: both left the records behind the failure to go out first).
    #[tokio::test]
    async fn failures_no_session_handled_withdraw_the_records_behind_them() {
        let mock = cluster();
        let producers = timing_out_pair(&mock, pipeline);
        mock.partition_leader("a", 0, None).unwrap();
        let mut tracker = tracker();
        // The session ends with the first record's failure in its queue.
        let mut a = sink(&producers, "a");
        let old = a.producer.clone();
        a.send(record("a"), token(&mut tracker)).unwrap();
        first_report_waits(&a).await;
        a.send(record("a"), token(&mut tracker)).unwrap();
        drop(a);
        assert!(
            old.is_retired(),
            "an untaken failure left the producer running"
        );
        left_over_goes(&producers, "a").await;
        // The session ends before its first record fails: both are left over.
        let mut a = sink(&producers, "a");
        let old = a.producer.clone();
        for _ in 0..2 {
            a.send(record("a"), token(&mut tracker)).unwrap();
        }
        drop(a);
        left_over_goes(&producers, "a").await;
        assert!(
            old.is_retired(),
            "a left-over record's failure left the producer running"
        );
    }

    /// Waits until pipeline `name` has no records left over in the shared producer.
    async fn left_over_goes(producers: &SharedProducers, name: &str) {
        let share = producers.share(name).unwrap();
        let deadline = Instant::now() + DEADLINE;
        while share.left_over() != InFlight::default() {
            assert!(
                Instant::now() < deadline,
                "{name} still has {:?} left over after {DEADLINE:?}",
                share.left_over()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn valued(topic: &str, value: &'static str) -> Record {
        Record {
            value: Some(Bytes::from_static(value.as_bytes())),
            ..record(topic)
        }
    }

    /// The values in partition 0 of `topic` on `mock`, from the start up to the first `last`.
    fn values_up_to(
        mock: &MockCluster<'static, DefaultProducerContext>,
        topic: &str,
        last: &str,
    ) -> Vec<String> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::{Message, Offset, TopicPartitionList};
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", mock.bootstrap_servers())
            .set("group.id", "values-up-to")
            .set("enable.auto.commit", "false")
            .create()
            .expect("a consumer of the mock cluster");
        let mut partitions = TopicPartitionList::new();
        partitions
            .add_partition_offset(topic, 0, Offset::Beginning)
            .unwrap();
        consumer.assign(&partitions).unwrap();
        let deadline = Instant::now() + DEADLINE;
        let mut values = Vec::new();
        while values.last().is_none_or(|v| v != last) {
            assert!(
                Instant::now() < deadline,
                "{last:?} not read from {topic} within {DEADLINE:?}; read {values:?}"
            );
            if let Some(message) = consumer.poll(Duration::from_millis(100)) {
                let message = message.expect("a record of the mock cluster");
                values.push(String::from_utf8_lossy(message.payload().unwrap_or_default()).into());
            }
        }
        values
    }

    /// A fatal idempotence error refuses every member's records: each renews, onto one fresh
    /// producer.
    #[tokio::test]
    async fn a_fatal_producer_is_replaced_once_for_every_member() {
        let mock = cluster();
        let bootstrap = mock.bootstrap_servers();
        let producers = SharedProducers::for_pipelines(&[
            pipeline("a", &bootstrap, &[]),
            pipeline("b", &bootstrap, &[]),
        ]);
        let (mut a, mut b) = (sink(&producers, "a"), sink(&producers, "b"));
        let old = a.producer.clone();
        let reason = std::ffi::CString::new("test").unwrap();
        let code = unsafe {
            rdkafka::bindings::rd_kafka_test_fatal_error(
                rdkafka::producer::Producer::client(old.inner()).native_ptr(),
                rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                reason.as_ptr(),
            )
        };
        assert_eq!(
            code,
            rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
        );
        let mut tracker = tracker();
        for (name, sink) in [("a", &mut a), ("b", &mut b)] {
            match sink.send(record(name), token(&mut tracker)) {
                Err(SendError::Refused(e)) => assert!(e.retryable, "{e}"),
                other => panic!("a fatal producer accepted a record of {name}: {other:?}"),
            }
            sink.send(record(name), token(&mut tracker))
                .unwrap_or_else(|e| panic!("{name} kept the fatal producer: {e:?}"));
        }
        assert!(!a.producer.same(&old));
        assert!(
            a.producer.same(&b.producer),
            "one fresh producer per member"
        );
        assert!(next(&mut a, "pipeline a").await.result.is_ok());
        assert!(next(&mut b, "pipeline b").await.result.is_ok());
    }
}
