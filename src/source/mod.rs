//! The PostgreSQL side: the [`Source`] trait the session loop reads from, its two
//! implementations, and their parts.
//!
//! - [`conninfo`]: `source_url` as libpq reads it (URL, `PG*` variables, password file).
//! - [`logical`]: log tailing, the replication stream decoded into outbox events.
//! - [`polling`]: the outbox table read with `FOR UPDATE SKIP LOCKED`.
//! - [`privileges`]: what the relay's role may do, as `run` and `check` tell it.
//! - [`replication`]: connection, authentication and the CopyBoth stream (IO).
//! - [`pgoutput`]: bytes to typed pgoutput messages (pure).
//! - [`outbox`]: Relation cache and outbox Insert to [`outbox::OutboxEvent`] (pure).
//! - [`slot`]: checks of the publication and the slot over an ordinary SQL connection.
//! - [`target`]: which host of a multi-host URL to take (libpq's `target_session_attrs`).
//! - [`slot_record`]: the record of the slots the relay streamed from, so a lost slot is
//!   never re-created silently.
//! - [`tls`]: rustls for both connections, with libpq's `sslmode` semantics.

pub mod auth;
pub mod conninfo;
pub mod coverage;
pub mod logical;
pub mod outbox;
pub mod pgoutput;
pub mod polling;
pub mod privileges;
pub mod replication;
pub mod slot;
pub mod slot_record;
pub mod target;
pub mod tls;

use std::future::Future;

use crate::ack::TrackerError;
use crate::error::Error;
use crate::lsn::Lsn;
use crate::sink::DeliveryError;
use outbox::OutboxEvent;

/// What a [`Source`] yields, in source order. (Events are the common variant: boxing them
/// would cost an allocation each.)
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum SourceItem {
    /// A transaction starts; its events follow, then its [`SourceItem::Commit`].
    Begin {
        /// Where the transaction's commit record starts (pgoutput's `final_lsn`).
        final_lsn: Lsn,
        /// Commit time, Unix ms: the records' timestamp.
        commit_time_ms: i64,
    },
    /// An event of the open transaction.
    Event {
        event: OutboxEvent,
        /// The record's time (Unix ms) when it is not the transaction's commit time (the
        /// polling source: the row's `created_at`).
        time_ms: Option<i64>,
    },
    /// The open transaction ends; confirming `end_lsn` covers it.
    Commit { end_lsn: Lsn },
    /// Nothing the source sent before this position is an event: once nothing is in flight,
    /// it may be confirmed (a keepalive's `wal_end`).
    Idle(Lsn),
}

/// A position the session loop confirms to its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Confirmation {
    /// Every event before it is acknowledged by the sink (in exactly-once mode, committed);
    /// never decreases.
    pub position: Lsn,
    /// Records acknowledged since the previous confirmation, for progress reports.
    pub delivered: u64,
}

/// Who handles an event's failed delivery; the answer of [`Source::on_outcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureHandling {
    /// The session loop: a retryable failure ends the session (the next one publishes again
    /// from the confirmed position), any other dead-letters or halts (`on_bad_event`).
    Session,
    /// The source recorded it (polling: `retry_count`, `FAILED`): the event counts as
    /// settled and the session goes on.
    Recorded,
}

/// Where a session's events come from: a stream of [`SourceItem`]s that takes confirmations
/// of positions and learns each event's outcome. The session loop owns no IO; a source does its own (replication protocol,
/// keepalive replies, SQL).
pub trait Source: Send {
    /// The next item.
    ///
    /// Cancel-safe: a call dropped before it completed loses no item. Returns an error if
    /// the connection failed or the source read something it cannot map (bad input, a
    /// protocol violation).
    fn next(&mut self) -> impl Future<Output = Result<SourceItem, Error>> + Send;

    /// Tells the source that everything before `confirmation.position` is delivered: the
    /// log-tailing source sends it to the walsender as its flush LSN.
    ///
    /// Not cancel-safe: call it from a `select!` arm's body. Returns an error if it cannot be
    /// passed on (the connection failed).
    fn confirm(
        &mut self,
        confirmation: Confirmation,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// The outcome of event number `event` (its ordinal among the [`SourceItem::Event`]s this
    /// source yielded, from 0): acknowledged, or failed (the sink refused it or could not
    /// deliver it). Called before any confirmation that covers the event.
    fn on_outcome(&mut self, event: u64, outcome: Result<(), &DeliveryError>) -> FailureHandling;

    /// Whether the source asks for a confirmation now (the walsender requested a reply).
    fn confirm_requested(&self) -> bool;

    /// Ends the source cleanly after the last confirmation; problems are logged, not returned.
    fn close(self) -> impl Future<Output = ()> + Send;
}

/// An error of the PostgreSQL side of a pipeline.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("i/o error on the connection to PostgreSQL")]
    Io(#[from] std::io::Error),
    /// Connecting to one host of the source URL failed (refused, unreachable, no such name).
    #[error("cannot connect to PostgreSQL at {endpoint}{hint}")]
    Connect {
        /// `host:port`, `host (address):port` or the socket path tried.
        endpoint: String,
        /// Advice when the host looks like part of a password.
        hint: &'static str,
        #[source]
        source: std::io::Error,
    },
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
    /// The relay's role lacks a privilege the pipeline needs (the sentence names the fix).
    #[error("{0}")]
    Privilege(String),
    /// The slot the relay streamed from is gone (the slot record says so) or invalidated
    /// (`wal_status = 'lost'`): events after its last confirmed LSN may be missing.
    #[error("{0}")]
    SlotLost(String),
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
    /// No host of the source URL was reachable and what `target_session_attrs` asks for.
    #[error(transparent)]
    NoHostFits(#[from] target::NoHostFits),
    /// `teardown` stopped at a statement that failed, after removing what it names.
    #[error(transparent)]
    Teardown(#[from] slot::teardown::Stopped),
}

impl SourceError {
    /// The SQLSTATE of an error the server sent, if this is one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            SourceError::Server { code, .. } => Some(code),
            SourceError::Sql(error) => error.code().map(|c| c.code()),
            _ => None,
        }
    }

    /// Whether reconnecting may help. Server errors are classified by SQLSTATE class; an
    /// unknown one counts as transient.
    pub fn is_transient(&self) -> bool {
        match self {
            SourceError::Io(_) | SourceError::Connect { .. } | SourceError::Closed => true,
            // A failover in progress: a standby becomes the primary.
            SourceError::NoHostFits(_) => true,
            SourceError::Protocol(_) => true,
            SourceError::Server { code, .. } => sqlstate_is_transient(code),
            SourceError::Teardown(stopped) => stopped
                .source
                .code()
                .is_none_or(|code| sqlstate_is_transient(code.code())),
            SourceError::Sql(error) => match error.code() {
                Some(code) => sqlstate_is_transient(code.code()),
                // A certificate that fails verification, or an authentication request the
                // relay refuses, fails the same way next time.
                None => !is_tls_error(error) && !auth::is_refusal(error) && !is_auth_error(error),
            },
            SourceError::Auth(_)
            | SourceError::Tls(_)
            | SourceError::Config(_)
            | SourceError::Privilege(_)
            | SourceError::SlotLost(_)
            | SourceError::Decode { .. }
            | SourceError::Tracker { .. } => false,
        }
    }
}

/// Whether tokio-postgres refused the server's authentication itself (`channel_binding=require`
/// and a server that does not bind, a password the server asks for and the URL lacks).
fn is_auth_error(error: &tokio_postgres::Error) -> bool {
    error.to_string().starts_with("authentication error")
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

/// SQLSTATE classes that retrying cannot fix: data exceptions (22: a value the server
/// cannot send as asked, such as text that is not UTF-8 in a `SQL_ASCII` database, fails
/// the same way on every try), authorization (28), invalid catalog or schema names (3D,
/// 3F), syntax, undefined objects and privileges (42), feature not supported (0A).
/// Everything else, connection loss (08), resources (53), operator
/// intervention (57) and an active slot (55006) included, is worth a reconnect.
fn sqlstate_is_transient(code: &str) -> bool {
    !matches!(code.get(..2), Some("22" | "28" | "3D" | "3F" | "42" | "0A"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_sqlstates() {
        for transient in ["08006", "57P01", "55006", "53300", "XX000"] {
            assert!(sqlstate_is_transient(transient), "{transient}");
        }
        for permanent in ["28P01", "28000", "42704", "3D000", "0A000", "22021"] {
            assert!(!sqlstate_is_transient(permanent), "{permanent}");
        }
    }
}
