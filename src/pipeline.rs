//! One pipeline: a source database's slot streamed into Kafka, the flush LSN gated on acks.
//!
//! A *session* is one replication connection plus one producer, run by
//! [`crate::session::Session`] over a [`LogicalSource`] and a [`KafkaSink`]. Any transient
//! failure (the connection drops, the walsender restarts, Kafka gives up on a record) ends the
//! session: the producer is dropped (one shared with other pipelines stays, see
//! [`crate::sink::kafka::SharedProducers`]), and a new session resumes from the slot's
//! `confirmed_flush_lsn` after an exponential backoff with jitter. Since the relay confirms
//! only what Kafka acknowledged (see [`crate::ack`]), everything after that LSN is published
//! again: duplicates are possible after a failure, loss is not (docs/concepts/guarantees.md).
//!
//! Exactly-once mode (opt-in) makes the producer transactional ([`crate::exactly_once`]). A
//! new session fences the previous producer, reads the checkpoint back and passes over the
//! transactions at or below it.

use std::time::{Duration, Instant};

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::file::OnPipelineFailure;
use crate::config::{ConfigError, PipelineConfig, SourceKind};
use crate::error::{chain, Error, Recovery};
use crate::exactly_once::{self, Origin, Redo};
use crate::lsn::Lsn;
use crate::metrics::PipelineMetrics;
use crate::router::Router;
use crate::session::{Mode, Session};
use crate::sink::kafka::{KafkaSink, SharedProducers};
use crate::sink::AnySink;
use crate::source::coverage::Coverage;
use crate::source::logical::LogicalSource;
use crate::source::outbox::{MessageOrigin, OutboxDecoder};
use crate::source::privileges;
use crate::source::replication::{ReplicationClient, ReplicationStream};
use crate::source::slot;
use crate::source::slot_record::{self, Recorder};
use crate::source::SourceError;
use crate::supervisor::{self, SessionProgress};

mod slot_watch;

use slot_watch::SlotWatcher;

/// How long a session's end waits for the slot record's last update: one small UPDATE.
const RECORD_FINISH_TIMEOUT: Duration = Duration::from_secs(5);
/// Runs the pipeline until `shutdown` is cancelled (then `Ok`) or a permanent error stops it.
/// Its at-least-once Kafka sessions publish through the producer `producers` has for it, if
/// any (pipelines of one source kind with the same Kafka settings share one), else through one
/// of their own.
///
/// Both source kinds run under [`supervisor::supervise`]: transient errors restart the
/// session with backoff; each restart is logged with its reason and counted in
/// `outbox_relay_reconnects_total`.
pub async fn run(
    config: PipelineConfig,
    metrics: PipelineMetrics,
    producers: SharedProducers,
    shutdown: CancellationToken,
    on_failure: OnPipelineFailure,
) -> Result<(), Error> {
    debug_assert!(config.problems().is_empty(), "validated at start");
    if config.source_kind == SourceKind::Polling {
        let mut sessions = crate::source::polling::Polling {
            config: &config,
            metrics: &metrics,
            producers: &producers,
        };
        return supervisor::supervise(&config.name, &metrics, &shutdown, &mut sessions, on_failure)
            .await;
    }
    // Aborted when `run` returns (the watcher drops its task).
    let mut sessions = LogTailing {
        config: &config,
        metrics: &metrics,
        watcher: SlotWatcher::start(&config, &metrics),
        stopped: false,
        slot_seen: false,
        holder_watch: HolderWatch::default(),
        redo: Redo::default(),
        producers: &producers,
    };
    supervisor::supervise(&config.name, &metrics, &shutdown, &mut sessions, on_failure).await
}

/// Log-tailing sessions, with what the supervisor keeps between them.
struct LogTailing<'a> {
    config: &'a PipelineConfig,
    metrics: &'a PipelineMetrics,
    /// Once this process streamed from the slot, a missing slot means someone dropped it and
    /// the events after its confirmed LSN may be gone: never re-create it silently.
    slot_seen: bool,
    /// The slot watcher: the server the last session reached, what its publication checks
    /// verified.
    watcher: SlotWatcher,
    /// Whether the last session stopped the pipeline for good: the next one (with
    /// `on_pipeline_failure = "retry"`) starts it afresh, as a new process would.
    stopped: bool,
    holder_watch: HolderWatch,
    /// Exactly-once: events Kafka refused for good, dead-lettered in the redo of their
    /// transaction.
    redo: Redo,
    producers: &'a SharedProducers,
}

impl supervisor::Sessions for LogTailing<'_> {
    async fn session(
        &mut self,
        progress: &SessionProgress,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        if std::mem::take(&mut self.stopped) {
            // What the stop reported (a publication change among others) was the operator's
            // to fix; the checks of the new start verify the publication anew.
            self.watcher.start_afresh();
        }
        let result = run_session(
            self.config,
            self.metrics,
            shutdown,
            !self.slot_seen && self.config.create_slot,
            progress,
            &self.watcher,
            &mut self.holder_watch,
            &mut self.redo,
            self.producers,
        )
        .await;
        self.slot_seen |= progress.is_streaming();
        self.stopped = match &result {
            Err(e) if e.recovery() == Recovery::Stop => {
                reported_any_drift(e, &self.watcher.coverage.borrow())
            }
            _ => false,
        };
        if let Err(Error::Redo(refused)) = &result {
            // A refused event found anew is progress: the next session dead-letters it, so
            // the backoff does not grow between redos; the same one found again is not.
            if self.redo.learn(refused.as_ref().clone()) {
                progress.advanced();
            }
        }
        result
    }
}

/// Whether a pipeline stopped for good by `stop` may start afresh, its publication checks
/// forgetting what they found: unless they found a publication change `stop` does not report
/// (the session stopped on something else first), which the next session must stop on.
fn reported_any_drift(stop: &Error, coverage: &Coverage) -> bool {
    match coverage {
        // The drift error and the start's publication check both carry the check's sentence.
        Coverage::Drifted { reason, .. } => chain(stop).contains(reason.as_str()),
        Coverage::Verified(_) | Coverage::CannotConnectNow { .. } => true,
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

/// Whether this session may create the slot: `create_slot`, and, with the slot record, only
/// when the record's check found the slot missing and never streamed from. A slot the check
/// found, gone since (dropped in the milliseconds before `slot::prepare`), is a loss to stop
/// on, not a slot to create.
fn may_create_slot(create_slot: bool, record: Option<&slot_record::Checked>) -> bool {
    create_slot
        && record
            .is_none_or(|checked| matches!(checked.verdict, slot_record::Verdict::NeverStreamed))
}

/// One session: check the slot, connect, stream until shutdown or an error.
#[allow(clippy::too_many_arguments)] // what the supervisor keeps between sessions, by part
async fn run_session(
    config: &PipelineConfig,
    metrics: &PipelineMetrics,
    shutdown: &CancellationToken,
    create_slot: bool,
    progress: &SessionProgress,
    watcher: &SlotWatcher,
    holder_watch: &mut HolderWatch,
    redo: &mut Redo,
    producers: &SharedProducers,
) -> Result<(), Error> {
    // The replication connection chooses the server (target_session_attrs); the SQL
    // connection goes to that one.
    let conninfo = config.source_config()?;
    let mut replication = match ReplicationClient::connect(&conninfo).await {
        Ok(replication) => replication,
        // A role without REPLICATION: the sentence `check` prints, with the fix.
        Err(e) => {
            return Err(privileges::explain_walsender_refusal(config, e)
                .await
                .into())
        }
    };
    let server = replication.server().clone();
    watcher.server.send_if_modified(|known| {
        let changed = known.as_ref() != Some(&server);
        *known = Some(server.clone());
        changed
    });
    let (client, connection) = slot::connect_to(config, &server).await?;
    let identity = replication.identify_system().await?;
    // The slot record decides before the slot is created: a slot the relay streamed from
    // and that is gone now is never created again without `setup --accept-slot-loss`.
    let record = match config.slot_record {
        true => Some(slot_record::check(&client, config, &identity).await?),
        false => None,
    };
    if let Some(slot_record::Checked {
        verdict: slot_record::Verdict::Lost(loss),
        ..
    }) = &record
    {
        return Err(SourceError::SlotLost(loss.to_string()).into());
    }
    // What `check` fails of a standby the pipeline decodes on, and of failover = true, with
    // the same sentences.
    slot::standby::check_decoding(&client, &config.slot).await?;
    slot::turn_failover_on(&client, &mut replication, config).await?;
    slot::check_failover(&client, config).await?;
    // What `check` reports of the table, with the same sentence.
    slot::columns::check_present(&client, config).await?;
    let state = slot::prepare(
        &client,
        &config.slot,
        &config.publication,
        &config.table,
        may_create_slot(create_slot, record.as_ref()),
        config.failover,
        config.op_invalid_behavior.needs_updates(),
    )
    .await?;
    slot::columns::check_published(&client, config).await?;
    let outbox_oid = slot::table_oid(&client, &config.table).await?;
    // Where this timeline's history left earlier ones: exactly-once checks the checkpoint
    // against it, and message events get their default ids from it.
    let origin_ids = config.message_prefix.is_some()
        && config.message_default_id == crate::config::MessageDefaultId::Origin;
    let history = match config.exactly_once || origin_ids {
        true => exactly_once::timeline_history(&mut replication, identity.timeline).await?,
        false => Vec::new(),
    };
    let check_utf8 = replication.text_as_stored().await?;
    let mut stream = match replication
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
    let recorder = match record {
        Some(checked) if !checked.standby => {
            slot_record::streaming(
                &client,
                config,
                &identity,
                checked.record.as_ref(),
                confirmed_flush_lsn,
            )
            .await?;
            Some(Recorder::spawn(
                config,
                server,
                client,
                connection,
                confirmed_flush_lsn,
            ))
        }
        standby => {
            if standby.is_some() {
                warn!(pipeline = %config.name, slot = %config.slot, "this server is a standby: the slot record is read, not written (write it on the primary or set slot_record = false)");
            }
            drop(client);
            drop(connection);
            None
        }
    };
    let transactional_id = config.exactly_once.then(|| config.transactional_id());
    // With dead-lettering, a row naming a topic nobody made is bad input: refused and
    // dead-lettered, not waited for.
    let dead_letters = config.on_bad_event == crate::config::OnBadEvent::DeadLetter;
    let gate = move |sink: KafkaSink| match dead_letters {
        true => sink.refusing_missing_topics(),
        false => sink,
    };
    let kafka = |transactional_id: Option<&str>| {
        KafkaSink::new(
            &config.kafka,
            &format!("outbox-relay-{}", config.name),
            config.max_in_flight_events,
            config.max_in_flight_bytes,
            transactional_id,
        )
        .map(gate)
    };
    redo.forget_confirmed(confirmed_flush_lsn);
    // Status updates at most every min(status interval, wal_sender_timeout / 2).
    let mut status_interval = config.status_interval();
    if !state.wal_sender_timeout.is_zero() {
        status_interval = status_interval.min(state.wal_sender_timeout / 2);
    }
    let start_sink = async {
        Ok::<_, Error>(match transactional_id {
            Some(transactional_id) => {
                let sink = kafka(Some(&transactional_id))?;
                // Exactly-once: only after START_REPLICATION, so that a standby (which cannot get
                // the slot) never fences the active relay; WAL waits in the socket meanwhile.
                let origin = Origin {
                    system_id: identity.system_id.clone(),
                    timeline: identity.timeline,
                    slot: config.slot.clone(),
                };
                let eos =
                    exactly_once::start(&sink, config, origin, &history, redo.clone()).await?;
                (AnySink::Kafka(sink), Mode::ExactlyOnce(Box::new(eos)))
            }
            None => (
                AnySink::connect(config, || {
                    KafkaSink::new_or_shared(
                        producers,
                        &config.name,
                        config.kafka.create_topics.clone(),
                        || kafka(None),
                    )
                    .map(gate)
                })
                .await?,
                Mode::AtLeastOnce,
            ),
        })
    };
    let (sink, mode) = keeping_alive(
        &mut stream,
        confirmed_flush_lsn,
        status_interval,
        start_sink,
    )
    .await?;
    info!(
        pipeline = %config.name,
        slot = %config.slot,
        confirmed_flush_lsn = %confirmed_flush_lsn,
        server_lsn = %identity.xlogpos,
        timeline = identity.timeline,
        "streaming"
    );
    progress.streaming();

    let router = Router::new(config).map_err(ConfigError::from)?;
    let decoder = OutboxDecoder::new(
        config.table.clone(),
        config.columns.clone(),
        config.message_prefix.clone(),
    )
    .with_route_by(config.route.by_field.clone())
    .with_columns(router.columns().to_vec())
    .with_optional_columns(router.optional_columns())
    .with_oid(outbox_oid)
    .with_max_event_bytes(config.max_event_bytes())
    .with_utf8_check(check_utf8)
    .with_message_origin(origin_ids.then(|| MessageOrigin {
        system_id: identity.system_id.clone(),
        timeline: identity.timeline,
        switches: history.iter().map(|s| (s.timeline, s.switch_lsn)).collect(),
    }));
    let mut source = LogicalSource::new(
        stream,
        decoder,
        config.op_invalid_behavior,
        metrics.clone(),
        confirmed_flush_lsn,
    )
    .with_coverage(watcher.coverage.clone());
    let mut recorder_task = None;
    if let Some((recorder, task)) = recorder {
        source = source.with_recorder(recorder);
        recorder_task = Some(task);
    }
    metrics
        .confirmed_flush_lsn
        .set(i64::try_from(confirmed_flush_lsn.0).unwrap_or(i64::MAX));
    let result = Session::new(
        config,
        metrics,
        source,
        sink,
        router,
        mode,
        confirmed_flush_lsn,
        progress,
    )
    .run(shutdown, status_interval)
    .await;
    // The source is gone with its recorder: the record's last update, bounded.
    if let Some(task) = recorder_task {
        task.finish(RECORD_FINISH_TIMEOUT).await;
    }
    result
}

/// Runs `start`, the sink's set-up after START_REPLICATION (exactly-once's fencing and
/// checkpoint read, up to minutes; a sink's connect), while sending the walsender a status
/// update every `interval` with the slot's `confirmed` flush LSN (nothing is read meanwhile:
/// WAL waits in the socket). Without them the walsender ends the stream after
/// `wal_sender_timeout` and the session fails, or a relay waiting to take over
/// (`terminate_stale_walsender_after_secs`) takes the still `reply_time` for a dead relay's
/// and ends this one (PostgreSQL docs, 53.4 "Streaming Replication Protocol", Standby
/// status update).
///
/// Returns `start`'s result, or the error of a status update that could not be sent.
async fn keeping_alive<T>(
    stream: &mut ReplicationStream,
    confirmed: Lsn,
    interval: Duration,
    start: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let mut updates = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    updates.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tokio::pin!(start);
    loop {
        tokio::select! {
            result = &mut start => return result,
            _ = updates.tick() => stream.send_status(confirmed, confirmed).await?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(verdict: slot_record::Verdict) -> slot_record::Checked {
        slot_record::Checked {
            verdict,
            record: None,
            standby: false,
        }
    }

    #[test]
    fn a_slot_the_record_check_found_is_never_created_by_the_session() {
        use slot_record::Verdict;
        assert!(may_create_slot(true, None), "no record kept: as configured");
        assert!(
            may_create_slot(true, Some(&checked(Verdict::NeverStreamed))),
            "a first start"
        );
        assert!(
            !may_create_slot(true, Some(&checked(Verdict::Exists))),
            "a slot dropped after the record's check found it must not be created again"
        );
        assert!(!may_create_slot(
            false,
            Some(&checked(Verdict::NeverStreamed))
        ));
    }

    /// A pipeline stopped for good starts afresh, its publication checks forgetting what they
    /// found, only when the stop reported any change they found: one it did not report (the
    /// session stopped on a bad event first) stops the next session.
    #[test]
    fn a_drift_the_stop_did_not_report_is_kept_for_the_next_session() {
        let reason = "table public.outbox is not in publication \"outbox_pub\": ALTER PUBLICATION \"outbox_pub\" ADD TABLE \"public\".\"outbox\"";
        let drifted = Coverage::Drifted {
            reason: reason.to_owned(),
            verified: Lsn(0x100),
        };
        let start_check: Error = SourceError::Config(reason.to_owned()).into();
        let drift: Error = drifted.drift_error(Lsn(0x100)).unwrap().into();
        let other: Error = SourceError::Privilege("role \"r\" may not stream".into()).into();
        assert!(reported_any_drift(&start_check, &drifted));
        assert!(reported_any_drift(&drift, &drifted));
        assert!(!reported_any_drift(&other, &drifted));
        assert!(reported_any_drift(&other, &Coverage::Verified(Lsn(0x100))));
    }
}
