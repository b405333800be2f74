//! Per-key ordered delivery over a client that acknowledges one message at a time: the
//! [`Publisher`] a sink kind implements (Redis Streams, NATS JetStream, RabbitMQ, HTTP) and
//! the [`OrderedSink`] that makes a [`Sink`] of it.
//!
//! Order: one key's records (a key being a destination and a record key) are published one at
//! a time, each only once the record before it was acknowledged, so no retry ever puts a later
//! record of a key ahead of an earlier one. Records of different keys, and records with a null
//! key, are published concurrently, up to `max_concurrency` at once. (Kafka's idempotent
//! producer gives the same per-key order with pipelining, from per-partition sequence numbers;
//! these servers have nothing like them.)
//!
//! Failures: a retryable one ([`Failure::Retry`]: a timeout, the server unavailable) is
//! retried with backoff ([`FIRST_RETRY`] doubling up to [`MAX_RETRY`]), each attempt bounded by
//! what is left of `delivery_timeout` after the record's first attempt; then its outcome is a
//! retryable [`DeliveryError`]. The timeout measures the record's own attempts only: time spent
//! queued behind its key's earlier records or waiting for a concurrency slot does not count, so
//! a long run of one key's records (a big transaction, a backlog) is never failed for the time
//! the records before it took. [`Failure::Broken`] (the connection is gone and the client will
//! not reconnect) fails the record at once. A refusal ([`Failure::Refused`]: too large, not
//! routable, not authorized) is the record's outcome at once.
//!
//! After a failure the key is held: its records handed over before the session took that
//! outcome fail unpublished ("an earlier record of its key failed"), so nothing of the key
//! overtakes the failed record; records handed over after it are published again. (A log-tailing
//! session ends at such a failure and the next one publishes from the last confirmed position;
//! the polling source keeps the aggregate's later rows back itself.) With `hold_on_refusal`
//! false (`on_bad_event = "dead_letter"`), a refusal does not hold the key: the session sends a
//! dead-letter copy and the key's next records go ahead.
//!
//! The publishing runs in a task of its own, so acknowledgements are taken whatever the session
//! loop is doing; dropping the sink aborts it (unacknowledged records are then published again
//! by the next session).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::sync::mpsc;
use tracing::warn;

use super::{Delivery, DeliveryError, InFlight, Record, SendError, Sink};
use crate::ack::EventToken;
use crate::session::mutation::{self, Mutation};
use crate::shutdown::AbortOnDrop;

/// The first wait before publishing a record again.
pub const FIRST_RETRY: Duration = Duration::from_millis(100);
/// The longest wait between two attempts.
pub const MAX_RETRY: Duration = Duration::from_secs(5);
/// Least time between two warnings about records being retried.
const RETRY_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// What kind of failure a publish attempt had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Publishing the same record again may succeed (timeout, server unavailable, a 5xx).
    Retry,
    /// The connection is gone for good: fail now, the next session connects again.
    Broken,
    /// Not published: an earlier record of its key failed (never sent to the server).
    NotTried,
    /// The server refused this record and always will.
    Refused {
        /// Larger than the server's limit.
        too_large: bool,
    },
}

/// Why an attempt to publish a record failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishError {
    pub failure: Failure,
    /// What the server or client said, with the server's address where it helps.
    pub reason: String,
}

impl PublishError {
    pub fn retry(reason: impl Into<String>) -> Self {
        PublishError {
            failure: Failure::Retry,
            reason: reason.into(),
        }
    }

    pub fn broken(reason: impl Into<String>) -> Self {
        PublishError {
            failure: Failure::Broken,
            reason: reason.into(),
        }
    }

    pub fn refused(reason: impl Into<String>) -> Self {
        PublishError {
            failure: Failure::Refused { too_large: false },
            reason: reason.into(),
        }
    }

    pub fn too_large(reason: impl Into<String>) -> Self {
        PublishError {
            failure: Failure::Refused { too_large: true },
            reason: reason.into(),
        }
    }
}

/// A client of one sink kind: publishes a record and resolves once the server acknowledged it
/// (what "acknowledged" means for each kind is in its module and its page under docs/how-to/sinks/).
pub trait Publisher: Send + Sync + 'static {
    /// Publishes `record` (its `topic` is the routed destination: stream, subject, routing key
    /// or URL, as the kind defines). The future must not borrow `record`: clone what it needs
    /// (the record's parts are [`Bytes`], cheap to clone).
    ///
    /// Resolves to `Ok` on the server's acknowledgement, or the attempt's [`PublishError`].
    fn publish(&self, record: &Record) -> BoxFuture<'static, Result<(), PublishError>>;
}

/// The settings of an [`OrderedSink`].
#[derive(Debug, Clone, Copy)]
pub struct OrderedSettings {
    /// Records published at once (of different keys); at least 1.
    pub max_concurrency: usize,
    /// How long after its first attempt a record is retried before it fails.
    pub delivery_timeout: Duration,
    /// Whether a refusal holds its key like a failure (`on_bad_event = "halt"`: nothing of
    /// the key after the refused record is published before the session stops).
    pub hold_on_refusal: bool,
}

/// What a key is: a destination and a record key (`None`: a null key, never ordered).
type Key = (String, Bytes);

fn key_of(record: &Record) -> Option<Key> {
    record.key.clone().map(|key| (record.topic.clone(), key))
}

/// A record the session handed over, with what its outcome needs.
struct Job {
    seq: u64,
    token: EventToken,
    record: Record,
    /// On tokio's clock: the outcome's latency is measured from it.
    accepted: tokio::time::Instant,
    /// When the record was first published, on tokio's clock: the delivery timeout is
    /// measured from it. `None` while it waits for its key or a concurrency slot.
    first_attempt: Option<tokio::time::Instant>,
}

/// What the sink sends its publishing task.
enum Command {
    Publish(Job),
    /// The session took the failure that held this key: what it hands over next goes out.
    Release(Key),
}

/// An outcome for the sink's side: the job's number, the delivery, and the key the failure
/// holds (to release once the session has taken the outcome).
type Outcome = (u64, Delivery, Option<Key>);

/// A record without an outcome, as the sink's side keeps it.
struct Pending {
    size: usize,
    accepted: Instant,
    token: EventToken,
    topic: String,
}

/// A [`Publisher`] as a [`Sink`], with per-key order (see the module docs).
pub struct OrderedSink {
    jobs: mpsc::UnboundedSender<Command>,
    outcomes: mpsc::UnboundedReceiver<Outcome>,
    /// Each record without an outcome, by job number.
    pending: HashMap<u64, Pending>,
    in_flight: InFlight,
    next_seq: u64,
    _task: AbortOnDrop,
}

impl OrderedSink {
    /// Starts publishing through `publisher` (on the current tokio runtime).
    pub fn new(publisher: impl Publisher, settings: OrderedSettings) -> Self {
        let (jobs, job_rx) = mpsc::unbounded_channel();
        let (outcome_tx, outcomes) = mpsc::unbounded_channel();
        let driver = Driver {
            publisher: Arc::new(publisher),
            settings: OrderedSettings {
                max_concurrency: settings.max_concurrency.max(1),
                ..settings
            },
            outcomes: outcome_tx,
            waiting: HashMap::new(),
            ready: VecDeque::new(),
            held: HashMap::new(),
            last_retry_warning: None,
        };
        let task = tokio::spawn(driver.run(job_rx));
        OrderedSink {
            jobs,
            outcomes,
            pending: HashMap::new(),
            in_flight: InFlight::default(),
            next_seq: 0,
            _task: AbortOnDrop(task),
        }
    }
}

impl Sink for OrderedSink {
    fn send(&mut self, record: Record, token: EventToken) -> Result<(), SendError> {
        let seq = self.next_seq;
        let size = record.size();
        let pending = Pending {
            size,
            accepted: Instant::now(),
            token,
            topic: record.topic.clone(),
        };
        let job = Job {
            seq,
            token,
            record,
            accepted: tokio::time::Instant::now(),
            first_attempt: None,
        };
        if let Err(mpsc::error::SendError(Command::Publish(job))) =
            self.jobs.send(Command::Publish(job))
        {
            // Only if the publishing task panicked: say so rather than wait for nothing.
            return Err(SendError::Refused(DeliveryError {
                event_id: job.record.event_id(),
                topic: job.record.topic.clone(),
                reason: "the sink's publishing task ended".into(),
                retryable: true,
                too_large: false,
                connection_lost: false,
                attempted: false,
                record: Some(Box::new(job.record)),
            }));
        }
        self.next_seq += 1;
        self.pending.insert(seq, pending);
        self.in_flight.events += 1;
        self.in_flight.bytes += size;
        Ok(())
    }

    async fn next_delivery(&mut self) -> Option<Delivery> {
        if self.pending.is_empty() {
            return None;
        }
        let (seq, delivery) = match self.outcomes.recv().await {
            Some((seq, delivery, held)) => {
                if let Some(key) = held {
                    // Records handed over from now on are after the failure in the session's
                    // eyes; the channel keeps this after everything handed over before.
                    let _ = self.jobs.send(Command::Release(key));
                }
                (seq, delivery)
            }
            None => {
                // The publishing task is gone (it panicked): fail what it held, one by one.
                let seq = *self.pending.keys().next().expect("pending is not empty");
                let pending = &self.pending[&seq];
                let delivery = Delivery {
                    token: pending.token,
                    topic: pending.topic.clone(),
                    latency: pending.accepted.elapsed(),
                    timestamp_ms: None,
                    result: Err(DeliveryError {
                        event_id: String::new(),
                        topic: pending.topic.clone(),
                        reason: "the sink's publishing task ended".into(),
                        retryable: true,
                        too_large: false,
                        connection_lost: false,
                        attempted: true,
                        record: None,
                    }),
                };
                (seq, delivery)
            }
        };
        if let Some(pending) = self.pending.remove(&seq) {
            self.in_flight.events -= 1;
            self.in_flight.bytes -= pending.size;
        }
        Some(delivery)
    }

    fn in_flight(&self) -> InFlight {
        self.in_flight
    }

    fn oldest_in_flight(&self) -> Option<Instant> {
        self.pending.values().map(|p| p.accepted).min()
    }
}

/// The publishing task's state.
struct Driver<P> {
    publisher: Arc<P>,
    settings: OrderedSettings,
    outcomes: mpsc::UnboundedSender<Outcome>,
    /// Per key with a record in flight: the key's later records, in send order.
    waiting: HashMap<Key, VecDeque<Job>>,
    /// Records free to go once a concurrency slot is.
    ready: VecDeque<Job>,
    /// Keys held after a failure, until the session has taken it: their records fail with
    /// this reason.
    held: HashMap<Key, String>,
    last_retry_warning: Option<Instant>,
}

/// One attempt's result: the job, the attempt's number (from 0) and what the server said.
type Attempt = (Job, u32, Result<(), PublishError>);

impl<P: Publisher> Driver<P> {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut running: FuturesUnordered<BoxFuture<'static, Attempt>> = FuturesUnordered::new();
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Publish(job)) => self.admit(job),
                    Some(Command::Release(key)) => {
                        self.held.remove(&key);
                    }
                    None => return,
                },
                Some((job, attempt, result)) = running.next(), if !running.is_empty() => {
                    self.finished(job, attempt, result, &mut running);
                }
            }
            while running.len() < self.settings.max_concurrency {
                let Some(job) = self.ready.pop_front() else {
                    break;
                };
                running.push(self.attempt(job, 0));
            }
        }
    }

    /// A new record: ready now unless its key has one in flight or is held.
    fn admit(&mut self, job: Job) {
        let Some(key) = key_of(&job.record) else {
            self.ready.push_back(job);
            return;
        };
        if mutation::active(Mutation::OrderedKeyConcurrently) && !self.held.contains_key(&key) {
            self.ready.push_back(job);
            return;
        }
        if let Some(reason) = self.held.get(&key) {
            let reason = format!("not published: an earlier record of its key failed ({reason})");
            let error = PublishError {
                failure: Failure::NotTried,
                reason,
            };
            self.outcome(job, Err((error, false)));
            return;
        }
        match self.waiting.get_mut(&key) {
            Some(queue) => queue.push_back(job),
            None => {
                self.waiting.insert(key, VecDeque::new());
                self.ready.push_back(job);
            }
        }
    }

    /// Publishes `job`, after a backoff if this is a retry, waiting for the answer no longer
    /// than the delivery timeout leaves of the time since its first attempt.
    fn attempt(&self, mut job: Job, attempt: u32) -> BoxFuture<'static, Attempt> {
        let publisher = Arc::clone(&self.publisher);
        let delay = retry_delay(attempt);
        let timeout = self.settings.delivery_timeout;
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let first = *job
                .first_attempt
                .get_or_insert_with(tokio::time::Instant::now);
            let deadline = first + timeout;
            let result =
                match tokio::time::timeout_at(deadline, publisher.publish(&job.record)).await {
                    Ok(result) => result,
                    Err(_) => Err(PublishError::retry(format!(
                        "no acknowledgement within delivery_timeout_ms ({} ms)",
                        timeout.as_millis()
                    ))),
                };
            (job, attempt, result)
        })
    }

    /// Attempt `attempt` of `job` after its backoff, which `last` ended; when the backoff
    /// would end past the record's deadline, no attempt is made: the record fails at the
    /// deadline with `last`.
    fn retry(&self, job: Job, attempt: u32, last: PublishError) -> BoxFuture<'static, Attempt> {
        let deadline = job
            .first_attempt
            .map(|first| first + self.settings.delivery_timeout);
        match deadline {
            Some(deadline) if deadline <= tokio::time::Instant::now() + retry_delay(attempt) => {
                Box::pin(async move {
                    tokio::time::sleep_until(deadline).await;
                    (job, attempt, Err(last))
                })
            }
            _ => self.attempt(job, attempt),
        }
    }

    fn finished(
        &mut self,
        job: Job,
        attempt: u32,
        result: Result<(), PublishError>,
        running: &mut FuturesUnordered<BoxFuture<'static, Attempt>>,
    ) {
        match result {
            Err(e)
                if e.failure == Failure::Retry
                    && job
                        .first_attempt
                        .is_none_or(|first| first.elapsed() < self.settings.delivery_timeout) =>
            {
                if self
                    .last_retry_warning
                    .is_none_or(|at| at.elapsed() >= RETRY_WARNING_INTERVAL)
                {
                    self.last_retry_warning = Some(Instant::now());
                    warn!(event_id = %job.record.event_id(), destination = %job.record.topic, reason = %e.reason, attempt = attempt + 1, "publishing failed; retrying (until delivery_timeout_ms after the record's first attempt)");
                }
                running.push(self.retry(job, attempt + 1, e));
            }
            Err(e) => {
                let holds = match e.failure {
                    Failure::Retry | Failure::Broken | Failure::NotTried => true,
                    Failure::Refused { .. } => self.settings.hold_on_refusal,
                };
                self.outcome(job, Err((e, holds)));
            }
            Ok(()) if attempt == 0 && mutation::active(Mutation::OrderedRepublishAcknowledged) => {
                running.push(self.attempt(job, 1));
            }
            Ok(()) => self.outcome(job, Ok(())),
        }
    }

    /// Reports `job`'s outcome and lets its key's next record go (or, when `result` is a
    /// failure that holds the key, fails the key's waiting records and holds it until the
    /// session has taken this outcome).
    fn outcome(&mut self, job: Job, result: Result<(), (PublishError, bool)>) {
        let key = key_of(&job.record);
        let mut holds = None;
        let result = result.map_err(|(e, hold)| {
            let hold = hold && !mutation::active(Mutation::OrderedNoHold);
            if let (true, Some(key)) = (hold, &key) {
                if self.held.insert(key.clone(), e.reason.clone()).is_none() {
                    holds = Some(key.clone());
                }
            }
            e
        });
        let delivery = Delivery {
            token: job.token,
            topic: job.record.topic.clone(),
            latency: job.accepted.elapsed(),
            timestamp_ms: job.record.timestamp_ms,
            result: result.map_err(|e| DeliveryError {
                event_id: job.record.event_id(),
                topic: job.record.topic.clone(),
                reason: e.reason,
                retryable: matches!(
                    e.failure,
                    Failure::Retry | Failure::Broken | Failure::NotTried
                ),
                too_large: e.failure == Failure::Refused { too_large: true },
                connection_lost: e.failure == Failure::Broken,
                attempted: e.failure != Failure::NotTried,
                record: Some(Box::new(job.record)),
            }),
        };
        // The sink may be gone (the session ended): nothing is waiting for the outcome then.
        let _ = self.outcomes.send((job.seq, delivery, holds));
        let Some(key) = key else {
            return;
        };
        let next = match self.waiting.get_mut(&key) {
            Some(queue) => queue.pop_front(),
            None => return,
        };
        match next {
            Some(next) if self.held.contains_key(&key) => {
                // Fail the rest of the key's queue, in order, without publishing.
                let mut rest = vec![next];
                rest.extend(self.waiting.remove(&key).into_iter().flatten());
                for job in rest {
                    self.admit(job);
                }
            }
            Some(next) => self.ready.push_back(next),
            None => {
                self.waiting.remove(&key);
            }
        }
    }
}

/// The backoff before attempt number `attempt` (0: the first, none): [`FIRST_RETRY`] doubling
/// up to [`MAX_RETRY`].
fn retry_delay(attempt: u32) -> Duration {
    match attempt {
        0 => Duration::ZERO,
        n => FIRST_RETRY
            .saturating_mul(1 << (n - 1).min(16))
            .min(MAX_RETRY),
    }
}

#[cfg(test)]
mod tests;
