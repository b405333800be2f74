//! The PostgreSQL side: the walsender connection, the pgoutput decoder and the outbox mapping.
//!
//! - [`conninfo`]: `source_url` as libpq reads it (URL, `PG*` variables, password file).
//! - [`replication`]: connection, authentication and the CopyBoth stream (IO).
//! - [`pgoutput`]: bytes to typed pgoutput messages (pure).
//! - [`outbox`]: Relation cache and outbox Insert to [`outbox::OutboxEvent`] (pure).
//! - [`slot`]: checks of the publication and the slot over an ordinary SQL connection.
//! - [`tls`]: rustls for both connections, with libpq's `sslmode` semantics.

pub mod conninfo;
pub mod outbox;
pub mod pgoutput;
pub mod replication;
pub mod slot;
pub mod tls;

use crate::checkpoint::TrackerError;
use crate::lsn::Lsn;

/// An error of the PostgreSQL side of a pipeline.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("i/o error on the replication connection")]
    Io(#[from] std::io::Error),
    #[error("server error {code}: {message}")]
    Server { code: String, message: String },
    #[error("sql connection error")]
    Sql(#[from] tokio_postgres::Error),
    #[error("replication protocol error: {0}")]
    Protocol(String),
    #[error("authentication failed: {0}")]
    Auth(String),
    #[error("{0}")]
    Config(String),
    #[error("the server closed the replication connection")]
    Closed,
    #[error("invalid pgoutput message at LSN {lsn}")]
    Decode {
        lsn: Lsn,
        #[source]
        source: pgoutput::DecodeError,
    },
    #[error("impossible transaction sequence at LSN {lsn}")]
    Tracker {
        lsn: Lsn,
        #[source]
        source: TrackerError,
    },
    #[error("tls: {0}")]
    Tls(String),
}

impl SourceError {
    /// Whether reconnecting may help. Server errors are classified by SQLSTATE class; an
    /// unknown one counts as transient.
    pub fn is_transient(&self) -> bool {
        match self {
            SourceError::Io(_) | SourceError::Closed => true,
            SourceError::Protocol(_) => true,
            SourceError::Server { code, .. } => sqlstate_is_transient(code),
            SourceError::Sql(error) => match error.code() {
                Some(code) => sqlstate_is_transient(code.code()),
                // A certificate that fails verification fails the same way next time.
                None => !is_tls_error(error),
            },
            SourceError::Auth(_)
            | SourceError::Tls(_)
            | SourceError::Config(_)
            | SourceError::Decode { .. }
            | SourceError::Tracker { .. } => false,
        }
    }
}

/// Whether a tokio-postgres error came from the TLS layer (certificate or handshake).
fn is_tls_error(error: &tokio_postgres::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if cause.is::<rustls::Error>() {
            return true;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
            {
                return true;
            }
        }
        source = cause.source();
    }
    false
}

/// SQLSTATE classes that retrying cannot fix: authorization (28), invalid catalog or
/// schema names (3D, 3F), syntax, undefined objects and privileges (42), feature not
/// supported (0A). Everything else, connection loss (08), resources (53), operator
/// intervention (57) and an active slot (55006) included, is worth a reconnect.
fn sqlstate_is_transient(code: &str) -> bool {
    !matches!(code.get(..2), Some("28" | "3D" | "3F" | "42" | "0A"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_sqlstates() {
        for transient in ["08006", "57P01", "55006", "53300", "XX000"] {
            assert!(sqlstate_is_transient(transient), "{transient}");
        }
        for permanent in ["28P01", "28000", "42704", "3D000", "0A000"] {
            assert!(!sqlstate_is_transient(permanent), "{permanent}");
        }
    }
}
