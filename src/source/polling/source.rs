//! The polling cycle as a [`Source`]: one batch of rows is one transaction of source items.
//!
//! Positions are cycle numbers (an [`Lsn`] only by type): cycle `n` yields `Begin` at `n`, the
//! eligible rows as events, then `Commit` at `n`, and holds its SQL transaction (and with it
//! the row locks) open until the session confirms position `n`, i.e. every event of the batch
//! has an outcome. [`Source::on_outcome`] tells the source each row's outcome: the
//! confirmation marks the acknowledged rows, records the failures and commits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::table::{OutboxTable, PgTable, RetryPolicy, SelectedRow};
use super::{Cycle, Pace, FAILED};
use crate::config::{MarkMode, PipelineConfig, PollingConfig};
use crate::error::{chain, Error};
use crate::lsn::Lsn;
use crate::metrics::PipelineMetrics;
use crate::session::mutation::{active as mutated, Mutation};
use crate::session::now_ms;
use crate::sink::DeliveryError;
use crate::source::outbox::OutboxEvent;
use crate::source::{Confirmation, FailureHandling, Source, SourceError, SourceItem};

/// One selected row, and what became of it in this cycle.
struct Polled {
    ctid: String,
    event_id: String,
    /// Aggregate type and id; `None` for a NULL aggregate id (no order).
    key: Option<(Bytes, Bytes)>,
    /// The event until it is yielded.
    event: Option<OutboxEvent>,
    created_ms: Option<i64>,
    /// Blocking rows of its aggregate before it (in the table, not only the batch).
    older: i64,
    outcome: Outcome,
}

#[derive(Debug)]
enum Outcome {
    /// Not published in this cycle: an earlier blocking row of its aggregate is not in the
    /// batch, or an earlier one of the batch failed.
    Held,
    /// Yielded; no outcome yet.
    Sent,
    Acked,
    Failed(DeliveryError),
}

/// The cycle in progress: its SQL transaction is open.
struct Batch {
    position: Lsn,
    rows: Vec<Polled>,
    /// The next row to yield or hold.
    next: usize,
    begun: bool,
    ended: bool,
    /// Rows of each aggregate considered so far.
    in_batch: HashMap<(Bytes, Bytes), i64>,
    /// Aggregates with a failed event in this batch: their later events are held.
    failed_keys: Vec<(Bytes, Bytes)>,
    /// Event numbers (of [`Source::on_outcome`]) and their rows, in order.
    numbers: Vec<(u64, usize)>,
}

/// Rows fetched by a cycle's first statements.
type Fetch = BoxFuture<'static, Result<Vec<SelectedRow>, Error>>;

/// The outbox table of one pipeline as a [`Source`], over PostgreSQL ([`PgTable`]) or, in
/// the simulation, a fake table.
pub(crate) struct PollingSource<T: OutboxTable = PgTable> {
    config: PipelineConfig,
    metrics: PipelineMetrics,
    table: Arc<T>,
    /// Woken by LISTEN notifications.
    notified: Arc<Notify>,
    /// Whether a notification may start a poll now: after one that found no row, not before
    /// the next poll on the timer. Any role may `NOTIFY` the channel, and without this each
    /// notification was a poll (158 a second instead of one).
    notify_armed: bool,
    /// Whether the fetch in progress was started by a notification.
    fetch_notified: bool,
    pace: Pace,
    next_poll: tokio::time::Instant,
    next_stats: Instant,
    next_purge: Instant,
    /// The cycle's first statements in progress (kept across cancelled [`Source::next`]s).
    fetching: Option<Fetch>,
    batch: Option<Batch>,
    /// Event items yielded: the next one's number.
    events: u64,
    cycles: u64,
    /// The shutdown: once it began, a cycle's end (its UPDATEs and COMMIT) gets
    /// `shutdown_timeout_secs` of its own, so that a stop never waits on the database for good
    /// (a COMMIT waiting for a synchronous standby that is down, a lock).
    shutdown: CancellationToken,
}

impl<T: OutboxTable> PollingSource<T> {
    /// A source over `table`, notifications (LISTEN) waking `notified`.
    pub(crate) fn new(
        config: &PipelineConfig,
        metrics: PipelineMetrics,
        table: T,
        notified: Arc<Notify>,
        shutdown: &CancellationToken,
    ) -> Self {
        PollingSource {
            config: config.clone(),
            metrics,
            table: Arc::new(table),
            notified,
            notify_armed: true,
            fetch_notified: false,
            pace: Pace::default(),
            next_poll: tokio::time::Instant::now(),
            next_stats: Instant::now(),
            next_purge: Instant::now(),
            fetching: None,
            batch: None,
            events: 0,
            cycles: 0,
            shutdown: shutdown.clone(),
        }
    }

    /// [`PollingSource::finish`], given up `shutdown_timeout_secs` after the shutdown began or
    /// after it started, whichever is later (a drain that used its whole timeout leaves the
    /// marks theirs).
    ///
    /// Returns its error, or a timeout once given up: the cycle's rows then stay pending,
    /// unless its COMMIT went through on the server.
    async fn finish_in_time(&mut self) -> Result<(), Error> {
        let (shutdown, timeout) = (self.shutdown.clone(), self.config.shutdown_timeout());
        let give_up = async move {
            shutdown.cancelled().await;
            if mutated(Mutation::PollingFinishForever) {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(timeout).await;
        };
        tokio::select! {
            result = self.finish() => result,
            () = give_up => Err(SourceError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the polling cycle's marks and COMMIT did not end within shutdown_timeout_secs of the shutdown; its rows stay pending unless the COMMIT went through",
            ))
            .into()),
        }
    }

    /// The statements that start a cycle: the maintenance that is due (gauges, retention
    /// purge), BEGIN and the SELECT; an empty batch is committed at once.
    fn fetch(&mut self) -> Fetch {
        let now = Instant::now();
        let p = &self.config.polling;
        let stats = now >= self.next_stats;
        if stats {
            self.next_stats = now + Duration::from_millis(p.stats_interval_ms);
        }
        let purge = match (p.purge_published_after_secs, now >= self.next_purge) {
            (Some(age), true) => {
                self.next_purge = now + Duration::from_secs(p.purge_interval_secs);
                Some((
                    age as f64,
                    i64::try_from(p.purge_batch_size).unwrap_or(i64::MAX),
                ))
            }
            _ => None,
        };
        let batch_size = match mutated(Mutation::PollingUnboundedBatch) {
            true => i64::MAX,
            false => i64::try_from(p.batch_size).unwrap_or(i64::MAX),
        };
        let (table, metrics) = (self.table.clone(), self.metrics.clone());
        let name = self.config.name.clone();
        async move {
            if stats {
                let stats = table.stats().await?;
                let m = &metrics.polling;
                m.pending_rows.set(stats.pending);
                m.oldest_pending_age.set(stats.oldest_pending_age_secs);
                m.failed_rows.set(stats.failed);
            }
            if let Some((age, batch)) = purge {
                loop {
                    let deleted = table.purge(age, batch).await?;
                    metrics.polling.rows_purged.inc_by(deleted);
                    if deleted > 0 {
                        debug!(pipeline = %name, rows = deleted, "purged published rows");
                    }
                    if deleted < batch as u64 {
                        break;
                    }
                }
            }
            // An error before COMMIT ends the session, and with the connection the
            // transaction.
            table.begin().await?;
            let rows = table.select(batch_size).await?;
            metrics.polling.polls.inc();
            if rows.is_empty() {
                table.commit().await?;
            }
            Ok(rows)
        }
        .boxed()
    }

    /// The batch of `rows`, or `None` when there are none.
    fn batch(&mut self, rows: Vec<SelectedRow>) -> Option<Batch> {
        if rows.is_empty() {
            return None;
        }
        let mut polled = Vec::with_capacity(rows.len());
        for row in rows {
            let SelectedRow {
                ctid,
                event,
                created_ms,
                older,
            } = row;
            polled.push(Polled {
                ctid,
                event_id: String::from_utf8_lossy(&event.id).into_owned(),
                key: event
                    .aggregate_id
                    .clone()
                    .map(|id| (event.aggregate_type.clone(), id)),
                event: Some(event),
                created_ms,
                older,
                outcome: Outcome::Held,
            });
        }
        self.cycles += 1;
        Some(Batch {
            position: Lsn(self.cycles),
            rows: polled,
            next: 0,
            begun: false,
            ended: false,
            in_batch: HashMap::new(),
            failed_keys: Vec::new(),
            numbers: Vec::new(),
        })
    }

    /// Ends the cycle: marks the acknowledged rows, records the failures, commits. A row
    /// still without an outcome (the session ends before it came) stays pending, and so do
    /// the later rows of its aggregate.
    ///
    /// Returns an error if a statement fails, or, after the commit, the delivery error that
    /// stops the pipeline (`mark` other than `status` and an error retrying cannot fix).
    async fn finish(&mut self) -> Result<(), Error> {
        let Some(batch) = self.batch.take() else {
            return Ok(());
        };
        let p = &self.config.polling;
        let name = &self.config.name;
        // An event acknowledged after an earlier one of its aggregate failed stays pending.
        let mut failed_keys: Vec<&(Bytes, Bytes)> = Vec::new();
        let (mut published, mut retry, mut failed) = (Vec::new(), Vec::new(), Vec::new());
        let mut halt: Option<DeliveryError> = None;
        let mut retry_later = false;
        for polled in &batch.rows {
            if mutated(Mutation::PollingMarkUnacknowledged)
                && matches!(polled.outcome, Outcome::Sent | Outcome::Failed(_))
            {
                published.push(polled.ctid.clone());
                continue;
            }
            match &polled.outcome {
                Outcome::Acked => match &polled.key {
                    Some(key) if failed_keys.contains(&key) => {
                        warn!(pipeline = %name, event_id = %polled.event_id, "event acknowledged after an earlier event of its aggregate failed; it stays pending and is published again after that one");
                    }
                    _ => published.push(polled.ctid.clone()),
                },
                // Failed only because an earlier record of its key did, never sent: it stays
                // pending, charged nothing, behind that record.
                Outcome::Failed(e) if !e.attempted && !mutated(Mutation::PollingChargeUntried) => {
                    if let Some(key) = &polled.key {
                        failed_keys.push(key);
                    }
                }
                Outcome::Failed(e) => {
                    if let Some(key) = &polled.key {
                        if failure_blocks(p, e) {
                            failed_keys.push(key);
                        }
                    }
                    let retryable = e.retryable && !mutated(Mutation::PollingFailAtOnce);
                    match (p.mark, retryable) {
                        (MarkMode::Status, true) => retry.push(polled.ctid.clone()),
                        (MarkMode::Status, false) => {
                            error!(pipeline = %name, event_id = %polled.event_id, error = %e, "event marked FAILED: publishing it again cannot succeed");
                            failed.push(polled.ctid.clone());
                        }
                        (_, true) => {
                            warn!(pipeline = %name, event_id = %polled.event_id, error = %e, "delivery failed; the event stays pending");
                            retry_later = true;
                        }
                        (_, false) => {
                            halt.get_or_insert_with(|| e.without_record());
                        }
                    }
                }
                Outcome::Sent => {
                    if let Some(key) = &polled.key {
                        failed_keys.push(key);
                    }
                }
                Outcome::Held => {}
            }
        }
        let table = self.table.clone();
        if !published.is_empty() {
            let n = table.mark_published(&published).await?;
            debug!(pipeline = %name, rows = n, "marked published");
        }
        if !retry.is_empty() {
            let policy = RetryPolicy {
                retry_min_ms: p.retry_min_ms,
                retry_max_ms: p.retry_max_ms,
                max_attempts: p.max_attempts,
            };
            for mark in table.mark_retry(&retry, policy).await? {
                let super::table::RetryMark {
                    event_id,
                    status,
                    attempts,
                } = mark;
                let reason = batch
                    .rows
                    .iter()
                    .find(|b| b.event_id == event_id)
                    .and_then(|b| match &b.outcome {
                        Outcome::Failed(e) => Some(e.reason.as_str()),
                        _ => None,
                    })
                    .unwrap_or("");
                if status == FAILED {
                    error!(pipeline = %name, %event_id, attempts, error = %reason, "event marked FAILED after its last attempt");
                    self.metrics.polling.failed(self.metrics.name(), true);
                } else {
                    warn!(pipeline = %name, %event_id, attempts, error = %reason, "delivery failed; retrying later");
                }
            }
        }
        if !failed.is_empty() {
            for _ in 0..table.mark_failed(&failed).await? {
                self.metrics.polling.failed(self.metrics.name(), false);
            }
        }
        table.commit().await?;
        let cycle = Cycle {
            fetched: batch.rows.len(),
            published: published.len(),
            retry_later,
        };
        let delay = self.pace.next(p, &cycle);
        self.next_poll = tokio::time::Instant::now() + delay;
        match halt {
            Some(e) => Err(Error::Delivery(e)),
            None => Ok(()),
        }
    }
}

impl<T: OutboxTable> Source for PollingSource<T> {
    /// Cancel-safe: the cycle's statements are kept in the source while they run, the wait
    /// before a cycle is a deadline, and the rest does not wait.
    async fn next(&mut self) -> Result<SourceItem, Error> {
        loop {
            if let Some(batch) = &mut self.batch {
                if !batch.begun {
                    batch.begun = true;
                    return Ok(SourceItem::Begin {
                        final_lsn: batch.position,
                        commit_time_ms: now_ms(),
                    });
                }
                // Send the eligible rows in order; hold the rest.
                while batch.next < batch.rows.len() {
                    let i = batch.next;
                    batch.next += 1;
                    let polled = &mut batch.rows[i];
                    let eligible = match &polled.key {
                        None => true,
                        Some(key) => {
                            let before = batch.in_batch.entry(key.clone()).or_insert(0);
                            let older_in_batch =
                                polled.older == *before || mutated(Mutation::PollingIgnoreOlder);
                            let eligible = older_in_batch && !batch.failed_keys.contains(key);
                            *before += 1;
                            eligible
                        }
                    };
                    if eligible {
                        polled.outcome = Outcome::Sent;
                        batch.numbers.push((self.events, i));
                        self.events += 1;
                        let event = polled.event.take().expect("each row is yielded once");
                        return Ok(SourceItem::Event {
                            event,
                            time_ms: Some(polled.created_ms.unwrap_or_else(now_ms)),
                        });
                    }
                }
                if !batch.ended {
                    batch.ended = true;
                    return Ok(SourceItem::Commit {
                        end_lsn: batch.position,
                    });
                }
                // Every outcome, then the confirmation that ends the cycle.
                return std::future::pending().await;
            }
            if self.fetching.is_none() {
                let notified = tokio::select! {
                    biased;
                    _ = self.notified.notified(), if self.notify_armed => true,
                    _ = tokio::time::sleep_until(self.next_poll) => false,
                };
                // A notification that finds nothing disarms them until the next timed poll: a
                // flood of them adds at most one poll per timed one, and the backoff goes on.
                self.notify_armed = true;
                self.fetch_notified = notified;
                self.fetching = Some(self.fetch());
            }
            let rows = self.fetching.as_mut().expect("fetching").await;
            self.fetching = None;
            self.batch = self.batch(rows?);
            if self.batch.is_none() {
                self.notify_armed = !self.fetch_notified;
                let delay = self.pace.next(&self.config.polling, &Cycle::default());
                self.next_poll = tokio::time::Instant::now() + delay;
            }
        }
    }

    async fn confirm(&mut self, confirmation: Confirmation) -> Result<(), Error> {
        match &self.batch {
            Some(batch) if batch.ended && confirmation.position >= batch.position => {
                self.finish_in_time().await
            }
            _ => Ok(()),
        }
    }

    /// Every outcome is the source's to record: a failed row is retried, marked FAILED or
    /// stops the pipeline after the cycle (`mark`), the session goes on.
    fn on_outcome(&mut self, event: u64, outcome: Result<(), &DeliveryError>) -> FailureHandling {
        let Some(batch) = &mut self.batch else {
            return FailureHandling::Recorded;
        };
        let Ok(at) = batch.numbers.binary_search_by_key(&event, |(n, _)| *n) else {
            return FailureHandling::Recorded;
        };
        let polled = &mut batch.rows[batch.numbers[at].1];
        polled.outcome = match outcome {
            Ok(()) => Outcome::Acked,
            Err(e) => {
                // Any failure holds the aggregate's rows this cycle has not sent yet, also one
                // that does not block it (refused for good with `failed_blocks_aggregate =
                // false`): they pass it only once its FAILED mark is committed, in a later
                // cycle. Sent now, they would be ahead of it if this cycle's COMMIT did not go
                // through and it were published again.
                if let Some(key) = &polled.key {
                    batch.failed_keys.push(key.clone());
                }
                Outcome::Failed(e.without_record())
            }
        };
        FailureHandling::Recorded
    }

    fn confirm_requested(&self) -> bool {
        false
    }

    /// Ends a cycle still open with the outcomes known: acknowledged rows are marked, rows
    /// without an outcome stay pending.
    async fn close(mut self) {
        if let Err(e) = self.finish_in_time().await {
            error!(pipeline = %self.config.name, error = %chain(&e), "could not end the polling cycle; its rows stay pending");
        }
    }
}

/// Whether later events of the aggregate must wait behind this failed one.
fn failure_blocks(p: &PollingConfig, e: &DeliveryError) -> bool {
    e.retryable || p.mark != MarkMode::Status || p.failed_blocks_aggregate
}
