//! The top-level error: one variant per layer, each knowing whether a retry may help.

use crate::config::ConfigError;
use crate::exactly_once::{CheckpointError, TransactionError};
use crate::router::RouteError;
use crate::sink::kafka::ProducerError;
use crate::sink::DeliveryError;
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
    #[error(transparent)]
    Route(#[from] RouteError),
    /// Kafka reported a failed delivery (asynchronously: later records may be in flight).
    #[error(transparent)]
    Delivery(#[from] DeliveryError),
    /// The producer refused a record outright: nothing after it was sent.
    #[error(transparent)]
    Rejected(DeliveryError),
    #[error(transparent)]
    Producer(#[from] ProducerError),
    /// The polling source cannot use the outbox table or one of its rows.
    #[error(transparent)]
    Polling(#[from] crate::source::polling::PollingError),
    /// Exactly-once mode: a Kafka transaction call failed.
    #[error(transparent)]
    Transaction(#[from] TransactionError),
    /// Exactly-once mode: the checkpoint could not be read at session start.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("cannot serve metrics on {listen}")]
    Listen {
        listen: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether another walsender holds the slot (SQLSTATE 55006, "replication slot ... is
    /// active for PID n").
    pub fn is_slot_in_use(&self) -> bool {
        matches!(self, Error::Source(crate::source::SourceError::Server { code, .. }) if code == "55006")
    }

    /// Whether another relay with the same `transactional.id` fenced this one (exactly-once
    /// mode): like a slot in use, a reason to stand by and retry soon.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Transaction(e) if e.is_fenced())
    }

    /// Whether restarting the pipeline session (reconnect, new producer, resume from the slot)
    /// may succeed. Permanent errors stop the pipeline without confirming past the failing event.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Source(e) => e.is_transient(),
            Error::Delivery(e) | Error::Rejected(e) => e.retryable,
            Error::Transaction(e) => e.is_transient(),
            Error::Checkpoint(e) => matches!(
                e,
                CheckpointError::Kafka { .. } | CheckpointError::Timeout(_)
            ),
            Error::Config(_)
            | Error::Outbox(_)
            | Error::Route(_)
            | Error::Producer(_)
            | Error::Polling(_)
            | Error::Listen { .. } => false,
        }
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
