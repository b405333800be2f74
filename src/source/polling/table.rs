//! The outbox table as the polling cycle uses it: the [`OutboxTable`] trait, one connection's
//! statements, and [`PgTable`], its tokio-postgres implementation. The cycle
//! ([`super::PollingSource`]) decides what to publish, mark and charge; the table runs the
//! statements, so a fake table can stand in for PostgreSQL in the deterministic simulation.

use std::future::Future;

use tokio_postgres::Client;

use super::statements::{Statements, COL_CTID};
use crate::config::{EventLimit, OutboxColumns};
use crate::error::Error;
use crate::source::outbox::OutboxEvent;
use crate::source::slot::SqlConnection;
use crate::source::SourceError;

/// One row the cycle's SELECT locked.
#[derive(Debug, Clone)]
pub(crate) struct SelectedRow {
    /// Where the row is (`ctid` text): the marks name rows by it.
    pub ctid: String,
    pub event: OutboxEvent,
    /// The created_at column, Unix ms.
    pub created_ms: Option<i64>,
    /// Blocking rows of its aggregate before it in `(created_at, id)` order (in the table, not
    /// only the batch): pending ones, and FAILED ones when they block the aggregate.
    pub older: i64,
}

/// What a retryable failure's mark made of a row (`mark = "status"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RetryMark {
    pub event_id: String,
    /// `PENDING`, or `FAILED` once its attempts reached `max_attempts`.
    pub status: String,
    /// `retry_count` after the mark.
    pub attempts: i64,
}

/// The retry bookkeeping of `mark = "status"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// The first retry delay; doubled per attempt before it, at most `retry_max_ms`.
    pub retry_min_ms: u64,
    pub retry_max_ms: u64,
    /// Attempts after which a retryable failure makes the row `FAILED`.
    pub max_attempts: u32,
}

/// The gauges' numbers: pending rows, the age of the oldest (s), FAILED rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TableStats {
    pub pending: i64,
    pub oldest_pending_age_secs: f64,
    pub failed: i64,
}

/// One connection to the outbox table and the pipeline's statements on it. A cycle is
/// `begin`, `select`, then (when it found rows) the marks and `commit`; the transaction ends
/// with the connection if it is dropped before the commit (its marks are then undone and its
/// row locks released).
///
/// Every method returns an error if the statement fails (the connection lost, a server error);
/// the cycle's session then ends.
pub(crate) trait OutboxTable: Send + Sync + 'static {
    /// Counts pending and FAILED rows.
    fn stats(&self) -> impl Future<Output = Result<TableStats, Error>> + Send;

    /// Deletes at most `batch` published rows older than `age_secs`; returns how many.
    /// Nothing (0) where the pipeline has no purge (`purge_published_after_secs` unset or
    /// `mark = "delete"`).
    fn purge(&self, age_secs: f64, batch: i64) -> impl Future<Output = Result<u64, Error>> + Send;

    fn begin(&self) -> impl Future<Output = Result<(), Error>> + Send;

    /// Locks and returns at most `batch_size` pending rows that are due, in `(created_at, id)`
    /// order, skipping rows another transaction has locked (`FOR UPDATE SKIP LOCKED`) and
    /// rows behind a stuck one of their aggregate.
    ///
    /// Also returns an error naming the row if a required column is NULL.
    fn select(
        &self,
        batch_size: i64,
    ) -> impl Future<Output = Result<Vec<SelectedRow>, Error>> + Send;

    /// Marks the rows at `ctids` published (status, flag or delete); returns how many.
    fn mark_published(&self, ctids: &[String]) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Charges one attempt to each row at `ctids` and schedules its retry, or makes it
    /// `FAILED` after its last attempt (`mark = "status"`; nothing otherwise).
    fn mark_retry(
        &self,
        ctids: &[String],
        policy: RetryPolicy,
    ) -> impl Future<Output = Result<Vec<RetryMark>, Error>> + Send;

    /// Charges one attempt to each row at `ctids` and makes it `FAILED` (`mark = "status"`;
    /// nothing otherwise); returns how many.
    fn mark_failed(&self, ctids: &[String]) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Commits the open transaction. An error leaves its outcome unknown: the server may
    /// have committed.
    fn commit(&self) -> impl Future<Output = Result<(), Error>> + Send;
}

/// The outbox table over a tokio-postgres connection.
pub(crate) struct PgTable {
    client: Client,
    _driver: SqlConnection,
    sql: Statements,
    columns: OutboxColumns,
    /// A row over it is selected as a reference only (`max_event_bytes`).
    limit: EventLimit,
}

impl PgTable {
    /// The table over `client` (its connection driven by `driver`), with `sql` built for it;
    /// rows over `limit` come back as references.
    pub(crate) fn new(
        client: Client,
        driver: SqlConnection,
        sql: Statements,
        columns: OutboxColumns,
        limit: EventLimit,
    ) -> Self {
        PgTable {
            client,
            _driver: driver,
            sql,
            columns,
            limit,
        }
    }
}

fn sql_error(e: tokio_postgres::Error) -> Error {
    Error::from(SourceError::Sql(e))
}

impl OutboxTable for PgTable {
    async fn stats(&self) -> Result<TableStats, Error> {
        let row = self
            .client
            .query_one(&self.sql.stats, &[])
            .await
            .map_err(sql_error)?;
        Ok(TableStats {
            pending: row.get(0),
            oldest_pending_age_secs: row.get(1),
            failed: row.get(2),
        })
    }

    async fn purge(&self, age_secs: f64, batch: i64) -> Result<u64, Error> {
        match &self.sql.purge {
            Some(statement) => self
                .client
                .execute(statement, &[&age_secs, &batch])
                .await
                .map_err(sql_error),
            None => Ok(0),
        }
    }

    // BEGIN and COMMIT by hand (the client is shared by the cycle's statements).
    async fn begin(&self) -> Result<(), Error> {
        self.client.batch_execute("BEGIN").await.map_err(sql_error)
    }

    async fn select(&self, batch_size: i64) -> Result<Vec<SelectedRow>, Error> {
        let rows = self
            .client
            .query(
                &self.sql.select,
                &[
                    &batch_size,
                    &i64::try_from(self.limit.bytes).unwrap_or(i64::MAX),
                ],
            )
            .await
            .map_err(sql_error)?;
        rows.iter()
            .map(|row| {
                let (event, created_ms, older) = self.sql.event(&self.columns, self.limit, row)?;
                Ok(SelectedRow {
                    ctid: row.get::<_, String>(COL_CTID),
                    event,
                    created_ms,
                    older,
                })
            })
            .collect()
    }

    async fn mark_published(&self, ctids: &[String]) -> Result<u64, Error> {
        self.client
            .execute(&self.sql.mark_published, &[&ctids])
            .await
            .map_err(sql_error)
    }

    async fn mark_retry(
        &self,
        ctids: &[String],
        policy: RetryPolicy,
    ) -> Result<Vec<RetryMark>, Error> {
        let Some(sql) = &self.sql.mark_retry else {
            return Ok(Vec::new());
        };
        let rows = self
            .client
            .query(
                sql,
                &[
                    &ctids,
                    &(policy.retry_min_ms as f64),
                    &(policy.retry_max_ms as f64),
                    &i32::try_from(policy.max_attempts).unwrap_or(i32::MAX),
                ],
            )
            .await
            .map_err(sql_error)?;
        Ok(rows
            .iter()
            .map(|row| RetryMark {
                event_id: row.get(0),
                status: row.get(1),
                attempts: row.get(2),
            })
            .collect())
    }

    async fn mark_failed(&self, ctids: &[String]) -> Result<u64, Error> {
        let Some(sql) = &self.sql.mark_failed else {
            return Ok(0);
        };
        let rows = self.client.query(sql, &[&ctids]).await.map_err(sql_error)?;
        Ok(rows.len() as u64)
    }

    async fn commit(&self) -> Result<(), Error> {
        self.client.batch_execute("COMMIT").await.map_err(sql_error)
    }
}
