//! Deterministic simulation of the session loop: the real [`Session`] over the real
//! log-tailing source ([`LogicalSource`], its pgoutput decoding and outbox mapping) reading a
//! fake walsender, and a fake Kafka or the real [`crate::sink::ordered::OrderedSink`] over a
//! fake server ([`publisher`]), all driven by one seeded random source on tokio's
//! paused clock, for sessions one after another as the supervisor runs them. Invariants are
//! checked after every step (each status update, each record sent, each Commit read) and at
//! the end of each schedule.
//!
//! # What a schedule is
//! Drawn from its seed: the pipeline's limits (`max_in_flight_events` 1-6,
//! `max_in_flight_bytes` 400-6000, a producer queue that may hold fewer records, the
//! producer's and the broker's record size limits, a few KB: room for a dead-letter copy's
//! document), at-least-once with or without
//! `on_bad_event = "dead_letter"`, or exactly-once; a WAL of 1-4 transactions of 0-5 changes
//! (outbox inserts and transactional logical messages with the prefix, which are events;
//! inserts into another table and messages with another prefix, which are not; a
//! non-transactional message with the prefix now and then; overlapping transactions; one
//! `ALTER TABLE` of the outbox that moves every column; exactly-once: up to 6 transactions,
//! some in bursts a few ms apart) committing at random times; exactly-once: batch limits (1
//! to 4 or 1000 transactions, 50-2000 bytes or none, a linger of 0-20 ms), so that Kafka
//! transactions of several PostgreSQL transactions commit, fail, hang, and meet connection
//! loss and shutdown while open (the run's summary counts those committed and aborted); then up to
//! three sessions, each with its own faults: connection loss at a random time, a graceful
//! shutdown at a random time, retryable record failures (the partition's later records time
//! out too, as with the idempotent producer), records refused for good by the broker, records
//! the producer refuses at send, a full producer queue, a partition that never acknowledges,
//! random latencies (acknowledgements in order within a partition, in any order across
//! them), keepalives with and without a reply requested; exactly-once: a registration that
//! fails, commits that succeed, fail, hang for the call's whole timeout, whose outcome the
//! client does not learn, or whose request reaches the coordinator only after the next
//! session's registration, and aborts that fail. A session that ends with an error classed
//! [`Recovery::Stop`] is followed by the operator's fix (`on_bad_event = "dead_letter"`); the
//! last session has no faults and runs until the slot reached the last commit.
//!
//! Over the ordered sink (a mode of its own, at-least-once): `max_concurrency` 1-4 and a
//! delivery timeout of 0.3-5 s, and in each session with faults: random latencies, retryable
//! errors before and after the server wrote the record, refusals for good, attempts without an
//! answer, the server down for a while and back, the connection broken for good (a session
//! that draws neither a connection loss nor a shutdown loses its source connection within
//! 6 s, not 2, to leave time for these).
//!
//! # Invariants
//! The flush LSN never decreases (across sessions: never below the slot); never passes the
//! commit record of a transaction with an event the broker did not write (exactly-once: that
//! a `read_committed` consumer does not see); reaches the last commit in the last session;
//! every committed event reaches the broker (exactly-once: is visible exactly once); the first
//! arrivals of each key are in commit order (exactly-once: of the visible records), except
//! after an event the broker refused for good once it was sent (a known limit, docs/concepts/guarantees.md: a
//! later record of its key may be acknowledged first); records and bytes in flight stay
//! within the limits (bytes: one record past the limit, plus the larger headers of the
//! dead-letter copies that replace refused records), and so do the committed transactions
//! queued behind an unacknowledged one in the ack tracker; a shutdown completes within
//! `shutdown_timeout` (exactly-once: plus the commit call's and the abort's timeouts, 60 s
//! and 10 s, which the drain cannot cut short); nothing but committed events is written.
//! Over the ordered sink the flush LSN passes only events whose acknowledgement reached the
//! session (a record the server wrote without its acknowledgement arriving does not count);
//! the order exemption is for records refused with a dead-letter topic only (with `halt` a
//! refusal holds its key); within a session the session hands each record over once and the
//! sink publishes none again after the server acknowledged it (so the copies of an event are
//! at most the sessions that published it plus its lost acknowledgements); no more than
//! `max_concurrency` attempts wait for an answer at once.
//!
//! # The coordinator model
//! librdkafka's mock cluster writes no transaction markers and does not fence, and no broker
//! with working transactions can be installed here, so [`broker`] models what a real
//! coordinator does: records of an aborted or open transaction are hidden from
//! `read_committed` readers (the checkpoint read back at a session's start included); a
//! registration (`InitProducerId`) bumps the producer epoch and aborts the open transaction;
//! a request with an older epoch is fenced; a commit the coordinator accepted completes even
//! when the client saw a timeout. The producer's side: after a record of the transaction
//! failed, librdkafka refuses every further record and the commit until the abort.
//!
//! The polling source has a simulation of its own ([`polling`]): the real cycle over a fake
//! outbox table, several pollers at once, over the real ordered sink.
//!
//! # Not modelled
//! The clients of
//! the ordered sink's servers (reconnecting, what each calls an acknowledgement); UPDATE and
//! DELETE of outbox rows; PostgreSQL losing a confirmed flush LSN in a crash; several relays
//! at once (a standby is the supervisor's test); the supervisor's backoff (its jitter is not
//! seeded; sessions follow each other at once); keepalives inside a transaction.
//! Exactly-once with a dead-letter topic runs as a third mode: the schedule carries the
//! pipeline's [`Redo`] from session to session as `pipeline.rs` does.
//!
//! # Why a scheduler of its own
//! The session drives its fakes (it decides when to read, send and confirm); the fakes only
//! answer, so the schedule is a stream of random answers, not a sequence of operations a
//! state machine test (proptest-state-machine) applies to a system. turmoil and madsim
//! simulate networks and hosts, which the loop does not have. A seed per schedule with
//! [`fastrand`] costs nothing per case, where proptest's runner and its shrinking would at
//! 100,000 cases, and a seed replays exactly: one thread, tokio's paused clock, a `biased`
//! select, no hash-order iteration in the fakes.
//!
//! # Running it
//! `cargo test --locked` runs [`DEFAULT_SCHEDULES`] schedules in each of the three modes
//! (at-least-once, exactly-once, exactly-once with a dead-letter topic; in a debug build about
//! 0.7 ms of CPU each: 35 s for the first two on the 2-core development machine otherwise idle,
//! run at once, and about 30 s for the third), [`DEFAULT_ORDERED_SCHEDULES`] over the
//! ordered sink (about 0.8 ms each: 8 s), and [`polling::DEFAULT_POLLING_SCHEDULES`] of the
//! polling source (2 to 5 ms each: 2 to 5 s). Each test `the_simulation_catches_...`
//! switches one deliberate defect on ([`super::mutation`]) and asserts that the default
//! schedules find it. A longer run: `SIMULATION_SCHEDULES=5000000 cargo test --release
//! --locked --lib session::simulation::tests::every_schedule` (5 million per mode; for the
//! first two modes 6.5 minutes on the 2-core development machine, none failing);
//! `SIMULATION_FIRST_SEED`
//! starts at another seed. A failure prints its seed and the command that replays it
//! (`SIMULATION_SEED=...`).

mod broker;
mod polling;
mod publisher;
mod server;
mod wal;
mod world;

use std::time::Duration;

use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_util::sync::CancellationToken;

use super::mutation::{self, Mutation};
use super::{Mode, Session};
use crate::config::{OnBadEvent, PipelineConfig};
use crate::error::{Error, Recovery};
use crate::exactly_once::{Checkpoint, ExactlyOnce, Redo, Transactions};
use crate::metrics::{Metrics, PipelineMetrics};
use crate::router::Router;
use crate::source::logical::LogicalSource;
use crate::source::outbox::OutboxDecoder;
use crate::supervisor::SessionProgress;
use broker::{SimSink, SimTransactions};
use publisher::SimOrderedSink;
use server::FakeWalsender;
use wal::{DEAD_LETTER_TOPIC, MESSAGE_PREFIX, OUTBOX_OID};
use world::{Guarantee, Setup, Shared, World};

/// Schedules per mode in the test command.
pub(crate) const DEFAULT_SCHEDULES: u64 = 50_000;
/// Schedules over the ordered sink in the test command (each runs the sink's publishing task
/// too, and its retries' backoff makes sessions longer).
pub(crate) const DEFAULT_ORDERED_SCHEDULES: u64 = 10_000;

/// Schedules of `guarantee` in the test command.
fn default_schedules(guarantee: Guarantee) -> u64 {
    match guarantee {
        Guarantee::AtLeastOnceOrdered => DEFAULT_ORDERED_SCHEDULES,
        _ => DEFAULT_SCHEDULES,
    }
}
/// Most sessions with faults before the last one.
const MAX_FAULTY_SESSIONS: usize = 3;
/// How long the last session may take to reach the last commit after it committed.
const LIVENESS_DEADLINE: Duration = Duration::from_secs(300);

thread_local! {
    /// Metric handles and the router, shared by the schedules of a thread: nothing checks
    /// the metrics, every schedule routes alike, and building them costs about as much as a
    /// schedule.
    static METRICS: PipelineMetrics = Metrics::new().pipeline("main");
    static ROUTER: Router = Router::new(&PipelineConfig {
        on_bad_event: OnBadEvent::DeadLetter,
        dead_letter_topic: Some(DEAD_LETTER_TOPIC.into()),
        message_prefix: Some(MESSAGE_PREFIX.into()),
        ..PipelineConfig::test_pipeline()
    })
    .expect("the simulation's routing is valid");
}

/// What one schedule did, for the run's summary.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Summary {
    pub sessions: usize,
    pub events: usize,
    pub records_written: usize,
    /// Exactly-once: Kafka transactions with records of several PostgreSQL transactions,
    /// committed and aborted.
    pub batches_committed: usize,
    pub batches_aborted: usize,
}

/// Runs the schedule of `seed`, exactly-once or not.
///
/// Returns the first invariant it violated.
pub(crate) fn run_schedule(seed: u64, guarantee: Guarantee) -> Result<Summary, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(schedule(seed, guarantee))
}

async fn schedule(seed: u64, guarantee: Guarantee) -> Result<Summary, String> {
    let world = Shared::new(World::new(seed, guarantee));
    let metrics = METRICS.with(PipelineMetrics::clone);
    let faulty = world.lock().rng.usize(0..=MAX_FAULTY_SESSIONS);
    let mut fixed = false;
    // What the pipeline keeps between sessions in exactly-once mode: the events Kafka refused
    // for good, dead-lettered when their transaction is redone.
    let mut redo = Redo::default();
    let mut n = 0;
    loop {
        let last = fixed || n >= faulty;
        let end = session(&world, &metrics, n, last, fixed, &mut redo).await;
        {
            let mut w = world.lock();
            let note = format!(
                "session {n} (last: {last}, fixed: {fixed}) {:?} ended: {}; slot {}",
                w.faults,
                match &end {
                    End::Stopped => "stopped".to_owned(),
                    End::Failed(recovery, e) => format!("{recovery:?}: {e}"),
                    End::Redo(e) => format!("redo: {e}"),
                    End::Abandoned => "abandoned".to_owned(),
                },
                w.slot
            );
            w.notes.push(note);
        }
        n += 1;
        if world.lock().violation.is_some() {
            break;
        }
        match end {
            End::Stopped if last => break,
            End::Stopped => {}
            // Bad input halts the pipeline until the operator's fix.
            End::Failed(Recovery::Stop, _) if !fixed => fixed = true,
            End::Failed(_, e) if last => {
                world
                    .lock()
                    .violate(format!("the session without faults failed: {e}"));
                break;
            }
            End::Failed(_, _) => {}
            // The next session redoes the transaction with the refused event dead-lettered
            // (the last session too: the refusal is the event's, not a fault's). Each refused
            // event is redone once, so this ends.
            End::Redo(_) if redo.is_full() => {
                world
                    .lock()
                    .violate("more refused events than the redo keeps".to_owned());
                break;
            }
            End::Redo(_) => {}
            End::Abandoned => break,
        }
    }
    let mut w = world.lock();
    if w.violation.is_none() {
        w.check_end();
    }
    match w.violation.take() {
        Some(violation) if std::env::var_os("SIMULATION_SEED").is_some() => Err(format!(
            "{violation}\n{:?}\n{}\nwritten: {:?}",
            w.setup,
            w.notes.join("\n"),
            w.log
                .iter()
                .map(|r| format!(
                    "{}@{}{}",
                    r.id,
                    r.topic,
                    r.txn.map_or(String::new(), |t| format!("/txn{t}"))
                ))
                .collect::<Vec<_>>()
        )),
        Some(violation) => Err(violation),
        None => {
            let (batches_committed, batches_aborted) = w.coordinator.batches_of_several();
            Ok(Summary {
                sessions: n,
                events: w.wal.txns.iter().map(|t| t.events().count()).sum(),
                records_written: w.log.len(),
                batches_committed,
                batches_aborted,
            })
        }
    }
}

enum End {
    /// Ended after a shutdown.
    Stopped,
    Failed(Recovery, String),
    /// Exactly-once: Kafka refused an event for good; its transaction was aborted, to be redone
    /// with the event in the dead-letter topic.
    Redo(String),
    /// Did not end in time (a violation says so).
    Abandoned,
}

/// The pipeline's configuration in a session; `fixed`: after the operator's fix.
fn pipeline_config(setup: &Setup, fixed: bool) -> PipelineConfig {
    let dead_letter = setup.dead_letter || (fixed && !setup.exactly_once);
    PipelineConfig {
        max_in_flight_events: setup.max_in_flight_events,
        max_in_flight_bytes: setup.max_in_flight_bytes,
        status_interval_ms: setup.status_interval_ms,
        shutdown_timeout_secs: setup.shutdown_timeout_secs,
        message_prefix: Some(MESSAGE_PREFIX.into()),
        on_bad_event: if dead_letter {
            OnBadEvent::DeadLetter
        } else {
            OnBadEvent::Halt
        },
        dead_letter_topic: dead_letter.then(|| DEAD_LETTER_TOPIC.into()),
        exactly_once: setup.exactly_once,
        ..PipelineConfig::test_pipeline()
    }
}

/// Session `n`, set up as `pipeline::session` does; `last`: without faults, until the slot
/// reached the last commit.
async fn session(
    world: &Shared,
    metrics: &PipelineMetrics,
    n: usize,
    last: bool,
    fixed: bool,
    redo: &mut Redo,
) -> End {
    let (config, start, shutdown_after) = {
        let mut w = world.lock();
        w.begin_session(n, last);
        (
            pipeline_config(&w.setup, fixed),
            w.slot,
            w.faults.shutdown_after,
        )
    };
    let router = ROUTER.with(Router::clone);
    let decoder = OutboxDecoder::new(
        config.table.clone(),
        config.columns.clone(),
        config.message_prefix.clone(),
    )
    .with_columns(router.columns().to_vec())
    .with_optional_columns(router.optional_columns())
    .with_oid(Some(OUTBOX_OID));
    let source = LogicalSource::new(
        FakeWalsender::new(world.clone()),
        decoder,
        config.op_invalid_behavior,
        metrics.clone(),
        start,
    );
    let mode = match config.exactly_once {
        false => Mode::AtLeastOnce,
        true => {
            let transactions = SimTransactions::new(world.clone());
            if let Err(e) = transactions.init().await {
                let e = crate::error::Error::from(e);
                return End::Failed(e.recovery(), e.to_string());
            }
            let checkpoint = match mutation::active(Mutation::IgnoreCheckpoint) {
                true => None,
                false => world.lock().coordinator.checkpoint(),
            };
            // As pipeline.rs: the slot is confirmed past the transactions redone already.
            redo.forget_confirmed(start);
            Mode::ExactlyOnce(Box::new(
                ExactlyOnce::new(Box::new(transactions), checkpoint.map(Checkpoint))
                    .with_redo(redo.clone())
                    .with_limits(world.lock().setup.batch),
            ))
        }
    };
    let shutdown = CancellationToken::new();
    let liveness_deadline = {
        let mut w = world.lock();
        w.done = last.then(|| shutdown.clone());
        let last_commit_at = w
            .wal
            .txns
            .last()
            .map_or(w.origin, |t| w.origin + t.commit_at);
        last_commit_at.max(Instant::now()) + LIVENESS_DEADLINE
    };
    let progress = SessionProgress::new(metrics.clone());
    let ordered = world.lock().setup.ordered.is_some();
    let mut run: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Error>>>> =
        match ordered {
            false => Box::pin(
                Session::new(
                    &config,
                    metrics,
                    source,
                    SimSink::new(world.clone()),
                    router,
                    mode,
                    start,
                    &progress,
                )
                .run(&shutdown, config.status_interval()),
            ),
            true => Box::pin(
                Session::new(
                    &config,
                    metrics,
                    source,
                    SimOrderedSink::new(world.clone(), config.on_bad_event == OnBadEvent::Halt),
                    router,
                    mode,
                    start,
                    &progress,
                )
                .run(&shutdown, config.status_interval()),
            ),
        };
    let session_start = Instant::now();
    let shutdown_at = shutdown_after.map(|after| session_start + after);
    let result = tokio::select! {
        biased;
        result = &mut run => Some(result),
        _ = sleep_until(shutdown_at.unwrap_or(session_start)), if shutdown_at.is_some() => None,
        _ = sleep_until(liveness_deadline) => {
            let mut w = world.lock();
            let (slot, last_commit) = (w.slot, w.wal.last_commit());
            w.violate(match last {
                true => format!("the session without faults did not reach the last commit {last_commit} within {LIVENESS_DEADLINE:?}: the flush LSN stayed at {slot}"),
                false => format!("a session did not end within {LIVENESS_DEADLINE:?} of the last commit (flush LSN {slot})"),
            });
            return End::Abandoned;
        }
    };
    let result = match result {
        Some(result) => result,
        None => {
            shutdown.cancel();
            // The timer wheel's granularity: the session's own drain deadline fires at the
            // same millisecond. Exactly-once gets no more: a commit or abort still running at
            // the deadline is abandoned to the next session.
            let deadline = config.shutdown_timeout() + Duration::from_millis(1);
            match timeout(deadline, &mut run).await {
                Ok(result) => result,
                Err(_) => {
                    world.lock().violate(format!(
                        "the session did not end within {deadline:?} of the shutdown"
                    ));
                    return End::Abandoned;
                }
            }
        }
    };
    // Sessions follow each other at once; let a commit request on its way arrive or not.
    sleep(Duration::from_millis(1)).await;
    match result {
        Ok(()) => End::Stopped,
        Err(Error::Redo(refused)) => {
            let text = format!(
                "event {} at LSN {}",
                String::from_utf8_lossy(&refused.id),
                refused.lsn
            );
            redo.add(*refused);
            End::Redo(text)
        }
        Err(e) => End::Failed(e.recovery(), crate::error::chain(&e)),
    }
}

/// The seeds of a run: `SIMULATION_SEED` alone, or `SIMULATION_SCHEDULES` (default
/// `default`) from `SIMULATION_FIRST_SEED` (default 0).
fn seeds(default: u64) -> std::ops::Range<u64> {
    let var = |name: &str| {
        std::env::var(name).ok().map(|v| {
            let v = v.trim();
            match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            }
            .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        })
    };
    match var("SIMULATION_SEED") {
        Some(seed) => seed..seed + 1,
        None => {
            let first = var("SIMULATION_FIRST_SEED").unwrap_or(0);
            first..first + var("SIMULATION_SCHEDULES").unwrap_or(default)
        }
    }
}

/// Runs `seeds` and returns the first failing seed with its violation, and the count run.
fn find_violation(
    seeds: std::ops::Range<u64>,
    guarantee: Guarantee,
) -> (u64, Option<(u64, String)>, Summary) {
    let mut total = Summary::default();
    let mut ran = 0;
    for seed in seeds {
        ran += 1;
        let t0 = std::time::Instant::now();
        let r = run_schedule(seed, guarantee);
        if std::env::var_os("SIMULATION_PROFILE").is_some()
            && t0.elapsed() > Duration::from_millis(20)
        {
            eprintln!("PROFILE seed {seed}: {:?} {:?}", t0.elapsed(), r);
        }
        match r {
            Ok(summary) => {
                total.sessions += summary.sessions;
                total.events += summary.events;
                total.records_written += summary.records_written;
                total.batches_committed += summary.batches_committed;
                total.batches_aborted += summary.batches_aborted;
            }
            Err(violation) => return (ran, Some((seed, violation)), total),
        }
    }
    (ran, None, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_schedule(guarantee: Guarantee, test: &str) {
        let started = std::time::Instant::now();
        let (ran, failure, total) = find_violation(seeds(default_schedules(guarantee)), guarantee);
        if let Some((seed, violation)) = failure {
            panic!(
                "invariant violated in schedule {seed}: {violation}\nreplay: SIMULATION_SEED={seed} cargo test --locked --lib session::simulation::tests::{test} -- --exact --nocapture"
            );
        }
        println!(
            "{ran} schedules ({} sessions, {} events, {} records written; Kafka transactions of several PostgreSQL transactions: {} committed, {} aborted) in {:.1} s",
            total.sessions,
            total.events,
            total.records_written,
            total.batches_committed,
            total.batches_aborted,
            started.elapsed().as_secs_f64()
        );
    }

    #[test]
    fn every_schedule_at_least_once() {
        every_schedule(Guarantee::AtLeastOnce, "every_schedule_at_least_once");
    }

    /// With a dead-letter topic, a record the broker refuses for good
    /// leaves the transaction abortable; the session aborts it and the next one redoes the
    /// transaction with the event in the dead-letter topic. (Before the redo, the copy was
    /// refused in the abortable transaction and every session met the same record again:
    /// found after 217 schedules.)
    #[test]
    fn every_schedule_exactly_once_with_dead_letter() {
        every_schedule(
            Guarantee::ExactlyOnceWithDeadLetter,
            "every_schedule_exactly_once_with_dead_letter",
        );
    }

    #[test]
    fn every_schedule_at_least_once_ordered() {
        every_schedule(
            Guarantee::AtLeastOnceOrdered,
            "every_schedule_at_least_once_ordered",
        );
    }

    #[test]
    fn every_schedule_exactly_once() {
        every_schedule(Guarantee::ExactlyOnce, "every_schedule_exactly_once");
    }

    /// Found by the simulation (schedule 26554, at-least-once): bad input met while a
    /// shutdown's drain finished the open transaction stopped the session, and the drain that
    /// follows such an error waited a whole `shutdown_timeout` again, so the stop took up to
    /// twice the timeout. (A seed names a schedule only as long as the generator draws the
    /// same: this test then still passes, but may no longer meet that case; `session::tests`
    /// has the case as a scenario of its own.)
    #[test]
    fn bad_input_met_while_draining_does_not_extend_the_shutdown() {
        run_schedule(26554, Guarantee::AtLeastOnce).unwrap();
    }

    /// Runs the default schedules with `mutation` on until one violates an invariant whose
    /// message contains `expected`; returns how many ran.
    fn caught(mutation: Mutation, guarantee: Guarantee, expected: &str) -> u64 {
        let _on = mutation::switch_on(mutation);
        let (ran, failure, _) = find_violation(0..default_schedules(guarantee), guarantee);
        match failure {
            Some((seed, violation)) => {
                println!(
                    "{mutation:?} caught by schedule {seed}, after {ran} schedules: {violation}"
                );
                assert!(
                    violation.contains(expected),
                    "{mutation:?} caught by schedule {seed}, but not as {expected:?}: {violation}"
                );
                ran
            }
            None => panic!("{mutation:?} survived {ran} schedules"),
        }
    }

    #[test]
    fn the_simulation_catches_a_flush_lsn_that_decreases() {
        caught(
            Mutation::TrackerStartsAtZero,
            Guarantee::AtLeastOnce,
            "below the slot's confirmed LSN",
        );
    }

    #[test]
    fn the_simulation_catches_a_flush_lsn_past_an_unacknowledged_event() {
        caught(
            Mutation::ConfirmSourcePosition,
            Guarantee::AtLeastOnce,
            "which is not acknowledged",
        );
        caught(
            Mutation::AckUnwritten,
            Guarantee::AtLeastOnce,
            "which is not acknowledged",
        );
    }

    #[test]
    fn the_simulation_catches_a_flush_lsn_that_stalls() {
        caught(
            Mutation::ForgetBlocked,
            Guarantee::AtLeastOnce,
            "did not reach the last commit",
        );
    }

    #[test]
    fn the_simulation_catches_a_skipped_event() {
        caught(
            Mutation::DropBlocked,
            Guarantee::AtLeastOnce,
            "which is not acknowledged",
        );
    }

    #[test]
    fn the_simulation_catches_a_key_out_of_order() {
        caught(
            Mutation::Overtake,
            Guarantee::AtLeastOnce,
            "arrived first after",
        );
    }

    #[test]
    fn the_simulation_catches_an_unbounded_ack_tracker() {
        caught(
            Mutation::NoTrackerBound,
            Guarantee::AtLeastOnce,
            "wait in the ack tracker",
        );
    }

    #[test]
    fn the_simulation_catches_a_shutdown_past_its_deadline() {
        caught(
            Mutation::DrainForever,
            Guarantee::AtLeastOnce,
            "of the shutdown",
        );
    }

    #[test]
    fn the_simulation_catches_duplicates_and_uncommitted_confirmations_in_exactly_once_mode() {
        caught(
            Mutation::IgnoreCheckpoint,
            Guarantee::ExactlyOnce,
            "visible 2 times",
        );
        caught(
            Mutation::NoAbortMarkers,
            Guarantee::ExactlyOnce,
            "visible 2 times",
        );
        caught(
            Mutation::NoFencing,
            Guarantee::ExactlyOnce,
            "visible 2 times",
        );
        caught(
            Mutation::ConfirmSourcePosition,
            Guarantee::ExactlyOnce,
            "which is not committed",
        );
    }

    /// The session's defects, over the ordered sink.
    #[test]
    fn the_simulation_catches_session_defects_over_the_ordered_sink() {
        caught(
            Mutation::TrackerStartsAtZero,
            Guarantee::AtLeastOnceOrdered,
            "below the slot's confirmed LSN",
        );
        caught(
            Mutation::ConfirmSourcePosition,
            Guarantee::AtLeastOnceOrdered,
            "which is not acknowledged",
        );
        caught(
            Mutation::NoTrackerBound,
            Guarantee::AtLeastOnceOrdered,
            "wait in the ack tracker",
        );
        caught(
            Mutation::DrainForever,
            Guarantee::AtLeastOnceOrdered,
            "of the shutdown",
        );
    }

    #[test]
    fn the_simulation_catches_an_ordered_sink_that_publishes_a_key_concurrently() {
        caught(
            Mutation::OrderedKeyConcurrently,
            Guarantee::AtLeastOnceOrdered,
            "arrived first after",
        );
    }

    #[test]
    fn the_simulation_catches_an_ordered_sink_that_does_not_hold_a_failed_key() {
        caught(
            Mutation::OrderedNoHold,
            Guarantee::AtLeastOnceOrdered,
            "arrived first after",
        );
    }

    #[test]
    fn the_simulation_catches_an_ordered_sink_that_publishes_an_acknowledged_record_again() {
        caught(
            Mutation::OrderedRepublishAcknowledged,
            Guarantee::AtLeastOnceOrdered,
            "again after the server acknowledged it",
        );
    }

    /// A batch of several PostgreSQL transactions checkpointed at its first one's end: the
    /// session after a crash passes over only that one and publishes the rest again.
    #[test]
    fn the_simulation_catches_a_batch_checkpointed_at_its_first_transaction() {
        caught(
            Mutation::CheckpointFirstTransaction,
            Guarantee::ExactlyOnce,
            "visible 2 times",
        );
    }
}
