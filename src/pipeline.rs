//! One pipeline: a source database's slot streamed into Kafka, the flush LSN gated on acks.
//!
//! A *session* is one replication connection plus one producer. Any transient failure (the
//! connection drops, the walsender restarts, Kafka gives up on a record) ends the session:
//! the producer is dropped, and a new session resumes from the slot's `confirmed_flush_lsn`
//! after an exponential backoff with jitter ([`crate::supervisor`] decides, for both source
//! kinds). Since the relay confirms only what Kafka
//! acknowledged (see [`crate::checkpoint`]), everything after that LSN is published again:
//! duplicates are possible after a failure, loss is not (README, "What it guarantees").
//!
//! Exactly-once mode (opt-in) adds a transactional producer. Each PostgreSQL transaction with
//! events gets one Kafka transaction: its records, then a checkpoint record (the commit's end
//! LSN), then the Kafka commit, and only then does the ack tracker see the PostgreSQL commit,
//! so the slot never passes a transaction whose Kafka transaction is not committed. WAL is
//! not read while a Kafka commit is pending. A new session fences the previous producer,
//! reads the checkpoint back and passes over the transactions at or below it: those committed
//! to Kafka before a crash that came before the slot's confirmation.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::future::Future;
use std::pin::Pin;

use tokio::time::{interval, sleep_until, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::checkpoint::{AckTracker, Checkpoint, EventToken};
use crate::config::{ConfigError, InvalidOpBehavior, OnBadEvent, PipelineConfig, SourceKind};
use crate::error::{chain, Error, Recovery};
use crate::lsn::Lsn;
use crate::metrics::PipelineMetrics;
use crate::router::Router;
use crate::sink::kafka::{self, KafkaSink, TransactionError, Transactions};
use crate::sink::{Delivery, DeliveryError, Sink};
use crate::source::outbox::{OutboxDecoder, OutboxError, OutboxEvent};
use crate::source::pgoutput::{self, LogicalReplicationMessage};
use crate::source::replication::{
    ReplicationClient, ReplicationMessage, ReplicationStream, PG_EPOCH_OFFSET_SECS,
};
use crate::source::{slot, SourceError};
use crate::supervisor::{self, SessionProgress};

/// Minimum gap between status updates sent because the flush LSN moved; the timer sends
/// one every `status_interval_ms` regardless.
const MIN_STATUS_GAP: Duration = Duration::from_millis(10);
/// Least time between two warnings about events with a null key.
const NULL_KEY_WARNING_INTERVAL: Duration = Duration::from_secs(60);
/// How often the catch-up progress line is logged.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(10);
/// Lag that counts as catching up: 16 MiB of WAL.
const PROGRESS_MIN_LAG_BYTES: u64 = 16 << 20;
/// How long to wait for the walsender to acknowledge the end of streaming.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the slot's `wal_status` and `safe_wal_size` are read for the metrics: WAL
/// retention changes over minutes, and the query is cheap.
const SLOT_WATCH_INTERVAL: Duration = Duration::from_secs(10);
/// How long to wait for an abort of the open Kafka transaction when a session ends; if it does
/// not finish, the next session's producer aborts it (and the coordinator, after
/// `transaction.timeout.ms`, if no session follows).
const ABORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the pipeline until `shutdown` is cancelled (then `Ok`) or a permanent error stops it.
///
/// Both source kinds run under [`supervisor::supervise`]: transient errors restart the
/// session with backoff; each restart is logged with its reason and counted in
/// `outbox_relay_reconnects_total`.
pub async fn run(
    config: PipelineConfig,
    metrics: PipelineMetrics,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    debug_assert!(config.problems().is_empty(), "validated at start");
    if config.source_kind == SourceKind::Polling {
        let mut sessions = crate::polling::Polling {
            config: &config,
            metrics: &metrics,
        };
        return supervisor::supervise(&config.name, &metrics, &shutdown, &mut sessions).await;
    }
    // Aborted when `run` returns (the guard drops the task).
    let _slot_watch = AbortOnDrop(tokio::spawn(watch_slot(config.clone(), metrics.clone())));
    let mut sessions = LogTailing {
        config: &config,
        metrics: &metrics,
        slot_seen: false,
        holder_watch: HolderWatch::default(),
    };
    supervisor::supervise(&config.name, &metrics, &shutdown, &mut sessions).await
}

/// Log-tailing sessions, with what the supervisor keeps between them.
struct LogTailing<'a> {
    config: &'a PipelineConfig,
    metrics: &'a PipelineMetrics,
    /// Once this process streamed from the slot, a missing slot means someone dropped it and
    /// the events after its confirmed LSN may be gone: never re-create it silently.
    slot_seen: bool,
    holder_watch: HolderWatch,
}

impl supervisor::Sessions for LogTailing<'_> {
    async fn session(
        &mut self,
        progress: &SessionProgress,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        let result = run_session(
            self.config,
            self.metrics,
            shutdown,
            !self.slot_seen && self.config.create_slot,
            progress,
            &mut self.holder_watch,
        )
        .await;
        self.slot_seen |= progress.is_streaming();
        result
    }
}

/// Refreshes the slot's `wal_status` and `safe_wal_size` metrics every
/// [`SLOT_WATCH_INTERVAL`] over an SQL connection of its own (kept open, made again after an
/// error), whether or not this relay holds the slot. Runs until aborted.
async fn watch_slot(config: PipelineConfig, metrics: PipelineMetrics) {
    let mut timer = interval(SLOT_WATCH_INTERVAL);
    timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut connection = None;
    loop {
        timer.tick().await;
        // Each step within one interval: a half-open connection must not freeze the metrics
        // until TCP gives up.
        if connection.is_none() {
            match tokio::time::timeout(SLOT_WATCH_INTERVAL, slot::connect(&config)).await {
                Ok(Ok(c)) => connection = Some(c),
                Ok(Err(e)) => {
                    // The session logs the same failure; this is only for the metrics.
                    debug!(pipeline = %config.name, error = %chain(&e), "cannot read the slot's wal_status");
                    continue;
                }
                Err(_) => {
                    debug!(pipeline = %config.name, "connecting to read the slot's wal_status timed out");
                    continue;
                }
            }
        }
        let Some((client, _)) = &connection else {
            continue;
        };
        match tokio::time::timeout(SLOT_WATCH_INTERVAL, slot::slot_wal(client, &config.slot)).await
        {
            Ok(Ok(Some(wal))) => metrics.set_slot_wal(wal.wal_status.as_deref(), wal.safe_wal_size),
            Ok(Ok(None)) => metrics.set_slot_wal(None, None),
            Ok(Err(e)) => {
                debug!(pipeline = %config.name, error = %chain(&e), "cannot read the slot's wal_status");
                connection = None;
            }
            Err(_) => {
                debug!(pipeline = %config.name, "reading the slot's wal_status timed out; reconnecting");
                connection = None;
            }
        }
    }
}

/// What this relay saw of the walsender holding its slot while waiting for it, to tell a
/// stale holder from a live one for `terminate_stale_walsender_after_secs`.
///
/// A holder is stale when, for the whole grace period, this relay saw the same walsender
/// with the same `reply_time` (its client sent no status update: a live relay sends one at
/// least every `status_interval_ms`), and the server's clock also puts that reply (or the
/// connection's start) longer ago than the grace period. Watching `reply_time` change, not
/// only comparing it with the server's clock, keeps a live relay on a host with a skewed clock
/// safe. Seeing `reply_time` needs `pg_read_all_stats` (else nothing is terminated and an
/// error says so); terminating needs `pg_signal_backend`, the holder's role, or superuser.
///
/// A walsender busy decoding a large transaction reads no replies, so its `reply_time` stands
/// still although its client is alive: the grace period must exceed such pauses.
#[derive(Default)]
struct HolderWatch {
    /// The holder's pid and `reply_time` when first seen like that, and when.
    seen: Option<(i32, Option<String>, Instant)>,
}

impl HolderWatch {
    /// Reads the slot's holder; terminates it if it has been stale for `grace` (logging a
    /// warning naming it), or logs an error if this role may not terminate it. Never fails:
    /// the caller retries the slot either way.
    async fn check(
        &mut self,
        client: &tokio_postgres::Client,
        config: &PipelineConfig,
        grace: Duration,
    ) {
        let holder = match slot::slot_holder(client, &config.slot).await {
            Ok(Some(holder)) => holder,
            Ok(None) => {
                self.seen = None;
                return;
            }
            Err(e) => {
                warn!(pipeline = %config.name, error = %chain(&e), "cannot read the walsender holding the slot");
                return;
            }
        };
        if !holder.details_visible {
            // Without reply_time a live relay cannot be told from a stale one.
            error!(
                pipeline = %config.name,
                slot = %config.slot,
                pid = holder.pid,
                "cannot tell whether the walsender holding the slot is stale: this role cannot see its reply_time in pg_stat_replication; GRANT pg_read_all_stats to the relay's role for terminate_stale_walsender_after_secs"
            );
            self.seen = None;
            return;
        }
        let since = match &self.seen {
            Some((pid, reply_time, since))
                if *pid == holder.pid && *reply_time == holder.reply_time =>
            {
                *since
            }
            _ => {
                let now = Instant::now();
                self.seen = Some((holder.pid, holder.reply_time.clone(), now));
                now
            }
        };
        let server_age = holder.reply_age_secs.unwrap_or(0.0);
        if since.elapsed() < grace || server_age < grace.as_secs_f64() {
            debug!(pipeline = %config.name, pid = holder.pid, reply_age_secs = server_age, unchanged_secs = since.elapsed().as_secs(), "slot held by another walsender");
            return;
        }
        // The server itself ends a walsender whose client is silent for wal_sender_timeout;
        // a walsender that outlived that while its reply_time stood still is busy (replaying
        // a large transaction) and its relay alive. Terminating it would restart the replay,
        // and two relays with the option would take turns forever.
        match slot::wal_sender_timeout(client).await {
            Ok(timeout) if !timeout.is_zero() && grace <= timeout => {
                warn!(pipeline = %config.name, pid = holder.pid, wal_sender_timeout_secs = timeout.as_secs(), grace_secs = grace.as_secs(), "not terminating the walsender holding the slot: terminate_stale_walsender_after_secs must exceed the server's wal_sender_timeout, which ends stale walsenders by itself");
                self.seen = None;
                return;
            }
            Ok(_) => {}
            Err(e) => {
                warn!(pipeline = %config.name, error = %chain(&e), "cannot read wal_sender_timeout; not terminating the walsender holding the slot");
                return;
            }
        }
        let terminated = slot::terminate_stale_walsender(client, &holder).await;
        match &terminated {
            Ok(true) => warn!(
                pipeline = %config.name,
                slot = %config.slot,
                pid = holder.pid,
                application_name = %holder.application_name,
                client = %holder.client,
                reply_age_secs = server_age.round(),
                "terminated the walsender holding the slot: its client sent no status update for longer than terminate_stale_walsender_after_secs ({}s); taking the slot over",
                grace.as_secs()
            ),
            Ok(false) => {
                info!(pipeline = %config.name, pid = holder.pid, "the walsender holding the slot replied again or ended; not terminated")
            }
            // Keeps watching: once the privilege is granted, the next attempt terminates it.
            Err(e) => error!(
                pipeline = %config.name,
                slot = %config.slot,
                pid = holder.pid,
                application_name = %holder.application_name,
                client = %holder.client,
                reply_age_secs = server_age.round(),
                error = %chain(&e),
                "cannot terminate the stale walsender holding the slot: the relay's role needs pg_signal_backend, membership in the walsender's role, or superuser (a superuser's walsender only a superuser may end)"
            ),
        }
        if terminated.is_ok() {
            self.seen = None;
        }
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One session: check the slot, connect, stream until shutdown or an error.
async fn run_session(
    config: &PipelineConfig,
    metrics: &PipelineMetrics,
    shutdown: &CancellationToken,
    create_slot: bool,
    progress: &SessionProgress,
    holder_watch: &mut HolderWatch,
) -> Result<(), Error> {
    let (client, connection) = slot::connect(config).await?;
    let (pg, tls) = config.source_config()?;
    let state = slot::prepare(
        &client,
        &config.slot,
        &config.publication,
        &config.table,
        create_slot,
    )
    .await?;
    let outbox_oid = slot::table_oid(&client, &config.table).await?;

    let mut replication = ReplicationClient::connect(&pg, &tls).await?;
    let identity = replication.identify_system().await?;
    let stream = match replication
        .start_replication(&config.slot, Lsn::ZERO, &config.publication)
        .await
    {
        Ok(stream) => stream,
        Err(e) => {
            let e = Error::from(e);
            if let (Recovery::StandBy, Some(grace)) =
                (e.recovery(), config.terminate_stale_walsender_after())
            {
                holder_watch.check(&client, config, grace).await;
            }
            return Err(e);
        }
    };
    *holder_watch = HolderWatch::default();
    // Read the confirmed LSN again now that this walsender holds the slot: another relay may
    // have confirmed more since `prepare`, and PostgreSQL 15 would let an older flush LSN move
    // the slot backwards.
    let confirmed_flush_lsn = slot::confirmed_flush_lsn(&client, &config.slot).await?;
    drop(client);
    drop(connection);
    let transactional_id = config.exactly_once.then(|| config.transactional_id());
    let sink = KafkaSink::new(
        &config.kafka,
        &format!("outbox-relay-{}", config.name),
        config.max_in_flight_events,
        transactional_id.as_deref(),
    )?;
    // Exactly-once: only after START_REPLICATION, so that a standby (which cannot get the
    // slot) never fences the active relay; WAL waits in the socket meanwhile.
    let eos = match &transactional_id {
        Some(transactional_id) => {
            let transactions = sink.transactions(config.checkpoint_topic(), &config.name);
            // Fences the previous producer with this id and aborts its open transaction, so
            // the read_committed read below is not held back by it.
            transactions.init().await?;
            let checkpoint =
                kafka::read_checkpoint(&config.kafka, config.checkpoint_topic(), &config.name)
                    .await?;
            info!(
                pipeline = %config.name,
                transactional_id = %transactional_id,
                checkpoint_topic = %config.checkpoint_topic(),
                checkpoint_lsn = %checkpoint.map_or_else(|| "none".to_owned(), |lsn| lsn.to_string()),
                confirmed_flush_lsn = %confirmed_flush_lsn,
                "exactly-once mode: transactions before the checkpoint are passed over"
            );
            Some(ExactlyOnce {
                transactions,
                checkpoint: checkpoint.map(Checkpoint),
                skipping: false,
                kafka_open: false,
                commit_at: None,
                committing: None,
            })
        }
        None => None,
    };
    info!(
        pipeline = %config.name,
        slot = %config.slot,
        confirmed_flush_lsn = %confirmed_flush_lsn,
        server_lsn = %identity.xlogpos,
        timeline = identity.timeline,
        "streaming"
    );
    progress.streaming();

    // Status updates at most every min(status interval, wal_sender_timeout / 2).
    let mut status_interval = config.status_interval();
    if !state.wal_sender_timeout.is_zero() {
        status_interval = status_interval.min(state.wal_sender_timeout / 2);
    }

    let router = Router::new(config).map_err(ConfigError::from)?;
    let session = Session {
        config,
        metrics,
        session_progress: progress,
        stream,
        sink,
        tracker: AckTracker::new(confirmed_flush_lsn),
        decoder: OutboxDecoder::new(
            config.table.clone(),
            config.columns.clone(),
            config.message_prefix.clone(),
        )
        .with_route_by(config.route.by_field.clone())
        .with_columns(router.columns().to_vec())
        .with_oid(outbox_oid),
        router,
        null_key_warned: (None, 0),
        commit_time_ms: None,
        last_received: confirmed_flush_lsn,
        server_wal_end: confirmed_flush_lsn,
        progress: Progress {
            at: Instant::now(),
            published: 0,
            flush: confirmed_flush_lsn,
        },
        sent_flush: Lsn::ZERO,
        last_status: Instant::now(),
        eos,
    };
    metrics
        .confirmed_flush_lsn
        .set(lsn_gauge(confirmed_flush_lsn));
    session
        .stream_until_shutdown(shutdown, status_interval)
        .await
}

struct Session<'a, S: Sink> {
    config: &'a PipelineConfig,
    metrics: &'a PipelineMetrics,
    /// Told when the confirmed flush LSN moves (the supervisor's backoff resets on progress).
    session_progress: &'a SessionProgress,
    stream: ReplicationStream,
    sink: S,
    tracker: AckTracker,
    decoder: OutboxDecoder,
    router: Router,
    /// When the last null-key warning was logged, and events with a null key not yet in one.
    null_key_warned: (Option<Instant>, u64),
    /// Commit time of the open transaction (Unix ms), from its Begin message.
    commit_time_ms: Option<i64>,
    /// Highest LSN received, for error context.
    last_received: Lsn,
    /// The server's end of WAL, as last reported in XLogData or a keepalive.
    server_wal_end: Lsn,
    /// For the catch-up progress line: when it was last logged, with the counts then.
    progress: Progress,
    /// Flush LSN of the last status update sent.
    sent_flush: Lsn,
    last_status: Instant,
    /// Exactly-once mode's state; `None` in the default (at-least-once) mode.
    eos: Option<ExactlyOnce>,
}

/// A Kafka commit in progress.
type Committing = Pin<Box<dyn Future<Output = Result<(), TransactionError>> + Send>>;

/// A session's exactly-once state.
struct ExactlyOnce {
    transactions: Transactions,
    /// Read at session start: transactions it covers were committed to Kafka already.
    checkpoint: Option<Checkpoint>,
    /// The open PostgreSQL transaction is covered by the checkpoint: its events are passed over.
    skipping: bool,
    /// A Kafka transaction is open: the current PostgreSQL transaction has records.
    kafka_open: bool,
    /// The end LSN of the PostgreSQL transaction whose Kafka commit is pending; no WAL is
    /// read and the ack tracker keeps the transaction open until the commit succeeded.
    commit_at: Option<Lsn>,
    /// The commit call, started once every record of the transaction was acknowledged.
    committing: Option<Committing>,
}

/// Waits for the Kafka commit in progress; never completes if there is none. Cancel-safe (the
/// commit itself goes on and is polled again).
async fn kafka_commit(eos: &mut Option<ExactlyOnce>) -> Result<(), TransactionError> {
    match eos.as_mut().and_then(|eos| eos.committing.as_mut()) {
        Some(commit) => commit.await,
        None => std::future::pending().await,
    }
}

impl<S: Sink> Session<'_, S> {
    /// Streams until `shutdown` (then drains and returns `Ok`) or an error. On a permanent
    /// error found before its event was sent (bad input, a record the producer refuses), what
    /// was sent before it is still delivered and confirmed (up to the shutdown timeout), so a
    /// restart after the fix publishes as little again as possible; the failing event's
    /// transaction stays unconfirmed. After a failed delivery nothing more is awaited: later
    /// records of the same key may be queued behind it, and dropping the producer purges them.
    async fn stream_until_shutdown(
        mut self,
        shutdown: &CancellationToken,
        status_interval: Duration,
    ) -> Result<(), Error> {
        let result = self.stream(shutdown, status_interval).await;
        self.end_kafka_transaction(&result).await;
        if let Err(e) = &result {
            if e.recovery() != Recovery::Stop || matches!(e, Error::Delivery(_)) {
                return result;
            }
            self.drain_in_flight(self.config.shutdown_timeout()).await;
        }
        if let Err(e) = self.send_status().await {
            warn!(pipeline = %self.config.name, error = %chain(&e), "could not send the final status update");
            return result.and(Err(e));
        }
        let flush = self.tracker.flush_lsn();
        if let Err(e) = self.stream.stop(STOP_TIMEOUT).await {
            warn!(pipeline = %self.config.name, error = %chain(&e), "walsender did not end the stream cleanly");
        }
        info!(pipeline = %self.config.name, confirmed_flush_lsn = %flush, "stopped");
        result
    }

    /// Exactly-once: lets a Kafka commit in progress finish (two transaction calls at once are
    /// refused), then aborts a Kafka transaction still open, unless this producer was fenced.
    /// An abort that fails is left to the next session's producer.
    async fn end_kafka_transaction(&mut self, result: &Result<(), Error>) {
        let Some(eos) = &mut self.eos else {
            return;
        };
        if let Some(commit) = eos.committing.take() {
            let end_lsn = eos.commit_at.take();
            if commit.await.is_ok() {
                eos.kafka_open = false;
                self.metrics.kafka_transaction("committed");
                if let Some(end_lsn) = end_lsn {
                    // Cannot fail: the transaction was open in the tracker.
                    let _ = self.tracker.commit(end_lsn);
                }
            }
        }
        let fenced = matches!(result, Err(Error::Transaction(e)) if e.is_fenced());
        if !eos.kafka_open || fenced {
            return;
        }
        eos.kafka_open = false;
        match eos.transactions.abort(ABORT_TIMEOUT).await {
            Ok(()) => {
                self.metrics.kafka_transaction("aborted");
                info!(pipeline = %self.config.name, "open kafka transaction aborted");
            }
            Err(e) => {
                warn!(pipeline = %self.config.name, error = %chain(&e), "could not abort the open kafka transaction; the next session aborts it")
            }
        }
    }

    /// Waits up to `timeout` for the outcomes of records in flight, acknowledging them.
    async fn drain_in_flight(&mut self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.sink.in_flight().events > 0 {
            let Ok(Some(delivery)) =
                tokio::time::timeout_at(deadline, self.sink.next_delivery()).await
            else {
                break;
            };
            if self.on_delivery(delivery).await.is_err() {
                break;
            }
        }
    }

    async fn stream(
        &mut self,
        shutdown: &CancellationToken,
        status_interval: Duration,
    ) -> Result<(), Error> {
        let mut status_timer = interval(status_interval);
        status_timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut drain_deadline: Option<tokio::time::Instant> = None;

        loop {
            let in_flight = self.sink.in_flight();
            // Exactly-once: every record of the committed PostgreSQL transaction is
            // acknowledged: commit its Kafka transaction (with the checkpoint record).
            let mut committing = false;
            if let Some(eos) = &mut self.eos {
                if let (Some(end_lsn), None) = (eos.commit_at, &eos.committing) {
                    if in_flight.events == 0 {
                        eos.committing = Some(Box::pin(eos.transactions.commit(end_lsn)));
                    }
                }
                committing = eos.commit_at.is_some();
            }
            let has_capacity = in_flight.events < self.config.max_in_flight_events
                && in_flight.bytes < self.config.max_in_flight_bytes;
            // While draining, finish the open transaction (so its events are confirmed and
            // not published again after restart) but start no new one.
            let draining = drain_deadline.is_some();
            let read_wal =
                has_capacity && (!draining || self.tracker.in_transaction()) && !committing;
            if draining && !self.tracker.in_transaction() && in_flight.events == 0 {
                break;
            }

            tokio::select! {
                biased;
                // 1. Shutdown: stop taking new transactions, drain what is in flight.
                _ = shutdown.cancelled(), if !draining => {
                    info!(pipeline = %self.config.name, in_flight = in_flight.events, "draining before shutdown");
                    drain_deadline = Some(tokio::time::Instant::now() + self.config.shutdown_timeout());
                }
                _ = sleep_until(drain_deadline.unwrap_or_else(tokio::time::Instant::now)), if draining => {
                    warn!(
                        pipeline = %self.config.name,
                        in_flight = in_flight.events,
                        in_transaction = self.tracker.in_transaction(),
                        "shutdown timeout reached; events after the confirmed LSN will be published again on restart"
                    );
                    break;
                }
                // 2. Delivery outcomes: free capacity, move the flush LSN.
                Some(delivery) = self.sink.next_delivery(), if in_flight.events > 0 => {
                    self.on_delivery(delivery).await?;
                }
                // Exactly-once: the Kafka commit, then the ack tracker sees the PG commit.
                result = kafka_commit(&mut self.eos), if committing => self.on_kafka_commit(result)?,
                // 3. Status updates on a timer, also while WAL is not being read.
                _ = status_timer.tick() => self.send_status().await?,
                // 4. New WAL, only while there is room in flight.
                message = self.stream.recv(), if read_wal => {
                    match message? {
                        Some(message) => self.on_message(message).await?,
                        None => return Err(SourceError::Closed.into()),
                    }
                }
            }

            if self.tracker.flush_lsn() > self.sent_flush
                && self.last_status.elapsed() >= MIN_STATUS_GAP
            {
                self.send_status().await?;
            }
        }

        Ok(())
    }

    /// Exactly-once: the Kafka transaction of the PostgreSQL transaction ending at `commit_at`
    /// is committed (or failed: the session ends, and the next one aborts what is open).
    fn on_kafka_commit(&mut self, result: Result<(), TransactionError>) -> Result<(), Error> {
        let eos = self
            .eos
            .as_mut()
            .expect("commits only in exactly-once mode");
        eos.committing = None;
        result?;
        eos.kafka_open = false;
        let end_lsn = eos.commit_at.take().expect("a commit was pending");
        self.metrics.kafka_transaction("committed");
        self.tracker
            .commit(end_lsn)
            .map_err(|source| SourceError::Tracker {
                lsn: end_lsn,
                source,
            })?;
        Ok(())
    }

    async fn on_message(&mut self, message: ReplicationMessage) -> Result<(), Error> {
        match message {
            ReplicationMessage::XLogData {
                wal_start,
                wal_end,
                data,
                ..
            } => {
                self.last_received = self.last_received.max(wal_start);
                self.server_wal_end = self.server_wal_end.max(wal_end);
                let message = pgoutput::decode(data).map_err(|source| SourceError::Decode {
                    lsn: wal_start,
                    source,
                })?;
                self.on_pgoutput(message, wal_start).await
            }
            ReplicationMessage::PrimaryKeepalive {
                wal_end,
                reply_requested,
                ..
            } => {
                self.last_received = self.last_received.max(wal_end);
                self.server_wal_end = self.server_wal_end.max(wal_end);
                self.tracker.idle(wal_end);
                if reply_requested {
                    self.send_status().await?;
                }
                Ok(())
            }
        }
    }

    async fn on_pgoutput(
        &mut self,
        message: LogicalReplicationMessage,
        lsn: Lsn,
    ) -> Result<(), Error> {
        let tracker_error = |source| SourceError::Tracker { lsn, source };
        match message {
            LogicalReplicationMessage::Begin(begin) => {
                self.tracker.begin().map_err(tracker_error)?;
                self.commit_time_ms =
                    Some(begin.timestamp_us / 1_000 + PG_EPOCH_OFFSET_SECS * 1_000);
                if let Some(eos) = &mut self.eos {
                    eos.skipping = eos.checkpoint.is_some_and(|c| c.covers(begin.final_lsn));
                }
            }
            LogicalReplicationMessage::Commit(commit) => {
                self.commit_time_ms = None;
                self.metrics.transactions.inc();
                if let Some(eos) = &mut self.eos {
                    if std::mem::take(&mut eos.skipping) {
                        if let Some(checkpoint) = eos.checkpoint.filter(|c| commit.end_lsn > c.0) {
                            return Err(SourceError::Protocol(format!(
                                "transaction ending at {} was passed over as committed to Kafka, but the checkpoint is {}",
                                commit.end_lsn, checkpoint.0
                            ))
                            .into());
                        }
                    } else if eos.kafka_open {
                        // The tracker sees the commit once Kafka committed (on_kafka_commit).
                        eos.commit_at = Some(commit.end_lsn);
                        return Ok(());
                    }
                }
                self.tracker.commit(commit.end_lsn).map_err(tracker_error)?;
            }
            LogicalReplicationMessage::Type(ty) => self.decoder.on_type(&ty),
            LogicalReplicationMessage::Relation(relation) => {
                debug!(pipeline = %self.config.name, rel_id = relation.rel_id, table = %format_args!("{}.{}", relation.namespace, relation.name), "relation");
                self.decoder.on_relation(&relation);
            }
            LogicalReplicationMessage::Insert(insert) => {
                match self.decoder.on_insert(&insert, lsn)? {
                    Some(event) => self.publish(event, lsn).await?,
                    None => self.metrics.skipped("insert"),
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
                } else if !message.transactional {
                    // Emitted whether or not its transaction commits: not an outbox event.
                    warn!(pipeline = %self.config.name, %lsn, prefix = %message.prefix, "non-transactional logical message with the outbox prefix passed over; emit outbox messages with pg_logical_emit_message(true, ...)");
                    self.metrics.skipped("message_non_transactional");
                } else {
                    let event = self.decoder.on_message(&message, lsn)?;
                    self.publish(event, lsn).await?;
                }
            }
            other => self.metrics.skipped(other.kind()),
        }
        Ok(())
    }

    /// An UPDATE or DELETE of an outbox row, handled as `op_invalid_behavior` says.
    fn invalid_op(&self, op: &'static str, lsn: Lsn) -> Result<(), Error> {
        match self.config.op_invalid_behavior {
            InvalidOpBehavior::Ignore => {}
            InvalidOpBehavior::Warn => {
                warn!(pipeline = %self.config.name, %lsn, op, "outbox row changed after its insert; passed over")
            }
            InvalidOpBehavior::Error => return Err(OutboxError::InvalidOp { op, lsn }.into()),
        }
        self.metrics.skipped(op);
        Ok(())
    }

    /// Routes an event of the open transaction and hands it to the sink; an event that
    /// cannot be routed stops the pipeline or goes to the dead-letter topic (`on_bad_event`),
    /// acknowledged like any other record before its transaction is confirmed.
    async fn publish(&mut self, event: OutboxEvent, lsn: Lsn) -> Result<(), Error> {
        let commit_time_ms = self.commit_time_ms.ok_or_else(|| {
            SourceError::Protocol(format!("outbox event at LSN {lsn} outside a transaction"))
        })?;
        self.metrics.events_decoded.inc();
        if self.eos.as_ref().is_some_and(|eos| eos.skipping) {
            // Committed to Kafka with its transaction before the last crash.
            self.metrics.skipped("checkpointed");
            return Ok(());
        }
        if event.aggregate_id.is_none() {
            self.null_key(&event);
        }
        let record = match self.router.route(&event, commit_time_ms) {
            Ok(record) => record,
            Err(e) => match (&self.config.on_bad_event, &self.config.dead_letter_topic) {
                (OnBadEvent::DeadLetter, Some(topic)) => {
                    warn!(pipeline = %self.config.name, %lsn, event_id = %String::from_utf8_lossy(&event.id), topic = %topic, reason = %e, "event sent to the dead-letter topic");
                    self.metrics.dead_lettered(e.reason_label());
                    Router::dead_letter(&event, &e, topic, commit_time_ms)
                }
                _ => return Err(e.into()),
            },
        };
        if let Some(eos) = &mut self.eos {
            if !eos.kafka_open {
                eos.transactions.begin().await?;
                eos.kafka_open = true;
            }
        }
        let token = self
            .tracker
            .track_event()
            .map_err(|source| SourceError::Tracker { lsn, source })?;
        if let Err(e) = self.sink.send(record, token).await {
            self.dead_letter_refused(e, token)
                .await
                .map_err(Error::Rejected)?;
        }
        self.update_in_flight_gauges();
        Ok(())
    }

    /// A record Kafka refused: with `on_bad_event = "dead_letter"` and an error retrying
    /// cannot fix, its copy goes to the dead-letter topic under the same token (so its
    /// transaction is confirmed once the copy is acknowledged). Records of the same key sent
    /// after the refused one may be published before the copy: dead-lettering trades that
    /// for flow.
    ///
    /// Returns `error` when it is not to be dead-lettered, or the copy's own refusal.
    async fn dead_letter_refused(
        &mut self,
        mut error: DeliveryError,
        token: EventToken,
    ) -> Result<(), DeliveryError> {
        let dead_letter_topic = match (&self.config.on_bad_event, &self.config.dead_letter_topic) {
            (OnBadEvent::DeadLetter, Some(topic)) if !error.retryable && error.topic != *topic => {
                topic.clone()
            }
            _ => return Err(error),
        };
        let Some(record) = error.record.take() else {
            return Err(error);
        };
        warn!(pipeline = %self.config.name, event_id = %error.event_id, topic = %error.topic, dead_letter_topic = %dead_letter_topic, reason = %error.reason, "Kafka refused the record; sending it to the dead-letter topic");
        self.metrics.dead_lettered(if error.too_large {
            "too_large"
        } else {
            "refused"
        });
        let copy = Router::dead_letter_refused(*record, &error, &dead_letter_topic);
        self.sink.send(copy, token).await
    }

    /// Counts an event with a NULL aggregate id (published with a null key) and warns at
    /// most every [`NULL_KEY_WARNING_INTERVAL`].
    fn null_key(&mut self, event: &OutboxEvent) {
        self.metrics.events_null_key.inc();
        let (last, unwarned) = &mut self.null_key_warned;
        *unwarned += 1;
        if last.is_none_or(|at| at.elapsed() >= NULL_KEY_WARNING_INTERVAL) {
            warn!(pipeline = %self.config.name, event_id = %String::from_utf8_lossy(&event.id), events = *unwarned, "events with a NULL aggregate id published with a null key (no per-aggregate order); counted in outbox_relay_events_null_key_total");
            *last = Some(Instant::now());
            *unwarned = 0;
        }
    }

    async fn on_delivery(&mut self, delivery: Delivery) -> Result<(), Error> {
        self.update_in_flight_gauges();
        match delivery.result {
            Ok(()) => {
                self.tracker
                    .ack(delivery.token)
                    .map_err(|source| SourceError::Tracker {
                        lsn: self.last_received,
                        source,
                    })?;
                self.metrics.published(&delivery.topic);
                self.progress.published += 1;
                self.metrics
                    .delivery_latency
                    .observe(delivery.latency.as_secs_f64());
                if let Some(commit_ms) = delivery.timestamp_ms {
                    let now_ms = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as i64);
                    self.metrics
                        .commit_to_ack
                        .observe((now_ms - commit_ms).max(0) as f64 / 1_000.0);
                }
                Ok(())
            }
            Err(e) => {
                self.metrics.delivery_failed(&delivery.topic, e.retryable);
                if e.retryable {
                    return Err(e.into());
                }
                // Halting: a Delivery error, so nothing queued behind it is awaited.
                self.dead_letter_refused(e, delivery.token)
                    .await
                    .map_err(Error::Delivery)?;
                self.update_in_flight_gauges();
                Ok(())
            }
        }
    }

    /// Sends write = flush = apply = the tracker's flush LSN. Reporting a write position
    /// beyond flush would stop the walsender's unsolicited keepalives (it sends them while
    /// both are behind what it has read), and with them idle progress.
    async fn send_status(&mut self) -> Result<(), Error> {
        let flush = self.tracker.flush_lsn();
        self.stream.send_status(flush, flush).await?;
        if flush != self.sent_flush {
            debug!(pipeline = %self.config.name, flush_lsn = %flush, "confirmed");
        }
        if flush > self.sent_flush && self.sent_flush != Lsn::ZERO {
            self.session_progress.advanced();
        }
        self.sent_flush = flush;
        self.last_status = Instant::now();
        self.metrics.status_updates.inc();
        self.metrics.confirmed_flush_lsn.set(lsn_gauge(flush));
        let lag = self.server_wal_end.0.saturating_sub(flush.0);
        self.metrics
            .lag_bytes
            .set(i64::try_from(lag).unwrap_or(i64::MAX));
        self.metrics.oldest_unacked_age.set(
            self.sink
                .oldest_in_flight()
                .map_or(0.0, |sent| sent.elapsed().as_secs_f64()),
        );
        self.log_progress(flush, lag);
        Ok(())
    }

    /// While catching up on a backlog (more than [`PROGRESS_MIN_LAG_BYTES`] behind), logs every
    /// [`PROGRESS_INTERVAL`] how fast it goes and when it should be done.
    fn log_progress(&mut self, flush: Lsn, lag: u64) {
        let elapsed = self.progress.at.elapsed();
        if elapsed < PROGRESS_INTERVAL {
            return;
        }
        let published = self.progress.published;
        if lag > PROGRESS_MIN_LAG_BYTES {
            let secs = elapsed.as_secs_f64();
            let bytes_per_sec = flush.0.saturating_sub(self.progress.flush.0) as f64 / secs;
            let eta = (bytes_per_sec > 0.0).then(|| format!("{:.0}s", lag as f64 / bytes_per_sec));
            info!(
                pipeline = %self.config.name,
                events_per_sec = (published as f64 / secs).round(),
                lag_bytes = lag,
                eta = eta.as_deref().unwrap_or("unknown"),
                "catching up"
            );
        }
        self.progress = Progress {
            at: Instant::now(),
            published: 0,
            flush,
        };
    }

    fn update_in_flight_gauges(&self) {
        let in_flight = self.sink.in_flight();
        self.metrics.in_flight_events.set(in_flight.events as i64);
        self.metrics.in_flight_bytes.set(in_flight.bytes as i64);
    }
}

/// Snapshot for the catch-up progress line.
struct Progress {
    at: Instant,
    /// Records acknowledged since `at`.
    published: u64,
    flush: Lsn,
}

fn lsn_gauge(lsn: Lsn) -> i64 {
    i64::try_from(lsn.0).unwrap_or(i64::MAX)
}
