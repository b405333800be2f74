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
mod tests;
