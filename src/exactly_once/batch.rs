//! Batches: consecutive PostgreSQL transactions committed in one Kafka transaction, whose
//! checkpoint is the last one's end LSN.
//!
//! A batch holds whole PostgreSQL transactions: it closes only between two of them, so a
//! redo from the checkpoint never meets half of a transaction committed. While a batch's
//! Kafka commit is pending, the next batch fills (its records wait in the session, since a
//! producer has one transaction at a time); it may close only after the commit returned.
//! Each batch remembers the flush LSN from before its first transaction ([`Batch::hold`]):
//! the session confirms no further until the batch committed.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::PipelineConfig;
use crate::lsn::Lsn;

/// When a batch closes: after `max_transactions` PostgreSQL transactions, after the one that
/// took its records past `max_bytes`, or `linger` after its first transaction committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    pub max_transactions: usize,
    pub max_bytes: usize,
    pub linger: Duration,
}

impl BatchLimits {
    /// One PostgreSQL transaction per Kafka transaction.
    pub const SINGLE: BatchLimits = BatchLimits {
        max_transactions: 1,
        max_bytes: usize::MAX,
        linger: Duration::ZERO,
    };

    /// The limits `config` sets (`exactly_once_max_batch_transactions`,
    /// `exactly_once_max_batch_bytes`, `exactly_once_batch_linger_ms`).
    pub fn of(config: &PipelineConfig) -> Self {
        BatchLimits {
            max_transactions: config.exactly_once_max_batch_transactions.max(1),
            max_bytes: config.exactly_once_max_batch_bytes.max(1),
            linger: Duration::from_millis(config.exactly_once_batch_linger_ms),
        }
    }
}

/// PostgreSQL transactions with records in one Kafka transaction (or waiting for it).
#[derive(Clone, Copy, Debug)]
pub struct Batch {
    /// The flush LSN before its first transaction: the most the session may confirm until
    /// the batch committed.
    pub hold: Lsn,
    /// Its committed PostgreSQL transactions.
    pub transactions: usize,
    /// Bytes of its records.
    pub bytes: usize,
    /// End LSNs of its first and last committed transactions (the checkpoint is the last's).
    pub first_end: Option<Lsn>,
    pub last_end: Option<Lsn>,
    /// When its first transaction committed, on tokio's clock.
    pub first_commit_at: Option<Instant>,
    /// The source reported itself idle after its last transaction: close it now.
    pub idle: bool,
}

impl Batch {
    /// An empty batch that holds the flush LSN at `hold`.
    pub fn new(hold: Lsn) -> Self {
        Batch {
            hold,
            transactions: 0,
            bytes: 0,
            first_end: None,
            last_end: None,
            first_commit_at: None,
            idle: false,
        }
    }

    /// A PostgreSQL transaction with records in this batch committed at `end_lsn`.
    pub fn committed(&mut self, end_lsn: Lsn) {
        self.transactions += 1;
        self.first_end.get_or_insert(end_lsn);
        self.last_end = Some(end_lsn);
        self.first_commit_at.get_or_insert_with(Instant::now);
        self.idle = false;
    }

    /// Whether no further transaction may join: the count or byte limit is reached.
    pub fn full(&self, limits: &BatchLimits) -> bool {
        self.transactions >= limits.max_transactions || self.bytes >= limits.max_bytes
    }

    /// When its linger ends, once a transaction committed.
    pub fn linger_until(&self, limits: &BatchLimits) -> Option<Instant> {
        self.first_commit_at.map(|at| at + limits.linger)
    }

    /// Whether the batch is to close now (between transactions): `draining`, full, idle or
    /// lingered long enough. Never before a transaction committed in it.
    pub fn due(&self, limits: &BatchLimits, draining: bool) -> bool {
        self.transactions > 0
            && (draining
                || self.idle
                || self.full(limits)
                || self
                    .linger_until(limits)
                    .is_some_and(|at| at <= Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_batch_closes_on_count_bytes_linger_idle_or_drain_and_never_empty() {
        let limits = BatchLimits {
            max_transactions: 3,
            max_bytes: 100,
            linger: Duration::from_millis(5),
        };
        let mut batch = Batch::new(Lsn(0x10));
        batch.bytes = 20;
        assert!(!batch.due(&limits, true), "no transaction committed yet");
        batch.committed(Lsn(0x20));
        batch.committed(Lsn(0x30));
        assert_eq!(
            (batch.first_end, batch.last_end),
            (Some(Lsn(0x20)), Some(Lsn(0x30)))
        );
        assert!(!batch.due(&limits, false));
        assert!(batch.due(&limits, true), "draining");
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(batch.due(&limits, false), "lingered");

        let mut batch = Batch::new(Lsn(0x10));
        batch.committed(Lsn(0x20));
        batch.idle = true;
        assert!(batch.due(&limits, false), "idle");
        batch.committed(Lsn(0x30));
        assert!(
            !batch.due(&limits, false),
            "a transaction after the idle report"
        );
        batch.committed(Lsn(0x40));
        assert!(batch.full(&limits) && batch.due(&limits, false), "count");

        let mut batch = Batch::new(Lsn(0x10));
        batch.bytes = 100;
        assert!(batch.full(&limits) && !batch.due(&limits, false));
        batch.committed(Lsn(0x20));
        assert!(batch.due(&limits, false), "bytes");
    }
}
