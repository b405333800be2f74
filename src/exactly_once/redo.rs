//! Dead-lettering in exactly-once mode: a record Kafka refuses for good makes librdkafka's
//! transactional producer abortable, so its dead-letter copy cannot go in the same
//! transaction. The session aborts instead and ends with [`crate::error::Error::Redo`]; the
//! next session streams the PostgreSQL transaction again from the slot and sends that event,
//! known by its LSN and id, straight to the dead-letter topic within the redone transaction.
//! [`Redo`] is what the pipeline keeps between the two sessions.

use bytes::Bytes;

use crate::lsn::Lsn;
use crate::sink::DeliveryError;

/// Most refused events kept for redone transactions: each costs a redo (a new session), and a
/// transaction with more refusals than this stops the pipeline instead (the error names the
/// event), as without dead-lettering.
pub const MAX_REDO_EVENTS: usize = 64;

/// An event of an unconfirmed transaction whose record Kafka refused for good.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedEvent {
    /// The commit LSN (pgoutput's Begin `final_lsn`) of its transaction: once the confirmed
    /// flush LSN is past it, the transaction is done and the entry is dropped.
    pub commit_lsn: Lsn,
    /// The event's own LSN (its insert or logical message).
    pub lsn: Lsn,
    /// The event's id (the outbox row's `id`).
    pub id: Bytes,
    /// The topic Kafka refused it in, and why: for the dead-letter copy's headers.
    pub topic: String,
    pub reason: String,
    /// The record was over a size limit: the copy goes without the value.
    pub too_large: bool,
}

impl RefusedEvent {
    /// The delivery error the dead-letter copy is made from, as Kafka reported it.
    pub fn delivery_error(&self) -> DeliveryError {
        DeliveryError {
            event_id: String::from_utf8_lossy(&self.id).into_owned(),
            topic: self.topic.clone(),
            reason: self.reason.clone(),
            retryable: false,
            too_large: self.too_large,
            connection_lost: false,
            attempted: true,
            record: None,
        }
    }
}

/// The refused events that the next sessions send straight to the dead-letter topic: at most
/// [`MAX_REDO_EVENTS`], each until the slot is confirmed past its transaction.
#[derive(Clone, Debug, Default)]
pub struct Redo {
    events: Vec<RefusedEvent>,
}

impl Redo {
    /// Adds `event`. Returns `false` (adding nothing) when [`MAX_REDO_EVENTS`] are kept.
    pub fn add(&mut self, event: RefusedEvent) -> bool {
        if self.is_full() {
            return false;
        }
        if !self.events.contains(&event) {
            self.events.push(event);
        }
        true
    }

    /// Adds `event` found by a session that ended to redo its transaction, and says whether it
    /// is new: a redo that found a new refused event made progress (the next session
    /// dead-letters it), one that found a known event again did not.
    pub fn learn(&mut self, event: RefusedEvent) -> bool {
        !self.events.contains(&event) && self.add(event)
    }

    /// Whether no more events can be added.
    pub fn is_full(&self) -> bool {
        self.events.len() >= MAX_REDO_EVENTS
    }

    /// Drops the events of transactions the slot is confirmed past (`confirmed_flush_lsn`,
    /// where a new session starts).
    pub fn forget_confirmed(&mut self, confirmed_flush_lsn: Lsn) {
        self.events.retain(|e| e.commit_lsn >= confirmed_flush_lsn);
    }

    /// The refused event at `lsn` with `id`, if the redo sends it to the dead-letter topic.
    pub fn find(&self, lsn: Lsn, id: &[u8]) -> Option<&RefusedEvent> {
        self.events.iter().find(|e| e.lsn == lsn && e.id == id)
    }

    /// How many events are kept.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(commit_lsn: u64, lsn: u64, id: &'static str) -> RefusedEvent {
        RefusedEvent {
            commit_lsn: Lsn(commit_lsn),
            lsn: Lsn(lsn),
            id: Bytes::from_static(id.as_bytes()),
            topic: "Order.events".into(),
            reason: "Broker: Message size too large".into(),
            too_large: true,
        }
    }

    /// A redo that found a new refused event made progress (the supervisor's backoff does not
    /// grow: it grew 1, 2, 4 ... 30 s between redos); one that found a known event again did
    /// not (else the same event would be redone every second for good).
    #[test]
    fn a_refused_event_found_anew_is_progress_and_found_again_is_not() {
        let mut redo = Redo::default();
        assert!(redo.learn(refused(0x200, 0x110, "a")));
        assert!(redo.learn(refused(0x300, 0x210, "b")));
        assert!(!redo.learn(refused(0x200, 0x110, "a")), "found again");
        assert_eq!(redo.len(), 2);
    }

    #[test]
    fn an_event_is_found_by_lsn_and_id_until_the_slot_passes_its_transaction() {
        let mut redo = Redo::default();
        assert!(redo.add(refused(0x200, 0x110, "a")));
        assert!(
            redo.add(refused(0x200, 0x110, "a")),
            "a second add is a no-op"
        );
        assert_eq!(redo.len(), 1);
        assert!(redo.find(Lsn(0x110), b"a").is_some());
        assert!(redo.find(Lsn(0x110), b"b").is_none(), "another id");
        assert!(redo.find(Lsn(0x118), b"a").is_none(), "another LSN");
        // Confirmed up to a transaction that ended inside this one's WAL: still open.
        redo.forget_confirmed(Lsn(0x150));
        assert_eq!(redo.len(), 1);
        redo.forget_confirmed(Lsn(0x238));
        assert!(redo.is_empty());
    }

    #[test]
    fn the_redo_keeps_at_most_its_bound() {
        let mut redo = Redo::default();
        for i in 0..MAX_REDO_EVENTS as u64 {
            assert!(redo.add(refused(0x1000, i, "x")));
        }
        assert!(redo.is_full());
        assert!(!redo.add(refused(0x1000, 0x999, "y")));
        assert_eq!(redo.len(), MAX_REDO_EVENTS);
        let copy = refused(1, 2, "id-1").delivery_error();
        assert_eq!(
            (copy.event_id.as_str(), copy.retryable, copy.too_large),
            ("id-1", false, true)
        );
    }
}
