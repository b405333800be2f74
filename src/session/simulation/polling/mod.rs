//! Deterministic simulation of the polling source: the real [`Session`] over the real
//! [`PollingSource`] (its cycle: the eligibility of each row, the marks, the charges, the
//! deadline of its COMMIT) reading a fake outbox table ([`table`]), and the real
//! [`crate::sink::ordered::OrderedSink`] over a fake server ([`sink`]), for several pollers at
//! once, each running sessions one after another as the supervisor does, all on one seeded
//! random source and tokio's paused clock.
//!
//! # What a schedule is
//! Drawn from its seed: 1-3 pollers of one table; `mark` (status, flag or delete), `batch_size`
//! 1-5, the in-flight limits, `max_attempts` 1-4 with retry delays of 10 ms to 2 s,
//! `failed_blocks_aggregate`, the poll intervals, `on_bad_event` (whether the sink holds a
//! key after a refusal), the sink's `max_concurrency` and delivery timeout, and whether
//! inserts wake the pollers (NOTIFY); 1-12 rows of 1-3 aggregates (one in ten with a NULL
//! aggregate id) inserted over 3 s. Each poller runs up to two sessions with faults, then one
//! without: connection loss at a random time (every statement from then on fails), a graceful
//! shutdown at a random time, COMMITs that fail before or after the server committed or hang
//! for up to 10 s, publish attempts that fail retryably (written or not), are refused for good
//! or get no answer, a server down for a while, a sink connection that breaks.
//!
//! # Invariants
//! Checked as the statements run: a row is marked published only after the sink reported its
//! acknowledgement to the session in the same cycle; an attempt (`retry_count`) is charged only
//! to a row tried in the cycle; a row becomes FAILED only after `max_attempts` attempts or when
//! its last attempt was refused for good; a cycle locks at most `batch_size` rows; a row marked
//! published (its COMMIT done) or FAILED is never published again (so the copies of a row are
//! bounded by the cycles that published it without their COMMIT going through); the in-flight
//! limits; a session stops within twice `shutdown_timeout` of the shutdown (the drain, then the
//! cycle's marks and COMMIT, each bounded by it). At the end: every row is marked published
//! (and was acknowledged), FAILED, or pending behind a FAILED row of its aggregate that blocks
//! it; the server wrote only rows; the first arrivals of each aggregate's rows are in
//! `(created_at, id)` order.
//!
//! # Not modelled
//! The table's SQL itself (its conditions are the fake's, checked against PostgreSQL by the
//! polling e2e tests); rows inserted out of `created_at` order; the retention purge; a Kafka
//! sink; the supervisor's backoff between sessions.

mod sink;
mod table;
mod world;

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::Notify;
use tokio::time::{sleep_until, timeout, Instant};
use tokio_util::sync::CancellationToken;

use super::super::{Mode, Session};
use super::ROUTER;
use crate::config::{OnBadEvent, PipelineConfig, PollingConfig, SourceKind};
use crate::error::Recovery;
use crate::lsn::Lsn;
use crate::metrics::{Metrics, PipelineMetrics};
use crate::router::Router;
use crate::source::polling::PollingSource;
use crate::supervisor::SessionProgress;
use sink::PollSink;
use table::FakeTable;
use world::{Setup, Shared, World};

/// Schedules in the test command.
pub(crate) const DEFAULT_POLLING_SCHEDULES: u64 = 1_000;
/// Most sessions with faults per poller before its last one.
const MAX_FAULTY_SESSIONS: usize = 2;
/// How long after the last insert every row must be settled.
const LIVENESS_DEADLINE: Duration = Duration::from_secs(300);

thread_local! {
    static METRICS: PipelineMetrics = Metrics::new().pipeline("main");
}

/// What one schedule did, for the run's summary.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Summary {
    pub pollers: usize,
    pub sessions: usize,
    pub rows: usize,
    pub records_written: usize,
    pub commits: usize,
    /// Rows FAILED at the end.
    pub failed: usize,
}

/// Runs the schedule of `seed`.
///
/// Returns the first invariant it violated.
pub(crate) fn run_schedule(seed: u64) -> Result<Summary, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(schedule(seed))
}

async fn schedule(seed: u64) -> Result<Summary, String> {
    let world = Shared::new(World::new(seed));
    let metrics = METRICS.with(PipelineMetrics::clone);
    let pollers = world.lock().setup.pollers;
    let (sessions, ()) = futures::join!(
        join_all((0..pollers).map(|p| poller(&world, &metrics, p))),
        insert_rows(&world)
    );
    let mut w = world.lock();
    if w.violation.is_none() {
        w.check_end();
    }
    match w.violation.take() {
        Some(violation) if std::env::var_os("SIMULATION_SEED").is_some() => Err(format!(
            "{violation}\n{:?}\n{}\nrows: {:?}\nwritten: {:?}",
            w.setup,
            w.notes.join("\n"),
            w.rows
                .iter()
                .map(|r| format!("{}/{:?}/{:?}/{}", r.id, r.key, r.state, r.retry_count))
                .collect::<Vec<_>>(),
            w.log.iter().map(|r| r.id.as_str()).collect::<Vec<_>>()
        )),
        Some(violation) => Err(violation),
        None => Ok(Summary {
            pollers,
            sessions: sessions.iter().sum(),
            rows: w.rows.len(),
            records_written: w.log.len(),
            commits: w.commits,
            failed: w
                .rows
                .iter()
                .filter(|r| r.state == world::RowState::Failed)
                .count(),
        }),
    }
}

/// Inserts the schedule's rows at their times.
async fn insert_rows(world: &Shared) {
    let (origin, inserts) = {
        let w = world.lock();
        (w.origin, w.inserts.clone())
    };
    for (at, key) in inserts {
        sleep_until(origin + at).await;
        world.lock().insert(key);
    }
    let mut w = world.lock();
    w.inserted_all = true;
    w.check_done();
}

/// One poller: its sessions with faults, then one without until every row is settled.
/// Returns how many sessions it ran.
async fn poller(world: &Shared, metrics: &PipelineMetrics, poller: usize) -> usize {
    let faulty = world.lock().rng.usize(0..=MAX_FAULTY_SESSIONS);
    let mut n = 0;
    loop {
        let last = n >= faulty;
        let end = session(world, metrics, poller, last).await;
        let mut w = world.lock();
        let note = format!(
            "poller {poller} session {n} (last: {last}) {:?} ended: {end:?}",
            w.sessions[poller].faults
        );
        w.notes.push(note);
        n += 1;
        if w.violation.is_some() {
            return n;
        }
        match end {
            End::Stopped if last => return n,
            End::Failed(e) | End::Halted(e) if last => {
                w.violate(format!(
                    "poller {poller}'s session without faults failed: {e}"
                ));
                return n;
            }
            End::Abandoned => return n,
            // A refusal for good halts a pipeline without retry bookkeeping until the
            // operator restarts it; the refusal was the session's fault.
            End::Stopped | End::Failed(_) | End::Halted(_) => {}
        }
    }
}

#[derive(Debug)]
enum End {
    /// Ended after a shutdown.
    Stopped,
    Failed(String),
    /// Stopped the pipeline (a refusal for good without retry bookkeeping): the operator
    /// starts it again.
    Halted(String),
    /// Did not end in time (a violation says so).
    Abandoned,
}

/// The pipeline's configuration.
fn pipeline_config(setup: &Setup) -> PipelineConfig {
    PipelineConfig {
        source_kind: SourceKind::Polling,
        max_in_flight_events: setup.max_in_flight_events,
        max_in_flight_bytes: setup.max_in_flight_bytes,
        status_interval_ms: setup.status_interval_ms,
        shutdown_timeout_secs: setup.shutdown_timeout_secs,
        on_bad_event: match setup.halt {
            true => OnBadEvent::Halt,
            false => OnBadEvent::DeadLetter,
        },
        dead_letter_topic: (!setup.halt).then(|| super::wal::DEAD_LETTER_TOPIC.into()),
        polling: PollingConfig {
            batch_size: setup.batch_size,
            min_interval_ms: setup.min_interval_ms,
            max_interval_ms: setup.max_interval_ms,
            mark: setup.mark,
            max_attempts: setup.max_attempts,
            retry_min_ms: setup.retry_min_ms,
            retry_max_ms: setup.retry_max_ms,
            failed_blocks_aggregate: setup.failed_blocks_aggregate,
            stats_interval_ms: setup.stats_interval_ms,
            ..PollingConfig::default()
        },
        ..PipelineConfig::test_pipeline()
    }
}

/// Session `n` of `poller`, set up as `polling::session` does; `last`: without faults, until
/// every row is settled.
async fn session(world: &Shared, metrics: &PipelineMetrics, poller: usize, last: bool) -> End {
    let notify = Arc::new(Notify::new());
    let (config, shutdown_after, done, liveness_deadline) = {
        let mut w = world.lock();
        w.begin_session(poller, last);
        w.notifies[poller] = Some(notify.clone());
        let last_insert = w.inserts.last().map_or(Duration::ZERO, |(at, _)| *at);
        (
            pipeline_config(&w.setup),
            w.sessions[poller].faults.shutdown_after,
            w.done.clone(),
            (w.origin + last_insert).max(Instant::now()) + LIVENESS_DEADLINE,
        )
    };
    let router = ROUTER.with(Router::clone);
    let shutdown = CancellationToken::new();
    let source = PollingSource::new(
        &config,
        metrics.clone(),
        FakeTable::new(world.clone(), poller),
        notify,
        &shutdown,
    );
    let progress = SessionProgress::new(metrics.clone());
    let mut run = std::pin::pin!(Session::new(
        &config,
        metrics,
        source,
        PollSink::new(world.clone(), poller, &config),
        router,
        Mode::AtLeastOnce,
        Lsn::ZERO,
        &progress,
    )
    .run(&shutdown, config.status_interval()));
    let session_start = Instant::now();
    let shutdown_at = shutdown_after.map(|after| session_start + after);
    let result = tokio::select! {
        biased;
        result = &mut run => Some(result),
        _ = sleep_until(shutdown_at.unwrap_or(session_start)), if shutdown_at.is_some() => None,
        _ = done.cancelled(), if last => None,
        _ = sleep_until(liveness_deadline) => {
            let mut w = world.lock();
            let pending: Vec<String> = w
                .rows
                .iter()
                .filter(|r| r.state == world::RowState::Pending)
                .map(|r| format!("{} (retry_count {})", r.id, r.retry_count))
                .collect();
            let kind = if last { "without" } else { "with" };
            w.violate(format!(
                "poller {poller}'s session {kind} faults did not end within {LIVENESS_DEADLINE:?} of the last insert; rows still pending: {pending:?}"
            ));
            return End::Abandoned;
        }
    };
    let result = match result {
        Some(result) => result,
        None => {
            shutdown.cancel();
            // The drain, then the cycle's marks and COMMIT, each within the timeout (and the
            // timer wheel's millisecond).
            let deadline = config.shutdown_timeout() * 2 + Duration::from_millis(2);
            match timeout(deadline, &mut run).await {
                Ok(result) => result,
                Err(_) => {
                    world.lock().violate(format!(
                        "poller {poller}'s session did not end within {deadline:?} of the shutdown"
                    ));
                    return End::Abandoned;
                }
            }
        }
    };
    world.lock().notifies[poller] = None;
    match result {
        Ok(()) => End::Stopped,
        Err(e) if e.recovery() == Recovery::Stop => End::Halted(crate::error::chain(&e)),
        Err(e) => End::Failed(crate::error::chain(&e)),
    }
}

/// Runs `seeds` and returns how many ran, the first failing seed with its violation, and the
/// run's totals.
fn find_violation(seeds: std::ops::Range<u64>) -> (u64, Option<(u64, String)>, Summary) {
    let mut total = Summary::default();
    let mut ran = 0;
    for seed in seeds {
        ran += 1;
        match run_schedule(seed) {
            Ok(s) => {
                total.pollers += s.pollers;
                total.sessions += s.sessions;
                total.rows += s.rows;
                total.records_written += s.records_written;
                total.commits += s.commits;
                total.failed += s.failed;
            }
            Err(violation) => return (ran, Some((seed, violation)), total),
        }
    }
    (ran, None, total)
}

#[cfg(test)]
mod tests {
    use super::super::super::mutation::{self, Mutation};
    use super::*;

    #[test]
    fn every_schedule_polling() {
        let started = std::time::Instant::now();
        let (ran, failure, total) = find_violation(super::super::seeds(DEFAULT_POLLING_SCHEDULES));
        if let Some((seed, violation)) = failure {
            panic!(
                "invariant violated in schedule {seed}: {violation}\nreplay: SIMULATION_SEED={seed} cargo test --locked --lib session::simulation::polling::tests::every_schedule_polling -- --exact --nocapture"
            );
        }
        println!(
            "{ran} polling schedules ({} pollers, {} sessions, {} rows ({} FAILED at the end), {} records written, {} cycles committed) in {:.1} s",
            total.pollers,
            total.sessions,
            total.rows,
            total.failed,
            total.records_written,
            total.commits,
            started.elapsed().as_secs_f64()
        );
    }

    /// Found by the simulation (schedule 6509): with `on_bad_event = "dead_letter"`, the
    /// ordered sink under a polling source did not hold a key after a refusal, although the
    /// polling source never dead-letters a refused row; the key's next row reached the server
    /// first, and the refused one came after it once the pipeline ran again. (A seed names a
    /// schedule only as long as the generator draws the same; `sink::any`'s tests have the
    /// setting itself.)
    #[test]
    fn a_refused_row_holds_its_aggregate_whatever_on_bad_event_says() {
        run_schedule(6509).unwrap();
    }

    /// Found by the simulation (schedule 57593): with `failed_blocks_aggregate = false`, a
    /// row refused for good let the aggregate's next row of the batch go out at once; the
    /// cycle's COMMIT did not go through, so the refused row stayed pending, was published
    /// again, and arrived after the next one.
    #[test]
    fn a_refused_row_is_passed_only_once_its_failed_mark_is_committed() {
        run_schedule(57593).unwrap();
    }

    /// Runs the default schedules with `mutation` on until one violates an invariant whose
    /// message contains `expected`.
    fn caught(mutation: Mutation, expected: &str) {
        let _on = mutation::switch_on(mutation);
        let (ran, failure, _) = find_violation(0..DEFAULT_POLLING_SCHEDULES);
        match failure {
            Some((seed, violation)) => {
                println!(
                    "{mutation:?} caught by schedule {seed}, after {ran} schedules: {violation}"
                );
                assert!(
                    violation.contains(expected),
                    "{mutation:?} caught by schedule {seed}, but not as {expected:?}: {violation}"
                );
            }
            None => panic!("{mutation:?} survived {ran} schedules"),
        }
    }

    #[test]
    fn the_simulation_catches_a_row_marked_published_before_its_acknowledgement() {
        caught(
            Mutation::PollingMarkUnacknowledged,
            "before the sink reported its acknowledgement",
        );
    }

    #[test]
    fn the_simulation_catches_an_attempt_charged_to_a_row_never_tried() {
        caught(Mutation::PollingChargeUntried, "not tried in this cycle");
    }

    #[test]
    fn the_simulation_catches_a_row_failed_before_its_last_attempt() {
        caught(
            Mutation::PollingFailAtOnce,
            "its last attempt was not refused",
        );
    }

    #[test]
    fn the_simulation_catches_a_polling_stop_past_its_deadline() {
        caught(Mutation::PollingFinishForever, "of the shutdown");
    }

    #[test]
    fn the_simulation_catches_a_polled_aggregate_out_of_order() {
        caught(Mutation::PollingIgnoreOlder, "arrived first after");
    }

    #[test]
    fn the_simulation_catches_a_poller_that_stops_polling() {
        caught(Mutation::PollingNoRetry, "did not end within");
    }

    #[test]
    fn the_simulation_catches_a_cycle_past_its_batch_size() {
        caught(Mutation::PollingUnboundedBatch, "batch_size");
    }

    #[test]
    fn the_simulation_catches_a_published_row_published_again() {
        caught(
            Mutation::PollingSelectMarked,
            "again after its published mark was committed",
        );
    }
}
