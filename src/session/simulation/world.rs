//! What the fakes share: the seeded random source, the WAL, the slot, the broker's log and
//! transaction coordinator (or the ordered sink's server), this session's faults, and the
//! invariant checks run after every step the session takes against them.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fastrand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::publisher::{PublisherSetup, Server};
use super::wal::{Wal, WalShape, START, TOPIC};
use crate::exactly_once::BatchLimits;
use crate::lsn::Lsn;
use crate::session::mutation::{self, Mutation};
use crate::sink::InFlight;

/// The world of one schedule, behind a lock the fakes share (the session runs on one thread;
/// the lock is never held across an await).
#[derive(Clone)]
pub(super) struct Shared(Arc<Mutex<World>>);

impl Shared {
    pub fn new(world: World) -> Self {
        Shared(Arc::new(Mutex::new(world)))
    }

    pub fn lock(&self) -> MutexGuard<'_, World> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The delivery guarantee a run's schedules test, and the sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Guarantee {
    /// With or without a dead-letter topic, with bad input.
    AtLeastOnce,
    /// At-least-once over the ordered sink (the sink of every kind but Kafka), with or without
    /// a dead-letter topic, with bad input.
    AtLeastOnceOrdered,
    /// Without a dead-letter topic and bad input.
    ExactlyOnce,
    /// With a dead-letter topic and bad input.
    ExactlyOnceWithDeadLetter,
}

/// How a schedule's pipeline is set up, drawn once per schedule.
#[derive(Clone, Copy, Debug)]
pub(super) struct Setup {
    pub exactly_once: bool,
    pub dead_letter: bool,
    pub max_in_flight_events: usize,
    pub max_in_flight_bytes: usize,
    pub status_interval_ms: u64,
    pub shutdown_timeout_secs: u64,
    /// Records the producer's queue holds (`queue.buffering.max.messages`).
    pub queue_limit: usize,
    /// Larger records the producer refuses at send (`message.max.bytes`).
    pub producer_max_bytes: usize,
    /// Larger records the broker refuses after sending (the topic's `max.message.bytes`).
    pub broker_max_bytes: usize,
    pub partitions: usize,
    /// Exactly-once: when a batch of PostgreSQL transactions closes.
    pub batch: BatchLimits,
    /// The ordered sink's settings, when the schedule runs it instead of Kafka.
    pub ordered: Option<PublisherSetup>,
}

/// What goes wrong in one session, drawn at its start; nothing does in the final one.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Faults {
    /// Since the session's start.
    pub connection_lost_after: Option<Duration>,
    pub shutdown_after: Option<Duration>,
    /// Per mille of records that time out (retryable), and that the broker refuses for good.
    pub retryable_per_mille: u16,
    pub permanent_per_mille: u16,
    /// A partition none of whose records gets an outcome in this session.
    pub unavailable_partition: Option<usize>,
    pub latency_max_ms: u64,
    /// Exactly-once: the producer's registration fails.
    pub init_fails: bool,
    /// Exactly-once: per mille of commits that fail, whose outcome the client does not learn
    /// (the coordinator committed), that hang until the call's timeout, whose request reaches
    /// the coordinator late; and of aborts that fail.
    pub commit_fail_per_mille: u16,
    pub commit_unknown_per_mille: u16,
    pub commit_hang_per_mille: u16,
    pub commit_late_per_mille: u16,
    pub abort_fail_per_mille: u16,
    /// The ordered sink's server: per mille of attempts that get no answer; the time, since
    /// the session's start, from which it is down and until it is back; when the client's
    /// connection breaks for good.
    pub silent_per_mille: u16,
    pub server_down: Option<(Duration, Duration)>,
    pub broken_after: Option<Duration>,
}

/// A record the broker wrote, in the order it wrote them.
#[derive(Clone, Debug)]
pub(super) struct Written {
    pub id: String,
    pub key: Option<String>,
    pub topic: String,
    /// The Kafka transaction it belongs to (exactly-once).
    pub txn: Option<usize>,
}

/// A Kafka transaction as the coordinator sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TxnStatus {
    Ongoing,
    Committed,
    Aborted,
}

/// A commit request on its way to the coordinator.
#[derive(Clone, Copy, Debug)]
pub(super) struct LateCommit {
    pub arrives_at: Instant,
    pub epoch: u64,
    pub txn: usize,
}

/// The transaction coordinator of the pipeline's `transactional.id`, as a real broker runs it
/// (librdkafka's mock cluster writes no abort markers and does not fence).
#[derive(Debug, Default)]
pub(super) struct Coordinator {
    /// The producer epoch of the last registration (`InitProducerId`).
    pub epoch: u64,
    pub txns: Vec<TxnStatus>,
    /// The transaction the current epoch has open.
    pub ongoing: Option<usize>,
    pub late: Vec<LateCommit>,
    /// Checkpoint records, by transaction, in the order written.
    pub checkpoints: Vec<(usize, Lsn)>,
    /// The PostgreSQL transactions (numbers in the WAL) with records in each Kafka
    /// transaction, for the run's summary.
    pub batches: BTreeMap<usize, BTreeSet<usize>>,
    /// Commit requests refused because their epoch was fenced.
    pub fenced: u64,
    /// A record of this transaction failed: librdkafka's producer is in an abortable error
    /// state, refusing every record and the commit until the transaction is aborted.
    pub abortable: Option<usize>,
}

impl Coordinator {
    /// Whether `read_committed` consumers see the records of transaction `txn`.
    pub fn visible(&self, txn: Option<usize>) -> bool {
        match txn.map(|t| self.txns[t]) {
            None | Some(TxnStatus::Committed) => true,
            Some(TxnStatus::Aborted) => mutation::active(Mutation::NoAbortMarkers),
            Some(TxnStatus::Ongoing) => false,
        }
    }

    /// Applies the commit requests that arrived by `now`: committed if their epoch is the
    /// current one and the transaction still open, else refused (fenced).
    pub fn deliver_late(&mut self, now: Instant) {
        let (arrived, waiting) = self.late.drain(..).partition(|l| l.arrives_at <= now);
        self.late = waiting;
        for late in arrived {
            let LateCommit { epoch, txn, .. } = late;
            let current = epoch == self.epoch && self.txns[txn] == TxnStatus::Ongoing;
            if current
                || (mutation::active(Mutation::NoFencing) && self.txns[txn] != TxnStatus::Committed)
            {
                self.commit(txn);
            } else {
                self.fenced += 1;
            }
        }
    }

    pub fn commit(&mut self, txn: usize) {
        self.txns[txn] = TxnStatus::Committed;
        if self.ongoing == Some(txn) {
            self.ongoing = None;
        }
    }

    /// How many Kafka transactions with records of several PostgreSQL transactions were
    /// committed, and how many aborted.
    pub fn batches_of_several(&self) -> (usize, usize) {
        let several = |status| {
            self.batches
                .iter()
                .filter(|(txn, pg)| pg.len() > 1 && self.txns[**txn] == status)
                .count()
        };
        (several(TxnStatus::Committed), several(TxnStatus::Aborted))
    }

    /// The last checkpoint a `read_committed` consumer reads.
    pub fn checkpoint(&self) -> Option<Lsn> {
        self.checkpoints
            .iter()
            .rev()
            .find(|(txn, _)| self.visible(Some(*txn)))
            .map(|(_, lsn)| *lsn)
    }
}

/// The model's view of one transaction within the current session.
#[derive(Debug, Default)]
struct SessionTxn {
    commit_read: bool,
    sent: BTreeSet<String>,
    acknowledged: BTreeSet<String>,
}

/// The world of one schedule.
pub(super) struct World {
    pub rng: Rng,
    pub setup: Setup,
    pub wal: Wal,
    /// When the schedule started, on the paused clock.
    pub origin: Instant,
    /// The slot's confirmed flush LSN.
    pub slot: Lsn,
    pub log: Vec<Written>,
    written: HashSet<String>,
    /// Events the broker refused for good after accepting them: a later record of the same
    /// key may be acknowledged first (docs/concepts/guarantees.md, "Known limits"), so they
    /// are exempt from the order check.
    pub refused_after_send: HashSet<String>,
    pub coordinator: Coordinator,
    pub faults: Faults,
    /// The producer epoch this session's producer registered with.
    pub producer_epoch: u64,
    /// The session number (from 0) and its start.
    pub session: usize,
    pub session_start: Instant,
    session_txns: BTreeMap<usize, SessionTxn>,
    /// The first violated invariant.
    pub violation: Option<String>,
    /// What happened, for a replay's report.
    pub notes: Vec<String>,
    /// Transactions whose events were checked delivered when the flush LSN passed them.
    covered: usize,
    /// The final session: cancelled once the slot reached the last commit.
    pub done: Option<CancellationToken>,
    /// The largest numbers seen, for the report.
    pub peak_in_flight: InFlight,
    pub peak_unconfirmed: usize,
    /// The ordered sink's server and what the sink reported.
    pub server: Server,
}

impl World {
    pub fn new(seed: u64, guarantee: Guarantee) -> World {
        let mut rng = Rng::with_seed(seed);
        let exactly_once = matches!(
            guarantee,
            Guarantee::ExactlyOnce | Guarantee::ExactlyOnceWithDeadLetter
        );
        let dead_letter = match guarantee {
            Guarantee::AtLeastOnce | Guarantee::AtLeastOnceOrdered => rng.bool(),
            Guarantee::ExactlyOnce => false,
            Guarantee::ExactlyOnceWithDeadLetter => true,
        };
        let max_in_flight_events = rng.usize(1..=6);
        let setup = Setup {
            exactly_once,
            dead_letter,
            max_in_flight_events,
            max_in_flight_bytes: rng.usize(400..6000),
            status_interval_ms: rng.u64(200..=1000),
            shutdown_timeout_secs: rng.u64(1..=3),
            queue_limit: match rng.bool() {
                true => rng.usize(1..=max_in_flight_events),
                false => usize::MAX,
            },
            producer_max_bytes: rng.usize(1600..2800),
            broker_max_bytes: rng.usize(1200..3200),
            partitions: rng.usize(1..=3),
            batch: match exactly_once {
                false => BatchLimits::SINGLE,
                true => BatchLimits {
                    max_transactions: match rng.u8(0..4) {
                        0 => 1,
                        1 => 1_000,
                        _ => rng.usize(2..=4),
                    },
                    max_bytes: match rng.bool() {
                        true => rng.usize(50..2_000),
                        false => usize::MAX,
                    },
                    linger: Duration::from_millis(rng.u64(0..=20)),
                },
            },
            ordered: (guarantee == Guarantee::AtLeastOnceOrdered)
                .then(|| PublisherSetup::draw(&mut rng)),
        };
        // Exactly-once without a dead-letter topic: bad input that halts cannot be fixed by
        // the operator's restart.
        let wal = Wal::generate(
            &mut rng,
            WalShape {
                bad_input: guarantee != Guarantee::ExactlyOnce,
                bursts: exactly_once,
            },
        );
        World {
            rng,
            setup,
            wal,
            origin: Instant::now(),
            slot: START,
            log: Vec::new(),
            written: HashSet::new(),
            refused_after_send: HashSet::new(),
            coordinator: Coordinator::default(),
            faults: Faults::default(),
            producer_epoch: 0,
            session: 0,
            session_start: Instant::now(),
            session_txns: BTreeMap::new(),
            violation: None,
            notes: Vec::new(),
            covered: 0,
            done: None,
            peak_in_flight: InFlight::default(),
            peak_unconfirmed: 0,
            server: Server::default(),
        }
    }

    /// Starts session `n`: draws its faults (none if `last`).
    pub fn begin_session(&mut self, n: usize, last: bool) {
        self.session = n;
        self.session_start = Instant::now();
        self.session_txns.clear();
        let rng = &mut self.rng;
        let mut per_mille = |max: u16| if rng.bool() { rng.u16(0..=max) } else { 0 };
        self.faults = match last {
            true => Faults::default(),
            false => Faults {
                retryable_per_mille: per_mille(100),
                permanent_per_mille: if self.setup.exactly_once {
                    0
                } else {
                    per_mille(60)
                },
                commit_fail_per_mille: per_mille(150),
                commit_unknown_per_mille: per_mille(150),
                commit_hang_per_mille: per_mille(80),
                commit_late_per_mille: per_mille(150),
                abort_fail_per_mille: per_mille(300),
                connection_lost_after: self
                    .rng
                    .bool()
                    .then(|| Duration::from_millis(self.rng.u64(0..2_000))),
                shutdown_after: (self.rng.u8(0..3) == 0)
                    .then(|| Duration::from_millis(self.rng.u64(0..2_000))),
                unavailable_partition: (self.rng.u8(0..4) == 0)
                    .then(|| self.rng.usize(0..self.setup.partitions)),
                latency_max_ms: self.rng.u64(1..50),
                init_fails: self.rng.u8(0..10) == 0,
                ..Faults::default()
            },
        };
        if self.setup.ordered.is_some() {
            self.server.begin_session();
            if !last {
                Server::draw_faults(&mut self.rng, &mut self.faults);
            }
        }
        if last {
            self.faults.latency_max_ms = self.rng.u64(1..50);
        } else if self.faults.connection_lost_after.is_none()
            && self.faults.shutdown_after.is_none()
        {
            // A session with faults ends by one of them at the latest (over the ordered sink,
            // later: time for its server to go down and come back, and for the delivery
            // timeout).
            let latest = match self.setup.ordered {
                None => 2_000,
                Some(_) => 6_000,
            };
            self.faults.connection_lost_after =
                Some(Duration::from_millis(self.rng.u64(0..latest)));
        }
    }

    /// Draws whether something with a chance of `per_mille` / 1000 happens.
    pub fn chance(&mut self, per_mille: u16) -> bool {
        per_mille > 0 && self.rng.u16(0..1000) < per_mille
    }

    pub fn violate(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(what);
        }
    }

    /// The broker wrote `record`.
    pub fn write(&mut self, written: Written) {
        self.written.insert(written.id.clone());
        self.log.push(written);
    }

    /// The source handed the session transaction `txn`'s Commit.
    pub fn on_commit_read(&mut self, txn: usize) {
        self.session_txns.entry(txn).or_default().commit_read = true;
        self.check_tracker_bound();
    }

    /// The sink accepted the record of event `id`; `in_flight` counts it, `size` is the
    /// largest record in flight, and `dead_letter_bytes` those of dead-letter copies.
    pub fn on_sent(
        &mut self,
        id: &str,
        in_flight: InFlight,
        size: usize,
        dead_letter_bytes: usize,
    ) {
        if let Some(txn) = txn_of(id) {
            self.session_txns
                .entry(txn)
                .or_default()
                .sent
                .insert(id.to_owned());
        }
        let Setup {
            max_in_flight_events,
            max_in_flight_bytes,
            ..
        } = self.setup;
        if in_flight.events > max_in_flight_events {
            self.violate(format!(
                "{} records in flight, max_in_flight_events = {max_in_flight_events}",
                in_flight.events
            ));
        }
        // Reading stops at the limit: one record more may take it past, and so may the
        // dead-letter copies that replace refused records (their error headers are larger).
        // (The last record read need not be the largest: others may have been acknowledged.)
        if in_flight.bytes >= max_in_flight_bytes + size + dead_letter_bytes {
            self.violate(format!(
                "{} bytes in flight, the largest record {size}, {dead_letter_bytes} of dead-letter copies, max_in_flight_bytes = {max_in_flight_bytes}",
                in_flight.bytes
            ));
        }
        self.peak_in_flight.events = self.peak_in_flight.events.max(in_flight.events);
        self.peak_in_flight.bytes = self.peak_in_flight.bytes.max(in_flight.bytes);
    }

    /// The sink reported event `id` acknowledged.
    pub fn on_acknowledged(&mut self, id: &str) {
        if let Some(txn) = txn_of(id) {
            self.session_txns
                .entry(txn)
                .or_default()
                .acknowledged
                .insert(id.to_owned());
        }
    }

    /// The ack tracker's queue: committed transactions with records behind the first one not
    /// yet acknowledged in full stay within `max_in_flight_events`.
    fn check_tracker_bound(&mut self) {
        let mut blocked = false;
        let mut queued = 0;
        for txn in self.session_txns.values() {
            blocked |= !txn.commit_read || txn.sent.len() > txn.acknowledged.len();
            if blocked && txn.commit_read && !txn.sent.is_empty() {
                queued += 1;
            }
        }
        self.peak_unconfirmed = self.peak_unconfirmed.max(queued);
        let max = self.setup.max_in_flight_events;
        if queued > max {
            self.violate(format!(
                "{queued} committed transactions wait in the ack tracker, max_in_flight_events = {max}"
            ));
        }
    }

    /// The session confirmed `flush` to the slot: it never decreases and never passes an
    /// event that is not acknowledged (exactly-once: committed).
    pub fn on_confirm(&mut self, flush: Lsn) {
        if flush < self.slot {
            self.violate(format!(
                "flush LSN {flush} confirmed below the slot's confirmed LSN {}",
                self.slot
            ));
        }
        self.slot = flush;
        while let Some(txn) = self.wal.txns.get(self.covered) {
            if txn.final_lsn >= flush {
                break;
            }
            let missing = txn
                .events()
                .find(|e| !self.delivered(&e.id))
                .map(|e| e.id.clone());
            if let Some(id) = missing {
                let what = if self.setup.exactly_once {
                    "committed"
                } else {
                    "acknowledged"
                };
                let txn = txn.end_lsn;
                self.violate(format!(
                    "flush LSN {flush} passed event {id} (transaction ending at {txn}), which is not {what}"
                ));
            }
            self.covered += 1;
        }
        if flush >= self.wal.last_commit() {
            if let Some(done) = &self.done {
                done.cancel();
            }
        }
    }

    /// Whether event `id` reached the broker (exactly-once: is visible to `read_committed`;
    /// the ordered sink: its acknowledgement reached the session).
    fn delivered(&self, id: &str) -> bool {
        match self.setup.exactly_once {
            false if self.setup.ordered.is_some() => self.server.acknowledged.contains(id),
            false => self.written.contains(id),
            true => self
                .log
                .iter()
                .any(|w| w.id == id && self.coordinator.visible(w.txn)),
        }
    }

    /// After the last session: the flush LSN reached the last commit, every committed event
    /// reached the broker (exactly-once: is visible exactly once), and the first arrivals of
    /// each key are in commit order.
    pub fn check_end(&mut self) {
        self.coordinator
            .deliver_late(Instant::now() + Duration::from_secs(3_600));
        let last = self.wal.last_commit();
        if self.slot < last {
            self.violate(format!(
                "the flush LSN {} did not reach the last commit {last}",
                self.slot
            ));
        }
        let events: HashSet<&str> = self
            .wal
            .txns
            .iter()
            .flat_map(|t| t.events())
            .map(|e| e.id.as_str())
            .collect();
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        // Per key: the last first arrival, as (transaction, change).
        let mut last_of_key: BTreeMap<&str, (usize, usize, &str)> = BTreeMap::new();
        let mut problems = Vec::new();
        for w in &self.log {
            if !events.contains(w.id.as_str()) {
                problems.push(format!(
                    "record {} written to {} is no committed event",
                    w.id, w.topic
                ));
            }
            if !self.coordinator.visible(w.txn) {
                continue;
            }
            let count = seen.entry(w.id.as_str()).or_default();
            *count += 1;
            if *count > 1 || w.topic != TOPIC {
                continue;
            }
            if let (Some(key), Some(position)) = (w.key.as_deref(), position_of(&w.id)) {
                if let Some(&(t, n, previous)) = last_of_key.get(key) {
                    if (t, n) > position && !self.refused_after_send.contains(&w.id) {
                        problems.push(format!(
                            "key {key}: event {} arrived first after {previous}, which was committed after it",
                            w.id
                        ));
                    }
                }
                last_of_key.insert(key, (position.0, position.1, w.id.as_str()));
            }
        }
        for txn in &self.wal.txns {
            for event in txn.events() {
                match (seen.get(event.id.as_str()), self.setup.exactly_once) {
                    (None, _) => problems.push(format!(
                        "event {} of the transaction ending at {} never reached {}",
                        event.id,
                        txn.end_lsn,
                        if self.setup.exactly_once {
                            "a read_committed consumer"
                        } else {
                            "the broker"
                        }
                    )),
                    (Some(&n), true) if n > 1 => problems.push(format!(
                        "event {} visible {n} times to a read_committed consumer",
                        event.id
                    )),
                    _ => {}
                }
            }
        }
        if let Some(problem) = problems.into_iter().next() {
            self.violate(problem);
        }
    }
}

/// The transaction number of event `e<txn>.<n>`, or of its dead-letter copy.
pub(super) fn txn_of(id: &str) -> Option<usize> {
    position_of(id).map(|(txn, _)| txn)
}

/// Transaction and change number of event `e<txn>.<n>`.
fn position_of(id: &str) -> Option<(usize, usize)> {
    let (txn, n) = id.strip_prefix('e')?.split_once('.')?;
    Some((txn.parse().ok()?, n.parse().ok()?))
}
