//! The session loop: source -> router -> sink -> ack tracker, generic over [`Source`] and
//! [`Sink`], with exactly-once as a [`Mode`] the caller chooses from a transactional sink.
//!
//! The invariant it keeps: the position confirmed to the source never passes an event the sink
//! has not acknowledged (in exactly-once mode, committed), and never decreases. Positions come
//! only from [`AckTracker::flush_lsn`], in exactly-once mode held before the first source
//! transaction whose sink transaction has not committed
//! ([`crate::exactly_once::ExactlyOnce::limit`]).
//!
//! Memory stays bounded: no source item is read while the sink holds `max_in_flight_events`
//! records or `max_in_flight_bytes` bytes without an outcome, while a record waits for room in
//! the sink's queue, or while `max_in_flight_events` committed transactions wait behind an
//! unacknowledged event in the ack tracker ([`AckTracker::unconfirmed_commits`]); in
//! exactly-once mode the records of the next batch read while a commit is pending count as in
//! flight, and reading stops once that batch is full. Shutdown and confirmations stay live in
//! all of these states.
//!
//! The loop owns no IO: the caller builds the source and the sink and hands them over, so a
//! test drives it with fakes.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use tokio::time::{interval, sleep, sleep_until, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::ack::{AckTracker, EventToken, TrackerError};
use crate::config::{OnBadEvent, PipelineConfig, SourceKind};
use crate::error::{chain, Error, Recovery};
use crate::exactly_once::{ExactlyOnce, Placement, TransactionError};
use crate::lsn::Lsn;
use crate::metrics::{PipelineMetrics, PipelineState};
use crate::router::{RouteError, Router};
use crate::sink::{Delivery, DeliveryError, InFlight, Record, Sink};
use crate::source::outbox::OutboxEvent;
use crate::source::{Confirmation, Source, SourceError, SourceItem};
use crate::supervisor::SessionProgress;

/// Minimum gap between confirmations sent because the flush LSN moved; the timer sends one
/// every status interval regardless.
const MIN_CONFIRM_GAP: Duration = Duration::from_millis(10);
/// Least time between two warnings about events with a null key.
const NULL_KEY_WARNING_INTERVAL: Duration = Duration::from_secs(60);
/// How often a record the sink's queue had no room for is offered again while the sink has
/// nothing in flight whose outcome would free room.
const QUEUE_FULL_RETRY: Duration = Duration::from_millis(10);
/// The longest wait between such offers: the wait doubles while the queue stays full (records
/// an ended session left in a shared producer, whose reports wake no session, can fill it for
/// as long as they wait), so the loop does not wake 100 times a second meanwhile.
const QUEUE_FULL_MAX_RETRY: Duration = Duration::from_millis(500);
/// Delivery outcomes that one turn of the loop takes when they are there already (no wait): a
/// produce response's reports cost one turn (its timers and wake-ups) instead of one each.
/// Small enough that a shutdown is seen within microseconds. (Source items are taken one per
/// turn: taking a socket read's worth at once doubled the walsender's CPU in the backlog
/// benchmark, docs/performance.md.)
const READY_BATCH: usize = 64;

/// The delivery guarantee of a session.
pub enum Mode {
    /// Records are confirmed once acknowledged; a restart may publish them again.
    AtLeastOnce,
    /// Batches of consecutive source transactions are committed in one sink transaction each,
    /// with a checkpoint; built from a [`crate::exactly_once::TransactionalSink`].
    ExactlyOnce(Box<ExactlyOnce>),
}

/// One session: a source, a sink, the router between them and the ack tracker behind them.
pub struct Session<'a, So: Source, Si: Sink> {
    config: &'a PipelineConfig,
    metrics: &'a PipelineMetrics,
    source: So,
    sink: Si,
    router: Router,
    tracker: AckTracker,
    eos: Option<ExactlyOnce>,
    /// Records the sink's queue had no room for, in send order, with their tokens.
    blocked: VecDeque<(Box<Record>, EventToken)>,
    /// The wait before offering them again while nothing is in flight.
    blocked_wait: Duration,
    /// Exactly-once: records of the next batch, read while the closed one commits, and their
    /// bytes; sent once the next Kafka transaction began.
    waiting: VecDeque<(Box<Record>, EventToken)>,
    waiting_bytes: usize,
    /// Commit time of the open transaction (Unix ms), from its Begin.
    commit_time_ms: Option<i64>,
    /// The last position the source reported, for error context.
    position: Lsn,
    /// The position of the last confirmation sent.
    confirmed: Lsn,
    /// When it was sent, on tokio's clock (a simulation's clock when paused).
    last_confirm: tokio::time::Instant,
    /// Records acknowledged since the last confirmation.
    delivered: u64,
    /// Event items the source yielded: the next one's number for [`Source::on_outcome`].
    events: u64,
    /// Where the session started, and whom to tell when the confirmed position passes it
    /// (the supervisor resets its backoff only after such progress).
    start: Lsn,
    progress: &'a SessionProgress,
    /// When the last null-key warning was logged, and events with a null key not yet in one.
    null_key_warned: (Option<Instant>, u64),
    /// Once a shutdown began: when its drain must end, whatever ends the session.
    drain_deadline: Option<tokio::time::Instant>,
    /// A failure the source recorded that left the sink's client without a connection: the
    /// session finishes the source transaction it is in (the source records every outcome and
    /// ends its cycle), then ends with this error so that the next one connects again.
    lost: Option<DeliveryError>,
    /// The pipeline read `degraded` at the last confirmation: its entry is logged at WARN, its
    /// end at INFO, once each.
    degraded: bool,
}

impl<'a, So: Source, Si: Sink> Session<'a, So, Si> {
    /// A session starting at `start` (the source's confirmed position: the flush LSN never
    /// goes below it).
    #[expect(
        clippy::too_many_arguments,
        reason = "each is a distinct part the caller owns; a parameter struct would only rename them"
    )]
    pub fn new(
        config: &'a PipelineConfig,
        metrics: &'a PipelineMetrics,
        source: So,
        sink: Si,
        router: Router,
        mode: Mode,
        start: Lsn,
        progress: &'a SessionProgress,
    ) -> Self {
        Session {
            config,
            metrics,
            source,
            sink,
            router,
            tracker: AckTracker::new(match mutated(Mutation::TrackerStartsAtZero) {
                true => Lsn::ZERO,
                false => start,
            }),
            eos: match mode {
                Mode::AtLeastOnce => None,
                Mode::ExactlyOnce(eos) => Some(*eos),
            },
            blocked: VecDeque::new(),
            blocked_wait: QUEUE_FULL_RETRY,
            waiting: VecDeque::new(),
            waiting_bytes: 0,
            commit_time_ms: None,
            position: start,
            confirmed: Lsn::ZERO,
            last_confirm: tokio::time::Instant::now(),
            delivered: 0,
            events: 0,
            start,
            progress,
            null_key_warned: (None, 0),
            drain_deadline: None,
            lost: None,
            degraded: false,
        }
    }

    /// Streams until `shutdown` (then drains and returns `Ok`) or an error, confirming at
    /// least every `status_interval`. On a permanent error found before its event was sent
    /// (bad input, a record the sink refuses), what was sent before it is still delivered and
    /// confirmed (up to the shutdown timeout), so a restart after the fix publishes as little
    /// again as possible; the failing event's transaction stays unconfirmed. After a failed
    /// delivery nothing more is awaited: later records of the same key may be queued behind
    /// it, and the sink withdraws them ([`Sink::withdraw_in_flight`]).
    pub async fn run(
        mut self,
        shutdown: &CancellationToken,
        status_interval: Duration,
    ) -> Result<(), Error> {
        let result = self.stream(shutdown, status_interval).await;
        // What is left of a shutdown's drain, if one began; else a shutdown timeout from now.
        let end_by = self
            .drain_deadline
            .unwrap_or_else(|| tokio::time::Instant::now() + self.config.shutdown_timeout());
        if let Some(eos) = &mut self.eos {
            let fenced = matches!(&result, Err(Error::Transaction(e)) if e.is_fenced());
            eos.end(fenced, self.metrics, end_by).await;
        }
        if let Err(e) = &result {
            if matches!(e, Error::Delivery(_)) {
                self.sink.withdraw_in_flight();
                return result;
            }
            if e.recovery() != Recovery::Stop {
                return result;
            }
            // Within what is left of a shutdown's drain, if one began (the simulation found a
            // stop that took twice the shutdown timeout: bad input met while the drain
            // finished the open transaction, then a second drain of a whole timeout).
            self.metrics
                .set_state(PipelineState::Draining, Some(chain(e)));
            self.drain_in_flight(end_by).await;
        }
        if let Err(e) = self.confirm().await {
            warn!(pipeline = %self.config.name, error = %chain(&e), "could not send the final confirmation");
            return result.and(Err(e));
        }
        let flush = self.flush_lsn();
        self.source.close().await;
        // A polling source's positions are its cycle numbers, not LSNs.
        match self.config.source_kind {
            SourceKind::LogTailing => {
                info!(pipeline = %self.config.name, confirmed_flush_lsn = %flush, "stopped")
            }
            SourceKind::Polling => info!(pipeline = %self.config.name, cycle = flush.0, "stopped"),
        }
        result
    }

    async fn stream(
        &mut self,
        shutdown: &CancellationToken,
        status_interval: Duration,
    ) -> Result<(), Error> {
        let mut status_timer = interval(status_interval);
        status_timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // Made once, not on every turn: each registers with the token or the timer wheel.
        let cancelled = shutdown.cancelled();
        tokio::pin!(cancelled);
        let confirm_gap = sleep_until(self.last_confirm + MIN_CONFIRM_GAP);
        tokio::pin!(confirm_gap);

        loop {
            if confirm_gap.deadline() != self.last_confirm + MIN_CONFIRM_GAP {
                confirm_gap
                    .as_mut()
                    .reset(self.last_confirm + MIN_CONFIRM_GAP);
            }
            let in_flight = self.sink.in_flight();
            // While draining, finish the open transaction (so its events are confirmed and
            // not published again after restart) but start no new one.
            let draining = self.drain_deadline.is_some();
            // Exactly-once: close the batch when it is due, and once every record of it is
            // acknowledged, commit its sink transaction (with the checkpoint record).
            let (committing, linger_until, eos_reads, uncommitted) = match &mut self.eos {
                Some(eos) => {
                    eos.step(in_flight.events == 0 && self.blocked.is_empty(), draining);
                    (
                        eos.committing(),
                        eos.linger_until(),
                        eos.reads(),
                        eos.uncommitted(),
                    )
                }
                None => (false, None, true, false),
            };
            // After a lost connection, as while draining: finish the open transaction only.
            let finishing = draining || self.lost.is_some();
            let read = self.has_capacity(in_flight)
                && (!finishing || self.tracker.in_transaction())
                && eos_reads;
            if self.lost.is_some()
                && !self.tracker.in_transaction()
                && in_flight.events == 0
                && self.blocked.is_empty()
            {
                // Its outcomes recorded, the transaction is confirmed (the polling cycle marks
                // its rows and commits) before the session ends.
                self.confirm().await?;
                return Err(Error::Delivery(self.lost.take().expect("lost")));
            }
            // Done once nothing is left to publish: a record waiting for room (a dead-letter
            // copy of a record refused after its Commit) belongs to a read transaction too.
            if draining
                && !self.tracker.in_transaction()
                && in_flight.events == 0
                && self.blocked.is_empty()
                && !uncommitted
            {
                break;
            }

            tokio::select! {
                biased;
                // 1. Shutdown: stop taking new transactions, drain what is in flight.
                _ = &mut cancelled, if !draining => {
                    info!(pipeline = %self.config.name, in_flight = in_flight.events, "draining before shutdown");
                    self.metrics.set_state(PipelineState::Draining, None);
                    self.drain_deadline = Some(tokio::time::Instant::now() + self.config.shutdown_timeout());
                }
                _ = until(self.drain_deadline), if draining && !mutated(Mutation::DrainForever) => {
                    warn!(
                        pipeline = %self.config.name,
                        in_flight = in_flight.events,
                        in_transaction = self.tracker.in_transaction(),
                        "shutdown timeout reached; events after the confirmed LSN will be published again on restart"
                    );
                    break;
                }
                // 2. Delivery outcomes: free capacity, move the flush LSN.
                Some(delivery) = self.sink.next_delivery(), if in_flight.events > 0 => {
                    self.on_delivery(delivery)?;
                    self.ready_deliveries()?;
                }
                // Exactly-once: the sink's commit, then the flush LSN may pass its batch.
                result = committed(&mut self.eos), if committing => self.on_committed(result).await?,
                // 3. Confirmations on a timer, also while no source item is read, and once
                // the flush LSN moved (at most every MIN_CONFIRM_GAP).
                _ = status_timer.tick() => self.confirm().await?,
                _ = &mut confirm_gap, if self.flush_lsn() > self.confirmed => {}
                // A record waits for room in the sink's queue, and no outcome will make some.
                _ = async { sleep(self.blocked_wait).await }, if !self.blocked.is_empty() && in_flight.events == 0 => {
                    self.blocked_wait = (self.blocked_wait * 2).min(QUEUE_FULL_MAX_RETRY);
                }
                // 4. New source items, only while there is capacity.
                item = self.source.next(), if read => self.on_item(item?).await?,
                // Exactly-once: the open batch's linger ended (and no source item came).
                _ = until(linger_until), if linger_until.is_some() => {}
            }

            self.send_blocked()?;
            self.abort_if_held_by_a_missing_topic()?;
            if (self.flush_lsn() > self.confirmed && self.last_confirm.elapsed() >= MIN_CONFIRM_GAP)
                || self.source.confirm_requested()
            {
                self.confirm().await?;
            }
        }

        Ok(())
    }

    /// Whether another source item may be read: the in-flight limits (exactly-once: counting
    /// the records waiting for the next Kafka transaction), the ack tracker's queue of
    /// committed transactions (bounded by `max_in_flight_events` too: one entry each) and the
    /// sink's queue.
    fn has_capacity(&self, in_flight: InFlight) -> bool {
        in_flight.events + self.waiting.len() < self.config.max_in_flight_events
            && in_flight.bytes + self.waiting_bytes < self.config.max_in_flight_bytes
            && (self.tracker.unconfirmed_commits() < self.config.max_in_flight_events
                || mutated(Mutation::NoTrackerBound))
            && (self.blocked.is_empty() || mutated(Mutation::Overtake))
    }

    /// Takes the delivery outcomes that are there already, up to [`READY_BATCH`] in all.
    fn ready_deliveries(&mut self) -> Result<(), Error> {
        for _ in 1..READY_BATCH {
            if self.sink.in_flight().events == 0 {
                break;
            }
            // Cancel-safe (the trait's promise): an outcome not there yet stays in the sink.
            match self.sink.next_delivery().now_or_never() {
                Some(Some(delivery)) => self.on_delivery(delivery)?,
                _ => break,
            }
        }
        Ok(())
    }

    /// Waits until `deadline` for the outcomes of records in flight, acknowledging them, and
    /// (at least once) sends the records still waiting for room in the sink's queue: the
    /// dead-letter copy of a record refused after its Commit was read holds its transaction's
    /// confirmation. Exactly-once leaves them: their sink transaction has ended. A waiting
    /// record the sink refuses is logged, and the others stay unsent (their transactions
    /// unconfirmed); the records in flight are still awaited.
    async fn drain_in_flight(&mut self, deadline: tokio::time::Instant) {
        let mut sending = self.eos.is_none();
        loop {
            if sending {
                if let Err(e) = self.send_blocked() {
                    warn!(pipeline = %self.config.name, error = %chain(&e), "a record waiting for room in the sink's queue was refused while draining; its transaction and those after it stay unconfirmed (read again after a restart)");
                    sending = false;
                }
            }
            let blocked = sending && !self.blocked.is_empty();
            if self.sink.in_flight().events == 0 {
                if !blocked
                    || tokio::time::timeout_at(deadline, sleep(QUEUE_FULL_RETRY))
                        .await
                        .is_err()
                {
                    break;
                }
                continue;
            }
            let Ok(Some(delivery)) =
                tokio::time::timeout_at(deadline, self.sink.next_delivery()).await
            else {
                break;
            };
            if self.on_delivery(delivery).is_err() {
                // A failed delivery: what is behind it must not go out (as in `run`).
                self.sink.withdraw_in_flight();
                break;
            }
        }
    }

    async fn on_item(&mut self, item: SourceItem) -> Result<(), Error> {
        match item {
            SourceItem::Begin {
                final_lsn,
                commit_time_ms,
            } => {
                self.tracker
                    .begin()
                    .map_err(|source| tracker_error(final_lsn, source))?;
                self.commit_time_ms = Some(commit_time_ms);
                if let Some(eos) = &mut self.eos {
                    eos.on_begin(final_lsn);
                }
            }
            SourceItem::Event { event, time_ms } => self.publish(event, time_ms).await?,
            SourceItem::Commit { end_lsn } => {
                self.position = self.position.max(end_lsn);
                self.commit_time_ms = None;
                self.metrics.transactions.inc();
                // Exactly-once: the flush LSN stays held before its batch until the batch's
                // sink transaction committed.
                if let Some(eos) = &mut self.eos {
                    eos.on_commit(end_lsn)?;
                }
                self.tracker
                    .commit(end_lsn)
                    .map_err(|source| tracker_error(end_lsn, source))?;
            }
            SourceItem::Idle(position) => {
                self.position = self.position.max(position);
                self.tracker.idle(position);
                if let Some(eos) = &mut self.eos {
                    eos.on_idle();
                }
            }
        }
        Ok(())
    }

    /// Exactly-once: the sink transaction of the closed batch committed (or failed: the
    /// session ends, and the next one aborts what is open). The records read meanwhile go
    /// to the sink in the next sink transaction, in order.
    ///
    /// Returns an error if the commit failed or the next transaction cannot begin.
    async fn on_committed(&mut self, result: Result<(), TransactionError>) -> Result<(), Error> {
        result?;
        self.metrics.kafka_transaction("committed");
        if self.waiting.is_empty() {
            return Ok(());
        }
        if let Some(eos) = &mut self.eos {
            eos.before_send().await?;
        }
        self.blocked.append(&mut self.waiting);
        self.waiting_bytes = 0;
        Ok(())
    }

    /// Routes an event of the open transaction and hands it to the sink, acknowledged like any
    /// other record before its transaction is confirmed.
    async fn publish(&mut self, event: OutboxEvent, time_ms: Option<i64>) -> Result<(), Error> {
        let number = self.events;
        self.events += 1;
        let lsn = event.lsn;
        self.position = self.position.max(lsn);
        let commit_time_ms = self.commit_time_ms.ok_or_else(|| {
            SourceError::Protocol(format!("outbox event at LSN {lsn} outside a transaction"))
        })?;
        self.metrics.events_decoded.inc();
        self.metrics.read_event(commit_time_ms);
        if self.eos.as_ref().is_some_and(ExactlyOnce::skipping) {
            // Committed to the sink with its transaction before the last crash.
            self.metrics.skipped("checkpointed");
            return Ok(());
        }
        if event.aggregate_id.is_none() {
            self.null_key(&event);
        }
        let mut record = route_or_dead_letter(
            &self.router,
            self.config,
            self.metrics,
            &event,
            time_ms.unwrap_or(commit_time_ms),
        )
        .map_err(|route| Error::Route { lsn, route })?;
        if let Some(eos) = &mut self.eos {
            // Refused for good in an earlier session, whose transaction was aborted for it.
            if let (Some(refused), Some(topic)) = (
                eos.refused_before(lsn, &event.id),
                &self.config.dead_letter_topic,
            ) {
                warn!(pipeline = %self.config.name, event_id = %String::from_utf8_lossy(&event.id), %lsn, topic = %refused.topic, dead_letter_topic = %topic, reason = %refused.reason, "the sink refused the record in the aborted transaction; sending it to the dead-letter topic in the redone one");
                self.metrics.dead_lettered(if refused.too_large {
                    "too_large"
                } else {
                    "refused"
                });
                record = Router::dead_letter_refused(record, &refused.delivery_error(), topic);
            }
            eos.sent(number, lsn, event.id.clone());
            if eos.place(self.tracker.flush_lsn(), record.size()) == Placement::Next {
                let token = self.track_event(number, lsn)?;
                self.waiting_bytes += record.size();
                self.waiting.push_back((Box::new(record), token));
                return Ok(());
            }
            eos.before_send().await?;
        }
        let token = self.track_event(number, lsn)?;
        self.send(record, token).map_err(Error::Rejected)?;
        self.update_in_flight_gauges();
        Ok(())
    }

    /// The ack tracker's token for event number `number` at `lsn` of the open transaction.
    ///
    /// Returns an error if no transaction is open.
    fn track_event(&mut self, number: u64, lsn: Lsn) -> Result<EventToken, Error> {
        Ok(self
            .tracker
            .track_event()
            .map_err(|source| tracker_error(lsn, source))?
            .with_event(number))
    }

    /// The flush LSN that may be confirmed: the ack tracker's (exactly-once: held before the
    /// first transaction whose sink transaction has not committed).
    fn flush_lsn(&self) -> Lsn {
        let flush = self.tracker.flush_lsn();
        match &self.eos {
            Some(eos) => eos.limit(flush),
            None => flush,
        }
    }

    /// Confirms the tracker's flush LSN to the source.
    async fn confirm(&mut self) -> Result<(), Error> {
        let mut flush = self.flush_lsn();
        if mutated(Mutation::ConfirmSourcePosition) {
            flush = flush.max(self.position);
        }
        let delivered = std::mem::take(&mut self.delivered);
        self.source
            .confirm(Confirmation {
                position: flush,
                delivered,
            })
            .await?;
        if flush != self.confirmed {
            debug!(pipeline = %self.config.name, flush_lsn = %flush, "confirmed");
        }
        // The confirmed position advances (it never decreases: the tracker's never does).
        self.confirmed = flush;
        if flush > self.start {
            self.progress.advanced();
        }
        self.last_confirm = tokio::time::Instant::now();
        // Also on the timer: left-over records' reports come to no session.
        self.update_in_flight_gauges();
        // With the records an ended session left in a shared producer: they hold the
        // pipeline's confirmations as much.
        let oldest = match (self.sink.oldest_in_flight(), self.sink.oldest_left_over()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.metrics
            .oldest_unacked_age
            .set(oldest.map_or(0.0, |sent| sent.elapsed().as_secs_f64()));
        let waiting = self.sink.waiting();
        let named = waiting.is_some();
        self.metrics.set_waiting(waiting);
        self.log_degraded_change(named);
        Ok(())
    }

    /// Logs the pipeline's entry into `degraded` (records wait for the sink's acknowledgement:
    /// a broker down) at WARN with the reason `/readyz` gives, and its end at INFO, once each:
    /// the state is derived when read, so without this the logs would not say it. Not when the
    /// sink `named` why records wait itself (a missing topic, which its own line names once).
    /// A drain is not an end: the records still wait, and nothing says the sink takes them.
    fn log_degraded_change(&mut self, named: bool) {
        let Some(health) = self.metrics.state() else {
            return;
        };
        if health.state == PipelineState::Draining {
            return;
        }
        let degraded = health.state == PipelineState::Degraded && !named;
        if degraded == self.degraded {
            return;
        }
        self.degraded = degraded;
        let in_flight = self.sink.in_flight().events;
        if degraded {
            warn!(pipeline = %self.config.name, reason = health.reason.as_deref().unwrap_or(""), in_flight, "pipeline degraded: records wait (nothing is lost; the relay goes on once the sink takes them)");
        } else {
            info!(pipeline = %self.config.name, state = health.state.as_str(), in_flight, "pipeline no longer degraded: the sink takes records again");
        }
    }

    /// The session's records in flight, with those its pipeline's ended sessions left in a
    /// shared producer (they hold its reads as much).
    fn update_in_flight_gauges(&self) {
        let (own, left_over) = (self.sink.in_flight(), self.sink.left_over());
        let events = own.events + left_over.events;
        let bytes = own.bytes + left_over.bytes;
        self.metrics.in_flight_events.set(events as i64);
        self.metrics.in_flight_bytes.set(bytes as i64);
    }
}

/// Sleeps until `deadline`; never completes without one. Reads no clock until polled (a
/// `select!` builds the futures of its disabled branches too, on every turn).
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Waits for the sink commit in progress; never completes if there is none. Cancel-safe.
async fn committed(eos: &mut Option<ExactlyOnce>) -> Result<(), TransactionError> {
    match eos {
        Some(eos) => eos.committed().await,
        None => std::future::pending().await,
    }
}

fn tracker_error(lsn: Lsn, source: TrackerError) -> Error {
    SourceError::Tracker { lsn, source }.into()
}

/// Routes `event` (its time `time_ms`, Unix ms); an event that cannot be routed goes to the
/// dead-letter topic when `on_bad_event = "dead_letter"` (logged and counted).
///
/// Returns the routing error otherwise: the pipeline stops.
pub(crate) fn route_or_dead_letter(
    router: &Router,
    config: &PipelineConfig,
    metrics: &PipelineMetrics,
    event: &OutboxEvent,
    time_ms: i64,
) -> Result<Record, RouteError> {
    match router.route(event, time_ms) {
        Ok(record) => Ok(record),
        Err(e) => match (&config.on_bad_event, &config.dead_letter_topic) {
            (OnBadEvent::DeadLetter, Some(topic)) => {
                warn!(pipeline = %config.name, event_id = %String::from_utf8_lossy(&event.id), lsn = event.lsn.known(), topic = %topic, reason = %e, "event sent to the dead-letter topic");
                metrics.dead_lettered(e.reason_label());
                Ok(Router::dead_letter(event, &e, topic, time_ms))
            }
            _ => Err(e),
        },
    }
}

/// Counts a delivery outcome in the metrics: published records by topic with their latency
/// (acceptance to outcome) and commit-to-ack time, failures by topic and retryability.
pub(crate) fn observe_delivery(metrics: &PipelineMetrics, delivery: &Delivery) {
    match &delivery.result {
        Ok(()) => {
            metrics.published(&delivery.topic);
            metrics
                .delivery_latency
                .observe(delivery.latency.as_secs_f64());
            if let Some(commit_ms) = delivery.timestamp_ms {
                metrics
                    .commit_to_ack
                    .observe((now_ms() - commit_ms).max(0) as f64 / 1_000.0);
            }
        }
        Err(e) => metrics.delivery_failed(&delivery.topic, e.retryable),
    }
}

/// The wall clock, Unix ms.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Deliberate defects for the simulation to catch: `mutated` is `false` outside tests.
mod delivery;
pub(crate) mod mutation;
use mutation::{active as mutated, Mutation};

#[cfg(test)]
mod simulation;
#[cfg(test)]
mod tests;
