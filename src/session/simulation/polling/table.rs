//! A fake outbox table behind the real polling cycle: one poller's connection, implementing
//! [`OutboxTable`] over the schedule's rows the way PostgreSQL runs the pipeline's statements
//! at READ COMMITTED.
//!
//! Each statement takes a random latency (0-3 ms), then takes effect at once (a statement is
//! atomic against the other pollers; dropped before, it did nothing). The SELECT sees the
//! committed state: pending rows that are due, not behind a stuck row of their aggregate
//! (FAILED when it blocks, or waiting for its retry), in `seq` order, skipping rows another
//! transaction holds (`SKIP LOCKED`), locking the rows it returns; each with the count of its
//! aggregate's blocking rows before it. The marks are kept in the transaction until its COMMIT;
//! a COMMIT may fail before the server committed (rolled back), fail after it (the client does
//! not learn it), or hang (a synchronous standby down) and complete later; a connection
//! dropped during that wait leaves it committed, as PostgreSQL does. After the session's
//! connection loss every statement fails and the transaction is rolled back.
//!
//! The checks of the marks: a row is marked published only after the sink reported its
//! acknowledgement to the session in this cycle; a retry or a FAILED mark charges only rows
//! tried in this cycle; a row becomes FAILED only after `max_attempts` attempts or when its
//! last attempt was refused for good; a cycle locks at most `batch_size` rows.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::{sleep, Instant};

use super::world::{RowState, Shared, World};
use crate::config::MarkMode;
use crate::error::Error;
use crate::lsn::Lsn;
use crate::session::mutation::{self, Mutation};
use crate::source::outbox::{OutboxEvent, ValueKind};
use crate::source::polling::{OutboxTable, RetryMark, RetryPolicy, SelectedRow, TableStats};
use crate::source::SourceError;

/// A mark kept in the open transaction: the row's state, retry count and next retry after
/// the COMMIT.
#[derive(Clone, Copy, Debug)]
struct Change {
    row: usize,
    state: RowState,
    retry_count: u32,
    next_retry_at: Option<Instant>,
}

#[derive(Debug, Default)]
struct Txn {
    id: u64,
    locked: Vec<usize>,
    changes: Vec<Change>,
    /// A COMMIT is waiting: dropping the connection leaves it committed.
    committing: bool,
}

/// One poller's connection to the table.
pub(super) struct FakeTable {
    world: Shared,
    poller: usize,
    txn: Mutex<Option<Txn>>,
}

impl FakeTable {
    pub fn new(world: Shared, poller: usize) -> Self {
        FakeTable {
            world,
            poller,
            txn: Mutex::new(None),
        }
    }

    fn txn(&self) -> std::sync::MutexGuard<'_, Option<Txn>> {
        self.txn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits a statement's latency; returns an error if the connection is lost by then (the
    /// transaction is rolled back).
    async fn statement(&self) -> Result<(), Error> {
        let latency = {
            let mut w = self.world.lock();
            Duration::from_millis(w.rng.u64(0..=3))
        };
        sleep(latency).await;
        let w = self.world.lock();
        let session = &w.sessions[self.poller];
        let lost = session
            .faults
            .connection_lost_after
            .is_some_and(|after| Instant::now() >= session.start + after);
        drop(w);
        if lost {
            self.rollback();
            return Err(lost_error("simulated connection loss"));
        }
        Ok(())
    }

    fn rollback(&self) {
        if let Some(txn) = self.txn().take() {
            let mut w = self.world.lock();
            release(&mut w, &txn);
        }
    }
}

fn lost_error(reason: &str) -> Error {
    SourceError::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        reason.to_owned(),
    ))
    .into()
}

fn release(w: &mut World, txn: &Txn) {
    for &i in &txn.locked {
        if w.rows[i].locked_by == Some(txn.id) {
            w.rows[i].locked_by = None;
        }
    }
}

/// Applies `txn`'s marks and releases its locks.
fn apply(w: &mut World, txn: &Txn) {
    for change in &txn.changes {
        let row = &mut w.rows[change.row];
        row.state = change.state;
        row.retry_count = change.retry_count;
        row.next_retry_at = change.next_retry_at;
    }
    release(w, txn);
    w.commits += 1;
    w.check_done();
}

impl Drop for FakeTable {
    fn drop(&mut self) {
        if let Some(txn) = self.txn().take() {
            let mut w = self.world.lock();
            match txn.committing {
                true => apply(&mut w, &txn),
                false => release(&mut w, &txn),
            }
        }
    }
}

/// Whether rows of `state` are pending under `mark`.
fn pending(mark: MarkMode, state: RowState) -> bool {
    state == RowState::Pending
        || (mutation::active(Mutation::PollingSelectMarked)
            && state == RowState::Published
            && mark != MarkMode::Delete)
}

impl OutboxTable for FakeTable {
    async fn stats(&self) -> Result<TableStats, Error> {
        self.statement().await?;
        let w = self.world.lock();
        let count = |state| w.rows.iter().filter(|r| r.state == state).count() as i64;
        Ok(TableStats {
            pending: count(RowState::Pending),
            oldest_pending_age_secs: 0.0,
            failed: count(RowState::Failed),
        })
    }

    async fn purge(&self, _age_secs: f64, _batch: i64) -> Result<u64, Error> {
        self.statement().await?;
        Ok(0)
    }

    async fn begin(&self) -> Result<(), Error> {
        self.statement().await?;
        let mut txn = self.txn();
        if txn.is_some() {
            self.world
                .lock()
                .violate("BEGIN inside an open transaction".into());
        }
        let mut w = self.world.lock();
        w.next_txn += 1;
        *txn = Some(Txn {
            id: w.next_txn,
            ..Txn::default()
        });
        Ok(())
    }

    async fn select(&self, batch_size: i64) -> Result<Vec<SelectedRow>, Error> {
        self.statement().await?;
        let mut guard = self.txn();
        let Some(txn) = guard.as_mut() else {
            self.world
                .lock()
                .violate("SELECT outside a transaction".into());
            return Ok(Vec::new());
        };
        let mut w = self.world.lock();
        let now = Instant::now();
        let setup = w.setup;
        let status = setup.mark == MarkMode::Status;
        let blocking = |state: RowState| match setup.mark {
            MarkMode::Status => {
                state == RowState::Pending
                    || (setup.failed_blocks_aggregate && state == RowState::Failed)
            }
            MarkMode::Flag => state == RowState::Pending,
            MarkMode::Delete => state != RowState::Deleted,
        };
        let stuck = |state: RowState, next: Option<Instant>| {
            status
                && ((setup.failed_blocks_aggregate && state == RowState::Failed)
                    || (state == RowState::Pending && next.is_some_and(|at| at > now)))
        };
        let limit = usize::try_from(batch_size).unwrap_or(usize::MAX);
        let mut selected = Vec::new();
        for i in 0..w.rows.len() {
            if selected.len() >= limit {
                break;
            }
            let row = &w.rows[i];
            let due = !status || row.next_retry_at.is_none_or(|at| at <= now);
            if !pending(setup.mark, row.state) || !due || row.locked_by.is_some() {
                continue;
            }
            let before = || {
                w.rows[..i]
                    .iter()
                    .filter(move |p| p.key.is_some() && p.key == row.key)
            };
            if before().any(|p| stuck(p.state, p.next_retry_at)) {
                continue;
            }
            let older = before().filter(|p| blocking(p.state)).count().min(limit);
            selected.push((i, older as i64));
        }
        if selected.len() > setup.batch_size {
            let n = selected.len();
            w.violate(format!(
                "a cycle locked {n} rows, batch_size = {}",
                setup.batch_size
            ));
        }
        let inserted: Vec<Duration> = w.inserts.iter().map(|(at, _)| *at).collect();
        let rows = selected
            .into_iter()
            .map(|(i, older)| {
                txn.locked.push(i);
                let row = &mut w.rows[i];
                row.locked_by = Some(txn.id);
                row.tried = false;
                row.last_refused = false;
                row.ack_reported = false;
                SelectedRow {
                    ctid: format!("(0,{i})"),
                    event: event(&row.id, row.key.as_deref()),
                    created_ms: Some(i64::try_from(inserted[i].as_millis()).unwrap_or(0)),
                    older,
                }
            })
            .collect();
        Ok(rows)
    }

    async fn mark_published(&self, ctids: &[String]) -> Result<u64, Error> {
        self.statement().await?;
        let state = match self.world.lock().setup.mark {
            MarkMode::Delete => RowState::Deleted,
            _ => RowState::Published,
        };
        self.mark(ctids, "published", |w, i| {
            let row = &w.rows[i];
            if !row.ack_reported {
                let id = row.id.clone();
                w.violate(format!(
                    "row {id} marked published before the sink reported its acknowledgement"
                ));
            }
            let row = &w.rows[i];
            (state, row.retry_count, row.next_retry_at)
        })
        .map(|changed| changed.len() as u64)
    }

    async fn mark_retry(
        &self,
        ctids: &[String],
        policy: RetryPolicy,
    ) -> Result<Vec<RetryMark>, Error> {
        self.statement().await?;
        let now = Instant::now();
        let changed = self.mark(ctids, "retried", |w, i| {
            charged(w, i);
            let row = &w.rows[i];
            let retry_count = row.retry_count + 1;
            let backoff = policy
                .retry_min_ms
                .saturating_mul(1 << row.retry_count.min(40))
                .min(policy.retry_max_ms);
            let state = match retry_count >= policy.max_attempts {
                true => RowState::Failed,
                false => RowState::Pending,
            };
            let max = w.setup.max_attempts;
            if state == RowState::Failed && retry_count < max {
                let id = row.id.clone();
                w.violate(format!(
                    "row {id} marked FAILED after {retry_count} attempts, max_attempts = {max}"
                ));
            }
            (
                state,
                retry_count,
                Some(now + Duration::from_millis(backoff)),
            )
        })?;
        let w = self.world.lock();
        Ok(changed
            .into_iter()
            .map(|c| RetryMark {
                event_id: w.rows[c.row].id.clone(),
                status: match c.state {
                    RowState::Failed => "FAILED".into(),
                    _ => "PENDING".into(),
                },
                attempts: i64::from(c.retry_count),
            })
            .collect())
    }

    async fn mark_failed(&self, ctids: &[String]) -> Result<u64, Error> {
        self.statement().await?;
        self.mark(ctids, "FAILED", |w, i| {
            charged(w, i);
            let row = &w.rows[i];
            if row.tried && !row.last_refused {
                let id = row.id.clone();
                w.violate(format!(
                    "row {id} marked FAILED although its last attempt was not refused for good"
                ));
            }
            let row = &w.rows[i];
            (RowState::Failed, row.retry_count + 1, row.next_retry_at)
        })
        .map(|changed| changed.len() as u64)
    }

    async fn commit(&self) -> Result<(), Error> {
        let (fail_before, fail_after, hang) = {
            let mut w = self.world.lock();
            let faults = w.sessions[self.poller].faults;
            let fail_before = w.chance(faults.commit_fail_before_per_mille);
            let fail_after = !fail_before && w.chance(faults.commit_fail_after_per_mille);
            let hang = w
                .chance(faults.commit_hang_per_mille)
                .then(|| Duration::from_millis(w.rng.u64(100..=10_000)));
            (fail_before, fail_after, hang)
        };
        self.statement().await?;
        if fail_before {
            self.rollback();
            return Err(lost_error("simulated COMMIT failure before the commit"));
        }
        if let Some(hang) = hang {
            if let Some(txn) = self.txn().as_mut() {
                txn.committing = true;
            }
            sleep(hang).await;
        }
        if let Some(txn) = self.txn().take() {
            apply(&mut self.world.lock(), &txn);
        }
        match fail_after {
            true => Err(lost_error("simulated COMMIT failure after the commit")),
            false => Ok(()),
        }
    }
}

impl FakeTable {
    /// Keeps the mark `change` makes of each row at `ctids` in the transaction; returns the
    /// changes. Each row must be one the transaction locked.
    fn mark(
        &self,
        ctids: &[String],
        what: &str,
        mut change: impl FnMut(&mut World, usize) -> (RowState, u32, Option<Instant>),
    ) -> Result<Vec<Change>, Error> {
        let mut guard = self.txn();
        let mut w = self.world.lock();
        let Some(txn) = guard.as_mut() else {
            w.violate(format!("rows marked {what} outside a transaction"));
            return Ok(Vec::new());
        };
        let mut changed = Vec::new();
        for ctid in ctids {
            let Some(i) = ctid
                .strip_prefix("(0,")
                .and_then(|s| s.strip_suffix(')'))
                .and_then(|s| s.parse::<usize>().ok())
                .filter(|i| *i < w.rows.len())
            else {
                w.violate(format!("rows marked {what} at an unknown ctid {ctid}"));
                continue;
            };
            if w.rows[i].locked_by != Some(txn.id) {
                let id = w.rows[i].id.clone();
                w.violate(format!("row {id} marked {what} without its lock"));
            }
            let (state, retry_count, next_retry_at) = change(&mut w, i);
            let c = Change {
                row: i,
                state,
                retry_count,
                next_retry_at,
            };
            txn.changes.push(c);
            changed.push(c);
        }
        Ok(changed)
    }
}

/// An attempt is charged to row `i`: it must have been tried in this cycle.
fn charged(w: &mut World, i: usize) {
    if !w.rows[i].tried {
        let id = w.rows[i].id.clone();
        w.violate(format!(
            "row {id} charged an attempt (retry_count) although it was not tried in this cycle"
        ));
    }
}

/// The event of row `id`.
fn event(id: &str, key: Option<&str>) -> OutboxEvent {
    OutboxEvent {
        id: Bytes::from(id.to_owned()),
        aggregate_type: Bytes::from_static(b"order"),
        aggregate_id: key.map(|k| Bytes::from(k.to_owned())),
        aggregate_id_kind: ValueKind::Text,
        event_type: Some(Bytes::from_static(b"created")),
        payload: Some(Bytes::from(format!(r#"{{"row":"{id}"}}"#))),
        headers: None,
        routed_by: None,
        payload_kind: ValueKind::Json,
        columns: Vec::new(),
        lsn: Lsn::ZERO,
        refused: None,
    }
}
