//! A fake walsender over the schedule's WAL: replays every transaction whose commit record
//! starts at or after the slot's confirmed LSN (as PostgreSQL's decoding does), as pgoutput
//! messages, with a Relation message before the first change to a table in each session and
//! after the outbox's schema changed, keepalives while idle, and a connection that may be lost.
//! Status updates confirm the slot, after the invariant checks.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::{sleep_until, Instant};

use super::wal::{Change, Txn, RELATIONS};
use super::world::Shared;
use crate::lsn::Lsn;
use crate::source::replication::{ReplicationMessage, WalStream};
use crate::source::SourceError;

/// One session's replication stream.
pub(super) struct FakeWalsender {
    world: Shared,
    /// The next transaction to send.
    next: usize,
    /// Messages of the transaction being sent (and the transaction's number once its Commit
    /// is among them).
    pending: VecDeque<(ReplicationMessage, Option<usize>)>,
    /// The outbox schema this session described in a Relation message; the other table's.
    outbox_described: Option<u8>,
    other_described: bool,
    /// When the next message is due (kept across cancelled calls: `recv` is cancel-safe).
    due: Option<Instant>,
    /// The end of what was sent: a keepalive never reports less.
    sent_end: Lsn,
    lost_at: Option<Instant>,
}

impl FakeWalsender {
    /// A stream starting at the slot's confirmed LSN.
    pub fn new(world: Shared) -> Self {
        let w = world.lock();
        let next = w.wal.txns.iter().position(|t| t.final_lsn >= w.slot);
        let lost_at = w
            .faults
            .connection_lost_after
            .map(|after| w.session_start + after);
        let sent_end = w.slot;
        let next = next.unwrap_or(w.wal.txns.len());
        drop(w);
        FakeWalsender {
            world,
            next,
            pending: VecDeque::new(),
            outbox_described: None,
            other_described: false,
            due: None,
            sent_end,
            lost_at,
        }
    }

    fn lost(&self) -> Result<(), SourceError> {
        match self.lost_at {
            Some(at) if Instant::now() >= at => Err(SourceError::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "simulated connection loss",
            ))),
            _ => Ok(()),
        }
    }

    /// The pgoutput messages of `txn` (number `index`) in this session: a Relation message
    /// before the first change to each table in the session and after the outbox's schema
    /// changed, as the walsender sends them.
    fn expand(&mut self, txn: &Txn, index: usize, wal_end: Lsn) {
        let xlog = |lsn: Lsn, data: &Bytes| ReplicationMessage::XLogData {
            wal_start: lsn,
            wal_end,
            send_time_us: 0,
            data: data.clone(),
        };
        let encoded = &txn.encoded;
        if let Some(message) = &encoded.non_transactional_before {
            let lsn = Lsn(txn.final_lsn.0 - 0x4);
            self.pending.push_back((xlog(lsn, message), None));
        }
        self.pending
            .push_back((xlog(txn.final_lsn, &encoded.begin), None));
        for ((change, &lsn), data) in txn
            .changes
            .iter()
            .zip(&txn.change_lsns)
            .zip(&encoded.changes)
        {
            let relation = match change {
                Change::Insert(_) if self.outbox_described != Some(txn.schema) => {
                    self.outbox_described = Some(txn.schema);
                    Some(&RELATIONS.outbox[usize::from(txn.schema)])
                }
                Change::OtherTable if !self.other_described => {
                    self.other_described = true;
                    Some(&RELATIONS.other)
                }
                _ => None,
            };
            if let Some(relation) = relation {
                self.pending.push_back((xlog(lsn, relation), None));
            }
            self.pending.push_back((xlog(lsn, data), None));
        }
        self.pending
            .push_back((xlog(txn.final_lsn, &encoded.commit), Some(index)));
    }
}

impl WalStream for FakeWalsender {
    async fn recv(&mut self) -> Result<Option<ReplicationMessage>, SourceError> {
        loop {
            self.lost()?;
            let due = match self.due {
                Some(due) => due,
                None => {
                    let mut w = self.world.lock();
                    let now = Instant::now();
                    let next_commit = w.wal.txns.get(self.next).map(|t| w.origin + t.commit_at);
                    let due = if !self.pending.is_empty() || next_commit.is_some_and(|at| at <= now)
                    {
                        // Mostly at once; sometimes a little later, so that outcomes come
                        // between the messages of one transaction.
                        match w.rng.u8(0..4) {
                            0 => now + Duration::from_millis(w.rng.u64(0..20)),
                            _ => now,
                        }
                    } else {
                        // Idle: a keepalive now and then, or the next commit.
                        let keepalive = now + Duration::from_millis(w.rng.u64(1..1_000));
                        next_commit.map_or(keepalive, |at| at.min(keepalive))
                    };
                    drop(w);
                    self.due = Some(due);
                    due
                }
            };
            match self.lost_at {
                Some(lost) if lost < due => sleep_until(lost).await,
                _ => sleep_until(due).await,
            }
            self.lost()?;
            self.due = None;
            if let Some((message, commit)) = self.pending.pop_front() {
                if let ReplicationMessage::XLogData { wal_start, .. } = &message {
                    self.sent_end = self.sent_end.max(*wal_start);
                }
                if let Some(txn) = commit {
                    let mut w = self.world.lock();
                    self.sent_end = self.sent_end.max(w.wal.txns[txn].end_lsn);
                    w.on_commit_read(txn);
                }
                return Ok(Some(message));
            }
            let w = self.world.lock();
            let ready = w
                .wal
                .txns
                .get(self.next)
                .filter(|t| w.origin + t.commit_at <= Instant::now())
                .cloned();
            let wal_end = w.wal.end;
            let upcoming = w.wal.txns.get(self.next).map(|t| t.final_lsn);
            drop(w);
            match ready {
                Some(txn) => {
                    self.expand(&txn, self.next, wal_end);
                    self.next += 1;
                }
                None => {
                    // Everything before the next transaction's commit record was sent (it
                    // is decoded again from there after a restart).
                    let mut w = self.world.lock();
                    let upto = upcoming.unwrap_or(wal_end).max(self.sent_end);
                    let wal_end = Lsn(w.rng.u64(self.sent_end.0..=upto.0));
                    let reply_requested = w.rng.u8(0..4) == 0;
                    return Ok(Some(ReplicationMessage::PrimaryKeepalive {
                        wal_end,
                        send_time_us: 0,
                        reply_requested,
                    }));
                }
            }
        }
    }

    async fn send_status(&mut self, _write: Lsn, flush: Lsn) -> Result<(), SourceError> {
        self.lost()?;
        self.world.lock().on_confirm(flush);
        Ok(())
    }

    async fn stop(self, _timeout: Duration) -> Result<(), SourceError> {
        self.lost()
    }
}
