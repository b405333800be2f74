//! What the polling simulation's fakes share: the seeded random source, the outbox table's
//! rows (committed state, row locks, what each cycle did with its rows), the server's log,
//! each poller's faults, and the checks run at the end of a schedule.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fastrand::Rng;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::MarkMode;

/// The world of one schedule, behind a lock the fakes share (one thread; the lock is never
/// held across an await).
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

/// How a schedule's pipelines are set up, drawn once per schedule (every poller alike).
#[derive(Clone, Copy, Debug)]
pub(super) struct Setup {
    pub pollers: usize,
    pub mark: MarkMode,
    pub batch_size: usize,
    pub max_in_flight_events: usize,
    pub max_in_flight_bytes: usize,
    pub max_attempts: u32,
    pub retry_min_ms: u64,
    pub retry_max_ms: u64,
    pub failed_blocks_aggregate: bool,
    pub min_interval_ms: u64,
    pub max_interval_ms: u64,
    pub stats_interval_ms: u64,
    pub status_interval_ms: u64,
    pub shutdown_timeout_secs: u64,
    /// `on_bad_event = "halt"`, else `"dead_letter"`.
    pub halt: bool,
    pub max_concurrency: usize,
    pub delivery_timeout: Duration,
    /// Inserts wake the pollers (LISTEN / NOTIFY).
    pub notify: bool,
}

/// What goes wrong in one session of one poller, drawn at its start; nothing in the last.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Faults {
    /// Since the session's start: every statement from then on fails (the connection is
    /// gone, its transaction rolled back).
    pub connection_lost_after: Option<Duration>,
    pub shutdown_after: Option<Duration>,
    /// Per mille of COMMITs that fail before the server committed, that fail after it
    /// committed (the client does not learn the outcome), and that hang for a while (a
    /// synchronous standby that is down) before they complete.
    pub commit_fail_before_per_mille: u16,
    pub commit_fail_after_per_mille: u16,
    pub commit_hang_per_mille: u16,
    /// Per mille of publish attempts that fail retryably (the server may have written the
    /// record), that are refused for good, and that get no answer.
    pub retryable_per_mille: u16,
    pub permanent_per_mille: u16,
    pub silent_per_mille: u16,
    pub latency_max_ms: u64,
    /// From when and until when (since the session's start) the server is down.
    pub server_down: Option<(Duration, Duration)>,
    /// When the sink's connection breaks for good.
    pub broken_after: Option<Duration>,
}

/// A row's committed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RowState {
    Pending,
    /// `status = 'PUBLISHED'` or `published = true`.
    Published,
    Failed,
    /// `mark = "delete"` deleted it.
    Deleted,
}

/// One outbox row: its committed state, its lock, and what the cycle holding it did.
#[derive(Clone, Debug)]
pub(super) struct Row {
    /// `r<seq>`; `(created_at, id)` order is `seq` order.
    pub id: String,
    pub seq: usize,
    /// The aggregate id (`None`: NULL, no order).
    pub key: Option<String>,
    pub state: RowState,
    pub retry_count: u32,
    pub next_retry_at: Option<Instant>,
    /// The transaction holding its lock.
    pub locked_by: Option<u64>,
    /// In the cycle holding it: an attempt reached the server; the last one was refused for
    /// good; the sink reported its acknowledgement to the session.
    pub tried: bool,
    pub last_refused: bool,
    pub ack_reported: bool,
    /// An acknowledgement of it ever reached a session.
    pub acknowledged: bool,
}

/// A record the server wrote, in the order written.
#[derive(Clone, Debug)]
pub(super) struct Written {
    pub id: String,
    pub key: Option<String>,
}

/// One poller's current session.
#[derive(Clone, Debug)]
pub(super) struct PollerSession {
    pub start: Instant,
    pub faults: Faults,
}

/// The world of one schedule.
pub(super) struct World {
    pub rng: Rng,
    pub setup: Setup,
    pub origin: Instant,
    /// Inserts to come: when (since the origin) and the aggregate id.
    pub inserts: Vec<(Duration, Option<String>)>,
    pub rows: Vec<Row>,
    pub log: Vec<Written>,
    pub sessions: Vec<PollerSession>,
    /// Each poller's LISTEN wake-up, while a session runs.
    pub notifies: Vec<Option<Arc<Notify>>>,
    pub next_txn: u64,
    /// Cancelled once every row is inserted and settled (or on a violation): the last
    /// sessions stop.
    pub done: CancellationToken,
    pub inserted_all: bool,
    pub violation: Option<String>,
    pub notes: Vec<String>,
    /// Cycles that committed, for the run's summary.
    pub commits: usize,
}

impl World {
    pub fn new(seed: u64) -> World {
        let mut rng = Rng::with_seed(seed);
        let retry_min_ms = rng.u64(10..=300);
        let min_interval_ms = rng.u64(1..=50);
        let setup = Setup {
            pollers: rng.usize(1..=3),
            mark: match rng.u8(0..4) {
                0 => MarkMode::Flag,
                1 => MarkMode::Delete,
                _ => MarkMode::Status,
            },
            batch_size: rng.usize(1..=5),
            max_in_flight_events: rng.usize(1..=6),
            max_in_flight_bytes: rng.usize(300..4_000),
            max_attempts: rng.u32(1..=4),
            retry_min_ms,
            retry_max_ms: rng.u64(retry_min_ms..=2_000),
            failed_blocks_aggregate: rng.bool(),
            min_interval_ms,
            max_interval_ms: rng.u64(min_interval_ms..=1_000),
            stats_interval_ms: rng.u64(100..=2_000),
            status_interval_ms: rng.u64(200..=1_000),
            shutdown_timeout_secs: rng.u64(1..=3),
            halt: rng.bool(),
            max_concurrency: rng.usize(1..=4),
            delivery_timeout: Duration::from_millis(rng.u64(300..=3_000)),
            notify: rng.bool(),
        };
        let keys = rng.usize(1..=3);
        let mut inserts: Vec<(Duration, Option<String>)> = (0..rng.usize(1..=12))
            .map(|_| {
                let key = (rng.u8(0..10) != 0).then(|| format!("k{}", rng.usize(0..keys)));
                (Duration::from_millis(rng.u64(0..3_000)), key)
            })
            .collect();
        inserts.sort_by_key(|(at, _)| *at);
        World {
            rng,
            setup,
            origin: Instant::now(),
            inserts,
            rows: Vec::new(),
            log: Vec::new(),
            sessions: (0..setup.pollers)
                .map(|_| PollerSession {
                    start: Instant::now(),
                    faults: Faults::default(),
                })
                .collect(),
            notifies: vec![None; setup.pollers],
            next_txn: 0,
            done: CancellationToken::new(),
            inserted_all: false,
            violation: None,
            notes: Vec::new(),
            commits: 0,
        }
    }

    /// Starts session `n` of `poller`: draws its faults (none if `last`).
    pub fn begin_session(&mut self, poller: usize, last: bool) {
        let rng = &mut self.rng;
        let mut per_mille = |max: u16| if rng.bool() { rng.u16(0..=max) } else { 0 };
        let mut faults = match last {
            true => Faults::default(),
            false => Faults {
                commit_fail_before_per_mille: per_mille(150),
                commit_fail_after_per_mille: per_mille(150),
                commit_hang_per_mille: per_mille(300),
                retryable_per_mille: per_mille(150),
                permanent_per_mille: per_mille(60),
                silent_per_mille: per_mille(60),
                ..Faults::default()
            },
        };
        faults.latency_max_ms = self.rng.u64(1..50);
        if !last {
            let rng = &mut self.rng;
            faults.connection_lost_after =
                rng.bool().then(|| Duration::from_millis(rng.u64(0..4_000)));
            faults.shutdown_after =
                (rng.u8(0..3) == 0).then(|| Duration::from_millis(rng.u64(0..4_000)));
            faults.server_down = (rng.u8(0..3) == 0).then(|| {
                let from = Duration::from_millis(rng.u64(0..2_000));
                (from, from + Duration::from_millis(rng.u64(0..4_000)))
            });
            faults.broken_after =
                (rng.u8(0..4) == 0).then(|| Duration::from_millis(rng.u64(0..4_000)));
            if faults.connection_lost_after.is_none() && faults.shutdown_after.is_none() {
                faults.connection_lost_after = Some(Duration::from_millis(rng.u64(0..8_000)));
            }
        }
        self.sessions[poller] = PollerSession {
            start: Instant::now(),
            faults,
        };
    }

    /// Draws whether something with a chance of `per_mille` / 1000 happens.
    pub fn chance(&mut self, per_mille: u16) -> bool {
        per_mille > 0 && self.rng.u16(0..1000) < per_mille
    }

    pub fn violate(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(what);
        }
        self.done.cancel();
    }

    /// The row of event `id` (`r<seq>`).
    pub fn row_mut(&mut self, id: &str) -> Option<&mut Row> {
        let seq: usize = id.strip_prefix('r')?.parse().ok()?;
        self.rows.get_mut(seq)
    }

    /// Inserts the next row (committed at once), waking the pollers that listen.
    pub fn insert(&mut self, key: Option<String>) {
        let seq = self.rows.len();
        self.rows.push(Row {
            id: format!("r{seq}"),
            seq,
            key,
            state: RowState::Pending,
            retry_count: 0,
            next_retry_at: None,
            locked_by: None,
            tried: false,
            last_refused: false,
            ack_reported: false,
            acknowledged: false,
        });
        if self.setup.notify {
            for notify in self.notifies.iter().flatten() {
                notify.notify_one();
            }
        }
    }

    /// Whether `row` waits for nothing more: marked published, FAILED, or pending behind a
    /// FAILED row of its aggregate that blocks it.
    fn settled(&self, row: &Row) -> bool {
        match row.state {
            RowState::Published | RowState::Deleted | RowState::Failed => true,
            RowState::Pending => self.behind_failed(row),
        }
    }

    fn behind_failed(&self, row: &Row) -> bool {
        self.setup.failed_blocks_aggregate
            && row.key.is_some()
            && self.rows[..row.seq]
                .iter()
                .any(|p| p.key == row.key && p.state == RowState::Failed)
    }

    /// Ends the schedule once every row is inserted and settled.
    pub fn check_done(&mut self) {
        if self.inserted_all && self.rows.iter().all(|r| self.settled(r)) {
            self.done.cancel();
        }
    }

    /// After the last sessions: every row settled; a row marked published was acknowledged;
    /// the server wrote only rows; each key's rows first arrived in `(created_at, id)` order.
    pub fn check_end(&mut self) {
        let mut problems = Vec::new();
        for row in &self.rows {
            match row.state {
                RowState::Published | RowState::Deleted if !row.acknowledged => problems.push(
                    format!("row {} marked published but never acknowledged", row.id),
                ),
                RowState::Failed if self.setup.mark != MarkMode::Status => {
                    problems.push(format!("row {} FAILED without mark = \"status\"", row.id))
                }
                RowState::Pending if !self.behind_failed(row) => problems.push(format!(
                    "row {} still pending at the end (retry_count {})",
                    row.id, row.retry_count
                )),
                _ => {}
            }
        }
        let mut first: BTreeMap<&str, ()> = BTreeMap::new();
        let mut last_of_key: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
        for w in &self.log {
            let Some(seq) = w.id.strip_prefix('r').and_then(|s| s.parse::<usize>().ok()) else {
                problems.push(format!("record {} written is no row", w.id));
                continue;
            };
            if seq >= self.rows.len() {
                problems.push(format!("record {} written is no row", w.id));
                continue;
            }
            if first.insert(w.id.as_str(), ()).is_some() {
                continue;
            }
            if let Some(key) = w.key.as_deref() {
                if let Some(&(before, previous)) = last_of_key.get(key) {
                    if before > seq {
                        problems.push(format!(
                            "key {key}: row {} arrived first after {previous}, which was created after it",
                            w.id
                        ));
                    }
                }
                last_of_key.insert(key, (seq, w.id.as_str()));
            }
        }
        if let Some(problem) = problems.into_iter().next() {
            self.violate(problem);
        }
    }
}
