//! Log tailing: the replication stream, decoded (pgoutput) and mapped to outbox events, as a
//! [`Source`].
//!
//! Positions are LSNs. A confirmation is a standby status update with write = flush = apply =
//! the confirmed LSN: the walsender never sends what it covers again, so the session loop
//! confirms only what the sink acknowledged. Keepalive replies are this source's affair: a
//! keepalive that asks for one makes [`Source::confirm_requested`] true.

use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::coverage::{Coverage, CoverageWatch};
use super::outbox::{OutboxDecoder, OutboxError};
use super::pgoutput::{self, LogicalReplicationMessage};
use super::replication::{ReplicationMessage, ReplicationStream, WalStream, PG_EPOCH_OFFSET_SECS};
use super::slot_record::Recorder;
use super::{Confirmation, FailureHandling, Source, SourceError, SourceItem};
use crate::config::InvalidOpBehavior;
use crate::error::{chain, Error};
use crate::lsn::Lsn;
use crate::metrics::PipelineMetrics;
use crate::sink::DeliveryError;

/// How often the catch-up progress line is logged.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(10);
/// Lag that counts as catching up: 16 MiB of WAL.
const PROGRESS_MIN_LAG_BYTES: u64 = 16 << 20;
/// How long to wait for the walsender to acknowledge the end of streaming.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// The replication stream of one slot as a [`Source`]. Generic over the stream (a
/// [`WalStream`]: the walsender's [`ReplicationStream`], or the session simulation's fake
/// server), so that a test drives the real decoding and mapping below the trait.
pub struct LogicalSource<W: WalStream = ReplicationStream> {
    metrics: PipelineMetrics,
    stream: W,
    decoder: OutboxDecoder,
    op_invalid_behavior: InvalidOpBehavior,
    /// A keepalive asked for a reply that was not sent yet.
    reply_requested: bool,
    /// For the catch-up progress line: when it was last logged, with the counts then.
    progress: Progress,
    /// Told each position confirmed after deliveries, for the slot record.
    recorder: Option<Recorder>,
    /// How far the publication is known to cover the outbox table's inserts: confirmations go
    /// no further, unless an insert of the table decoded later shows it covered
    /// ([`super::coverage`]). `None`: no limit (tests of the decoding).
    coverage: Option<CoverageWatch>,
    /// Whether the open transaction has an insert of the outbox table.
    txn_has_insert: bool,
    /// The end of the last transaction with an insert of the outbox table: the publication
    /// covered the table there.
    insert_seen: Lsn,
    /// The last position sent as flush: never lowered.
    flush_sent: Lsn,
    /// When this session's source was made: a server's refusal of the publication checks
    /// after it ends the session ([`Coverage::cannot_connect_now_error`]).
    started: Instant,
}

impl<W: WalStream> LogicalSource<W> {
    /// A source over `stream`, started at the slot's `confirmed_flush_lsn`; `decoder` maps
    /// the outbox table's inserts and messages.
    pub fn new(
        stream: W,
        decoder: OutboxDecoder,
        op_invalid_behavior: InvalidOpBehavior,
        metrics: PipelineMetrics,
        confirmed_flush_lsn: Lsn,
    ) -> Self {
        LogicalSource {
            metrics,
            stream,
            decoder,
            op_invalid_behavior,
            reply_requested: false,
            progress: Progress {
                at: Instant::now(),
                published: 0,
                flush: confirmed_flush_lsn,
            },
            recorder: None,
            coverage: None,
            txn_has_insert: false,
            insert_seen: Lsn::ZERO,
            flush_sent: confirmed_flush_lsn,
            started: Instant::now(),
        }
    }

    /// Confirms positions only up to what `coverage` verified (or the end of the last
    /// transaction with an insert of the outbox, which shows the table published there), and
    /// stops on a publication change it found ([`super::coverage`]).
    pub fn with_coverage(mut self, coverage: CoverageWatch) -> Self {
        self.coverage = Some(coverage);
        self
    }

    /// Returns the error `of` finds in the publication checks' coverage: a publication change
    /// ([`Coverage::drift_error`], which stops the pipeline) or, since this session started, a
    /// server refusing the checks' connection ([`Coverage::cannot_connect_now_error`]: it is
    /// shutting down, and its walsender waits for a confirmation that cannot come).
    fn check_coverage(
        &self,
        of: impl FnOnce(&Coverage) -> Option<SourceError>,
    ) -> Result<(), Error> {
        match self.coverage.as_ref().and_then(|c| of(&c.borrow())) {
            Some(error) => Err(error.into()),
            None => Ok(()),
        }
    }

    /// The flush position to send for a confirmed `position`: lowered to what the publication
    /// is known to cover, never below what was sent before (a new server's checks start
    /// again from nothing).
    fn confirmable(&self, position: Lsn) -> Lsn {
        let covered = match self.coverage.as_ref().map(|c| c.borrow().clone()) {
            Some(Coverage::Drifted { .. }) => position.min(self.insert_seen),
            Some(coverage) => position.min(coverage.verified().max(self.insert_seen)),
            None => return position,
        };
        covered.max(self.flush_sent)
    }

    /// Tells `recorder` every position confirmed to the slot after events were delivered
    /// (the slot record's confirmed LSN, [`super::slot_record`]).
    pub fn with_recorder(mut self, recorder: Recorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// The item of one replication message; `None` for messages that yield none (relations,
    /// types, changes of other tables).
    fn on_message(&mut self, message: ReplicationMessage) -> Result<Option<SourceItem>, Error> {
        match message {
            ReplicationMessage::XLogData {
                wal_start, data, ..
            } => {
                let message = pgoutput::decode(data).map_err(|source| SourceError::Decode {
                    lsn: wal_start,
                    source,
                })?;
                self.on_pgoutput(message, wal_start)
            }
            ReplicationMessage::PrimaryKeepalive {
                wal_end,
                reply_requested,
                ..
            } => {
                self.reply_requested |= reply_requested;
                self.check_coverage(|c| c.drift_error(self.flush_sent))?;
                self.check_coverage(|c| c.cannot_connect_now_error(self.started))?;
                Ok(Some(SourceItem::Idle(wal_end)))
            }
        }
    }

    fn on_pgoutput(
        &mut self,
        message: LogicalReplicationMessage,
        lsn: Lsn,
    ) -> Result<Option<SourceItem>, Error> {
        let name = self.metrics.name();
        Ok(match message {
            LogicalReplicationMessage::Begin(begin) => {
                self.txn_has_insert = false;
                Some(SourceItem::Begin {
                    final_lsn: begin.final_lsn,
                    commit_time_ms: begin.timestamp_us / 1_000 + PG_EPOCH_OFFSET_SECS * 1_000,
                })
            }
            LogicalReplicationMessage::Commit(commit) => {
                // A drift found stops the pipeline before the next confirmation.
                self.check_coverage(|c| c.drift_error(self.flush_sent))?;
                if std::mem::take(&mut self.txn_has_insert) {
                    self.insert_seen = self.insert_seen.max(commit.end_lsn);
                }
                Some(SourceItem::Commit {
                    end_lsn: commit.end_lsn,
                })
            }
            LogicalReplicationMessage::Type(ty) => {
                self.decoder.on_type(&ty);
                None
            }
            LogicalReplicationMessage::Relation(relation) => {
                debug!(pipeline = %name, rel_id = relation.rel_id, table = %format_args!("{}.{}", relation.namespace, relation.name), "relation");
                self.decoder.on_relation(&relation);
                None
            }
            LogicalReplicationMessage::Insert(insert) => {
                match self.decoder.on_insert(&insert, lsn)? {
                    Some(event) => {
                        self.txn_has_insert = true;
                        Some(SourceItem::Event {
                            event,
                            time_ms: None,
                        })
                    }
                    None => {
                        self.metrics.skipped("insert");
                        None
                    }
                }
            }
            LogicalReplicationMessage::Update(update) if self.decoder.is_outbox(update.rel_id) => {
                self.invalid_op("update", lsn)?
            }
            LogicalReplicationMessage::Delete(delete) if self.decoder.is_outbox(delete.rel_id) => {
                self.invalid_op("delete", lsn)?
            }
            LogicalReplicationMessage::Message(message) => {
                if !self.decoder.is_outbox_message(&message) {
                    self.metrics.skipped("message");
                    None
                } else if !message.transactional {
                    // Emitted whether or not its transaction commits: not an outbox event.
                    warn!(pipeline = %name, %lsn, prefix = %message.prefix, "non-transactional logical message with the outbox prefix passed over; emit outbox messages with pg_logical_emit_message(true, ...)");
                    self.metrics.skipped("message_non_transactional");
                    None
                } else {
                    Some(SourceItem::Event {
                        event: self.decoder.on_message(&message, lsn)?,
                        time_ms: None,
                    })
                }
            }
            other => {
                self.metrics.skipped(other.kind());
                None
            }
        })
    }

    /// An UPDATE or DELETE of an outbox row, handled as `op_invalid_behavior` says.
    fn invalid_op(&self, op: &'static str, lsn: Lsn) -> Result<Option<SourceItem>, Error> {
        match self.op_invalid_behavior {
            InvalidOpBehavior::Ignore => {}
            InvalidOpBehavior::Warn => {
                warn!(pipeline = %self.metrics.name(), %lsn, op, "outbox row changed after its insert; passed over")
            }
            InvalidOpBehavior::Error => return Err(OutboxError::InvalidOp { op, lsn }.into()),
        }
        self.metrics.skipped(op);
        Ok(None)
    }

    /// While catching up on a backlog (more than [`PROGRESS_MIN_LAG_BYTES`] behind), logs every
    /// [`PROGRESS_INTERVAL`] how fast it goes and when it should be done.
    fn log_progress(&mut self, flush: Lsn, lag: u64) {
        let Some(line) = self.progress.tick(Instant::now(), flush, lag) else {
            return;
        };
        let eta = line.eta.map(|eta| format!("{:.0}s", eta.as_secs_f64()));
        info!(
            pipeline = %self.metrics.name(),
            events_per_sec = line.events_per_sec.round(),
            lag_bytes = line.lag_bytes,
            eta = eta.as_deref().unwrap_or("unknown"),
            "catching up"
        );
    }
}

impl<W: WalStream> Source for LogicalSource<W> {
    /// Cancel-safe: [`WalStream::recv`] is, and what follows it does not wait.
    async fn next(&mut self) -> Result<SourceItem, Error> {
        loop {
            let message = self.stream.recv().await?.ok_or(SourceError::Closed)?;
            if let Some(item) = self.on_message(message)? {
                return Ok(item);
            }
        }
    }

    /// Sends write = flush = apply = the confirmed position, lowered to what the publication is
    /// known to cover ([`LogicalSource::with_coverage`]). Reporting a write position
    /// beyond flush would stop the walsender's unsolicited keepalives (it sends them while
    /// both are behind what it has read), and with them idle progress.
    async fn confirm(&mut self, confirmation: Confirmation) -> Result<(), Error> {
        let flush = self.confirmable(confirmation.position);
        self.stream.send_status(flush, flush).await?;
        self.flush_sent = flush;
        self.reply_requested = false;
        if let Some(recorder) = self
            .recorder
            .as_ref()
            .filter(|_| confirmation.delivered > 0)
        {
            recorder.delivered(flush);
        }
        self.metrics.status_updates.inc();
        self.metrics
            .confirmed_flush_lsn
            .set(i64::try_from(flush.0).unwrap_or(i64::MAX));
        // The slot's lag as the slot watcher last read it from the server (at most
        // SLOT_WATCH_INTERVAL old), not the stream's: XLogData's end of WAL is the record's own
        // LSN and a keepalive's is how far the walsender has sent, so the stream never shows
        // more than what is in flight, and a backlog never got its line.
        let lag = u64::try_from(self.metrics.lag_bytes.get()).unwrap_or(0);
        self.progress.published += confirmation.delivered;
        self.log_progress(flush, lag);
        Ok(())
    }

    /// Outcomes are the session's: the walsender sends everything after the confirmed LSN
    /// again after a restart.
    fn on_outcome(&mut self, _event: u64, _outcome: Result<(), &DeliveryError>) -> FailureHandling {
        FailureHandling::Session
    }

    fn confirm_requested(&self) -> bool {
        self.reply_requested
    }

    async fn close(self) {
        let name = self.metrics.name().to_owned();
        if let Err(e) = self.stream.stop(STOP_TIMEOUT).await {
            warn!(pipeline = %name, error = %chain(&e), "walsender did not end the stream cleanly");
        }
    }
}

/// Snapshot for the catch-up progress line.
struct Progress {
    at: Instant,
    /// Records acknowledged since `at`.
    published: u64,
    flush: Lsn,
}

/// The figures of one "catching up" line.
#[derive(Debug, PartialEq)]
struct CatchUp {
    /// Records acknowledged per second since the last snapshot.
    events_per_sec: f64,
    /// The slot's lag as last read from the server (`outbox_relay_replication_lag_bytes`):
    /// WAL between its confirmed flush LSN and the server's end of WAL, bytes.
    lag_bytes: u64,
    /// `lag_bytes` at the rate the flush LSN moved since the last snapshot; `None` when it did
    /// not move.
    eta: Option<Duration>,
}

impl Progress {
    /// Called at each confirmation, `flush` being the confirmed LSN and `lag` the slot's bytes
    /// behind the server's end of WAL. Once [`PROGRESS_INTERVAL`] has passed since the
    /// snapshot, starts a new one at `now` and returns the line to log if `lag` is over
    /// [`PROGRESS_MIN_LAG_BYTES`]; before that, returns `None` and keeps counting.
    fn tick(&mut self, now: Instant, flush: Lsn, lag: u64) -> Option<CatchUp> {
        let elapsed = now.saturating_duration_since(self.at);
        if elapsed < PROGRESS_INTERVAL {
            return None;
        }
        let secs = elapsed.as_secs_f64();
        let bytes_per_sec = flush.0.saturating_sub(self.flush.0) as f64 / secs;
        let line = (lag > PROGRESS_MIN_LAG_BYTES).then(|| CatchUp {
            events_per_sec: self.published as f64 / secs,
            lag_bytes: lag,
            eta: (bytes_per_sec > 0.0)
                .then(|| Duration::try_from_secs_f64(lag as f64 / bytes_per_sec).ok())
                .flatten(),
        });
        *self = Progress {
            at: now,
            published: 0,
            flush,
        };
        line
    }
}

#[cfg(test)]
mod tests;
