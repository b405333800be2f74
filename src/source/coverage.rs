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
}

impl Coverage {
    /// The error that stops the pipeline on a drifted publication, naming `confirmed`, the
    /// last position the stopping session confirmed to the slot; `None` while verified.
    pub fn drift_error(&self, confirmed: Lsn) -> Option<SourceError> {
        match self {
            Coverage::Verified(_) => None,
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
        if matches!(*self.tell.borrow(), Coverage::Verified(_)) {
            self.tell.send_replace(Coverage::Verified(Lsn::ZERO));
        }
    }

    /// One check over `client` (on the server the sessions stream from). A drift, once found,
    /// stays: the pipeline stops on it, and only a new checker (the pipeline started afresh)
    /// forgets it.
    ///
    /// Returns an error if a query fails: nothing is verified then.
    pub async fn check(&mut self, client: &Client) -> Result<(), SourceError> {
        if matches!(*self.tell.borrow(), Coverage::Drifted { .. }) {
            return Ok(());
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
        let verified = match *self.tell.borrow() {
            Coverage::Verified(lsn) => lsn,
            Coverage::Drifted { verified, .. } => verified,
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

    /// Found by an operator: a pipeline whose checks had verified nothing yet stopped with
    /// "without confirming past LSN 0/0" although it had confirmed its new slot's start.
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
