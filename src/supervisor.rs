//! The supervisor: runs a pipeline's sessions one after another, for every source kind.
//!
//! A *session* is one attempt at the pipeline (connections, a producer, streaming until
//! shutdown or an error); a source kind provides it through [`Sessions`]. The supervisor alone
//! decides what an ended session leads to, from [`Error::recovery`]:
//!
//! - [`Recovery::Retry`]: a new session after an exponential backoff (1 s doubling to 30 s,
//!   each plus a jitter of up to as much again: at most [`LONGEST_WAIT`]).
//!   The backoff is reset only after *progress* ([`SessionProgress::advanced`]: the confirmed
//!   flush LSN moved, a polling batch was marked), not when a session merely starts, so an
//!   error that recurs right after every start backs off further each time instead of
//!   restarting the session (and the walsender's decoding from `restart_lsn`) every second.
//!   Such sessions are counted in `outbox_relay_consecutive_failed_sessions` and in `/readyz`.
//! - [`Recovery::StandBy`]: another relay holds the slot or the transactional id, or no host
//!   fits `target_session_attrs` yet (a failover under way): retry at
//!   most every [`STAND_BY_RETRY`], to take over within seconds of its exit. Not a failure.
//! - [`Recovery::Stop`]: the pipeline stops with the error (`failed`); with
//!   [`OnPipelineFailure::Retry`] it starts again after [`FAILED_MIN_DELAY`] doubling to
//!   [`FAILED_MAX_DELAY`].
//!
//! Logs: an error that ends session after session is logged once at WARN, then summarised
//! with its count at most every [`REPEAT_SUMMARY_EVERY`] while it recurs; a new error is
//! logged at once, and the recovery (the first progress after failed sessions) at INFO. A
//! standby says so once at INFO, then only when its state changes.
//!
//! Shutdown: until the session reports [`SessionProgress::streaming`], a shutdown drops the
//! session future at once (its set-up, such as a slot creation waiting for a long transaction
//! or the exactly-once start, has confirmed nothing and owns no detached task but the
//! exactly-once start's blocking librdkafka calls, on threads the process does not wait for);
//! once it streams, the session drains by itself (in-flight deliveries, the final status
//! update).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use tokio::time::sleep;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::file::OnPipelineFailure;
use crate::error::{chain, Error, Recovery};
use crate::metrics::{PipelineMetrics, PipelineState};

/// Shortest wait before a new session after an error.
const MIN_DELAY: Duration = Duration::from_secs(1);
/// Longest wait before a new session after an error: the backoff stops growing there.
pub const MAX_DELAY: Duration = Duration::from_secs(30);
/// Longest wait there can be between two sessions: [`MAX_DELAY`] with its jitter, which adds
/// up to the delay again.
pub const LONGEST_WAIT: Duration = Duration::from_secs(2 * MAX_DELAY.as_secs());
/// Longest wait between attempts while another relay holds the slot or the transactional id,
/// or while no host fits `target_session_attrs`.
pub const STAND_BY_RETRY: Duration = Duration::from_secs(3);
/// First wait before a failed pipeline starts again, with `on_pipeline_failure = "retry"`.
pub const FAILED_MIN_DELAY: Duration = Duration::from_secs(60);
/// Longest wait before a failed pipeline starts again: the backoff stops growing there.
pub const FAILED_MAX_DELAY: Duration = Duration::from_secs(15 * 60);
/// While one error ends session after session, its WARN line comes again at most this often,
/// with the count.
pub const REPEAT_SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// A source kind's sessions: what the supervisor starts again after each failure.
pub trait Sessions {
    /// Runs one session until `shutdown` (then drains and returns `Ok`) or an error. Calls
    /// `progress.streaming()` once set-up is done and `progress.advanced()` whenever it
    /// confirms something. Until `streaming()`, the future must be safe to drop at any await:
    /// it has confirmed nothing, and it owns (aborts on drop) every task it spawned.
    fn session<'a>(
        &'a mut self,
        progress: &'a SessionProgress,
        shutdown: &'a CancellationToken,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a;
}

/// How a session tells the supervisor that it streams and that it made progress.
pub struct SessionProgress {
    metrics: PipelineMetrics,
    streaming: AtomicBool,
    advanced: AtomicBool,
    /// Sessions in a row that failed before this one: its first progress is a recovery.
    failed_before: u64,
}

impl SessionProgress {
    /// A session's report, before it set anything.
    pub fn new(metrics: PipelineMetrics) -> Self {
        SessionProgress {
            metrics,
            streaming: AtomicBool::new(false),
            advanced: AtomicBool::new(false),
            failed_before: 0,
        }
    }

    /// The report of a session that follows `failed` failed sessions.
    fn after_failures(mut self, failed: u64) -> Self {
        self.failed_before = failed;
        self
    }

    /// Reports that set-up is done and the session streams (log tailing: after
    /// START_REPLICATION and the exactly-once start; polling: the table checked): from now on
    /// a shutdown drains the session instead of dropping it. The pipeline reads as ready.
    pub fn streaming(&self) {
        self.streaming.store(true, Ordering::Release);
        self.metrics.set_state(PipelineState::Streaming, None);
    }

    /// Reports progress: the confirmed flush LSN moved past where the session started, or a
    /// polling batch's marks committed. Resets the backoff and the count of failed sessions.
    pub fn advanced(&self) {
        if !self.advanced.swap(true, Ordering::AcqRel) {
            self.metrics.set_failed_sessions(0);
            if self.failed_before > 0 {
                info!(
                    pipeline = self.metrics.name(),
                    failed_sessions = self.failed_before,
                    "pipeline recovered: confirming again after failed sessions"
                );
            }
        }
    }

    /// Whether [`Self::streaming`] was called.
    pub fn is_streaming(&self) -> bool {
        self.streaming.load(Ordering::Acquire)
    }

    fn has_advanced(&self) -> bool {
        self.advanced.load(Ordering::Acquire)
    }
}

/// Runs `sessions` until `shutdown` is cancelled (then `Ok`) or an error classed
/// [`Recovery::Stop`] ends the pipeline (then that error; with [`OnPipelineFailure::Retry`],
/// a new session after a long backoff instead). Sets the pipeline's state for `/readyz`,
/// counts restarts after a transient error in `outbox_relay_reconnects_total` (not a
/// standby's retries) and logs them without repeating itself (see the module docs).
pub async fn supervise(
    pipeline: &str,
    metrics: &PipelineMetrics,
    shutdown: &CancellationToken,
    sessions: &mut impl Sessions,
    on_failure: OnPipelineFailure,
) -> Result<(), Error> {
    let mut retry = backoff();
    let mut stand_by = backoff();
    let mut failed = failed_backoff();
    let mut failed_sessions = 0u64;
    let mut repeats = Repeats::default();
    // The state a new session starts in: `starting` at first and after a failure, else the
    // state the last session ended in (a standby or a degraded pipeline does not flap through
    // `starting` on every attempt).
    let mut ended_in = None;
    loop {
        if ended_in.is_none() {
            metrics.set_state(PipelineState::Starting, None);
        }
        let progress = SessionProgress::new(metrics.clone()).after_failures(failed_sessions);
        let result = {
            let session = sessions.session(&progress, shutdown);
            tokio::pin!(session);
            tokio::select! {
                biased;
                result = &mut session => Some(result),
                () = stopped_during_set_up(shutdown, &progress) => None,
            }
        };
        // The session's producer is gone: nothing is awaiting an acknowledgement any more
        // (records a shared producer still holds are the next session's to count: its sink's
        // left_over).
        metrics.oldest_unacked_age.set(0.0);
        metrics.set_waiting(None);
        metrics.in_flight_events.set(0);
        metrics.in_flight_bytes.set(0);
        if progress.has_advanced() {
            retry = backoff();
            failed = failed_backoff();
            failed_sessions = 0;
            repeats = Repeats::default();
        }
        if progress.is_streaming() {
            ended_in = None;
        }
        let e = match result {
            None => {
                info!(pipeline, "stopped during session set-up");
                metrics.set_state(PipelineState::Stopped, None);
                return Ok(());
            }
            Some(Ok(())) => {
                info!(pipeline, "pipeline stopped");
                metrics.set_state(PipelineState::Stopped, None);
                return Ok(());
            }
            Some(Err(e)) => e,
        };
        let text = chain(&e);
        let delay = match e.recovery() {
            Recovery::Stop => {
                metrics.set_state(PipelineState::Failed, Some(text.clone()));
                if on_failure == OnPipelineFailure::Exit {
                    error!(pipeline, error = %text, "pipeline stopped by an error that retrying cannot fix");
                    return Err(e);
                }
                let delay = next(&mut failed).min(FAILED_MAX_DELAY);
                error!(pipeline, error = %text, retry_in_secs = delay.as_secs(), "pipeline failed with an error that retrying cannot fix; on_pipeline_failure = \"retry\": starting it again after a long backoff");
                ended_in = None;
                delay
            }
            Recovery::StandBy => {
                // Not a failure (another relay streams): neither a reconnect nor a failed
                // session.
                failed_sessions = 0;
                // Standing by first: a count of 0 while streaming would read as progress
                // and end last_error.
                metrics.set_state(PipelineState::StandingBy, Some(text.clone()));
                metrics.set_failed_sessions(0);
                let delay = next(&mut stand_by).min(STAND_BY_RETRY);
                if ended_in == Some(PipelineState::StandingBy) {
                    debug!(pipeline, reason = %text, "still standing by");
                } else {
                    info!(pipeline, reason = %text, "standing by: another relay holds the slot or the transactional id, or no host fits target_session_attrs yet; taking over within seconds once it can");
                }
                ended_in = Some(PipelineState::StandingBy);
                delay
            }
            Recovery::Retry => {
                stand_by = backoff();
                failed_sessions += 1;
                metrics.set_failed_sessions(failed_sessions);
                let delay = next(&mut retry);
                repeats.log(pipeline, &text, delay, failed_sessions);
                metrics.reconnects.inc();
                metrics.set_state(PipelineState::Degraded, Some(text));
                ended_in = Some(PipelineState::Degraded);
                delay
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => {
                metrics.set_state(PipelineState::Stopped, None);
                return Ok(());
            }
            _ = sleep(delay) => {}
        }
    }
}

/// The retryable error that ends session after session, for logs that do not repeat it.
#[derive(Default)]
struct Repeats {
    /// The error and when its WARN line was last written.
    last: Option<(String, Instant)>,
    /// Sessions it ended since that line.
    unlogged: u64,
}

impl Repeats {
    /// Logs that a session ended with `error`: at WARN when it differs from the last one or
    /// [`REPEAT_SUMMARY_EVERY`] passed (with how often it recurred meanwhile), else at DEBUG.
    fn log(&mut self, pipeline: &str, error: &str, delay: Duration, failed_sessions: u64) {
        let delay_ms = delay.as_millis() as u64;
        match &mut self.last {
            Some((last, logged)) if last == error => {
                self.unlogged += 1;
                if logged.elapsed() >= REPEAT_SUMMARY_EVERY {
                    warn!(
                        pipeline,
                        error,
                        delay_ms,
                        failed_sessions,
                        repeated = self.unlogged,
                        "pipeline sessions keep ending with the same error; reconnecting"
                    );
                    *logged = Instant::now();
                    self.unlogged = 0;
                } else {
                    debug!(
                        pipeline,
                        error, delay_ms, failed_sessions, "pipeline session ended; reconnecting"
                    );
                }
            }
            _ => {
                warn!(
                    pipeline,
                    error, delay_ms, failed_sessions, "pipeline session ended; reconnecting"
                );
                self.last = Some((error.to_owned(), Instant::now()));
                self.unlogged = 0;
            }
        }
    }
}

/// Completes when `shutdown` is cancelled while the session has not reported streaming yet;
/// never completes once it streams (the session then drains by itself). Cancel-safe.
async fn stopped_during_set_up(shutdown: &CancellationToken, progress: &SessionProgress) {
    shutdown.cancelled().await;
    if progress.is_streaming() {
        std::future::pending::<()>().await;
    }
}

fn backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(MIN_DELAY)
        .with_max_delay(MAX_DELAY)
        .with_jitter()
        .without_max_times()
        .build()
}

fn failed_backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(FAILED_MIN_DELAY)
        .with_max_delay(FAILED_MAX_DELAY)
        .without_max_times()
        .build()
}

fn next(backoff: &mut ExponentialBackoff) -> Duration {
    backoff.next().unwrap_or(LONGEST_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::source::SourceError;
    use std::sync::Arc;

    /// Sessions that stream, optionally confirm something, then fail with `error` (built
    /// afresh each time); the session after `failures` of them cancels the shutdown and ends.
    struct Fake {
        failures: usize,
        advance: bool,
        error: fn() -> Error,
        starts: Vec<Instant>,
        /// Whether a session reports streaming (a standby's fails before it streams).
        stream: bool,
    }

    impl Fake {
        fn new(failures: usize, advance: bool, error: fn() -> Error) -> Self {
            Fake {
                failures,
                advance,
                error,
                starts: Vec::new(),
                stream: true,
            }
        }

        /// Seconds between one session's start and the next one's.
        fn gaps(&self) -> Vec<f64> {
            self.starts
                .windows(2)
                .map(|w| (w[1] - w[0]).as_secs_f64())
                .collect()
        }
    }

    impl Sessions for Fake {
        async fn session(
            &mut self,
            progress: &SessionProgress,
            shutdown: &CancellationToken,
        ) -> Result<(), Error> {
            self.starts.push(Instant::now());
            if self.stream {
                progress.streaming();
            }
            if self.advance {
                progress.advanced();
            }
            if self.starts.len() > self.failures {
                shutdown.cancel();
                return Ok(());
            }
            Err((self.error)())
        }
    }

    /// Supervises `sessions` of pipeline `p` with `on_pipeline_failure = "exit"` and no
    /// shutdown (the fake cancels its own).
    async fn supervise_exit(
        p: &PipelineMetrics,
        sessions: &mut impl Sessions,
    ) -> Result<(), Error> {
        supervise(
            "p",
            p,
            &CancellationToken::new(),
            sessions,
            OnPipelineFailure::Exit,
        )
        .await
    }

    fn closed() -> Error {
        SourceError::Closed.into()
    }

    fn slot_in_use() -> Error {
        SourceError::Server {
            code: "55006".into(),
            message: "replication slot \"s\" is active for PID 42".into(),
        }
        .into()
    }

    fn gauge_line(metrics: &Metrics, value: u64) -> bool {
        metrics.render().contains(&format!(
            "outbox_relay_consecutive_failed_sessions{{pipeline=\"p\"}} {value}"
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_failing_right_after_its_start_backs_off_further_each_time() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("p");
        let mut fake = Fake::new(7, false, closed);
        supervise_exit(&p, &mut fake).await.unwrap();
        let gaps = fake.gaps();
        assert_eq!(gaps.len(), 7, "{gaps:?}");
        // Without jitter 1, 2, 4, 8, 16, 30, 30 s; jitter adds up to as much again.
        for (i, (gap, least)) in gaps
            .iter()
            .zip([1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0])
            .enumerate()
        {
            assert!(
                (least..=least * 2.0 + 0.1).contains(gap),
                "gap {i} between sessions {gap:.3} s, expected {least} to {} s: {gaps:?}",
                least * 2.0
            );
        }
        assert!(gauge_line(&metrics, 7), "{}", metrics.render());
        let health = metrics.health()["p"].clone();
        assert_eq!(health.consecutive_failed_sessions, 7);
        assert!(
            health
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("closed the replication connection")),
            "{health:?}"
        );
        assert_eq!(health.state, PipelineState::Stopped);
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_that_made_progress_resets_the_backoff() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("p");
        let mut fake = Fake::new(7, true, closed);
        supervise_exit(&p, &mut fake).await.unwrap();
        let gaps = fake.gaps();
        assert_eq!(gaps.len(), 7, "{gaps:?}");
        assert!(
            gaps.iter().all(|gap| (1.0..=2.1).contains(gap)),
            "every restart after progress waits the first delay (1 to 2 s): {gaps:?}"
        );
        // Each failure counts 1 until the next session's progress resets it to 0.
        assert!(gauge_line(&metrics, 0), "{}", metrics.render());
        assert_eq!(p.reconnects.get(), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_retries_within_seconds_and_is_not_a_failure() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("p");
        let mut fake = Fake::new(10, false, slot_in_use);
        supervise_exit(&p, &mut fake).await.unwrap();
        let gaps = fake.gaps();
        assert_eq!(gaps.len(), 10, "{gaps:?}");
        assert!(
            gaps.iter().all(|gap| (1.0..=3.0).contains(gap)),
            "standby retries every 1 to 3 s: {gaps:?}"
        );
        assert!(gauge_line(&metrics, 0), "{}", metrics.render());
        assert_eq!(p.reconnects.get(), 0, "standing by is not reconnecting");
    }

    /// A relay that failed, then stands by while another streams: no failed sessions, and
    /// nothing in flight, whatever its last session left in the gauges.
    #[tokio::test(start_paused = true)]
    async fn a_relay_that_ends_up_standing_by_shows_no_failures_and_nothing_in_flight() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("p");
        p.in_flight_events.set(5_000);
        p.in_flight_bytes.set(1 << 20);
        let mut failing = Fake::new(3, false, closed);
        supervise_exit(&p, &mut failing).await.unwrap();
        assert_eq!(p.reconnects.get(), 3);
        assert_eq!((p.in_flight_events.get(), p.in_flight_bytes.get()), (0, 0));
        let mut standing_by = Fake::new(2, false, slot_in_use);
        p.set_failed_sessions(3);
        supervise_exit(&p, &mut standing_by).await.unwrap();
        assert!(gauge_line(&metrics, 0), "{}", metrics.render());
        assert_eq!(p.reconnects.get(), 3, "standing by is not reconnecting");
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_retrying_cannot_fix_stops_the_pipeline() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("p");
        let mut fake = Fake::new(1, false, || SourceError::Auth("password".into()).into());
        let result = supervise_exit(&p, &mut fake).await;
        assert!(
            matches!(result, Err(Error::Source(SourceError::Auth(_)))),
            "{result:?}"
        );
        assert_eq!(fake.starts.len(), 1);
        assert_eq!(metrics.health()["p"].state, PipelineState::Failed);
    }

    /// A session whose set-up never ends (a slot creation waiting for a transaction), or one
    /// that streams and drains for `drain` after the shutdown.
    struct Stuck {
        stream: bool,
        drain: Duration,
        /// Set when the session future is dropped.
        dropped: Arc<AtomicBool>,
        drained: bool,
    }

    struct SetFlagOnDrop(Arc<AtomicBool>);

    impl Drop for SetFlagOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    impl Sessions for Stuck {
        async fn session(
            &mut self,
            progress: &SessionProgress,
            shutdown: &CancellationToken,
        ) -> Result<(), Error> {
            let _guard = SetFlagOnDrop(self.dropped.clone());
            if !self.stream {
                return std::future::pending().await;
            }
            progress.streaming();
            shutdown.cancelled().await;
            sleep(self.drain).await;
            self.drained = true;
            Ok(())
        }
    }

    async fn stop_after(shutdown: CancellationToken, after: Duration) {
        sleep(after).await;
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_during_set_up_drops_the_session_at_once() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("p");
        let shutdown = CancellationToken::new();
        let dropped = Arc::new(AtomicBool::new(false));
        let mut stuck = Stuck {
            stream: false,
            drain: Duration::ZERO,
            dropped: dropped.clone(),
            drained: false,
        };
        let start = Instant::now();
        let (result, ()) = tokio::join!(
            tokio::time::timeout(
                Duration::from_secs(60),
                supervise("p", &p, &shutdown, &mut stuck, OnPipelineFailure::Exit)
            ),
            stop_after(shutdown.clone(), Duration::from_secs(5)),
        );
        result
            .expect("the pipeline did not stop within 60 s of a shutdown during set-up")
            .unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert!(dropped.load(Ordering::SeqCst), "the set-up was not dropped");
        assert_eq!(metrics.health()["p"].state, PipelineState::Stopped);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_while_streaming_lets_the_session_drain() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("p");
        let shutdown = CancellationToken::new();
        let mut stuck = Stuck {
            stream: true,
            drain: Duration::from_secs(20),
            dropped: Arc::new(AtomicBool::new(false)),
            drained: false,
        };
        let start = Instant::now();
        let (result, ()) = tokio::join!(
            supervise("p", &p, &shutdown, &mut stuck, OnPipelineFailure::Exit),
            stop_after(shutdown.clone(), Duration::from_secs(5)),
        );
        result.unwrap();
        assert!(
            stuck.drained,
            "the streaming session was dropped instead of drained"
        );
        assert_eq!(start.elapsed(), Duration::from_secs(25));
    }

    /// Log lines written while the guard lives (this thread only).
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn start(&self) -> tracing::subscriber::DefaultGuard {
            let writer = self.clone();
            tracing::subscriber::set_default(
                tracing_subscriber::fmt()
                    .with_ansi(false)
                    .with_max_level(tracing::Level::INFO)
                    .with_writer(move || writer.clone())
                    .finish(),
            )
        }

        fn lines_with(&self, needle: &str) -> usize {
            String::from_utf8(self.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .filter(|l| l.contains(needle))
                .count()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_that_ends_session_after_session_is_logged_once_then_summarised() {
        let captured = Captured::default();
        let _guard = captured.start();
        let metrics = Metrics::new();
        let p = metrics.pipeline("p");
        let mut fake = Fake::new(12, false, closed);
        let start = Instant::now();
        supervise_exit(&p, &mut fake).await.unwrap();
        let minutes = start.elapsed().as_secs() / 60;
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            captured.lines_with("pipeline session ended; reconnecting"),
            1,
            "{log}"
        );
        let summaries = captured.lines_with("keep ending with the same error");
        assert!(
            (1..=minutes as usize).contains(&summaries),
            "{summaries} summaries in {minutes} minutes of 12 failed sessions:\n{log}"
        );
        assert!(log.contains("repeated="), "{log}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_says_so_once() {
        let captured = Captured::default();
        let _guard = captured.start();
        let metrics = Metrics::new();
        let p = metrics.pipeline("p");
        let mut fake = Fake::new(10, false, slot_in_use);
        fake.stream = false;
        supervise_exit(&p, &mut fake).await.unwrap();
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(captured.lines_with("standing by"), 1, "{log}");
        assert_eq!(captured.lines_with("WARN"), 0, "{log}");
    }

    #[tokio::test(start_paused = true)]
    async fn with_retry_a_failed_pipeline_reads_failed_then_starts_again_after_a_long_backoff() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("p");
        let mut fake = Fake::new(2, false, || SourceError::Auth("password".into()).into());
        let watch = async {
            sleep(Duration::from_secs(30)).await;
            metrics.health()["p"].clone()
        };
        let shutdown = CancellationToken::new();
        let (result, during_backoff) = tokio::join!(
            supervise("p", &p, &shutdown, &mut fake, OnPipelineFailure::Retry),
            watch
        );
        result.unwrap();
        assert_eq!(during_backoff.state, PipelineState::Failed);
        assert!(!during_backoff.ready);
        assert!(during_backoff
            .last_error
            .is_some_and(|e| e.contains("password")),);
        let gaps = fake.gaps();
        assert_eq!(gaps.len(), 2, "{gaps:?}");
        assert!(
            (60.0..61.0).contains(&gaps[0]) && (120.0..121.0).contains(&gaps[1]),
            "a failed pipeline starts again after 1 minute, then 2: {gaps:?}"
        );
    }
}
