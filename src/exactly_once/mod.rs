//! Exactly-once mode: a transactional capability of the sink, the checkpoint committed with
//! each transaction, and the session's bookkeeping of both.
//!
//! Each PostgreSQL transaction with events gets one sink transaction: its records, then a
//! checkpoint record (the commit's end LSN), then the commit, and only then does the ack
//! tracker see the PostgreSQL commit, so the slot never passes a transaction whose sink
//! transaction is not committed. No source item is read while a commit is pending. A new
//! session fences the previous producer ([`Transactions::init`]), reads the checkpoint back
//! ([`read_checkpoint`]), refuses it if it was written for another source
//! ([`StoredCheckpoint::verify`]) and passes over the transactions at or below it: those
//! committed before a crash that came before the slot's confirmation ([`start`]).
//!
//! - [`TransactionalSink`] and [`Transactions`]: the capability (begin, commit with a
//!   checkpoint, abort); [`kafka`] implements it for [`crate::sink::kafka::KafkaSink`].
//! - [`checkpoint`]: the checkpoint's format and origin, and the decision whether one read
//!   back belongs to this source.
//! - [`ExactlyOnce`]: what the session loop keeps between those calls.
//! - [`redo`]: events Kafka refused inside a transaction, dead-lettered when it is redone.

pub mod checkpoint;
pub mod kafka;
pub mod redo;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use tracing::{info, warn};

pub use checkpoint::{Checkpoint, Origin, StoredCheckpoint, TimelineSwitch};
pub use kafka::{read_checkpoint, KafkaTransactions, TransactionError};
pub use redo::{Redo, RefusedEvent};

use crate::config::PipelineConfig;
use crate::error::{chain, Error};
use crate::lsn::Lsn;
use crate::metrics::PipelineMetrics;
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
    #[error("checkpoint topic {0:?} does not exist: create it with cleanup.policy=compact (see README, exactly-once mode)")]
    MissingTopic(String),
    #[error("reading checkpoint topic {topic:?}")]
    Kafka {
        topic: String,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    #[error("checkpoint topic {0:?} was not read to its end within 60 s (a transaction open for longer holds read_committed readers back)")]
    Timeout(String),
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

/// A sink whose records can be grouped in transactions: the exactly-once capability.
pub trait TransactionalSink: Sink {
    /// The transaction calls of this sink, committing checkpoint records keyed `pipeline` in
    /// `checkpoint_topic`, written with `origin` (where their LSNs come from).
    fn transactions(
        &self,
        checkpoint_topic: &str,
        pipeline: &str,
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

/// A session's exactly-once state, between the transaction calls.
pub struct ExactlyOnce {
    transactions: Box<dyn Transactions>,
    /// Read at session start: transactions it covers were committed already.
    checkpoint: Option<Checkpoint>,
    /// The open PostgreSQL transaction is covered by the checkpoint: its events are passed over.
    skipping: bool,
    /// A sink transaction is open: the current PostgreSQL transaction has records.
    open: bool,
    /// The end LSN of the PostgreSQL transaction whose commit is pending; no source item is
    /// read and the ack tracker keeps the transaction open until the commit succeeded.
    commit_at: Option<Lsn>,
    /// The commit call, started once every record of the transaction was acknowledged.
    committing: Option<BoxFuture<'static, Result<(), TransactionError>>>,
    /// The commit LSN (Begin's `final_lsn`) of the open PostgreSQL transaction.
    commit_lsn: Lsn,
    /// Events refused in earlier sessions, sent straight to the dead-letter topic.
    redo: Redo,
    /// LSN and id of each record in flight by event number, to name a refused one in a
    /// [`RefusedEvent`]; bounded by the in-flight limit.
    sent: HashMap<u64, (Lsn, Bytes)>,
}

impl ExactlyOnce {
    /// State for a session whose sink's transactions are `transactions` (already
    /// [`Transactions::init`]ed) and whose checkpoint, read back at start, is `checkpoint`.
    pub fn new(transactions: Box<dyn Transactions>, checkpoint: Option<Checkpoint>) -> Self {
        ExactlyOnce {
            transactions,
            checkpoint,
            skipping: false,
            open: false,
            commit_at: None,
            committing: None,
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

    /// A PostgreSQL transaction whose commit record starts at `final_lsn` begins.
    pub fn on_begin(&mut self, final_lsn: Lsn) {
        self.skipping = self.checkpoint.is_some_and(|c| c.covers(final_lsn));
        self.commit_lsn = final_lsn;
    }

    /// The refused event at `lsn` with `id` if an earlier session saw Kafka refuse it: the
    /// redo sends it straight to the dead-letter topic.
    pub fn refused_before(&self, lsn: Lsn, id: &[u8]) -> Option<&RefusedEvent> {
        self.redo.find(lsn, id)
    }

    /// Notes that event number `event` (at `lsn`, with `id`) is sent.
    pub fn sent(&mut self, event: u64, lsn: Lsn, id: Bytes) {
        self.sent.insert(event, (lsn, id));
    }

    /// Event number `event` has its outcome.
    pub fn settled(&mut self, event: u64) {
        self.sent.remove(&event);
    }

    /// Kafka refused event number `event` for good: its transaction can only be aborted.
    /// Returns what the redo needs to dead-letter it, or `None` if the event is not in flight
    /// or the redo holds [`redo::MAX_REDO_EVENTS`] already (then the pipeline halts on it).
    pub fn refused(&mut self, event: u64, error: &DeliveryError) -> Option<RefusedEvent> {
        let (lsn, id) = self.sent.remove(&event)?;
        if self.redo.is_full() {
            return None;
        }
        Some(RefusedEvent {
            commit_lsn: self.commit_lsn,
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

    /// Opens a sink transaction unless one is open; call before sending a record.
    ///
    /// Returns an error if the sink refuses to begin.
    pub async fn before_send(&mut self) -> Result<(), TransactionError> {
        if !self.open {
            self.transactions.begin().await?;
            self.open = true;
        }
        Ok(())
    }

    /// The PostgreSQL transaction ends at `end_lsn`. Returns `true` if the ack tracker may see
    /// the commit now (no records: nothing to commit, or passed over), `false` if it waits for
    /// the sink's commit ([`ExactlyOnce::committed`]).
    ///
    /// Returns an error if a passed-over transaction ends after the checkpoint.
    pub fn on_commit(&mut self, end_lsn: Lsn) -> Result<bool, SourceError> {
        if std::mem::take(&mut self.skipping) {
            if let Some(checkpoint) = self.checkpoint.filter(|c| end_lsn > c.0) {
                return Err(SourceError::Protocol(format!(
                    "transaction ending at {end_lsn} was passed over as committed to Kafka, but the checkpoint is {}",
                    checkpoint.0
                )));
            }
            return Ok(true);
        }
        if self.open {
            self.commit_at = Some(end_lsn);
            return Ok(false);
        }
        Ok(true)
    }

    /// Whether a commit is pending (started or waiting for the last acknowledgements).
    pub fn commit_pending(&self) -> bool {
        self.commit_at.is_some()
    }

    /// Starts the pending commit once `all_acknowledged` (nothing in flight).
    pub fn start_commit(&mut self, all_acknowledged: bool) {
        if let (Some(end_lsn), None, true) = (self.commit_at, &self.committing, all_acknowledged) {
            self.committing = Some(self.transactions.commit(Checkpoint(end_lsn)));
        }
    }

    /// Waits for the commit in progress; never completes if there is none. Returns the end
    /// LSN of the PostgreSQL transaction now committed, for the ack tracker.
    ///
    /// Cancel-safe (the commit goes on and is polled again). Returns an error if the commit
    /// failed: the session ends, and the next one aborts what is open.
    pub async fn committed(&mut self) -> Result<Lsn, TransactionError> {
        let result = match self.committing.as_mut() {
            Some(commit) => commit.await,
            None => std::future::pending().await,
        };
        self.committing = None;
        result?;
        self.open = false;
        self.sent.clear();
        Ok(self.commit_at.take().expect("a commit was pending"))
    }

    /// At the end of a session, by `deadline` (what is left of a shutdown's drain): lets a
    /// commit in progress finish (two transaction calls at once are refused), then aborts a
    /// transaction still open, unless this producer was `fenced`. Returns the end LSN of a
    /// transaction the finished commit committed.
    ///
    /// A commit still running at the deadline is abandoned: its outcome is unknown here, so
    /// its transaction stays unconfirmed, and the next session's producer (registering the
    /// transactional id fences this one) settles it and reads the checkpoint back. An abort
    /// that fails or runs out of time is left to the next session's producer likewise.
    pub async fn end(
        &mut self,
        fenced: bool,
        metrics: &PipelineMetrics,
        deadline: tokio::time::Instant,
    ) -> Option<Lsn> {
        let mut committed = None;
        if let Some(commit) = self.committing.take() {
            let end_lsn = self.commit_at.take();
            match tokio::time::timeout_at(deadline, commit).await {
                Ok(Ok(())) => {
                    self.open = false;
                    metrics.kafka_transaction("committed");
                    committed = end_lsn;
                }
                Ok(Err(_)) => {}
                Err(_) => {
                    warn!(pipeline = %metrics.name(), "the kafka commit did not finish by the shutdown deadline; its transaction stays unconfirmed and the next session settles it");
                    return None;
                }
            }
        }
        if !self.open || fenced {
            return committed;
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
        committed
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
    let transactions = sink.transactions(topic, &config.name, origin.clone());
    transactions.init().await?;
    let stored = read_checkpoint(&config.kafka, topic, &config.name).await?;
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
    if let Some(StoredCheckpoint { lsn, origin: None }) = &stored {
        warn!(pipeline = %config.name, checkpoint_topic = %topic, checkpoint_lsn = %lsn, "the checkpoint is in the old format (a bare LSN, without system identifier, timeline and slot) and is taken as it is; the next commit rewrites it with its origin. If this pipeline was pointed at another database since it was written, stop it and delete the checkpoint first");
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
    Ok(ExactlyOnce::new(transactions, checkpoint).with_redo(redo))
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
