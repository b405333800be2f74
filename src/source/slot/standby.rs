//! Logical decoding on a physical standby (PostgreSQL 16+): what differs from a primary.
//!
//! - The standby writes no WAL, so `pg_current_wal_lsn()` fails there ("recovery is in
//!   progress"); the end of WAL a slot can be decoded up to is the replay position
//!   ([`WAL_END_SQL`]).
//! - Creating a slot there waits until the primary logs a running-transactions record
//!   (`xl_running_xacts`) and the standby replays it: the primary's background writer logs one
//!   every 15 s while WAL is being written, never while the primary is idle, and
//!   `SELECT pg_log_standby_snapshot()` on the primary logs one at once. [`CreationWait`]
//!   says when to tell the operator.
//! - The standby's own `wal_level` must be `logical`, and so must the primary's, which the
//!   standby knows from the WAL it replays but shows in no setting: a slot creation fails at
//!   once when it is lower ([`primary_wal_level_error`]).
//! - Without `hot_standby_feedback` (and a physical slot on the primary) a VACUUM on the
//!   primary removes catalog rows the standby's slot still needs, and the standby invalidates
//!   the slot (`rows_removed`; `conflicting` on 16).

use std::time::Duration;

use tokio_postgres::Client;

use super::failover::Server;
use crate::source::SourceError;

/// The end of WAL on the server, as an SQL `pg_lsn` expression: `pg_current_wal_lsn()` on a
/// primary, `pg_last_wal_replay_lsn()` on a standby (what a walsender there decodes up to).
pub const WAL_END_SQL: &str = "CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() ELSE pg_catalog.pg_current_wal_lsn() END";

/// How long a slot creation may wait before the relay says why it waits.
pub const FIRST_WAIT_LOG: Duration = Duration::from_secs(5);

/// How often it says so again while the creation still waits.
pub const WAIT_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// Reads whether the server of `client` is in recovery (a standby).
///
/// Returns an error if the query fails.
pub async fn in_recovery(client: &Client) -> Result<bool, SourceError> {
    Ok(client
        .query_one("SELECT pg_catalog.pg_is_in_recovery()", &[])
        .await?
        .get(0))
}

/// When to log that a slot creation is still waiting: first after [`FIRST_WAIT_LOG`], then
/// every [`WAIT_LOG_INTERVAL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreationWait {
    /// How many times it was logged.
    pub logged: u32,
}

impl CreationWait {
    pub fn new() -> Self {
        CreationWait { logged: 0 }
    }

    /// How long after the previous log line (or the creation's start) the next one is due.
    pub fn next_delay(&self) -> Duration {
        match self.logged {
            0 => FIRST_WAIT_LOG,
            _ => WAIT_LOG_INTERVAL,
        }
    }

    /// What to log when the creation of `slot` on the server at `host` has waited `waited`;
    /// counts the line as logged.
    pub fn message(&mut self, slot: &str, host: &str, standby: bool, waited: Duration) -> String {
        self.logged += 1;
        let waited = waited.as_secs();
        match standby {
            true => format!(
                "creating replication slot {slot:?} on the standby {host} has waited {waited} s for a running-transactions (xl_running_xacts) record from the primary; SELECT pg_log_standby_snapshot() on the primary ends the wait (its background writer logs one every 15 s only while WAL is written)"
            ),
            false => format!(
                "creating replication slot {slot:?} on {host} has waited {waited} s for the transactions running there to end (pg_stat_activity, backend_xid): a slot starts only after every transaction older than it"
            ),
        }
    }
}

impl Default for CreationWait {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether a failed slot creation's `message` says that the primary's `wal_level` is below
/// `logical` ("logical decoding on standby requires wal_level >= logical on the primary", with
/// quotes around the names from PostgreSQL 17).
pub fn is_primary_wal_level_error(message: &str) -> bool {
    message.contains("on standby") && message.contains("wal_level") && message.contains("primary")
}

/// Why the standby at `host` refuses logical slots when its primary's `wal_level` is below
/// `logical`, with the fix: what `check` fails its `primary wal_level` finding with, and what
/// the start's error says after the slot's name ([`primary_wal_level_error`]).
pub fn primary_wal_level_fix(host: &str) -> String {
    format!(
        "the standby {host} refuses logical slots: its primary has wal_level below logical, and logical decoding on a standby needs wal_level = logical on the primary as well: set it there (ALTER SYSTEM SET wal_level = logical) and restart the primary"
    )
}

/// The error of a slot creation on the standby at `host` refused because the primary's
/// `wal_level` is below `logical`.
pub fn primary_wal_level_error(slot: &str, host: &str) -> String {
    format!(
        "cannot create replication slot {slot:?}: {}",
        primary_wal_level_fix(host)
    )
}

/// The first major that decodes on a standby.
pub const DECODING_MIN_VERSION_NUM: i32 = 160_000;

/// Why a pipeline cannot decode on the standby `server` (with `hot_standby_feedback` on or
/// off): a major before 16, or `hot_standby_feedback` off (a VACUUM on the primary then
/// invalidates the slot, `rows_removed`); `None` when it can. The start stops with this
/// sentence (exit code 3) and `check` fails its `standby decoding` or `standby feedback`
/// finding with it.
pub fn decoding_refusal(server: &Server, hot_standby_feedback: bool) -> Option<String> {
    let host = &server.host;
    if server.version_num < DECODING_MIN_VERSION_NUM {
        return Some(format!(
            "{host} is a standby running PostgreSQL {}: logical decoding on a standby needs PostgreSQL 16 or later; point source_url at the primary",
            server.version
        ));
    }
    (!hot_standby_feedback).then(|| format!(
        "hot_standby_feedback is off on {host}, a standby the pipeline decodes on: a VACUUM on the primary may remove catalog rows the slot needs, and the standby then invalidates the slot (rows_removed): ALTER SYSTEM SET hot_standby_feedback = on there, then SELECT pg_reload_conf()"
    ))
}

/// Before a session on a standby: stops on what `check` fails of decoding there
/// ([`decoding_refusal`]); nothing on a primary. A lost slot is left to
/// [`prepare`](super::prepare), which stops on it with its own sentence and exit code.
///
/// Returns [`SourceError::Config`] with `check`'s sentence, or an error if a query fails.
pub async fn check_decoding(client: &Client, slot: &str) -> Result<(), SourceError> {
    let row = client
        .query_one(
            "SELECT pg_catalog.pg_is_in_recovery(), current_setting('hot_standby_feedback') = 'on',
                    EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots
                            WHERE slot_name = $1 AND wal_status = 'lost')",
            &[&slot],
        )
        .await?;
    let (in_recovery, feedback, lost): (bool, bool, bool) = (row.get(0), row.get(1), row.get(2));
    if !in_recovery || lost {
        return Ok(());
    }
    let server = super::failover::server(client).await?;
    match decoding_refusal(&server, feedback) {
        Some(refusal) => Err(SourceError::Config(refusal)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_told_after_five_seconds_then_every_thirty() {
        let mut wait = CreationWait::new();
        assert_eq!(wait.next_delay(), Duration::from_secs(5));
        let first = wait.message("s", "10.0.0.2:5432", true, Duration::from_secs(5));
        assert_eq!(wait.next_delay(), Duration::from_secs(30));
        let second = wait.message("s", "10.0.0.2:5432", true, Duration::from_secs(35));
        assert_eq!(wait.next_delay(), Duration::from_secs(30));
        assert_eq!(wait.logged, 2);
        for part in [
            "\"s\"",
            "standby 10.0.0.2:5432",
            "5 s",
            "xl_running_xacts",
            "SELECT pg_log_standby_snapshot() on the primary",
        ] {
            assert!(first.contains(part), "{part:?} missing in {first}");
        }
        assert!(second.contains("35 s"), "{second}");
        let primary = CreationWait::new().message("s", "h:1", false, Duration::from_secs(5));
        assert!(
            primary.contains("transactions running there") && !primary.contains("standby"),
            "{primary}"
        );
    }

    #[test]
    fn recognises_the_primary_wal_level_error_of_each_major() {
        for message in [
            // 16
            "logical decoding on standby requires wal_level >= logical on the primary",
            // 17, 18
            "logical decoding on standby requires \"wal_level\" >= \"logical\" on the primary",
        ] {
            assert!(is_primary_wal_level_error(message), "{message}");
        }
        for message in [
            "logical decoding requires wal_level >= logical",
            "replication slot \"s\" already exists",
        ] {
            assert!(!is_primary_wal_level_error(message), "{message}");
        }
        let error = primary_wal_level_error("s", "10.0.0.2:5432");
        for part in [
            "\"s\"",
            "standby 10.0.0.2:5432",
            "wal_level = logical on the primary",
        ] {
            assert!(error.contains(part), "{part:?} missing in {error}");
        }
    }
}
