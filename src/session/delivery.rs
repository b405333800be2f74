//! Records to the sink and their outcomes: sending (or waiting for room in the sink's queue),
//! refusals dead-lettered or ending the session, acknowledgements settled in the ack tracker,
//! and the warning for records without a key.

use std::time::Instant;

use tracing::{debug, warn};

use super::mutation::{active as mutated, Mutation};
use super::{
    observe_delivery, tracker_error, Session, NULL_KEY_WARNING_INTERVAL, QUEUE_FULL_RETRY,
};
use crate::ack::EventToken;
use crate::config::OnBadEvent;
use crate::error::Error;
use crate::exactly_once::HeldByMissingTopic;
use crate::router::Router;
use crate::sink::{Delivery, DeliveryError, Record, SendError, Sink};
use crate::source::outbox::OutboxEvent;
use crate::source::{FailureHandling, Source};

impl<So: Source, Si: Sink> Session<'_, So, Si> {
    /// Hands `record` to the sink, or queues it behind the records waiting for room.
    ///
    /// Returns an error if the sink refused it and it is not to be dead-lettered.
    pub(super) fn send(&mut self, record: Record, token: EventToken) -> Result<(), DeliveryError> {
        if !self.blocked.is_empty() {
            self.blocked.push_back((Box::new(record), token));
            return Ok(());
        }
        match self.sink.send(record, token) {
            Ok(()) => {
                self.took_record(token.event());
                Ok(())
            }
            Err(SendError::Full(_)) if mutated(Mutation::DropBlocked) => {
                let _ = self.tracker.ack(token);
                Ok(())
            }
            Err(SendError::Full(record)) => {
                debug!(pipeline = %self.config.name, "sink queue full; the record waits for room");
                self.blocked.push_back((record, token));
                Ok(())
            }
            Err(SendError::Refused(e)) => self.refused(e, token),
        }
    }

    /// Notes that the sink took the record of event number `event` (exactly-once: the open
    /// Kafka transaction has one on the broker).
    fn took_record(&mut self, event: u64) {
        if let Some(eos) = &mut self.eos {
            eos.took_record(event);
        }
    }

    /// Exactly-once: a record waits for a missing topic ([`Sink::waiting`]) while the open
    /// Kafka transaction holds records on the broker, which must not stay open until the
    /// broker's transaction timeout. When every waiting record belongs to the open PostgreSQL
    /// transaction and the sink took none of its records, that transaction moves to the next
    /// Kafka transaction ([`ExactlyOnce::defer_current`]): the ones before it commit, and its
    /// records wait where they hold nothing on the broker. Otherwise the session ends, and its
    /// end aborts the Kafka transaction ([`HeldByMissingTopic`]). A record that waits first in
    /// its Kafka transaction holds nothing on the broker: it waits in the session, as in
    /// at-least-once mode.
    ///
    /// Returns [`Error::HeldByMissingTopic`] when the session must end.
    pub(super) fn abort_if_held_by_a_missing_topic(&mut self) -> Result<(), Error> {
        let Some(eos) = &mut self.eos else {
            return Ok(());
        };
        if !eos.open_on_the_broker() || self.blocked.is_empty() {
            return Ok(());
        }
        let Some(why) = self.sink.waiting() else {
            return Ok(());
        };
        let all_current = self
            .blocked
            .iter()
            .all(|(_, token)| eos.of_current(token.event()));
        if all_current && eos.defer_current() {
            debug!(pipeline = %self.config.name, "a record waits for a missing topic: the transactions before its own commit without it; its records wait for the next kafka transaction");
            let mut deferred: std::collections::VecDeque<_> = self.blocked.drain(..).collect();
            self.waiting_bytes += deferred
                .iter()
                .map(|(record, _)| record.size())
                .sum::<usize>();
            deferred.append(&mut self.waiting);
            self.waiting = deferred;
            return Ok(());
        }
        Err(HeldByMissingTopic { why }.into())
    }

    /// A record the sink refused outright: the source's to record, or dead-lettered.
    ///
    /// Returns an error if neither.
    pub(super) fn refused(
        &mut self,
        error: DeliveryError,
        token: EventToken,
    ) -> Result<(), DeliveryError> {
        match self.source.on_outcome(token.event(), Err(&error)) {
            FailureHandling::Recorded => {
                self.metrics.delivery_failed(&error.topic, error.retryable);
                self.settle(token).map_err(|_| error)
            }
            FailureHandling::Session => self.dead_letter_refused(error, token),
        }
    }

    /// Counts an event the source recorded as failed as settled in the ack tracker.
    ///
    /// Returns an error if the token is not in flight.
    pub(super) fn settle(&mut self, token: EventToken) -> Result<(), Error> {
        self.tracker
            .ack(token)
            .map_err(|source| tracker_error(self.position, source))
    }

    /// Offers the records waiting for room to the sink again, in order.
    pub(super) fn send_blocked(&mut self) -> Result<(), Error> {
        if mutated(Mutation::ForgetBlocked) {
            return Ok(());
        }
        let newest_first = mutated(Mutation::Overtake);
        while let Some((record, token)) = match newest_first {
            true => self.blocked.pop_back(),
            false => self.blocked.pop_front(),
        } {
            match self.sink.send(*record, token) {
                Ok(()) => {
                    self.took_record(token.event());
                    self.blocked_wait = QUEUE_FULL_RETRY;
                }
                Err(SendError::Full(record)) if newest_first => {
                    self.blocked.push_back((record, token));
                    break;
                }
                Err(SendError::Full(record)) => {
                    self.blocked.push_front((record, token));
                    break;
                }
                Err(SendError::Refused(e)) => self.refused(e, token).map_err(Error::Rejected)?,
            }
        }
        Ok(())
    }

    /// A record the sink refused: with `on_bad_event = "dead_letter"` and an error retrying
    /// cannot fix, its copy goes to the dead-letter topic under the same token (so its
    /// transaction is confirmed once the copy is acknowledged). Records of the same key sent
    /// after the refused one may be published before the copy: dead-lettering trades that
    /// for flow.
    ///
    /// Returns `error` when it is not to be dead-lettered, or the copy's own refusal.
    pub(super) fn dead_letter_refused(
        &mut self,
        mut error: DeliveryError,
        token: EventToken,
    ) -> Result<(), DeliveryError> {
        if let Some(shrunk) = self.shrunk_copy(&error) {
            warn!(pipeline = %self.config.name, event_id = %error.event_id, dead_letter_topic = %error.topic, reason = %error.reason, "the sink refused the dead-letter copy as too large; sending it without the event's value and headers");
            return self.send(shrunk, token);
        }
        let Some(dead_letter_topic) = self.dead_letter_topic_for(&error) else {
            return Err(error);
        };
        let Some(record) = error.record.take() else {
            return Err(error);
        };
        warn!(pipeline = %self.config.name, event_id = %error.event_id, topic = %error.topic, dead_letter_topic = %dead_letter_topic, reason = %error.reason, "the sink refused the record; sending it to the dead-letter destination");
        self.metrics.dead_lettered(if error.too_large {
            "too_large"
        } else {
            "refused"
        });
        let copy = Router::dead_letter_refused(*record, &error, &dead_letter_topic);
        self.send(copy, token)
    }

    /// The too-large form of a dead-letter copy the sink refused as too large with `error`
    /// ([`Router::dead_letter_shrunk`]), with `on_bad_event = "dead_letter"`.
    /// Not in exactly-once mode: the refusal left the Kafka transaction abortable only, and the
    /// copy could not join it.
    pub(super) fn shrunk_copy(&self, error: &DeliveryError) -> Option<Record> {
        if self.eos.is_some() {
            return None;
        }
        let dead_letter_topic = self.config.dead_letter_topic.as_ref()?;
        let copy = error.record.as_deref()?;
        (self.config.on_bad_event == OnBadEvent::DeadLetter
            && error.too_large
            && error.topic == *dead_letter_topic)
            .then(|| Router::dead_letter_shrunk(copy, error))?
    }

    /// The dead-letter topic for a record the sink refused with `error`, if it is to be
    /// dead-lettered: `on_bad_event = "dead_letter"`, an error retrying cannot fix, and not
    /// already the dead-letter copy.
    pub(super) fn dead_letter_topic_for(&self, error: &DeliveryError) -> Option<String> {
        match (&self.config.on_bad_event, &self.config.dead_letter_topic) {
            (OnBadEvent::DeadLetter, Some(topic)) if !error.retryable && error.topic != *topic => {
                Some(topic.clone())
            }
            _ => None,
        }
    }

    /// Counts an event with a NULL aggregate id (published with a null key) and warns at
    /// most every [`NULL_KEY_WARNING_INTERVAL`].
    pub(super) fn null_key(&mut self, event: &OutboxEvent) {
        self.metrics.events_null_key.inc();
        let (last, unwarned) = &mut self.null_key_warned;
        *unwarned += 1;
        if last.is_none_or(|at| at.elapsed() >= NULL_KEY_WARNING_INTERVAL) {
            warn!(pipeline = %self.config.name, event_id = %String::from_utf8_lossy(&event.id), events = *unwarned, "events with a NULL aggregate id published with a null key (no per-aggregate order); counted in outbox_relay_events_null_key_total");
            *last = Some(Instant::now());
            *unwarned = 0;
        }
    }

    pub(super) fn on_delivery(&mut self, mut delivery: Delivery) -> Result<(), Error> {
        self.update_in_flight_gauges();
        observe_delivery(self.metrics, &delivery);
        // Once the connection is known lost, the records failing on the dead client after the
        // one that found it never reached the server: the source charges them nothing.
        if let (Some(_), Err(e)) = (&self.lost, &mut delivery.result) {
            if e.connection_lost {
                e.attempted = false;
            }
        }
        let handling = self
            .source
            .on_outcome(delivery.token.event(), delivery.result.as_ref().map(|_| ()));
        // Exactly-once: a refusal leaves the transaction abortable only, so a dead-letter copy
        // cannot join it: the session aborts, and the redo sends the event there.
        let redo = match &delivery.result {
            Err(e) => {
                handling == FailureHandling::Session && self.dead_letter_topic_for(e).is_some()
            }
            Ok(()) => false,
        };
        if let Some(eos) = &mut self.eos {
            let event = delivery.token.event();
            match (&delivery.result, redo) {
                (Err(e), true) => {
                    if let Some(refused) = eos.refused(event, e) {
                        return Err(Error::Redo(Box::new(refused)));
                    }
                    warn!(pipeline = %self.config.name, event_id = %e.event_id, "too many refused records in unconfirmed transactions to redo them; halting on this one");
                    return Err(Error::Delivery(delivery.result.unwrap_err()));
                }
                _ => eos.settled(event),
            }
        }
        match delivery.result {
            Ok(()) => {
                self.settle(delivery.token)?;
                self.delivered += 1;
                Ok(())
            }
            // The source recorded it, but a client whose connection is gone fails every record
            // after it too: the session ends once the source transaction is finished, so the
            // next one connects again.
            Err(e) if handling == FailureHandling::Recorded && e.connection_lost => {
                self.settle(delivery.token)?;
                if self.lost.is_none() {
                    warn!(pipeline = %self.config.name, event_id = %e.event_id, reason = %e.reason, "the sink's connection is gone; ending the session once this batch is recorded, then connecting again");
                    self.lost = Some(e);
                }
                Ok(())
            }
            Err(_) if handling == FailureHandling::Recorded => self.settle(delivery.token),
            Err(e) => {
                if e.retryable {
                    return Err(e.into());
                }
                // Halting: a Delivery error, so nothing queued behind it is awaited.
                self.dead_letter_refused(e, delivery.token)
                    .map_err(Error::Delivery)?;
                self.update_in_flight_gauges();
                Ok(())
            }
        }
    }
}
