//! Exactly-once mode: a transactional capability of the sink, the checkpoint committed with
//! each transaction, and the session's bookkeeping of both.
//!
//! Consecutive PostgreSQL transactions with events share one sink transaction, a [`batch`]:
//! their records, then a checkpoint record (the last one's end LSN), then the commit. The ack
//! tracker sees each PostgreSQL commit at once, but the position confirmed to the slot is held
//! before the batch's first transaction until the sink transaction committed
//! ([`ExactlyOnce::limit`]), so the slot never passes a transaction whose sink transaction is
//! not committed. While a commit is pending, the next batch is read and routed, its records
//! kept back until the next sink transaction began. A failed batch is aborted and redone from
//! the slot, which stands before its first transaction. A new session fences the previous
//! producer ([`Transactions::init`]), reads the checkpoint back ([`read_checkpoint`]), refuses
//! it if it was written for another source ([`StoredCheckpoint::verify`]) and passes over the
//! transactions at or below it: those committed before a crash that came before the slot's
//! confirmation ([`start`]). Batches close only between PostgreSQL transactions, so the
//! checkpoint never falls inside one.
//!
//! - [`TransactionalSink`] and [`Transactions`]: the capability (begin, commit with a
//!   checkpoint, abort); [`kafka`] implements it for [`crate::sink::kafka::KafkaSink`].
//! - [`batch`]: when a batch closes (count, bytes, linger, an idle source, shutdown) and what
//!   it holds the flush LSN at.
//! - [`checkpoint`]: the checkpoint's format and origin, and the decision whether one read
//!   back belongs to this source.
//! - [`ExactlyOnce`]: what the session loop keeps between those calls.
//! - [`redo`]: events Kafka refused inside a transaction, dead-lettered when it is redone.

pub mod batch;
pub mod checkpoint;
pub mod kafka;
pub mod redo;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use tracing::{debug, info, warn};

pub use batch::{Batch, BatchLimits};
pub use checkpoint::{Checkpoint, Origin, StoredCheckpoint, TimelineSwitch};
pub use kafka::{read_checkpoint, KafkaTransactions, TransactionError};
pub use redo::{Redo, RefusedEvent};

use crate::config::PipelineConfig;
use crate::error::{chain, Error};
use crate::lsn::Lsn;
use crate::metrics::PipelineMetrics;
use crate::session::mutation::{active as mutated, Mutation};
use crate::sink::{DeliveryError, Sink};
use crate::source::replication::ReplicationClient;
use crate::source::SourceError;

/// How long to wait for an abort of the open transaction when a session ends; if it does not
/// finish, the next session's producer aborts it (and the coordinator, after
/// `transaction.timeout.ms`, if no session follows).
const ABORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The checkpoint could not be read at session start.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint topic {0:?} does not exist: create it with cleanup.policy=compact (see docs/concepts/exactly-once.md)")]
    MissingTopic(String),
    /// The broker's metadata named an error for the topic other than its absence: transient
    /// (no leader yet, a broker restarting) unless it refuses the relay
    /// ([`CheckpointError::is_transient`]).
    #[error("checkpoint topic {topic:?}: the broker's metadata for it answered {code}")]
    Topic {
        topic: String,
        code: rdkafka::error::RDKafkaErrorCode,
    },
    #[error("reading checkpoint topic {topic:?}")]
    Kafka {
        topic: String,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    #[error("checkpoint topic {0:?} was not read to its end within 60 s")]
    Timeout(String),
    /// A transaction (this relay's or another's: the topic is shared) was still open in a
    /// partition when the wait for it ended; a `read_committed` read would stop before the
    /// checkpoints written after it. Transient: it ends when its producer commits or aborts,
    /// or when the broker aborts it after that producer's `transaction.timeout.ms`.
    #[error("checkpoint topic {topic:?} partition {partition}: a transaction is still open after {waited_secs} s (last stable offset {last_stable_offset}, high watermark {high_watermark}); the checkpoints after it cannot be read until its producer commits or aborts it, or the broker aborts it after that producer's transaction.timeout.ms")]
    OpenTransaction {
        topic: String,
        partition: i32,
        last_stable_offset: i64,
        high_watermark: i64,
        waited_secs: u64,
    },
    /// The checkpoint read back belongs to another source (see [`StoredCheckpoint::verify`]).
    #[error("checkpoint of pipeline {pipeline:?} in topic {topic:?} does not belong to this source: {reason}; passing over events by it would lose them. If the pipeline was moved to this database on purpose, delete its checkpoint (a tombstone record keyed {pipeline:?} in {topic:?}) or give it a new pipeline name and transactional_id; otherwise point it back at the database the checkpoint names")]
    Foreign {
        pipeline: String,
        topic: String,
        reason: String,
    },
    #[error("checkpoint topic {topic:?} partition {partition} offset {offset}: {reason}")]
    Value {
        topic: String,
        partition: i32,
        offset: i64,
        reason: String,
    },
}

impl CheckpointError {
    /// Whether a later session may read the checkpoint: the broker failing or slow, not a
    /// missing, refused or foreign topic or a bad value (those stop the pipeline). A topic the
    /// relay may describe but not read is refused at the fetch, not in the metadata: an
    /// authorization error is a refusal wherever it comes from (see `sink::kafka::is_refused`;
    /// librdkafka's local authentication error is not one).
    pub fn is_transient(&self) -> bool {
        use crate::sink::kafka::is_refused as refused;
        use rdkafka::error::RDKafkaErrorCode::InvalidTopic;
        match self {
            CheckpointError::Kafka { source, .. } => {
                !source.rdkafka_error_code().is_some_and(refused)
            }
            CheckpointError::Timeout(_) | CheckpointError::OpenTransaction { .. } => true,
            CheckpointError::Topic { code, .. } => !(refused(*code) || *code == InvalidTopic),
            CheckpointError::MissingTopic(_)
            | CheckpointError::Foreign { .. }
            | CheckpointError::Value { .. } => false,
        }
    }
}

/// A record waits for a topic the cluster does not have (`why`: the topic gate's sentence,
/// naming it and the fix) while the open Kafka transaction has records on the broker. Holding
/// that transaction until the topic exists would hold its partitions' last stable offset for
/// `read_committed` consumers, until the coordinator aborts it after `transaction.timeout.ms`
/// and the producer's next call fails. It is aborted instead, and its PostgreSQL transactions
/// are read again from the slot by the next session (after the supervisor's backoff).
#[derive(Debug, thiserror::Error)]
#[error("{why}; exactly-once: the open kafka transaction was aborted rather than held open until the broker's transaction timeout, and its transactions are read again from the slot")]
pub struct HeldByMissingTopic {
    pub why: String,
}

/// A sink whose records can be grouped in transactions: the exactly-once capability.
pub trait TransactionalSink: Sink {
    /// The transaction calls of this sink, committing checkpoint records keyed `pipeline` in
    /// `checkpoint_topic`, written with `origin` (where their LSNs come from) and marked with
    /// `transactional_id` (see [`checkpoint::mark`]).
    fn transactions(
        &self,
        checkpoint_topic: &str,
        pipeline: &str,
        transactional_id: &str,
        origin: Origin,
    ) -> Box<dyn Transactions>;
}

/// Transaction calls of a [`TransactionalSink`]. Each returned future owns what it needs, so
/// it may be kept across `select!` iterations while the sink is used; a dropped call still
/// completes in the background (not cancel-safe in that sense).
pub trait Transactions: Send {
    /// Registers with the transaction coordinator: fences any earlier producer with the same
    /// transactional id and aborts its open transaction.
    ///
    /// Returns an error if the coordinator cannot be reached in time or refuses the id.
    fn init(&self) -> BoxFuture<'static, Result<(), TransactionError>>;

    /// Starts a transaction; the records sent until commit or abort belong to it.
    fn begin(&self) -> BoxFuture<'static, Result<(), TransactionError>>;

    /// Adds the checkpoint record and commits. Call it once every record of the transaction
    /// was acknowledged.
    ///
    /// Returns an error if the transaction could not be committed; then it is open or
    /// aborted, never committed without the checkpoint.
    fn commit(&self, checkpoint: Checkpoint) -> BoxFuture<'static, Result<(), TransactionError>>;

    /// Aborts the open transaction within `timeout`: its records are never shown to
    /// `read_committed` consumers.
    fn abort(&self, timeout: Duration) -> BoxFuture<'static, Result<(), TransactionError>>;
}

/// Where the records of the open PostgreSQL transaction go ([`ExactlyOnce::place`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Into the open Kafka transaction: send them, after [`ExactlyOnce::before_send`].
    Transaction,
    /// The open batch is closed for its commit: they wait in the session until the commit
    /// returned and the next Kafka transaction began.
    Next,
}

/// A session's exactly-once state, between the transaction calls: the batch in the open
/// Kafka transaction and the one filling while it commits (see [`batch`]).
pub struct ExactlyOnce {
    transactions: Box<dyn Transactions>,
    /// Read at session start: transactions it covers were committed already.
    checkpoint: Option<Checkpoint>,
    limits: BatchLimits,
    /// The open PostgreSQL transaction is covered by the checkpoint: its events are passed over.
    skipping: bool,
    /// A Kafka transaction is open (begun, neither committed nor aborted).
    open: bool,
    /// The sink took a record in the open Kafka transaction: it is open on the broker too,
    /// holding its partitions' last stable offset until it ends (or the coordinator aborts it
    /// after `transaction.timeout.ms`).
    sent_in_open: bool,
    /// The sink took a record of the open PostgreSQL transaction in the open Kafka transaction.
    current_took: bool,
    /// Bytes of the open PostgreSQL transaction's records placed so far.
    current_bytes: usize,
    /// The PostgreSQL transactions with records in the open Kafka transaction.
    batch: Option<Batch>,
    /// The batch is closed: its commit starts once every record of it was acknowledged.
    closed: bool,
    /// The commit call of the closed batch.
    committing: Option<BoxFuture<'static, Result<(), TransactionError>>>,
    /// The PostgreSQL transactions read while the closed batch commits ([`Placement::Next`]).
    next: Option<Batch>,
    /// Where the open PostgreSQL transaction's records went, once it has one.
    current: Option<Placement>,
    /// The commit LSN (Begin's `final_lsn`) of the open PostgreSQL transaction.
    commit_lsn: Lsn,
    /// Events refused in earlier sessions, sent straight to the dead-letter topic.
    redo: Redo,
    /// Commit LSN of its transaction, LSN and id of each record not yet settled, by event
    /// number, to name a refused one in a [`RefusedEvent`]; bounded by the in-flight limit.
    sent: HashMap<u64, (Lsn, Lsn, Bytes)>,
}

impl ExactlyOnce {
    /// State for a session whose sink's transactions are `transactions` (already
    /// [`Transactions::init`]ed) and whose checkpoint, read back at start, is `checkpoint`;
    /// one PostgreSQL transaction per Kafka transaction ([`BatchLimits::SINGLE`]) unless
    /// [`ExactlyOnce::with_limits`] says otherwise.
    pub fn new(transactions: Box<dyn Transactions>, checkpoint: Option<Checkpoint>) -> Self {
        ExactlyOnce {
            transactions,
            checkpoint,
            limits: BatchLimits::SINGLE,
            skipping: false,
            open: false,
            sent_in_open: false,
            current_took: false,
            current_bytes: 0,
            batch: None,
            closed: false,
            committing: None,
            next: None,
            current: None,
            commit_lsn: Lsn::ZERO,
            redo: Redo::default(),
            sent: HashMap::new(),
        }
    }

    /// This state with the events that earlier sessions saw refused (see [`redo`]).
    pub fn with_redo(mut self, redo: Redo) -> Self {
        self.redo = redo;
        self
    }

    /// This state batching PostgreSQL transactions within `limits`.
    pub fn with_limits(mut self, limits: BatchLimits) -> Self {
        self.limits = limits;
        self
    }

    /// A PostgreSQL transaction whose commit record starts at `final_lsn` begins.
    pub fn on_begin(&mut self, final_lsn: Lsn) {
        self.skipping = self.checkpoint.is_some_and(|c| c.covers(final_lsn));
        self.commit_lsn = final_lsn;
        self.current = None;
        self.current_took = false;
        self.current_bytes = 0;
    }

    /// The refused event at `lsn` with `id` if an earlier session saw Kafka refuse it: the
    /// redo sends it straight to the dead-letter topic.
    pub fn refused_before(&self, lsn: Lsn, id: &[u8]) -> Option<&RefusedEvent> {
        self.redo.find(lsn, id)
    }

    /// Places a record of `bytes` of the open PostgreSQL transaction, the flush LSN being
    /// `flush_lsn`: the transaction's records all go where its first went, into the open
    /// Kafka transaction unless that is closed for its commit. A new batch holds the flush
    /// LSN at `flush_lsn` until it committed.
    pub fn place(&mut self, flush_lsn: Lsn, bytes: usize) -> Placement {
        let placement = match self.current {
            Some(placement) => placement,
            None if self.closed => Placement::Next,
            None => Placement::Transaction,
        };
        self.current = Some(placement);
        self.current_bytes += bytes;
        let batch = match placement {
            Placement::Transaction => &mut self.batch,
            Placement::Next => &mut self.next,
        };
        batch.get_or_insert_with(|| Batch::new(flush_lsn)).bytes += bytes;
        placement
    }

    /// Notes that event number `event` (at `lsn`, with `id`) is sent or waits to be.
    pub fn sent(&mut self, event: u64, lsn: Lsn, id: Bytes) {
        self.sent.insert(event, (self.commit_lsn, lsn, id));
    }

    /// Event number `event` has its outcome.
    pub fn settled(&mut self, event: u64) {
        self.sent.remove(&event);
    }

    /// Kafka refused event number `event` for good: its transaction can only be aborted.
    /// Returns what the redo needs to dead-letter it, or `None` if the event is not in flight
    /// or the redo holds [`redo::MAX_REDO_EVENTS`] already (then the pipeline halts on it).
    pub fn refused(&mut self, event: u64, error: &DeliveryError) -> Option<RefusedEvent> {
        let (commit_lsn, lsn, id) = self.sent.remove(&event)?;
        if self.redo.is_full() {
            return None;
        }
        Some(RefusedEvent {
            commit_lsn,
            lsn,
            id,
            topic: error.topic.clone(),
            reason: error.reason.clone(),
            too_large: error.too_large,
        })
    }

    /// Whether the events of the open PostgreSQL transaction are passed over (committed
    /// before the last crash).
    pub fn skipping(&self) -> bool {
        self.skipping
    }

    /// Opens a Kafka transaction unless one is open; call before sending a record placed in
    /// it ([`Placement::Transaction`]).
    ///
    /// Returns an error if the sink refuses to begin.
    pub async fn before_send(&mut self) -> Result<(), TransactionError> {
        if !self.open {
            self.transactions.begin().await?;
            self.open = true;
            self.sent_in_open = false;
        }
        Ok(())
    }

    /// The sink took the record of event number `event` (in the open Kafka transaction:
    /// records go to the sink only inside one).
    pub fn took_record(&mut self, event: u64) {
        self.sent_in_open |= self.open;
        if self.open && self.current == Some(Placement::Transaction) && self.of_current(event) {
            self.current_took = true;
        }
    }

    /// Whether event number `event`, not settled yet, belongs to the open PostgreSQL
    /// transaction.
    pub fn of_current(&self, event: u64) -> bool {
        self.sent
            .get(&event)
            .is_some_and(|(commit_lsn, _, _)| *commit_lsn == self.commit_lsn)
    }

    /// Moves the open PostgreSQL transaction out of the open Kafka transaction's batch into the
    /// next one, and closes the batch: its transactions commit without it. For a transaction
    /// whose records cannot go out yet (a missing topic) while the Kafka transaction holds
    /// records of the transactions before it: those commit, and its records wait for the next
    /// Kafka transaction ([`Placement::Next`]; the session moves them to its waiting records),
    /// where waiting holds nothing on the broker.
    ///
    /// Returns `false`, changing nothing, unless the open PostgreSQL transaction is in the
    /// open batch, none of its records was taken by the sink, and the batch has a committed
    /// transaction and is not closed.
    pub fn defer_current(&mut self) -> bool {
        if self.current != Some(Placement::Transaction) || self.current_took || self.closed {
            return false;
        }
        let Some(batch) = &mut self.batch else {
            return false;
        };
        if batch.transactions == 0 {
            return false;
        }
        batch.bytes = batch.bytes.saturating_sub(self.current_bytes);
        let hold = batch.hold;
        self.next.get_or_insert_with(|| Batch::new(hold)).bytes += self.current_bytes;
        self.current = Some(Placement::Next);
        self.closed = true;
        true
    }

    /// Whether the open Kafka transaction has records on the broker: ending it is up to this
    /// relay, or to the coordinator after `transaction.timeout.ms`.
    pub fn open_on_the_broker(&self) -> bool {
        self.open && self.sent_in_open
    }

    /// The PostgreSQL transaction ends at `end_lsn`: it joins the batch its records went to
    /// (the ack tracker may see its commit at once: [`ExactlyOnce::limit`] holds the flush
    /// LSN until the batch committed).
    ///
    /// Returns an error if a passed-over transaction ends after the checkpoint.
    pub fn on_commit(&mut self, end_lsn: Lsn) -> Result<(), SourceError> {
        if std::mem::take(&mut self.skipping) {
            if let Some(checkpoint) = self.checkpoint.filter(|c| end_lsn > c.0) {
                return Err(SourceError::Protocol(format!(
                    "transaction ending at {end_lsn} was passed over as committed to Kafka, but the checkpoint is {}",
                    checkpoint.0
                )));
            }
            return Ok(());
        }
        let batch = match self.current.take() {
            Some(Placement::Transaction) => &mut self.batch,
            Some(Placement::Next) => &mut self.next,
            None => return Ok(()),
        };
        if let Some(batch) = batch {
            batch.committed(end_lsn);
        }
        Ok(())
    }

    /// The source sent everything it had (a keepalive between transactions): the batches
    /// need wait for no more.
    pub fn on_idle(&mut self) {
        for batch in [&mut self.batch, &mut self.next].into_iter().flatten() {
            batch.idle = batch.transactions > 0;
        }
    }

    /// Closes the open batch if it is due (between PostgreSQL transactions; at once when
    /// `draining`), and starts its commit, with the last transaction's end LSN as the
    /// checkpoint, once `all_acknowledged` (none of its records in flight or waiting).
    pub fn step(&mut self, all_acknowledged: bool, draining: bool) {
        if !self.closed
            && self.current != Some(Placement::Transaction)
            && self
                .batch
                .is_some_and(|batch| batch.due(&self.limits, draining))
        {
            self.closed = true;
        }
        if let (true, None, true, Some(batch)) =
            (self.closed, &self.committing, all_acknowledged, &self.batch)
        {
            let end_lsn = match mutated(Mutation::CheckpointFirstTransaction) {
                true => batch.first_end,
                false => batch.last_end,
            };
            let end_lsn = end_lsn.expect("a closed batch has a committed transaction");
            debug!(transactions = batch.transactions, bytes = batch.bytes, checkpoint_lsn = %end_lsn, "committing a kafka transaction");
            self.committing = Some(self.transactions.commit(Checkpoint(end_lsn)));
        }
    }

    /// Whether another source item may be read: not while the batch commits and the next
    /// one is full already (a producer has one transaction at a time).
    pub fn reads(&self) -> bool {
        !(self.closed && self.next.is_some_and(|next| next.full(&self.limits)))
    }

    /// Whether a commit call is in progress.
    pub fn committing(&self) -> bool {
        self.committing.is_some()
    }

    /// Whether transactions with records wait for a Kafka commit.
    pub fn uncommitted(&self) -> bool {
        self.batch.is_some() || self.next.is_some()
    }

    /// When the open batch's linger ends, if it is to close then (not while a transaction of
    /// it is open, nor once closed).
    pub fn linger_until(&self) -> Option<tokio::time::Instant> {
        match self.closed || self.current == Some(Placement::Transaction) {
            true => None,
            false => self.batch?.linger_until(&self.limits),
        }
    }

    /// `flush_lsn` held at the flush LSN from before the first transaction not committed
    /// to Kafka: what may be confirmed.
    pub fn limit(&self, flush_lsn: Lsn) -> Lsn {
        [&self.batch, &self.next]
            .into_iter()
            .flatten()
            .map(|batch| batch.hold)
            .fold(flush_lsn, Lsn::min)
    }

    /// Waits for the commit in progress; never completes if there is none. Once it
    /// succeeded, the batch read meanwhile (if any) is the open one; its records wait for
    /// [`ExactlyOnce::before_send`].
    ///
    /// Cancel-safe (the commit goes on and is polled again). Returns an error if the commit
    /// failed: the session ends, and the next one aborts what is open.
    pub async fn committed(&mut self) -> Result<(), TransactionError> {
        let result = match self.committing.as_mut() {
            Some(commit) => commit.await,
            None => std::future::pending().await,
        };
        self.committing = None;
        result?;
        self.finish_commit();
        Ok(())
    }

    /// The closed batch committed: the next one takes its place, in no Kafka transaction yet,
    /// holding the flush LSN no lower than the committed batch's checkpoint (it was filled
    /// before that batch's acknowledgements came; what lies between the two has no records).
    fn finish_commit(&mut self) {
        self.open = false;
        self.closed = false;
        let committed = self.batch.take().and_then(|batch| batch.last_end);
        self.batch = self.next.take().map(|mut next| {
            next.hold = next.hold.max(committed.unwrap_or(Lsn::ZERO));
            next
        });
        if self.current == Some(Placement::Next) {
            self.current = Some(Placement::Transaction);
        }
    }

    /// At the end of a session, by `deadline` (what is left of a shutdown's drain): lets a
    /// commit in progress finish (two transaction calls at once are refused), then aborts a
    /// Kafka transaction still open, unless this producer was `fenced`. What the finished
    /// commit committed is no longer held ([`ExactlyOnce::limit`]).
    ///
    /// A commit still running at the deadline is abandoned: its outcome is unknown here, so
    /// its transactions stay unconfirmed, and the next session's producer (registering the
    /// transactional id fences this one) settles it and reads the checkpoint back. An abort
    /// that fails or runs out of time is left to the next session's producer likewise.
    pub async fn end(
        &mut self,
        fenced: bool,
        metrics: &PipelineMetrics,
        deadline: tokio::time::Instant,
    ) {
        if let Some(commit) = self.committing.take() {
            match tokio::time::timeout_at(deadline, commit).await {
                Ok(Ok(())) => {
                    self.finish_commit();
                    metrics.kafka_transaction("committed");
                }
                Ok(Err(_)) => {}
                Err(_) => {
                    warn!(pipeline = %metrics.name(), "the kafka commit did not finish by the shutdown deadline; its transaction stays unconfirmed and the next session settles it");
                    return;
                }
            }
        }
        if !self.open || fenced {
            return;
        }
        self.open = false;
        let left = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .min(ABORT_TIMEOUT);
        let aborted = tokio::time::timeout(left, self.transactions.abort(left)).await;
        match aborted {
            Ok(Ok(())) => {
                metrics.kafka_transaction("aborted");
                info!(pipeline = %metrics.name(), "open kafka transaction aborted");
            }
            Ok(Err(e)) => {
                warn!(pipeline = %metrics.name(), error = %chain(&e), "could not abort the open kafka transaction; the next session aborts it")
            }
            Err(_) => {
                warn!(pipeline = %metrics.name(), "aborting the open kafka transaction did not finish by the shutdown deadline; the next session aborts it")
            }
        }
    }
}

/// The exactly-once start of a session on `sink`, after START_REPLICATION (so that a standby,
/// which cannot get the slot, never fences the active relay): fences the previous producer
/// with the transactional id (aborting its open transaction, so the `read_committed` read is
/// not held back by it), reads the checkpoint back and checks that it belongs to `origin`,
/// whose timeline history is `history`. `redo` holds the refused events of earlier sessions.
///
/// Dropping the future at any await is safe (a stop during set-up): it has confirmed nothing,
/// and its blocking calls finish on detached threads that the process does not wait for.
///
/// Returns an error if the coordinator or the checkpoint topic cannot be read (retried), or
/// [`CheckpointError::Foreign`] if the checkpoint was written for another system, slot or
/// history (the pipeline stops: passing over events by it would lose them).
pub async fn start(
    sink: &impl TransactionalSink,
    config: &PipelineConfig,
    origin: Origin,
    history: &[TimelineSwitch],
    redo: Redo,
) -> Result<ExactlyOnce, Error> {
    let topic = config.checkpoint_topic();
    let transactional_id = config.transactional_id();
    let transactions = sink.transactions(topic, &config.name, &transactional_id, origin.clone());
    transactions.init().await?;
    let stored = read_checkpoint(&config.kafka, topic, &config.name, &transactional_id).await?;
    let checkpoint =
        match &stored {
            None => None,
            Some(stored) => Some(stored.verify(&origin, history).map_err(|reason| {
                CheckpointError::Foreign {
                    pipeline: config.name.clone(),
                    topic: topic.to_owned(),
                    reason,
                }
            })?),
        };
    if let Some(StoredCheckpoint {
        lsn, marked: false, ..
    }) = &stored
    {
        warn!(pipeline = %config.name, checkpoint_topic = %topic, checkpoint_lsn = %lsn, %transactional_id, "the checkpoint has no mark of its writer (the format before version 2) and is taken this once, as the pipeline has no marked checkpoint yet; the next commit writes a marked one, and unmarked records are ignored from then on");
    }
    info!(
        pipeline = %config.name,
        transactional_id = %config.transactional_id(),
        checkpoint_topic = %topic,
        checkpoint_lsn = %stored.as_ref().map_or_else(|| "none".to_owned(), ToString::to_string),
        origin = %origin,
        redone_dead_letters = redo.len(),
        "exactly-once mode: transactions before the checkpoint are passed over"
    );
    Ok(ExactlyOnce::new(transactions, checkpoint)
        .with_redo(redo)
        .with_limits(BatchLimits::of(config)))
}

/// The timeline history of `timeline` (`TIMELINE_HISTORY`, docs 55.4 "Streaming Replication
/// Protocol"): where each earlier timeline of this server's history ended. Timeline 1 has
/// none.
///
/// Returns an error if the server refuses the command or its file cannot be parsed.
pub async fn timeline_history(
    replication: &mut ReplicationClient,
    timeline: u32,
) -> Result<Vec<TimelineSwitch>, SourceError> {
    if timeline <= 1 {
        return Ok(Vec::new());
    }
    let rows = replication
        .simple_query(&format!("TIMELINE_HISTORY {timeline}"))
        .await?;
    let content = rows
        .first()
        .and_then(|row| row.get(1).cloned().flatten())
        .ok_or_else(|| {
            SourceError::Protocol(format!("TIMELINE_HISTORY {timeline} returned no content"))
        })?;
    checkpoint::parse_timeline_history(&content).map_err(SourceError::Protocol)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    /// Transaction calls that all succeed at once.
    struct Succeeding;

    impl Transactions for Succeeding {
        fn init(&self) -> BoxFuture<'static, Result<(), TransactionError>> {
            async { Ok(()) }.boxed()
        }
        fn begin(&self) -> BoxFuture<'static, Result<(), TransactionError>> {
            async { Ok(()) }.boxed()
        }
        fn commit(&self, _: Checkpoint) -> BoxFuture<'static, Result<(), TransactionError>> {
            async { Ok(()) }.boxed()
        }
        fn abort(&self, _: Duration) -> BoxFuture<'static, Result<(), TransactionError>> {
            async { Ok(()) }.boxed()
        }
    }

    fn refusal(topic: &str) -> DeliveryError {
        DeliveryError {
            event_id: "b".into(),
            topic: topic.into(),
            reason: "Broker: Message size too large".into(),
            retryable: false,
            too_large: true,
            connection_lost: false,
            attempted: true,
            record: None,
        }
    }

    #[test]
    fn a_refused_record_is_named_by_its_transaction_lsn_and_id_for_the_redo() {
        let mut eos = ExactlyOnce::new(Box::new(Succeeding), None);
        eos.on_begin(Lsn(0x200));
        eos.sent(0, Lsn(0x110), Bytes::from_static(b"a"));
        eos.sent(1, Lsn(0x118), Bytes::from_static(b"b"));
        eos.settled(0);
        assert_eq!(eos.refused(0, &refusal("T")), None, "settled already");
        let refused = eos.refused(1, &refusal("T")).expect("in flight");
        assert_eq!(
            refused,
            RefusedEvent {
                commit_lsn: Lsn(0x200),
                lsn: Lsn(0x118),
                id: Bytes::from_static(b"b"),
                topic: "T".into(),
                reason: "Broker: Message size too large".into(),
                too_large: true,
            }
        );

        // The next session, redoing the transaction.
        let mut redo = Redo::default();
        assert!(redo.add(refused));
        let eos = ExactlyOnce::new(Box::new(Succeeding), None).with_redo(redo);
        assert!(eos.refused_before(Lsn(0x118), b"b").is_some());
        assert!(eos.refused_before(Lsn(0x110), b"a").is_none());
    }

    #[test]
    fn no_refusal_is_named_once_the_redo_is_full() {
        let mut redo = Redo::default();
        for i in 0..redo::MAX_REDO_EVENTS as u64 {
            let mut eos = ExactlyOnce::new(Box::new(Succeeding), None);
            eos.on_begin(Lsn(0x1000));
            eos.sent(i, Lsn(i), Bytes::from_static(b"x"));
            assert!(redo.add(eos.refused(i, &refusal("T")).unwrap()));
        }
        let mut eos = ExactlyOnce::new(Box::new(Succeeding), None).with_redo(redo);
        eos.sent(7, Lsn(0x999), Bytes::from_static(b"y"));
        assert_eq!(eos.refused(7, &refusal("T")), None);
    }
}
