//! Publication coverage: how far the WAL is known to have been decoded with the outbox table in
//! the publication, publishing inserts.
//!
//! pgoutput decodes each change with the catalogs as they were at its LSN. After `ALTER
//! PUBLICATION ... DROP TABLE outbox`, `SET (publish = 'update, delete')`, or the outbox table
//! dropped and created again under a publication that is not `FOR ALL TABLES`, the walsender
//! leaves the table's inserts out and says nothing: keepalives and transactions without an
//! outbox insert (a row inserted and deleted at once shows only as its delete) would confirm
//! the slot past inserts that were never published. So the log-tailing source confirms a
//! position only up to WAL that a check of the publication covers ([`Coverage::Verified`]),
//! or up to the end of the last transaction in which it decoded an insert of the table (which
//! shows the table published there), and stops on a check that finds the publication changed
//! ([`Coverage::Drifted`]) before anything after that is confirmed.
//!
//! A check ([`Checker::check`]) reads the end of WAL `L`, then the running transactions'
//! horizon (`xmax` of a snapshot); a later check whose snapshot's `xmin` has passed that horizon
//! (every transaction that had ended or was running below it has ended, so the catalogs it reads
//! include their changes) and finds the publication still covering the table verifies `L`.
//! What remains:
//! - a publication change undone again between two checks (a table dropped from the
//!   publication and added back within the check interval) is not seen, and the inserts in
//!   between are not published;
//! - a change whose commit is written but not yet visible (held by a synchronous standby that
//!   does not answer, with a transaction id above the horizon) is seen only once it is visible;
//! - a transaction that does not end holds the verified LSN back (as it holds the slot's
//!   `restart_lsn`).
//!
//! A drift stays until the pipeline starts afresh with a new checker: after it stopped for good
//! and starts again (`on_pipeline_failure = "retry"`), as a new process would, whose start
//! checks the publication itself. So a change made and undone while the pipeline waits to
//! start again is not seen, as by a relay that was not running.
//!
//! A server that refuses the checks' connection because it is shutting down (SQLSTATE 57P03,
//! [`Coverage::CannotConnectNow`]) ends the sessions streaming from it: before it exits, a
//! walsender waits for its client to confirm everything it sent, the shutdown checkpoint
//! included, which no check can verify any more, so the relay would hold the shutdown up for
//! good.

use std::time::Instant;

use tokio::sync::watch;
use tokio_postgres::Client;

use super::slot::{check_publication, standby::WAL_END_SQL};
use super::SourceError;
use crate::config::TableName;
use crate::lsn::Lsn;

/// What the checks of the publication found so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    /// WAL before this LSN was decoded with the table in the publication, publishing inserts.
    Verified(Lsn),
    /// A check found the publication no longer covers the table's inserts.
    Drifted {
        /// What the check found, with the fix.
        reason: String,
        /// The last LSN verified before.
        verified: Lsn,
    },
    /// The server refused the checks' connection with SQLSTATE 57P03 (`cannot_connect_now`:
    /// shutting down, starting up, not accepting connections yet): WAL before `verified` is
    /// verified, nothing after it can be until a connection succeeds.
    CannotConnectNow {
        /// The server's refusal.
        reason: String,
        /// The last LSN verified before.
        verified: Lsn,
        /// When it last refused.
        at: Instant,
    },
}

impl Coverage {
    /// The LSN before which WAL is verified.
    pub fn verified(&self) -> Lsn {
        match self {
            Coverage::Verified(verified)
            | Coverage::Drifted { verified, .. }
            | Coverage::CannotConnectNow { verified, .. } => *verified,
        }
    }

    /// The transient error that ends a session started at `session_start` once the server
    /// refused a check's connection after it: a walsender shutting down waits for a
    /// confirmation no check can verify any more, so the session lets it go, and the next one
    /// starts once the server takes connections again. `None` otherwise.
    pub fn cannot_connect_now_error(&self, session_start: Instant) -> Option<SourceError> {
        match self {
            Coverage::CannotConnectNow { reason, at, .. } if *at >= session_start => {
                Some(SourceError::Server {
                    code: "57P03".to_owned(),
                    message: format!(
                        "the server refuses new connections ({reason}): the publication cannot be checked, so the slot cannot be confirmed further; the session ends so that the walsender can exit (a server shutting down waits for it), and the relay reconnects"
                    ),
                })
            }
            _ => None,
        }
    }

    /// The error that stops the pipeline on a drifted publication, naming `confirmed`, the
    /// last position the stopping session confirmed to the slot; `None` otherwise.
    pub fn drift_error(&self, confirmed: Lsn) -> Option<SourceError> {
        match self {
            Coverage::Verified(_) | Coverage::CannotConnectNow { .. } => None,
            Coverage::Drifted { reason, .. } => Some(SourceError::Config(format!(
                "the publication changed while streaming: {reason}. PostgreSQL decodes no insert of the table from the change on, so the relay stopped without confirming past LSN {confirmed}: re-add the table (or the 'insert' action) to the publication, then publish again the outbox rows written since the change, which the slot does not carry (docs/operations/runbook.md, \"The publication changed\")"
            ))),
        }
    }
}

/// The receiving side, for a source: the latest [`Coverage`].
pub type CoverageWatch = watch::Receiver<Coverage>;

/// Runs the checks of one pipeline's publication and tells a [`CoverageWatch`] what they found.
pub struct Checker {
    publication: String,
    table: TableName,
    tell: watch::Sender<Coverage>,
    /// The end of WAL read by the last check that found the publication covering the table,
    /// with the running transactions' horizon then (a snapshot's `xmax`): verified once a
    /// snapshot's `xmin` passed it.
    pending: Option<(Lsn, i64)>,
}

impl Checker {
    /// A checker for `publication` and `table` and its watch, which starts at
    /// `Verified(Lsn::ZERO)`: nothing is verified before a check.
    pub fn new(publication: &str, table: &TableName) -> (Self, CoverageWatch) {
        let (tell, watch) = watch::channel(Coverage::Verified(Lsn::ZERO));
        let checker = Checker {
            publication: publication.to_owned(),
            table: table.clone(),
            tell,
            pending: None,
        };
        (checker, watch)
    }

    /// The checks go to another server from now on: what was read or verified on the last
    /// one does not count (its transaction ids are its own, and after an asynchronous failover
    /// the new server's WAL may differ below the LSN verified there).
    pub fn new_server(&mut self) {
        self.pending = None;
        if !matches!(*self.tell.borrow(), Coverage::Drifted { .. }) {
            self.tell.send_replace(Coverage::Verified(Lsn::ZERO));
        }
    }

    /// The server refused the checks' connection with SQLSTATE 57P03 (`reason`): see
    /// [`Coverage::CannotConnectNow`]. A drift found before stays. Returns whether this is the
    /// first refusal since a check's connection succeeded.
    pub fn cannot_connect_now(&mut self, reason: String) -> bool {
        let (verified, first) = match &*self.tell.borrow() {
            Coverage::Drifted { .. } => return false,
            coverage => (
                coverage.verified(),
                !matches!(coverage, Coverage::CannotConnectNow { .. }),
            ),
        };
        self.tell.send_replace(Coverage::CannotConnectNow {
            reason,
            verified,
            at: Instant::now(),
        });
        first
    }

    /// One check over `client` (on the server the sessions stream from). A drift, once found,
    /// stays: the pipeline stops on it, and only a new checker (the pipeline started afresh)
    /// forgets it.
    ///
    /// Returns an error if a query fails: nothing is verified then.
    pub async fn check(&mut self, client: &Client) -> Result<(), SourceError> {
        let verified = match &*self.tell.borrow() {
            Coverage::Drifted { .. } => return Ok(()),
            coverage => coverage.verified(),
        };
        // Connected: the server takes connections again.
        if matches!(*self.tell.borrow(), Coverage::CannotConnectNow { .. }) {
            self.tell.send_replace(Coverage::Verified(verified));
        }
        // In three statements, each with a snapshot taken after the one before: the end of
        // WAL first, then the transactions running, then (a later check) the catalogs.
        let end: Lsn = client
            .query_one(&format!("SELECT ({WAL_END_SQL})::text"), &[])
            .await?
            .get::<_, String>(0)
            .parse()
            .map_err(|e| SourceError::Protocol(format!("end of WAL: {e}")))?;
        let (xmin, xmax): (i64, i64) = {
            let row = client
                .query_one(
                    "SELECT pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())::text::bigint,
                            pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint",
                    &[],
                )
                .await?;
            (row.get(0), row.get(1))
        };
        if let Err(e) = check_publication(client, &self.publication, &self.table).await {
            let reason = match e {
                SourceError::Config(reason) => reason,
                other => return Err(other),
            };
            self.tell
                .send_replace(Coverage::Drifted { reason, verified });
            return Ok(());
        }
        // The catalogs just read include every transaction that ended before this statement:
        // the last check's end of WAL is covered if every transaction running then has ended.
        match self.pending {
            Some((lsn, next_xid)) if xmin >= next_xid => {
                if lsn > verified {
                    self.tell.send_replace(Coverage::Verified(lsn));
                }
                self.pending = Some((end, xmax));
            }
            Some(_) => {}
            None => self.pending = Some((end, xmax)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checker() -> (Checker, CoverageWatch) {
        Checker::new("outbox_pub", &"public.outbox".parse().unwrap())
    }

    #[test]
    fn a_refused_connection_keeps_what_was_verified_and_is_said_once() {
        let (mut checker, watch) = checker();
        checker.tell.send_replace(Coverage::Verified(Lsn(0x100)));
        assert!(checker.cannot_connect_now("the database system is shutting down".into()));
        assert!(!checker.cannot_connect_now("the database system is shutting down".into()));
        assert!(matches!(
            &*watch.borrow(),
            Coverage::CannotConnectNow { verified, .. } if *verified == Lsn(0x100)
        ));
        assert_eq!(watch.borrow().verified(), Lsn(0x100));
        assert!(watch.borrow().drift_error(Lsn(0x100)).is_none());
        // A server new to the checks starts again from nothing.
        checker.new_server();
        assert_eq!(*watch.borrow(), Coverage::Verified(Lsn::ZERO));
    }

    #[test]
    fn a_drift_found_stays_through_a_refused_connection() {
        let (mut checker, watch) = checker();
        let drifted = Coverage::Drifted {
            reason: "table public.outbox is not in publication".into(),
            verified: Lsn(0x100),
        };
        checker.tell.send_replace(drifted.clone());
        assert!(!checker.cannot_connect_now("the database system is shutting down".into()));
        assert_eq!(*watch.borrow(), drifted);
    }

    /// Only a refusal after a session started ends it, with an error the supervisor retries: a
    /// session that connected since is streaming from a server that takes connections.
    #[test]
    fn a_refusal_ends_only_the_sessions_started_before_it_and_is_transient() {
        let before = Instant::now();
        let refused = Coverage::CannotConnectNow {
            reason: "the database system is shutting down".into(),
            verified: Lsn(0x100),
            at: Instant::now(),
        };
        let error = refused
            .cannot_connect_now_error(before)
            .expect("a session started before the refusal ends");
        assert!(error.is_transient(), "{error}");
        assert_eq!(error.sqlstate(), Some("57P03"));
        assert!(
            error
                .to_string()
                .contains("the database system is shutting down"),
            "{error}"
        );
        let after = Instant::now() + std::time::Duration::from_millis(1);
        assert!(refused.cannot_connect_now_error(after).is_none());
        assert!(Coverage::Verified(Lsn(0x100))
            .cannot_connect_now_error(before)
            .is_none());
    }

    /// The error names the position the session confirmed to the slot, not the last one a
    /// check verified, which is 0/0 before any check verified anything.
    #[test]
    fn the_drift_error_names_the_position_the_session_confirmed() {
        let drifted = Coverage::Drifted {
            reason: "table public.outbox is not in publication \"outbox_pub\"".into(),
            verified: Lsn::ZERO,
        };
        let error = drifted.drift_error(Lsn(0x192_D448)).unwrap().to_string();
        assert!(
            error.contains("without confirming past LSN 0/192D448:"),
            "{error}"
        );
        assert!(Coverage::Verified(Lsn(1)).drift_error(Lsn(1)).is_none());
    }
}
