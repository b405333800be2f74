//! Ack tracking: turns Kafka delivery outcomes into the flush LSN confirmed to PostgreSQL.
//!
//! The invariant this module exists for (I4, LSN safety, in docs/concepts/guarantees.md: no LSN past an unacknowledged event): the flush LSN sent to PostgreSQL never
//! passes the commit of a transaction that still has an event Kafka has not acknowledged.
//! Confirming a transaction's end LSN tells the walsender never to send it again, so confirming
//! early turns a later broker failure or crash into silent loss.
//!
//! [`AckTracker`] is a plain data structure with no IO. The pipeline feeds it the transaction
//! boundaries it decodes ([`AckTracker::begin`], [`AckTracker::commit`]), one
//! [`AckTracker::track_event`] per record handed to the sink, one [`AckTracker::ack`] per
//! delivery report, and idle keepalives; [`AckTracker::flush_lsn`] is then the end LSN of the
//! newest transaction whose events, and every earlier transaction's events, are acknowledged.
//!
//! Memory is one small entry per transaction that has events and is not yet confirmed: those
//! with unacknowledged events and the acknowledged ones queued behind them. A transaction
//! without outbox events folds into the one before it. [`AckTracker::unconfirmed_commits`]
//! is what the session loop bounds (docs/concepts/guarantees.md, "Bounded memory"): a record that is never
//! acknowledged must not let the queue behind it grow with the WAL read.
//!
//! The exactly-once checkpoint, a second position, lives in [`crate::exactly_once`].

use std::collections::VecDeque;

use crate::lsn::Lsn;

/// Identifies an event and the transaction it belongs to; returned by
/// [`AckTracker::track_event`], carried through the sink with the record, and handed back to
/// [`AckTracker::ack`] once the broker acknowledged the event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventToken {
    /// The tracker's transaction id.
    txn: u64,
    /// The event's number, given by [`EventToken::with_event`] (the session loop: its
    /// ordinal among the events of the session's source).
    event: u64,
}

impl EventToken {
    /// This token for event number `event`.
    pub fn with_event(self, event: u64) -> Self {
        EventToken { event, ..self }
    }

    /// The number given to [`EventToken::with_event`] (0 without).
    pub fn event(self) -> u64 {
        self.event
    }
}

/// The calls arrived in an order the replication protocol cannot produce.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TrackerError {
    #[error("begin while transaction is already open")]
    NestedBegin,
    #[error("{0} outside a transaction")]
    NoOpenTransaction(&'static str),
    #[error("commit end LSN {end_lsn} is before the previous commit's {previous}")]
    CommitBackwards { end_lsn: Lsn, previous: Lsn },
    #[error("acknowledgement for an event that is not in flight")]
    UnknownToken,
}

#[derive(Debug)]
struct PendingTxn {
    id: u64,
    /// `None` while the transaction is open.
    end_lsn: Option<Lsn>,
    unacked: u64,
}

/// Tracks transactions in commit order and yields the flush LSN that is safe to confirm.
#[derive(Debug)]
pub struct AckTracker {
    /// Transactions with events not yet all acknowledged, in commit order; ids are consecutive.
    pending: VecDeque<PendingTxn>,
    next_id: u64,
    /// `Some(tracked)` between Begin and Commit; `tracked` once the transaction has an event.
    open: Option<bool>,
    last_commit: Lsn,
    confirmed: Lsn,
}

impl AckTracker {
    /// Starts at `confirmed`, the slot's `confirmed_flush_lsn`: the flush LSN never goes below it
    /// (PostgreSQL 15 would move the slot backwards if told an older LSN).
    pub fn new(confirmed: Lsn) -> Self {
        AckTracker {
            pending: VecDeque::new(),
            next_id: 0,
            open: None,
            last_commit: confirmed,
            confirmed,
        }
    }

    /// Records a Begin message. Returns an error if a transaction is already open.
    pub fn begin(&mut self) -> Result<(), TrackerError> {
        if self.open.is_some() {
            return Err(TrackerError::NestedBegin);
        }
        self.open = Some(false);
        Ok(())
    }

    /// Records one event of the open transaction handed to the sink.
    ///
    /// Returns an error if no transaction is open.
    pub fn track_event(&mut self) -> Result<EventToken, TrackerError> {
        match self.open {
            None => return Err(TrackerError::NoOpenTransaction("event")),
            Some(false) => {
                self.pending.push_back(PendingTxn {
                    id: self.next_id,
                    end_lsn: None,
                    unacked: 0,
                });
                self.next_id += 1;
                self.open = Some(true);
            }
            Some(true) => {}
        }
        let txn = self
            .pending
            .back_mut()
            .expect("tracked open transaction is pending");
        txn.unacked += 1;
        Ok(EventToken {
            txn: txn.id,
            event: 0,
        })
    }

    /// Records the Commit of the open transaction, whose end LSN is `end_lsn`.
    ///
    /// Returns an error if no transaction is open or `end_lsn` is before the previous commit's.
    pub fn commit(&mut self, end_lsn: Lsn) -> Result<(), TrackerError> {
        let tracked = self
            .open
            .take()
            .ok_or(TrackerError::NoOpenTransaction("commit"))?;
        if end_lsn < self.last_commit {
            return Err(TrackerError::CommitBackwards {
                end_lsn,
                previous: self.last_commit,
            });
        }
        self.last_commit = end_lsn;
        match (tracked, self.pending.back_mut()) {
            (true, Some(txn)) => txn.end_lsn = Some(end_lsn),
            // Nothing to deliver: done as soon as the transaction before it is.
            (false, Some(previous)) => previous.end_lsn = Some(end_lsn),
            (false, None) => self.confirmed = self.confirmed.max(end_lsn),
            (true, None) => unreachable!("tracked transaction missing from pending"),
        }
        self.advance();
        Ok(())
    }

    /// Records that the broker acknowledged the event `token` was issued for.
    ///
    /// Returns an error if that event is not in flight (acknowledged twice, or unknown).
    pub fn ack(&mut self, token: EventToken) -> Result<(), TrackerError> {
        let front = self.pending.front().ok_or(TrackerError::UnknownToken)?.id;
        let index = token
            .txn
            .checked_sub(front)
            .ok_or(TrackerError::UnknownToken)?;
        let txn = usize::try_from(index)
            .ok()
            .and_then(|i| self.pending.get_mut(i))
            .ok_or(TrackerError::UnknownToken)?;
        txn.unacked = txn
            .unacked
            .checked_sub(1)
            .ok_or(TrackerError::UnknownToken)?;
        self.advance();
        Ok(())
    }

    /// Records a primary keepalive's `wal_end`: when no transaction is open and no event is in
    /// flight, everything the walsender sent before `wal_end` is done, so the flush LSN may move
    /// there. This keeps a slot on a busy server from holding WAL while the outbox is quiet.
    pub fn idle(&mut self, wal_end: Lsn) {
        if self.open.is_none() && self.pending.is_empty() {
            self.confirmed = self.confirmed.max(wal_end);
            self.last_commit = self.last_commit.max(wal_end);
        }
    }

    /// The LSN safe to send as flush (and apply) position; never decreases.
    pub fn flush_lsn(&self) -> Lsn {
        self.confirmed
    }

    /// Whether a transaction is between Begin and Commit.
    pub fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// Committed transactions with events that are not yet confirmed (unacknowledged
    /// events of their own, or of an earlier transaction): the entries this tracker holds
    /// besides the open transaction's. Bound it to bound the tracker's memory.
    pub fn unconfirmed_commits(&self) -> usize {
        self.pending.len() - usize::from(self.open == Some(true))
    }

    /// Whether any event is waiting for its acknowledgement.
    pub fn has_unacked(&self) -> bool {
        !self.pending.is_empty()
    }

    fn advance(&mut self) {
        while let Some(txn) = self.pending.front() {
            match txn.end_lsn {
                Some(end_lsn) if txn.unacked == 0 => {
                    self.confirmed = self.confirmed.max(end_lsn);
                    self.pending.pop_front();
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn unconfirmed_commits_count_the_queue_behind_an_unacknowledged_event_not_the_open_one() {
        let mut t = AckTracker::new(Lsn(10));
        t.begin().unwrap();
        let stuck = t.track_event().unwrap();
        assert_eq!(
            t.unconfirmed_commits(),
            0,
            "the open transaction is not counted"
        );
        t.commit(Lsn(20)).unwrap();
        for end in [30, 40, 50] {
            t.begin().unwrap();
            let token = t.track_event().unwrap();
            t.ack(token).unwrap();
            t.commit(Lsn(end)).unwrap();
        }
        assert_eq!(t.unconfirmed_commits(), 4);
        t.begin().unwrap();
        t.track_event().unwrap();
        assert_eq!(t.unconfirmed_commits(), 4);
        t.ack(stuck).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(50));
        assert_eq!(t.unconfirmed_commits(), 0);
    }

    #[test]
    fn waits_for_every_event_of_earlier_transactions() {
        let mut t = AckTracker::new(Lsn(100));
        t.begin().unwrap();
        let a1 = t.track_event().unwrap();
        let a2 = t.track_event().unwrap();
        t.commit(Lsn(200)).unwrap();
        t.begin().unwrap();
        let b1 = t.track_event().unwrap();
        t.commit(Lsn(300)).unwrap();

        t.ack(b1).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(100), "later transaction acked first");
        t.ack(a1).unwrap();
        assert_eq!(
            t.flush_lsn(),
            Lsn(100),
            "one event of the first still unacked"
        );
        t.ack(a2).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(300));
        assert!(!t.has_unacked());
    }

    #[test]
    fn open_transaction_holds_the_lsn_even_when_its_events_are_acked() {
        let mut t = AckTracker::new(Lsn(10));
        t.begin().unwrap();
        let e = t.track_event().unwrap();
        t.ack(e).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(10));
        t.idle(Lsn(500));
        assert_eq!(
            t.flush_lsn(),
            Lsn(10),
            "idle keepalive inside a transaction"
        );
        t.commit(Lsn(20)).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(20));
    }

    #[test]
    fn empty_transactions_fold_into_the_previous_one() {
        let mut t = AckTracker::new(Lsn(0));
        t.begin().unwrap();
        let e = t.track_event().unwrap();
        t.commit(Lsn(10)).unwrap();
        for end in 11..1000 {
            t.begin().unwrap();
            t.commit(Lsn(end)).unwrap();
        }
        assert_eq!(t.pending.len(), 1, "empty transactions must not queue");
        assert_eq!(t.flush_lsn(), Lsn(0));
        t.ack(e).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(999));
    }

    #[test]
    fn idle_keepalive_moves_only_when_nothing_is_in_flight() {
        let mut t = AckTracker::new(Lsn(5));
        t.idle(Lsn(50));
        assert_eq!(t.flush_lsn(), Lsn(50));
        t.idle(Lsn(40));
        assert_eq!(t.flush_lsn(), Lsn(50), "never backwards");
        t.begin().unwrap();
        let e = t.track_event().unwrap();
        t.commit(Lsn(60)).unwrap();
        t.idle(Lsn(70));
        assert_eq!(t.flush_lsn(), Lsn(50), "unacked event");
        t.ack(e).unwrap();
        t.idle(Lsn(70));
        assert_eq!(t.flush_lsn(), Lsn(70));
    }

    #[test]
    fn rejects_impossible_sequences() {
        let mut t = AckTracker::new(Lsn(0));
        assert_eq!(
            t.track_event(),
            Err(TrackerError::NoOpenTransaction("event"))
        );
        assert_eq!(
            t.commit(Lsn(1)),
            Err(TrackerError::NoOpenTransaction("commit"))
        );
        t.begin().unwrap();
        assert_eq!(t.begin(), Err(TrackerError::NestedBegin));
        let e = t.track_event().unwrap();
        t.commit(Lsn(9)).unwrap();
        t.ack(e).unwrap();
        assert_eq!(t.ack(e), Err(TrackerError::UnknownToken));
        t.begin().unwrap();
        assert!(matches!(
            t.commit(Lsn(8)),
            Err(TrackerError::CommitBackwards { .. })
        ));
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Begin, `events` events, Commit `gap` bytes after the previous commit.
        Txn { events: u8, gap: u16 },
        /// Acknowledge the in-flight event at this index (modulo the count).
        Ack(usize),
        /// An idle keepalive `gap` bytes past the last commit.
        Idle(u16),
        /// Begin and some events of a transaction left open until the next Txn.
        Partial(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..4, 1u16..100).prop_map(|(events, gap)| Op::Txn { events, gap }),
            any::<usize>().prop_map(Op::Ack),
            any::<usize>().prop_map(Op::Ack),
            (0u16..100).prop_map(Op::Idle),
            (0u8..3).prop_map(Op::Partial),
        ]
    }

    proptest! {
        /// For any interleaving: the flush LSN never goes backwards, never reaches the begin of a
        /// transaction with an unacknowledged event, and reaches the last commit once all
        /// events are acknowledged.
        #[test]
        fn flush_lsn_is_safe_and_live(ops in proptest::collection::vec(op(), 1..200)) {
            let start = Lsn(1000);
            let mut t = AckTracker::new(start);
            let mut last = start;
            // (token, begin LSN of its transaction; an event's data lies after it)
            let mut in_flight: Vec<(EventToken, Lsn)> = Vec::new();
            let mut open: Option<(Lsn, Vec<EventToken>)> = None;
            let mut previous = t.flush_lsn();

            for op in ops {
                match op {
                    Op::Txn { events, gap } => {
                        let begin = match open.take() {
                            Some((begin, tokens)) => {
                                for tok in tokens { in_flight.push((tok, begin)); }
                                begin
                            }
                            None => { t.begin().unwrap(); Lsn(last.0 + 1) }
                        };
                        for _ in 0..events {
                            in_flight.push((t.track_event().unwrap(), begin));
                        }
                        last = Lsn(last.0 + 1 + u64::from(gap));
                        t.commit(last).unwrap();
                    }
                    Op::Partial(events) => {
                        if open.is_none() {
                            t.begin().unwrap();
                            open = Some((Lsn(last.0 + 1), Vec::new()));
                        }
                        let (_, tokens) = open.as_mut().unwrap();
                        for _ in 0..events { tokens.push(t.track_event().unwrap()); }
                    }
                    Op::Ack(i) => {
                        if !in_flight.is_empty() {
                            let (tok, _) = in_flight.swap_remove(i % in_flight.len());
                            t.ack(tok).unwrap();
                        }
                    }
                    Op::Idle(gap) => {
                        let wal_end = Lsn(last.0 + u64::from(gap));
                        t.idle(wal_end);
                        if open.is_none() && in_flight.is_empty() {
                            prop_assert_eq!(t.flush_lsn(), wal_end.max(previous));
                            last = last.max(wal_end);
                        }
                    }
                }
                let flush = t.flush_lsn();
                prop_assert!(flush >= previous, "flush went backwards: {} -> {}", previous, flush);
                previous = flush;
                let oldest_unacked = in_flight.iter().map(|(_, b)| *b)
                    .chain(open.iter().map(|(b, _)| *b))
                    .min();
                if let Some(begin) = oldest_unacked {
                    prop_assert!(flush < begin, "flush {} passed unacked transaction at {}", flush, begin);
                }
            }
            // Close any open transaction and acknowledge everything.
            if let Some((_, tokens)) = open.take() {
                in_flight.extend(tokens.into_iter().map(|t| (t, Lsn(0))));
                last = Lsn(last.0 + 1);
                t.commit(last).unwrap();
            }
            for (tok, _) in in_flight.drain(..) { t.ack(tok).unwrap(); }
            prop_assert_eq!(t.flush_lsn(), last);
            prop_assert!(!t.has_unacked());
        }
    }
}
