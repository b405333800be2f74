//! A pipeline's state: one vocabulary for `/readyz`, `outbox_relay_pipeline_state`, `status`
//! and the logs (docs/operations/monitoring.md, "Pipeline states").
//!
//! The supervisor and the session *report* what they know (a session streams, another relay
//! holds the slot, an error ended a session); what a reader is shown is derived from that
//! report and two live measures at the time of reading: how long the oldest record has waited
//! for the sink's acknowledgement, and how old the commits being read are.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// Where a pipeline is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PipelineState {
    /// A session is being set up: connecting, checking the slot and the publication, starting
    /// replication or the polling cycle.
    Starting,
    /// Reading and delivering, with nothing waiting longer than `max_event_wait_secs`.
    Streaming,
    /// Streaming, and the commits being read are more than [`CATCHING_UP_AFTER`] old: a
    /// backlog is being worked off (after a restart, an outage, a burst).
    CatchingUp,
    /// Events are waiting: a record has waited longer than `max_event_wait_secs` for the
    /// sink's acknowledgement (the sink is unreachable or refusing), records wait for a
    /// destination that does not exist (a Kafka topic), or a session ended with a
    /// transient error and the next one waits for its backoff (`last_error` says which).
    Degraded,
    /// Another relay holds the slot or the transactional id, or no host fits
    /// `target_session_attrs` yet: this relay takes over within seconds once it can.
    StandingBy,
    /// A shutdown began, or an error that stops the pipeline: finishing what is in flight
    /// (after a shutdown, the open transaction too), reading nothing new, for up to
    /// `shutdown_timeout_secs`.
    Draining,
    /// Stopped by an error that retrying cannot fix (`last_error`); with
    /// `on_pipeline_failure = "retry"`, started again after a long backoff.
    Failed,
    /// Stopped after a shutdown.
    Stopped,
}

impl PipelineState {
    /// Every state, in the order the docs list them.
    pub const ALL: [PipelineState; 8] = [
        PipelineState::Starting,
        PipelineState::Streaming,
        PipelineState::CatchingUp,
        PipelineState::Degraded,
        PipelineState::StandingBy,
        PipelineState::Draining,
        PipelineState::Failed,
        PipelineState::Stopped,
    ];

    /// The state's name in `/readyz`, the `state` label and the logs.
    pub fn as_str(self) -> &'static str {
        match self {
            PipelineState::Starting => "starting",
            PipelineState::Streaming => "streaming",
            PipelineState::CatchingUp => "catching_up",
            PipelineState::Degraded => "degraded",
            PipelineState::StandingBy => "standing_by",
            PipelineState::Draining => "draining",
            PipelineState::Failed => "failed",
            PipelineState::Stopped => "stopped",
        }
    }

    /// Whether a pipeline in this state counts as ready: it delivers (or a standby is there
    /// to take over within seconds) and nothing waits too long.
    pub fn is_ready(self) -> bool {
        matches!(
            self,
            PipelineState::Streaming | PipelineState::CatchingUp | PipelineState::StandingBy
        )
    }
}

impl std::fmt::Display for PipelineState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Streaming counts as catching up while the commits read are older than this.
pub const CATCHING_UP_AFTER: Duration = Duration::from_secs(10);
/// A read this long ago no longer tells whether the pipeline is behind (the source is idle).
const READ_RECENTLY: Duration = Duration::from_secs(5);

/// A pipeline's state as `/readyz` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct PipelineHealth {
    pub state: PipelineState,
    /// Whether this pipeline counts as ready ([`PipelineState::is_ready`]).
    pub ready: bool,
    /// The sink's kind (`kafka`, `redis`, ...).
    pub sink: &'static str,
    /// When the pipeline entered the state its supervisor last reported, Unix epoch ms.
    pub since_unix_ms: u64,
    /// Why the pipeline is in this state, when it is not plainly streaming: the records
    /// waiting, the relay that holds the slot, the error.
    pub reason: Option<String>,
    /// The last error that ended a session, until a session makes progress again.
    pub last_error: Option<String>,
    /// Sessions in a row that ended in a retryable error without progress: above 0 while
    /// `last_error` keeps recurring (the supervisor's backoff grows meanwhile).
    pub consecutive_failed_sessions: u64,
    /// Seconds the oldest record has waited for the sink's acknowledgement; 0 when none.
    pub oldest_unacked_age_secs: f64,
}

/// What the supervisor last reported of a pipeline.
#[derive(Clone, Debug)]
pub(super) struct Reported {
    pub state: PipelineState,
    pub sink: &'static str,
    pub since_unix_ms: u64,
    pub reason: Option<String>,
    pub last_error: Option<String>,
    pub consecutive_failed_sessions: u64,
    pub max_event_wait: Duration,
}

/// How old the commits a pipeline reads are, written by the session on every event without a
/// lock: the newest commit time read and when it was read, Unix epoch ms (0: none yet).
#[derive(Debug, Default)]
pub struct Behind {
    commit_ms: AtomicI64,
    read_ms: AtomicI64,
}

impl Behind {
    /// Records that an event committed at `commit_ms` was read at `now_ms`.
    pub fn read(&self, commit_ms: i64, now_ms: i64) {
        self.commit_ms.store(commit_ms, Ordering::Relaxed);
        self.read_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Whether, at `now_ms`, the pipeline recently read commits older than
    /// [`CATCHING_UP_AFTER`].
    fn catching_up(&self, now_ms: i64) -> bool {
        let read_ms = self.read_ms.load(Ordering::Relaxed);
        let commit_ms = self.commit_ms.load(Ordering::Relaxed);
        read_ms > 0
            && now_ms - read_ms <= READ_RECENTLY.as_millis() as i64
            && read_ms - commit_ms > CATCHING_UP_AFTER.as_millis() as i64
    }
}

/// The state shown at `now_ms` for `reported`, with the oldest record's wait (seconds) and
/// what the session read last.
pub(super) fn derive(
    reported: &Reported,
    oldest_unacked_age_secs: f64,
    waiting: Option<&str>,
    behind: &Behind,
    now_ms: i64,
) -> PipelineHealth {
    let mut state = reported.state;
    let mut reason = reported.reason.clone();
    if state == PipelineState::Streaming {
        let wait = reported.max_event_wait.as_secs_f64();
        if let Some(waiting) = waiting {
            state = PipelineState::Degraded;
            reason = Some(waiting.to_owned());
        } else if oldest_unacked_age_secs > wait {
            state = PipelineState::Degraded;
            reason = Some(format!(
                "a record has waited {oldest_unacked_age_secs:.0} s for the {} sink's acknowledgement (max_event_wait_secs = {})",
                reported.sink,
                reported.max_event_wait.as_secs()
            ));
        } else if behind.catching_up(now_ms) {
            state = PipelineState::CatchingUp;
        }
    }
    PipelineHealth {
        state,
        ready: state.is_ready(),
        sink: reported.sink,
        since_unix_ms: reported.since_unix_ms,
        reason,
        last_error: reported.last_error.clone(),
        consecutive_failed_sessions: reported.consecutive_failed_sessions,
        oldest_unacked_age_secs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streaming() -> Reported {
        Reported {
            state: PipelineState::Streaming,
            sink: "kafka",
            since_unix_ms: 0,
            reason: None,
            last_error: None,
            consecutive_failed_sessions: 0,
            max_event_wait: Duration::from_secs(15),
        }
    }

    #[test]
    fn a_record_waiting_longer_than_max_event_wait_makes_a_streaming_pipeline_degraded() {
        let behind = Behind::default();
        let h = derive(&streaming(), 14.0, None, &behind, 1_000_000);
        assert_eq!((h.state, h.ready), (PipelineState::Streaming, true));
        let h = derive(&streaming(), 20.0, None, &behind, 1_000_000);
        assert_eq!((h.state, h.ready), (PipelineState::Degraded, false));
        let reason = h.reason.unwrap();
        assert!(
            reason.contains("20 s") && reason.contains("kafka"),
            "{reason}"
        );
    }

    #[test]
    fn records_waiting_for_a_missing_destination_make_a_streaming_pipeline_degraded() {
        let why = "topic a.events does not exist on the Kafka cluster";
        let h = derive(&streaming(), 0.0, Some(why), &Behind::default(), 1_000_000);
        assert_eq!((h.state, h.ready), (PipelineState::Degraded, false));
        assert_eq!(h.reason.as_deref(), Some(why));
    }

    #[test]
    fn reading_old_commits_is_catching_up_until_the_reads_stop() {
        let behind = Behind::default();
        let now = 1_000_000;
        behind.read(now - 60_000, now);
        let h = derive(&streaming(), 0.0, None, &behind, now + 1_000);
        assert_eq!((h.state, h.ready), (PipelineState::CatchingUp, true));
        // Recent commits: streaming.
        behind.read(now - 100, now);
        assert_eq!(
            derive(&streaming(), 0.0, None, &behind, now + 1_000).state,
            PipelineState::Streaming
        );
        // Old commits, but nothing read for a while: the source is idle, not behind.
        behind.read(now - 60_000, now);
        assert_eq!(
            derive(&streaming(), 0.0, None, &behind, now + 10_000).state,
            PipelineState::Streaming
        );
    }

    #[test]
    fn waiting_records_outrank_catching_up_and_other_states_are_shown_as_reported() {
        let behind = Behind::default();
        let now = 1_000_000;
        behind.read(now - 60_000, now);
        assert_eq!(
            derive(&streaming(), 30.0, None, &behind, now).state,
            PipelineState::Degraded
        );
        for state in [PipelineState::StandingBy, PipelineState::Failed] {
            let reported = Reported {
                state,
                ..streaming()
            };
            let h = derive(&reported, 30.0, None, &behind, now);
            assert_eq!(h.state, state);
            assert_eq!(h.ready, state == PipelineState::StandingBy);
        }
    }
}
