//! The top-level error: one variant per layer, each classified by [`Error::recovery`] as worth
//! a retry, a reason to stand by, or a stop.

use crate::config::ConfigError;
use crate::exactly_once::{CheckpointError, HeldByMissingTopic, RefusedEvent, TransactionError};
use crate::lsn::Lsn;
use crate::router::RouteError;
use crate::sink::kafka::ProducerError;
use crate::sink::{ConnectError, DeliveryError};
use crate::source::outbox::OutboxError;
use crate::source::SourceError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// Bad routing input in the event at `lsn` (a [`RouteError`] names the event id);
    /// [`Lsn::ZERO`] for a polled row, which has none (then no LSN is named).
    #[error("{}{route}", at_lsn(*.lsn))]
    Route { lsn: Lsn, route: RouteError },
    /// Kafka reported a failed delivery (asynchronously: later records may be in flight).
    #[error(transparent)]
    Delivery(#[from] DeliveryError),
    /// The producer refused a record outright: nothing after it was sent.
    #[error(transparent)]
    Rejected(DeliveryError),
    #[error(transparent)]
    Producer(#[from] ProducerError),
    /// A sink other than Kafka could not connect or is set up wrongly.
    #[error(transparent)]
    SinkConnect(#[from] ConnectError),
    /// The polling source cannot use the outbox table or one of its rows.
    #[error(transparent)]
    Polling(#[from] crate::source::polling::PollingError),
    /// Exactly-once mode: a Kafka transaction call failed.
    #[error(transparent)]
    Transaction(#[from] TransactionError),
    /// Exactly-once mode: the checkpoint could not be read at session start.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Exactly-once mode with `on_bad_event = "dead_letter"`: Kafka refused a record of the
    /// open transaction for good, which leaves the transaction abortable only. It was
    /// aborted; the next session redoes it with this event sent to the dead-letter topic
    /// ([`crate::exactly_once::Redo`]).
    #[error("kafka refused event {} at LSN {} in topic {:?} for good ({}); its transaction was aborted and is redone with the event in the dead-letter topic", String::from_utf8_lossy(&.0.id), .0.lsn, .0.topic, .0.reason)]
    Redo(Box<RefusedEvent>),
    /// Exactly-once mode: a record waits for a missing topic behind records of the open Kafka
    /// transaction, which was aborted; the next session reads its transactions again.
    #[error(transparent)]
    HeldByMissingTopic(#[from] HeldByMissingTopic),
    #[error("cannot serve metrics on {listen}")]
    Listen {
        listen: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Exit code: the configuration is wrong (a file, a flag, an environment variable, or what the
/// database or broker is set up with in a way retrying cannot fix).
pub const EXIT_CONFIG: u8 = 3;
/// Exit code: a pipeline stopped on a source error retrying cannot fix (authentication,
/// privileges, a lost slot, an event the relay cannot read).
pub const EXIT_SOURCE: u8 = 4;
/// Exit code: a pipeline stopped on a sink error retrying cannot fix (authorization, a record
/// refused for good with no dead-letter topic).
pub const EXIT_SINK: u8 = 5;
/// Exit code: a second SIGINT or SIGTERM ended the process before the drain finished.
pub const EXIT_SECOND_SIGNAL: u8 = 130;

/// What the supervisor does when a session ends with an error. Layers only classify (this
/// enum, from [`Error::recovery`]); [`crate::supervisor`] alone decides what follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// A new session (reconnect, new producer, resume from the slot's confirmed LSN) may
    /// succeed: restart after a backoff that grows until a session makes progress.
    Retry,
    /// Another relay holds the slot (SQLSTATE 55006, "replication slot ... is active for PID
    /// n") or fenced this one with the same `transactional.id`, or no host of the source URL
    /// fits `target_session_attrs` yet (a failover under way: the standby is not promoted):
    /// stand by, and try again soon enough to take over within seconds of the active relay's
    /// exit or the promotion.
    StandBy,
    /// Retrying cannot fix it (bad input, configuration, authorization): stop the pipeline
    /// without confirming past the failing event.
    Stop,
}

impl Error {
    /// How the pipeline recovers from this error (see [`Recovery`]).
    pub fn recovery(&self) -> Recovery {
        let retry_or_stop = |transient: bool| {
            if transient {
                Recovery::Retry
            } else {
                Recovery::Stop
            }
        };
        match self {
            Error::Source(crate::source::SourceError::Server { code, .. }) if code == "55006" => {
                Recovery::StandBy
            }
            Error::Source(crate::source::SourceError::NoHostFits(e)) if e.unfit => {
                Recovery::StandBy
            }
            Error::Source(e) => retry_or_stop(e.is_transient()),
            Error::Delivery(e) | Error::Rejected(e) => retry_or_stop(e.retryable),
            Error::Transaction(e) if e.is_fenced() => Recovery::StandBy,
            Error::Transaction(e) => retry_or_stop(e.is_transient()),
            Error::Redo(_) | Error::HeldByMissingTopic(_) => Recovery::Retry,
            Error::SinkConnect(e) => retry_or_stop(e.retryable),
            Error::Producer(e) => retry_or_stop(e.is_transient()),
            Error::Checkpoint(e) => retry_or_stop(e.is_transient()),
            Error::Config(_)
            | Error::Outbox(_)
            | Error::Route { .. }
            | Error::Polling(_)
            | Error::Listen { .. } => Recovery::Stop,
        }
    }

    /// The process's exit code when this error stopped a pipeline: [`EXIT_CONFIG`],
    /// [`EXIT_SOURCE`] or [`EXIT_SINK`].
    pub fn exit_code(&self) -> u8 {
        use crate::source::polling::PollingError;
        match self {
            Error::Config(_)
            | Error::Listen { .. }
            | Error::Source(crate::source::SourceError::Config(_))
            // What the outbox table is, as a log-tailing pipeline's missing table or column.
            | Error::Polling(
                PollingError::MissingTable { .. }
                | PollingError::MissingColumn { .. }
                | PollingError::NotPlain { .. },
            ) => EXIT_CONFIG,
            Error::Source(_) | Error::Outbox(_) | Error::Route { .. } | Error::Polling(_) => {
                EXIT_SOURCE
            }
            Error::Delivery(_)
            | Error::Rejected(_)
            | Error::Producer(_)
            | Error::SinkConnect(_)
            | Error::Transaction(_)
            | Error::Checkpoint(_)
            | Error::Redo(_)
            | Error::HeldByMissingTopic(_) => EXIT_SINK,
        }
    }
}

/// "at LSN X, ", or nothing for [`Lsn::ZERO`] (no LSN: a polled row).
fn at_lsn(lsn: Lsn) -> String {
    if lsn == Lsn::ZERO {
        String::new()
    } else {
        format!("at LSN {lsn}, ")
    }
}

/// Formats an error with its chain of causes: `outer: inner: root`.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::target::NoHostFits;
    use crate::source::SourceError;

    fn no_host_fits(unfit: bool) -> Error {
        Error::Source(SourceError::NoHostFits(NoHostFits {
            passed_over: vec![
                (
                    "127.0.0.1:5433".into(),
                    "is a standby (in_hot_standby=on), target_session_attrs=primary".into(),
                ),
                ("127.0.0.1:5432".into(), "failed: connection refused".into()),
            ],
            unfit,
        }))
    }

    #[test]
    fn a_failover_under_way_stands_by_and_a_database_that_is_down_backs_off() {
        // The old primary down, the standby not promoted yet: retry within seconds.
        assert_eq!(no_host_fits(true).recovery(), Recovery::StandBy);
        // Every host unreachable: an outage, counted and backed off like any other.
        assert_eq!(no_host_fits(false).recovery(), Recovery::Retry);
        let slot_in_use = Error::Source(SourceError::Server {
            code: "55006".into(),
            message: "replication slot \"s\" is active for PID 42".into(),
        });
        assert_eq!(slot_in_use.recovery(), Recovery::StandBy);
    }

    /// A producer whose threads could not start (the process short of threads or memory) is
    /// retried; a configuration librdkafka rejects stops the pipeline.
    #[test]
    fn a_producer_thread_that_cannot_start_is_retried_and_a_bad_property_is_not() {
        use rdkafka::error::KafkaError;
        let error = |reason: &str| {
            Error::Producer(ProducerError(KafkaError::ClientCreation(reason.into())))
        };
        for reason in [
            "cannot start the delivery report thread: Resource temporarily unavailable (os error 11)",
            "Failed to create thread: Resource temporarily unavailable (11)",
        ] {
            assert_eq!(error(reason).recovery(), Recovery::Retry, "{reason}");
        }
        assert_eq!(
            error("No such configuration property: \"linger.mss\"").recovery(),
            Recovery::Stop
        );
    }
}
