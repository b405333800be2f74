//! The slot watcher: the slot's WAL metrics and the publication's coverage of the outbox
//! table, read from the server over SQL.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{interval, MissedTickBehavior};
use tracing::{debug, info, warn};

use crate::config::PipelineConfig;
use crate::error::chain;
use crate::metrics::PipelineMetrics;
use crate::shutdown::AbortOnDrop;
use crate::source::coverage::{Checker, CoverageWatch};
use crate::source::slot::{self, failover};
use crate::source::target::Endpoint;

/// How often the slot's `wal_status` and `safe_wal_size` are read for the metrics: WAL
/// retention changes over minutes, and the query is cheap.
const SLOT_WATCH_INTERVAL: Duration = Duration::from_secs(10);
/// How often the publication is checked ([`Checker`]): idle progress is confirmed up to what
/// the check before last verified, so it lags the end of WAL by about twice this.
const PUBLICATION_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// Longest wait between two connection attempts while the server refuses them (doubling from
/// [`PUBLICATION_CHECK_INTERVAL`]): a wrong password is not tried every 2 s.
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(60);
/// Least time between two warnings about publication checks that keep failing.
const CHECK_WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// The running slot watcher of one pipeline ([`watch_slot`]), the server it reads and the
/// coverage its publication checks tell the sessions.
///
/// A publication change its checks found stops every session until the pipeline starts
/// afresh ([`SlotWatcher::start_afresh`]): a pipeline stopped for good that starts again
/// (`on_pipeline_failure = "retry"`) does, as a new process would, its stop having told the
/// operator what to fix.
pub(super) struct SlotWatcher {
    config: PipelineConfig,
    metrics: PipelineMetrics,
    /// The server the last session's replication connection reached.
    pub(super) server: watch::Sender<Option<Endpoint>>,
    /// What this watcher's publication checks verified.
    pub(super) coverage: CoverageWatch,
    /// Aborted when replaced or dropped.
    _task: AbortOnDrop,
}

impl SlotWatcher {
    /// Spawns the watcher of `config`'s slot and publication; nothing is verified yet.
    pub(super) fn start(config: &PipelineConfig, metrics: &PipelineMetrics) -> Self {
        let (server, _) = watch::channel(None);
        let (coverage, task) = spawn(config, metrics, &server);
        SlotWatcher {
            config: config.clone(),
            metrics: metrics.clone(),
            server,
            coverage,
            _task: task,
        }
    }

    /// Replaces the watcher with a new one whose checks start from nothing: what the old
    /// one verified or found changed no longer counts. The old one is aborted, so a check it
    /// had under way tells nobody.
    pub(super) fn start_afresh(&mut self) {
        let (coverage, task) = spawn(&self.config, &self.metrics, &self.server);
        self.coverage = coverage;
        self._task = task;
    }
}

/// Spawns [`watch_slot`] with a new [`Checker`], reading the server `server` names.
fn spawn(
    config: &PipelineConfig,
    metrics: &PipelineMetrics,
    server: &watch::Sender<Option<Endpoint>>,
) -> (CoverageWatch, AbortOnDrop) {
    let (checker, coverage) = Checker::new(&config.publication, &config.table);
    let task = tokio::spawn(watch_slot(
        config.clone(),
        metrics.clone(),
        server.subscribe(),
        checker,
    ));
    (coverage, AbortOnDrop(task))
}

/// Refreshes the slot's `wal_status`, `safe_wal_size`, invalidation reason, failover and
/// lag (`outbox_relay_replication_lag_bytes`) metrics every [`SLOT_WATCH_INTERVAL`] over an
/// SQL connection of its own (kept open, made again after an error, less and less often while
/// connecting fails, up to once a minute), whether or not this
/// relay holds the slot. For a failover slot it also reads `synchronized_standby_slots`:
/// while a physical slot named there cannot confirm changes, the walsender sends none and
/// the relay would look idle, so it logs a warning naming the setting and the slots (again
/// when they change) and sets `outbox_relay_standby_slots_stalled`. Every
/// [`PUBLICATION_CHECK_INTERVAL`] it runs `checker`'s check of the publication, which the
/// sessions' idle progress waits for. Runs until aborted.
///
/// It reads the server `server` names: the one the last session's replication connection
/// reached (a new one when that changes), or if none did within its first interval, the host
/// the source URL's settings choose. Left to choose by itself, it could read another host's
/// slot (a host refusing walsenders but not SQL) while the WAL streamed from elsewhere.
pub(super) async fn watch_slot(
    config: PipelineConfig,
    metrics: PipelineMetrics,
    mut server: watch::Receiver<Option<Endpoint>>,
    mut checker: Checker,
) {
    // The first read waits, up to one interval, for the first session to reach its server,
    // rather than read the host the URL's settings choose by themselves.
    if server.borrow().is_none() {
        let _ = tokio::time::timeout(SLOT_WATCH_INTERVAL, server.changed()).await;
    }
    let mut timer = interval(PUBLICATION_CHECK_INTERVAL);
    timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut next_slot_read = tokio::time::Instant::now();
    // When a failed publication check was last warned of, while they fail.
    let mut check_warned: Option<tokio::time::Instant> = None;
    let mut connection = None;
    // While connecting fails: when to try again, and the wait after the next failure.
    let mut next_connect = tokio::time::Instant::now();
    let mut reconnect_delay = PUBLICATION_CHECK_INTERVAL;
    // The stall last logged, so that a lasting one is logged once.
    let mut stall: Option<String> = None;
    loop {
        timer.tick().await;
        // Read and marked seen at once: a change between a check and the read is not lost.
        let (target, changed) = {
            let target = server.borrow_and_update();
            (target.clone(), target.has_changed())
        };
        if changed {
            connection = None;
            // A new server is tried at once, whatever the old one refused.
            next_connect = tokio::time::Instant::now();
            reconnect_delay = PUBLICATION_CHECK_INTERVAL;
            // Transaction ids are the server's own.
            checker.new_server();
        }
        // Each step within one interval: a half-open connection must not freeze the metrics
        // until TCP gives up.
        if connection.is_none() {
            if tokio::time::Instant::now() < next_connect {
                continue;
            }
            let connect = async {
                match &target {
                    Some(endpoint) => slot::connect_to(&config, endpoint).await,
                    None => slot::connect(&config).await,
                }
            };
            let connected = tokio::time::timeout(SLOT_WATCH_INTERVAL, connect).await;
            match connected {
                Ok(Ok(c)) => {
                    connection = Some(c);
                    reconnect_delay = PUBLICATION_CHECK_INTERVAL;
                }
                Ok(Err(e)) if cannot_connect_now(&e) => {
                    // Shutting down (or starting up): the sessions let their walsenders go.
                    if checker.cannot_connect_now(chain(&e)) {
                        info!(pipeline = %config.name, error = %chain(&e), "the server refuses new connections; the publication cannot be checked until it takes them again");
                    }
                    // While it refuses so, tried again at the next tick, not less and less
                    // often (a server that does not answer at all is, up to once a minute).
                    reconnect_delay = PUBLICATION_CHECK_INTERVAL / 2;
                }
                Ok(Err(e)) => {
                    // The session logs the same failure; this is only for the metrics.
                    debug!(pipeline = %config.name, error = %chain(&e), "cannot read the slot's wal_status");
                }
                Err(_) => {
                    debug!(pipeline = %config.name, "connecting to read the slot's wal_status timed out");
                }
            }
            if connection.is_none() {
                next_connect = tokio::time::Instant::now() + reconnect_delay;
                reconnect_delay = (reconnect_delay * 2).min(RECONNECT_MAX_DELAY);
                continue;
            }
        }
        let Some((client, _)) = &connection else {
            continue;
        };
        // A failed check verifies nothing (the sessions' confirmations wait, and WAL stays):
        // said at most once a minute. The slot's metrics are read all the same, and their read
        // tells whether the connection is gone.
        let checked = tokio::time::timeout(SLOT_WATCH_INTERVAL, checker.check(client)).await;
        let failure = match &checked {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(chain(e)),
            Err(_) => Some("timed out".to_owned()),
        };
        match (failure, &mut check_warned) {
            (Some(reason), warned) => {
                if warned.is_none_or(|at| at.elapsed() >= CHECK_WARNING_INTERVAL) {
                    warn!(pipeline = %config.name, publication = %config.publication, error = %reason, "cannot check the publication; the slot is confirmed only as far as the last check (or an outbox insert) verified until one succeeds");
                    *warned = Some(tokio::time::Instant::now());
                }
            }
            (None, warned @ Some(_)) => {
                info!(pipeline = %config.name, publication = %config.publication, "the publication is checked again");
                *warned = None;
            }
            (None, None) => {}
        }
        // A connection the server closed (a fast shutdown ends every backend first) is made
        // again at the next tick, where a refusal tells the sessions at once.
        if checked.is_err() || client.is_closed() {
            connection = None;
            continue;
        }
        if tokio::time::Instant::now() < next_slot_read {
            continue;
        }
        next_slot_read = tokio::time::Instant::now() + SLOT_WATCH_INTERVAL;
        let read = async {
            let wal = slot::slot_wal(client, &config.slot).await?;
            let standby_slots = match &wal {
                Some(wal) if wal.failover => Some(failover::standby_slots(client).await?),
                _ => None,
            };
            Ok::<_, crate::source::SourceError>((wal, standby_slots))
        };
        match tokio::time::timeout(SLOT_WATCH_INTERVAL, read).await {
            Ok(Ok((wal, standby_slots))) => {
                set_slot_gauges(&metrics, wal.as_ref());
                let message = standby_slots.as_ref().and_then(|s| s.stall_message());
                metrics.set_standby_slots_stalled(message.is_some());
                match (&message, &stall) {
                    (Some(now), before) if before.as_ref() != Some(now) => warn!(
                        pipeline = %config.name,
                        slot = %config.slot,
                        setting = "synchronized_standby_slots",
                        "failover slot stalled: {now}"
                    ),
                    (None, Some(_)) => info!(
                        pipeline = %config.name,
                        slot = %config.slot,
                        "synchronized_standby_slots no longer holds the failover slot back"
                    ),
                    _ => {}
                }
                stall = message;
            }
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

/// Whether `error` is the server's refusal of a new connection with SQLSTATE 57P03
/// (`cannot_connect_now`: shutting down, starting up, not yet accepting connections).
fn cannot_connect_now(error: &crate::Error) -> bool {
    matches!(error, crate::Error::Source(e) if e.sqlstate() == Some("57P03"))
}

/// Sets the slot's gauges from one reading; `None`: there is no such slot. The lag is 0
/// without a slot or before it confirmed anything (the last one read would stay for good).
fn set_slot_gauges(metrics: &PipelineMetrics, wal: Option<&slot::SlotWal>) {
    metrics.set_slot_wal(
        wal.and_then(|w| w.wal_status.as_deref()),
        wal.and_then(|w| w.safe_wal_size),
    );
    metrics.set_slot_invalidation(
        wal.and_then(|w| w.invalidation.as_ref())
            .map(|i| i.reason.as_str()),
    );
    metrics.set_slot_failover(wal.is_some_and(|w| w.failover));
    let lag = wal.and_then(|w| w.lag_bytes).unwrap_or(0);
    metrics.lag_bytes.set(lag.max(0));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    /// Found by review: the lag gauge kept its last reading once the slot was gone, while
    /// the other slot gauges were cleared.
    #[test]
    fn a_reading_without_the_slot_clears_the_lag() {
        let metrics = Metrics::new().pipeline("p");
        let wal = slot::SlotWal {
            wal_status: Some("reserved".into()),
            safe_wal_size: None,
            invalidation: None,
            failover: false,
            lag_bytes: Some(4096),
        };
        set_slot_gauges(&metrics, Some(&wal));
        assert_eq!(metrics.lag_bytes.get(), 4096);
        set_slot_gauges(&metrics, None);
        assert_eq!(metrics.lag_bytes.get(), 0, "the lag of a slot that is gone");
        set_slot_gauges(
            &metrics,
            Some(&slot::SlotWal {
                lag_bytes: None,
                ..wal
            }),
        );
        assert_eq!(metrics.lag_bytes.get(), 0);
    }

    /// Log lines written while the guard lives (this thread only), DEBUG included.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A source that refuses every connection (a wrong password, a database that is down)
    /// was tried every 2 s for as long as it refused: an authentication failure in the
    /// server's log every 2 s, on top of the sessions' own attempts.
    #[tokio::test(start_paused = true)]
    async fn a_source_that_refuses_connections_is_tried_again_less_and_less_often() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let mut config = PipelineConfig::new("p", "public.outbox".parse().unwrap());
        config.source_url = format!("postgres://relay@127.0.0.1:{port}/app").into();
        config.slot = "outbox_relay".into();
        config.publication = "outbox_pub".into();
        let (checker, _coverage) = Checker::new(&config.publication, &config.table);
        let (_server, receiver) = watch::channel(None);
        let captured = Captured::default();
        let writer = captured.clone();
        let _guard = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_ansi(false)
                .with_max_level(tracing::Level::DEBUG)
                .with_writer(move || writer.clone())
                .finish(),
        );
        let metrics = crate::metrics::Metrics::new().pipeline("p");
        let watching = watch_slot(config, metrics, receiver, checker);
        let ran = tokio::time::timeout(Duration::from_secs(600), watching).await;
        assert!(ran.is_err(), "watch_slot runs until aborted");
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let attempts = log
            .lines()
            .filter(|l| {
                l.contains("cannot read the slot's wal_status")
                    || l.contains("connecting to read the slot's wal_status timed out")
            })
            .count();
        assert!(
            (3..=25).contains(&attempts),
            "{attempts} connection attempts in 10 minutes:\n{log}"
        );
    }
}
