//! Exactly-once mode: a transactional capability of the sink, the checkpoint committed with
//! each transaction, and the session's bookkeeping of both.
//!
//! Each PostgreSQL transaction with events gets one sink transaction: its records, then a
//! checkpoint record (the commit's end LSN), then the commit, and only then does the ack
//! tracker see the PostgreSQL commit, so the slot never passes a transaction whose sink
//! transaction is not committed. No source item is read while a commit is pending. A new
//! session fences the previous producer ([`Transactions::init`]), reads the checkpoint back
//! ([`read_checkpoint`]) and passes over the transactions at or below it: those committed
//! before a crash that came before the slot's confirmation.
//!
//! - [`TransactionalSink`] and [`Transactions`]: the capability (begin, commit with a
//!   checkpoint, abort); [`kafka`] implements it for [`crate::sink::kafka::KafkaSink`].
//! - [`ExactlyOnce`]: what the session loop keeps between those calls.

pub mod kafka;

use std::time::Duration;

use futures::future::BoxFuture;
use tracing::{info, warn};

pub use kafka::{read_checkpoint, KafkaTransactions, TransactionError};

use crate::error::chain;
use crate::lsn::Lsn;
use crate::metrics::PipelineMetrics;
use crate::sink::Sink;
use crate::source::SourceError;

/// How long to wait for an abort of the open transaction when a session ends; if it does not
/// finish, the next session's producer aborts it (and the coordinator, after
/// `transaction.timeout.ms`, if no session follows).
const ABORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The exactly-once checkpoint: the commit end LSN of the newest PostgreSQL transaction whose
/// Kafka transaction committed. Stored as the value of a record keyed by the pipeline name, as
/// PostgreSQL prints an LSN (`0/16B3748`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint(pub Lsn);

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
    #[error("checkpoint topic {topic:?} partition {partition} offset {offset}: {reason}")]
    Value {
        topic: String,
        partition: i32,
        offset: i64,
        reason: String,
    },
}

impl Checkpoint {
    /// The record value: the LSN as PostgreSQL prints it (`0/16B3748`).
    pub fn encode(&self) -> String {
        self.0.to_string()
    }

    /// Parses a record value written by [`Checkpoint::encode`].
    ///
    /// Returns an error naming the value if it is not an LSN.
    pub fn decode(value: &[u8]) -> Result<Checkpoint, String> {
        let text = std::str::from_utf8(value)
            .map_err(|_| format!("checkpoint value is not UTF-8: {value:?}"))?;
        text.parse()
            .map(Checkpoint)
            .map_err(|e| format!("checkpoint value: {e}"))
    }

    /// Whether the transaction whose commit record starts at `final_lsn` (pgoutput's Begin) is
    /// at or below the checkpoint, i.e. already committed to Kafka. The transaction that ends
    /// at the checkpoint has its commit record before it; any later one starts at or after it.
    pub fn covers(&self, final_lsn: Lsn) -> bool {
        final_lsn < self.0
    }
}

/// A sink whose records can be grouped in transactions: the exactly-once capability.
pub trait TransactionalSink: Sink {
    /// The transaction calls of this sink, committing checkpoint records keyed `pipeline` in
    /// `checkpoint_topic`.
    fn transactions(&self, checkpoint_topic: &str, pipeline: &str) -> Box<dyn Transactions>;
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
        }
    }

    /// A PostgreSQL transaction whose commit record starts at `final_lsn` begins.
    pub fn on_begin(&mut self, final_lsn: Lsn) {
        self.skipping = self.checkpoint.is_some_and(|c| c.covers(final_lsn));
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
        Ok(self.commit_at.take().expect("a commit was pending"))
    }

    /// At the end of a session: lets a commit in progress finish (two transaction calls at
    /// once are refused), then aborts a transaction still open, unless this producer was
    /// `fenced`. Returns the end LSN of a transaction the finished commit committed. An abort
    /// that fails is left to the next session's producer.
    pub async fn end(&mut self, fenced: bool, metrics: &PipelineMetrics) -> Option<Lsn> {
        let mut committed = None;
        if let Some(commit) = self.committing.take() {
            let end_lsn = self.commit_at.take();
            if commit.await.is_ok() {
                self.open = false;
                metrics.kafka_transaction("committed");
                committed = end_lsn;
            }
        }
        if !self.open || fenced {
            return committed;
        }
        self.open = false;
        match self.transactions.abort(ABORT_TIMEOUT).await {
            Ok(()) => {
                metrics.kafka_transaction("aborted");
                info!(pipeline = %metrics.name(), "open kafka transaction aborted");
            }
            Err(e) => {
                warn!(pipeline = %metrics.name(), error = %chain(&e), "could not abort the open kafka transaction; the next session aborts it")
            }
        }
        committed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_values_round_trip_and_bad_ones_are_named() {
        let c = Checkpoint(Lsn(0x16B_3748));
        assert_eq!(c.encode(), "0/16B3748");
        assert_eq!(Checkpoint::decode(b"0/16B3748"), Ok(c));
        assert_eq!(
            Checkpoint::decode(b"1A/0").unwrap(),
            Checkpoint(Lsn(0x1A << 32))
        );
        for bad in [
            &b""[..],
            b"16B3748",
            b"0/16B3748 ",
            b"\xff/0",
            b"0/zz",
            &[0xff, b'/', b'0'],
        ] {
            let e = Checkpoint::decode(bad).unwrap_err();
            assert!(e.starts_with("checkpoint value"), "{e}");
        }
    }

    #[test]
    fn checkpoint_covers_the_transaction_ending_there_and_not_the_next() {
        // A transaction whose commit record spans 0/100..0/138, and the next at 0/138.
        let c = Checkpoint(Lsn(0x138));
        assert!(c.covers(Lsn(0x100)), "the checkpointed transaction itself");
        assert!(c.covers(Lsn(0x10)), "earlier transactions");
        assert!(!c.covers(Lsn(0x138)), "a commit record starting at the end");
        assert!(!c.covers(Lsn(0x200)), "later transactions");
    }
}
