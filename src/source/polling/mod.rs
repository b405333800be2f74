//! The polling source: one pipeline that reads the outbox table instead of the WAL, for
//! databases without logical replication (no REPLICATION privilege, `wal_level` not
//! `logical`, a read-only role on a managed service). Same [`Router`], sinks and metrics as
//! log tailing; [`crate::pipeline::run`] hands a pipeline with `source_kind = "polling"` to
//! `Polling`'s sessions under the supervisor. `PollingSource` is the cycle as a
//! [`crate::source::Source`]; routing with its dead-letter fallback, publishing and the
//! delivery metrics are the session loop's ([`crate::session`]), as for log tailing.
//! `statements.rs` builds the SQL.
//!
//! # One cycle
//!
//! In one transaction: `SELECT ... WHERE <pending> ORDER BY created_at, id LIMIT n FOR UPDATE
//! SKIP LOCKED`; publish the eligible rows; wait for every outcome (the session's confirmation
//! of the cycle's position); mark the acknowledged rows ([`crate::config::MarkMode`]:
//! `status = 'PUBLISHED'`, `published = true` or `DELETE`) and record the failures; commit. A
//! row is marked only after the sink acknowledged it, so a crash between publishing and the
//! commit leaves the rows pending and they are published again:
//! duplicates, never loss (the `id` header lets consumers dedupe).
//!
//! # Order with several pollers
//!
//! SKIP LOCKED keeps two relays from publishing the same row at the same time, but by itself
//! it would let a second poller publish an aggregate's second event while the first poller
//! still holds its first one. So each selected row also carries the number of *blocking*
//! rows of its aggregate (same aggregate type and id, pending, or FAILED unless
//! `failed_blocks_aggregate = false`) that come before it in `(created_at, id)` order. A row
//! is published only if all of those are in the same batch, before it: then its aggregate's
//! events go out in order from one producer (one partition, idempotent producer). A row
//! whose predecessor is locked by another poller, waits for a retry or is FAILED stays
//! pending. Its count is read in the same statement snapshot that found the predecessor
//! pending, so the check can only be too cautious, never let a row overtake.
//!
//! The order is `(created_at, id)` among committed rows: give `created_at` the default
//! `clock_timestamp()` (`sql/outbox_polling.sql`) so it is insert time, which per aggregate
//! is commit order when writers lock the aggregate's row. Rows with a NULL aggregate id
//! (null key) have no order.
//!
//! # Failures
//!
//! With `mark = "status"`: a retryable delivery error (broker down: the record times out
//! after `message.timeout.ms`, [`DELIVERY_TIMEOUT_MS`] unless configured) adds one to
//! `retry_count` and sets `next_retry_at` to now + `retry_min_ms * 2^retry_count` (at most
//! `retry_max_ms`); at `max_attempts` the row becomes `FAILED`. An error that publishing
//! again cannot fix (record too large, invalid topic, not authorized) makes it `FAILED` at
//! once: retrying would only delay the operator's attention. Each FAILED row is logged with
//! its event id and counted in `outbox_relay_events_failed_total`; later events of its
//! aggregate wait behind it. With `mark = "flag"` or `"delete"` there is no column for
//! this: a retryable error leaves the rows pending and the poller backs off; any other error
//! stops the pipeline, naming the event.
//!
//! An event of the same aggregate acknowledged after an earlier one of the batch failed is
//! not marked either: it is published again after the failed one (a duplicate, but the
//! aggregate's last record is again its newest event).
//!
//! After any failure the aggregate's rows the cycle has not sent yet are held to the next
//! cycle, also behind a row whose failure does not block it (`failed_blocks_aggregate =
//! false`): they pass it only once its FAILED mark is committed.

mod source;
mod statements;
mod table;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use tracing::info;

pub(crate) use source::PollingSource;
pub(crate) use statements::Statements;
use table::PgTable;
#[cfg(test)]
pub(crate) use table::{OutboxTable, RetryMark, RetryPolicy, SelectedRow, TableStats};

use crate::config::{ConfigError, KafkaConfig, PipelineConfig, PollingConfig};
use crate::error::Error;
use crate::lsn::Lsn;
use crate::metrics::PipelineMetrics;
use crate::router::Router;
use crate::session::mutation::{active as mutated, Mutation};
use crate::session::{Mode, Session};
use crate::sink::kafka::{KafkaSink, SharedProducers};
use crate::sink::AnySink;
use crate::source::replication::quote_ident;
use crate::source::slot::{self, SqlConnection};
use crate::source::SourceError;
use crate::supervisor::SessionProgress;

/// `message.timeout.ms` of a polling pipeline unless its Kafka properties set one: a cycle
/// holds its row locks until every record has an outcome, so a broker outage must end in a
/// retryable failure (and a retry later) instead of an open transaction for its duration.
pub const DELIVERY_TIMEOUT_MS: u64 = 30_000;

/// Status values of `mark = "status"`.
const PENDING: &str = "PENDING";
const PUBLISHED: &str = "PUBLISHED";
const FAILED: &str = "FAILED";

/// Checks that the outbox table has every column `config` needs, as a polling pipeline does
/// at start; returns the query of the pending count, oldest pending age (s) and failed count.
///
/// Returns an error naming the table or the missing column.
pub(crate) async fn check_table(client: &Client, config: &PipelineConfig) -> Result<String, Error> {
    let router = Router::new(config).map_err(ConfigError::from)?;
    Ok(Statements::prepare(client, config, &router).await?.stats)
}

/// A row the polling source cannot use; the pipeline stops (nothing of the row is marked).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PollingError {
    #[error("outbox table {table} does not exist (or the role cannot see it); apply sql/outbox_polling.sql")]
    MissingTable { table: String },
    #[error("outbox table {table} has no column {column:?} (polling needs it for {field}); apply sql/outbox_polling.sql or configure the column name")]
    MissingColumn {
        table: String,
        column: String,
        field: String,
    },
    #[error("outbox row {event_id} has NULL in required column {column:?}")]
    Null { event_id: String, column: String },
    /// Rows are marked by `ctid`, which is unique in one table only: on a partitioned or
    /// inherited table a mark would also hit the rows at the same place in the other ones,
    /// and a view or a foreign table has none.
    #[error("outbox table {table} is not a plain table: it is partitioned, has child tables (inheritance), or is a view or a foreign table, which the polling source does not support (it marks rows by ctid, unique only within one plain table): poll each partition as a table of its own, or use log tailing")]
    NotPlain { table: String },
}

/// A polling pipeline's sessions, for [`crate::supervisor::supervise`]: transient errors
/// (connection loss, server restart) reconnect with backoff.
pub(crate) struct Polling<'a> {
    pub(crate) config: &'a PipelineConfig,
    pub(crate) metrics: &'a PipelineMetrics,
    /// The producers pipelines of the process share ([`new_sink`]).
    pub(crate) producers: &'a SharedProducers,
}

impl crate::supervisor::Sessions for Polling<'_> {
    async fn session(
        &mut self,
        progress: &SessionProgress,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        session(
            self.config,
            self.metrics,
            self.producers,
            shutdown,
            progress,
        )
        .await
    }
}

/// One connection: check the table, then poll until shutdown or an error.
async fn session(
    config: &PipelineConfig,
    metrics: &PipelineMetrics,
    producers: &SharedProducers,
    shutdown: &CancellationToken,
    progress: &SessionProgress,
) -> Result<(), Error> {
    let (client, driver, notified) = connect(config).await?;
    let polling = &config.polling;
    if let Some(channel) = &polling.notify_channel {
        client
            .batch_execute(&format!("LISTEN {}", quote_ident(channel)))
            .await
            .map_err(SourceError::Sql)?;
    }
    let router = Router::new(config).map_err(ConfigError::from)?;
    let sql = Statements::prepare(&client, config, &router).await?;
    // The first cycle would fail on a missing privilege: stop with `check`'s sentence.
    if let Some(missing) = crate::source::privileges::polling_missing(&client, config)
        .await
        .map_err(SourceError::Sql)?
    {
        return Err(SourceError::Privilege(missing).into());
    }
    let table = PgTable::new(
        client,
        driver,
        sql,
        config.columns.clone(),
        config.max_event_bytes(),
    );
    let source = PollingSource::new(config, metrics.clone(), table, notified, shutdown);
    let sink = new_sink(config, producers).await?;
    info!(pipeline = %config.name, table = %config.table, mark = ?polling.mark, batch_size = polling.batch_size, notify = ?polling.notify_channel, "polling");
    progress.streaming();
    Session::new(
        config,
        metrics,
        source,
        sink,
        router,
        Mode::AtLeastOnce,
        Lsn::ZERO,
        progress,
    )
    .run(shutdown, config.status_interval())
    .await
}

/// An SQL connection like [`slot::connect`]'s whose notifications (LISTEN) wake `Notify`.
async fn connect(config: &PipelineConfig) -> Result<(Client, SqlConnection, Arc<Notify>), Error> {
    let notify = Arc::new(Notify::new());
    let (client, driver) = slot::connect_notified(config, Some(notify.clone())).await?;
    // What the cycle relies on whatever the role's defaults: SKIP LOCKED rows re-checked
    // under READ COMMITTED (REPEATABLE READ would fail with serialization errors), writable.
    client
        .batch_execute(
            "SET default_transaction_isolation = 'read committed';
             SET default_transaction_read_only = off;",
        )
        .await
        .map_err(SourceError::Sql)?;
    // A `SQL_ASCII` database stores text as any bytes: sent as UTF-8, a value that is not
    // would end the SELECT of the whole batch, naming no row. Sent as stored, each row's
    // values are checked and a bad one is refused naming its row and column.
    let encoding: String = client
        .query_one("SHOW server_encoding", &[])
        .await
        .map_err(SourceError::Sql)?
        .get(0);
    if encoding == "SQL_ASCII" {
        client
            .batch_execute("SET client_encoding = 'SQL_ASCII'")
            .await
            .map_err(SourceError::Sql)?;
    }
    Ok((client, driver, notify))
}

/// The pipeline's sink: the producer it shares with the other polling pipelines of the same
/// effective Kafka settings ([`SharedProducers`]), else one of its own with
/// [`kafka_settings`] and a queue of [`queue_events`] records.
///
/// Returns an error if the sink's client rejects its configuration or cannot connect.
async fn new_sink(config: &PipelineConfig, producers: &SharedProducers) -> Result<AnySink, Error> {
    AnySink::connect(config, || {
        KafkaSink::new_or_shared(
            producers,
            &config.name,
            config.kafka.create_topics.clone(),
            || {
                KafkaSink::new(
                    &kafka_settings(config),
                    &format!("outbox-relay-{}", config.name),
                    queue_events(config),
                    config.max_in_flight_bytes,
                    None,
                )
            },
        )
        // A polling cycle's transaction must end: a missing topic's records fail after
        // message.timeout.ms and are retried, instead of waiting for the topic.
        .map(KafkaSink::not_holding_missing_topics)
    })
    .await
}

/// The Kafka settings of a polling pipeline's producer: its own, with `message.timeout.ms` =
/// [`DELIVERY_TIMEOUT_MS`] unless they set `message.timeout.ms` or `delivery.timeout.ms`.
/// Polling pipelines share a producer when these are equal ([`SharedProducers`]).
pub(crate) fn kafka_settings(config: &PipelineConfig) -> KafkaConfig {
    let mut kafka = config.kafka.clone();
    if !kafka
        .properties
        .iter()
        .any(|(k, _)| k == "message.timeout.ms" || k == "delivery.timeout.ms")
    {
        kafka
            .properties
            .push(("message.timeout.ms".into(), DELIVERY_TIMEOUT_MS.to_string()));
    }
    kafka
}

/// Records librdkafka's queue of a polling pipeline's producer holds for it:
/// max(`max_in_flight_events`, `polling.batch_size`), so a whole batch fits.
pub(crate) fn queue_events(config: &PipelineConfig) -> usize {
    config.max_in_flight_events.max(config.polling.batch_size)
}

/// What one cycle did.
#[derive(Debug, Default)]
struct Cycle {
    fetched: usize,
    published: usize,
    /// A retryable failure without retry bookkeeping (`mark` other than `status`).
    retry_later: bool,
}

/// The wait before the next cycle.
#[derive(Debug, Default)]
struct Pace {
    /// Consecutive cycles that published nothing.
    idle_streak: u32,
    /// Consecutive cycles with a retryable failure (`mark` other than `status`).
    retry_streak: u32,
}

impl Pace {
    /// None after a full batch; `min_interval_ms` after a partial one; after a cycle that
    /// published nothing, `min_interval_ms` doubled per such cycle before it, at most
    /// `max_interval_ms`. After a retryable failure without retry columns, `retry_min_ms`
    /// doubled per consecutive failure, at most `retry_max_ms`.
    fn next(&mut self, p: &PollingConfig, cycle: &Cycle) -> Duration {
        let doubled = |base: u64, times: u32, max: u64| {
            Duration::from_millis(base.saturating_mul(1 << times.min(30)).min(max))
        };
        if cycle.retry_later {
            if mutated(Mutation::PollingNoRetry) {
                return Duration::from_secs(365 * 24 * 3600);
            }
            self.retry_streak = self.retry_streak.saturating_add(1);
            return doubled(p.retry_min_ms, self.retry_streak - 1, p.retry_max_ms);
        }
        self.retry_streak = 0;
        if cycle.published > 0 {
            self.idle_streak = 0;
            return if cycle.fetched >= p.batch_size {
                Duration::ZERO
            } else {
                Duration::from_millis(p.min_interval_ms)
            };
        }
        let wait = doubled(p.min_interval_ms, self.idle_streak, p.max_interval_ms);
        self.idle_streak = self.idle_streak.saturating_add(1);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_at_once_while_full_and_backs_off_to_the_maximum_when_idle() {
        let p = PollingConfig {
            batch_size: 100,
            min_interval_ms: 10,
            max_interval_ms: 1_000,
            retry_min_ms: 500,
            retry_max_ms: 2_000,
            ..PollingConfig::default()
        };
        let cycle = |fetched, published, retry_later| Cycle {
            fetched,
            published,
            retry_later,
        };
        let mut pace = Pace::default();
        let ms = |d: Duration| d.as_millis() as u64;
        assert_eq!(ms(pace.next(&p, &cycle(100, 100, false))), 0, "full batch");
        assert_eq!(
            ms(pace.next(&p, &cycle(40, 40, false))),
            10,
            "partial batch"
        );
        let idle: Vec<u64> = (0..9)
            .map(|_| ms(pace.next(&p, &cycle(0, 0, false))))
            .collect();
        assert_eq!(idle, [10, 20, 40, 80, 160, 320, 640, 1_000, 1_000]);
        // Rows found but none publishable (held behind another poller) count as idle.
        assert_eq!(ms(pace.next(&p, &cycle(100, 0, false))), 1_000);
        assert_eq!(
            ms(pace.next(&p, &cycle(100, 1, false))),
            0,
            "work resets the backoff"
        );
        assert_eq!(ms(pace.next(&p, &cycle(0, 0, false))), 10);
        let retries: Vec<u64> = (0..4)
            .map(|_| ms(pace.next(&p, &cycle(5, 0, true))))
            .collect();
        assert_eq!(retries, [500, 1_000, 2_000, 2_000]);
        assert_eq!(ms(pace.next(&p, &cycle(100, 100, false))), 0);
        assert_eq!(
            ms(pace.next(&p, &cycle(5, 0, true))),
            500,
            "a success resets the retry delay"
        );
        // Many idle cycles never overflow.
        for _ in 0..100 {
            pace.next(&p, &cycle(0, 0, false));
        }
        assert_eq!(ms(pace.next(&p, &cycle(0, 0, false))), 1_000);
    }
}
