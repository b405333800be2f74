//! The polling source: one pipeline that reads the outbox table instead of the WAL, for
//! databases without logical replication (no REPLICATION privilege, `wal_level` not
//! `logical`, a read-only role on a managed service). Same [`Router`], [`KafkaSink`] and
//! metrics as log tailing; [`crate::pipeline::run`] hands a pipeline with
//! `source_kind = "polling"` to [`run`]. Routing with its dead-letter fallback and the
//! delivery metrics are the session loop's ([`crate::session`]).
//!
//! # One cycle
//!
//! In one transaction: `SELECT ... WHERE <pending> ORDER BY created_at, id LIMIT n FOR UPDATE
//! SKIP LOCKED`; publish the eligible rows; wait for every outcome; mark the acknowledged
//! rows (`status = 'PUBLISHED'`, `published = true` or `DELETE`, [`MarkMode`]) and record
//! the failures; commit. A row is marked only after Kafka acknowledged it, so a crash
//! between publishing and the commit leaves the rows pending and they are published again:
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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::Notify;
use tokio::time::sleep;
use tokio_postgres::{AsyncMessage, Client, Row};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::ack::EventToken;
use crate::config::{ConfigError, KafkaConfig, MarkMode, PipelineConfig, PollingConfig};
use crate::error::{chain, Error};
use crate::lsn::Lsn;
use crate::metrics::{PipelineMetrics, PipelineState};
use crate::router::Router;
use crate::session::{now_ms, observe_delivery, route_or_dead_letter};
use crate::sink::kafka::KafkaSink;
use crate::sink::{Delivery, DeliveryError, SendError, Sink};
use crate::source::outbox::{ColumnValue, OutboxEvent, ValueKind};
use crate::source::replication::{quote_ident, quote_literal};
use crate::source::{slot, SourceError};

/// `message.timeout.ms` of a polling pipeline unless its Kafka properties set one: a cycle
/// holds its row locks until every record has an outcome, so a broker outage must end in a
/// retryable failure (and a retry later) instead of an open transaction for its duration.
pub const DELIVERY_TIMEOUT_MS: u64 = 30_000;

/// How often a record the producer's full queue refused is offered again while it has nothing
/// in flight.
const QUEUE_FULL_RETRY: Duration = Duration::from_millis(10);

/// Status values of `mark = "status"`.
const PENDING: &str = "PENDING";
const PUBLISHED: &str = "PUBLISHED";
const FAILED: &str = "FAILED";

/// Checks that the outbox table has every column `config` needs, as a polling pipeline does
/// at start; returns the query of the pending count, oldest pending age (s) and failed count.
///
/// Returns an error naming the table or the missing column.
pub(crate) async fn check_table(client: &Client, config: &PipelineConfig) -> Result<String, Error> {
    let router = Router::new(&config.route, &config.columns, &config.record)
        .map_err(|problem| ConfigError::new("route", problem))?;
    Ok(Statements::prepare(client, config, router.columns())
        .await?
        .stats)
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
}

/// Runs a polling pipeline until `shutdown` is cancelled (then `Ok`) or a permanent error
/// stops it; transient errors (connection loss, server restart) reconnect with backoff.
pub async fn run(
    config: PipelineConfig,
    metrics: PipelineMetrics,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    config.validate()?;
    let backoff = || {
        ExponentialBuilder::default()
            .with_min_delay(Duration::from_secs(1))
            .with_max_delay(Duration::from_secs(30))
            .with_jitter()
            .without_max_times()
            .build()
    };
    let mut delays = backoff();
    loop {
        metrics.set_state(PipelineState::Connecting, None);
        let mut polled = false;
        match session(&config, &metrics, &shutdown, &mut polled).await {
            Ok(()) => {
                metrics.set_state(PipelineState::Stopped, None);
                info!(pipeline = %config.name, "stopped");
                return Ok(());
            }
            Err(e) if e.is_transient() => {
                metrics.set_state(PipelineState::Reconnecting, Some(chain(&e)));
                if polled {
                    delays = backoff();
                }
                let delay = delays.next().unwrap_or(Duration::from_secs(30));
                warn!(pipeline = %config.name, error = %chain(&e), delay_ms = delay.as_millis() as u64, "polling session ended; reconnecting");
                metrics.reconnects.inc();
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = sleep(delay) => {}
                }
            }
            Err(e) => {
                metrics.set_state(PipelineState::Failed, Some(chain(&e)));
                error!(pipeline = %config.name, error = %chain(&e), "pipeline stopped by an error that retrying cannot fix");
                return Err(e);
            }
        }
    }
}

/// One connection: check the table, then poll until shutdown or an error.
async fn session(
    config: &PipelineConfig,
    metrics: &PipelineMetrics,
    shutdown: &CancellationToken,
    polled: &mut bool,
) -> Result<(), Error> {
    let (client, _driver, notified) = connect(config).await?;
    let polling = &config.polling;
    if let Some(channel) = &polling.notify_channel {
        client
            .batch_execute(&format!("LISTEN {}", quote_ident(channel)))
            .await
            .map_err(SourceError::Sql)?;
    }
    let router = Router::new(&config.route, &config.columns, &config.record)
        .map_err(|problem| ConfigError::new("route", problem))?;
    let sql = Statements::prepare(&client, config, router.columns()).await?;
    let mut poller = Poller {
        config,
        polling,
        metrics,
        client,
        sink: new_sink(config)?,
        router,
        sql,
        notified,
        pace: Pace::default(),
        next_stats: Instant::now(),
        next_purge: Instant::now(),
    };
    info!(pipeline = %config.name, table = %config.table, mark = ?polling.mark, batch_size = polling.batch_size, notify = ?polling.notify_channel, "polling");
    *polled = true;
    metrics.set_state(PipelineState::Streaming, None);
    poller.poll_until_shutdown(shutdown).await
}

/// Owns the task driving the SQL connection; aborts it when dropped.
struct Driver(tokio::task::JoinHandle<()>);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An SQL connection like [`slot::connect`]'s whose notifications (LISTEN) wake `Notify`.
async fn connect(config: &PipelineConfig) -> Result<(Client, Driver, Arc<Notify>), Error> {
    let (pg, tls) = config.source_config()?;
    let connector = tokio_postgres_rustls::MakeRustlsConnect::new(
        tls.client_config().map_err(SourceError::Tls)?,
    );
    let (client, mut connection) = pg.connect(connector).await.map_err(SourceError::Sql)?;
    let notify = Arc::new(Notify::new());
    let wake = notify.clone();
    let driver = Driver(tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(_)) => wake.notify_one(),
                Ok(_) => {}
                // The client's next query reports the broken connection.
                Err(_) => break,
            }
        }
    }));
    // What the cycle relies on whatever the role's defaults: SKIP LOCKED rows re-checked
    // under READ COMMITTED (REPEATABLE READ would fail with serialization errors), writable.
    client
        .batch_execute(slot::SESSION_SETTINGS)
        .await
        .map_err(SourceError::Sql)?;
    client
        .batch_execute(
            "SET default_transaction_isolation = 'read committed';
             SET default_transaction_read_only = off;",
        )
        .await
        .map_err(SourceError::Sql)?;
    Ok((client, driver, notify))
}

/// The pipeline's producer, with [`DELIVERY_TIMEOUT_MS`] unless a timeout is configured.
fn new_sink(config: &PipelineConfig) -> Result<KafkaSink, Error> {
    let mut kafka: KafkaConfig = config.kafka.clone();
    if !kafka
        .properties
        .iter()
        .any(|(k, _)| k == "message.timeout.ms" || k == "delivery.timeout.ms")
    {
        kafka
            .properties
            .push(("message.timeout.ms".into(), DELIVERY_TIMEOUT_MS.to_string()));
    }
    Ok(KafkaSink::new(
        &kafka,
        &format!("outbox-relay-{}", config.name),
        config.max_in_flight_events.max(config.polling.batch_size),
        config.max_in_flight_bytes,
        None,
    )?)
}

/// The SQL of one pipeline, built once from the configuration and the table's columns.
#[derive(Debug)]
pub(crate) struct Statements {
    /// `$1`: the batch size (int8).
    select: String,
    /// `$1`: ctids (text[]).
    mark_published: String,
    /// `$1`: ctids, `$2`: retry_min_ms, `$3`: retry_max_ms (float8), `$4`: max_attempts
    /// (int4). Returns id, status, retry_count. `None` unless `mark = "status"`.
    mark_retry: Option<String>,
    /// `$1`: ctids. Returns id. `None` unless `mark = "status"`.
    mark_failed: Option<String>,
    /// Pending rows, age of the oldest (s), failed rows.
    stats: String,
    /// `$1`: age (float8 s), `$2`: batch (int8). `None` without a purge.
    purge: Option<String>,
    payload_kind: ValueKind,
    extra_kinds: Vec<ValueKind>,
}

/// Positions in the SELECT's row.
const COL_CTID: usize = 0;
const COL_ID: usize = 1;
const COL_AGGREGATE_TYPE: usize = 2;
const COL_AGGREGATE_ID: usize = 3;
const COL_EVENT_TYPE: usize = 4;
const COL_PAYLOAD: usize = 5;
const COL_HEADERS: usize = 6;
const COL_ROUTED_BY: usize = 7;
const COL_CREATED_MS: usize = 8;
const COL_OLDER: usize = 9;
const COL_EXTRA: usize = 10;

impl Statements {
    /// Reads the table's columns and builds the statements.
    ///
    /// Returns an error naming the table or the column if one the configuration needs is
    /// not there.
    pub(crate) async fn prepare(
        client: &Client,
        config: &PipelineConfig,
        extra: &[String],
    ) -> Result<Statements, Error> {
        let table = format!(
            "{}.{}",
            quote_ident(&config.table.schema),
            quote_ident(&config.table.name)
        );
        let rows = client
            .query(
                "SELECT a.attname::text, coalesce(bt.typname, t.typname)::text,
                        coalesce(bt.typnamespace, t.typnamespace) = 'pg_catalog'::regnamespace
                 FROM pg_catalog.pg_attribute a
                 JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
                 LEFT JOIN pg_catalog.pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype
                 WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
                &[&table],
            )
            .await
            .map_err(SourceError::Sql)?;
        if rows.is_empty() {
            return Err(PollingError::MissingTable {
                table: config.table.to_string(),
            }
            .into());
        }
        let columns: HashMap<String, ValueKind> = rows
            .iter()
            .map(|r| {
                let builtin: bool = r.get(2);
                let kind = if builtin {
                    ValueKind::of_name(r.get(1))
                } else {
                    ValueKind::Text
                };
                (r.get::<_, String>(0), kind)
            })
            .collect();
        let need = |field: &str, column: &str| -> Result<(String, ValueKind), Error> {
            match columns.get(column) {
                Some(kind) => Ok((quote_ident(column), *kind)),
                None => Err(PollingError::MissingColumn {
                    table: config.table.to_string(),
                    column: column.to_owned(),
                    field: field.to_owned(),
                }
                .into()),
            }
        };
        let c = &config.columns;
        let p = &config.polling;
        let (id, _) = need("columns.id", &c.id)?;
        let (aggregate_type, _) = need("columns.aggregate_type", &c.aggregate_type)?;
        let (aggregate_id, _) = need("columns.aggregate_id", &c.aggregate_id)?;
        let (event_type, _) = need("columns.event_type", &c.event_type)?;
        let (payload, payload_kind) = need("columns.payload", &c.payload)?;
        let (created_at, _) = need("polling.created_at_column", &p.created_at_column)?;
        let headers = match columns.contains_key(&c.headers) {
            true => format!("o.{}::text", quote_ident(&c.headers)),
            false => "NULL::text".to_owned(),
        };
        let routed_by = match config.route.by_field.as_deref() {
            Some(column) if column != c.aggregate_type => {
                format!("o.{}::text", need("route.by_field", column)?.0)
            }
            _ => "NULL::text".to_owned(),
        };
        let mut extra_select = String::new();
        let mut extra_kinds = Vec::new();
        for column in extra {
            let (quoted, kind) = need("routing and record options", column)?;
            extra_select.push_str(&format!(", o.{quoted}::text"));
            extra_kinds.push(kind);
        }

        // The pending condition on the table under `alias` (`o.` or nothing).
        let pending_on = |alias: &str| -> Result<String, Error> {
            Ok(match p.mark {
                MarkMode::Status => format!(
                    "{alias}{} = {}",
                    need("polling.status_column", &p.status_column)?.0,
                    lit(PENDING)
                ),
                MarkMode::Flag => format!(
                    "NOT {alias}{}",
                    need("polling.published_column", &p.published_column)?.0
                ),
                MarkMode::Delete => "true".to_owned(),
            })
        };
        let (pending, stats_pending) = (pending_on("o.")?, pending_on("")?);
        let (blocking, due) = match p.mark {
            MarkMode::Status => {
                let (status, _) = need("polling.status_column", &p.status_column)?;
                need("polling.published_at_column", &p.published_at_column)?;
                need("polling.retry_count_column", &p.retry_count_column)?;
                let (next_retry_at, _) =
                    need("polling.next_retry_at_column", &p.next_retry_at_column)?;
                let blocking = if p.failed_blocks_aggregate {
                    format!("p.{status} IN ({}, {})", lit(PENDING), lit(FAILED))
                } else {
                    format!("p.{status} = {}", lit(PENDING))
                };
                (
                    blocking,
                    format!(" AND (o.{next_retry_at} IS NULL OR o.{next_retry_at} <= now())"),
                )
            }
            MarkMode::Flag => (pending_on("p.")?, String::new()),
            MarkMode::Delete => ("true".to_owned(), String::new()),
        };
        // The count stops at the batch size: a row with more blocking predecessors cannot
        // have them all in its batch anyway.
        let select = format!(
            "SELECT o.ctid::text, o.{id}::text, o.{aggregate_type}::text, o.{aggregate_id}::text,
                    o.{event_type}::text, o.{payload}::text, {headers}, {routed_by},
                    (extract(epoch FROM o.{created_at}) * 1000)::int8,
                    (SELECT count(*) FROM (SELECT 1 FROM {table} p
                        WHERE p.{aggregate_id} = o.{aggregate_id}
                          AND p.{aggregate_type} = o.{aggregate_type} AND {blocking}
                          AND (p.{created_at}, p.{id}) < (o.{created_at}, o.{id})
                        LIMIT $1) older)::int8
                    {extra_select}
             FROM {table} o
             WHERE {pending}{due}
             ORDER BY o.{created_at}, o.{id}
             LIMIT $1
             FOR UPDATE OF o SKIP LOCKED"
        );
        let ctids = "ctid = ANY($1::text[]::tid[])";
        let q = |column: &str| quote_ident(column);
        let mark_published = match p.mark {
            MarkMode::Status => format!(
                "UPDATE {table} SET {} = {}, {} = clock_timestamp() WHERE {ctids}",
                q(&p.status_column),
                lit(PUBLISHED),
                q(&p.published_at_column)
            ),
            MarkMode::Flag => format!(
                "UPDATE {table} SET {} = true WHERE {ctids}",
                q(&p.published_column)
            ),
            MarkMode::Delete => format!("DELETE FROM {table} WHERE {ctids}"),
        };
        let (mark_retry, mark_failed) = match p.mark {
            MarkMode::Status => {
                let (status, retries, next) = (
                    q(&p.status_column),
                    q(&p.retry_count_column),
                    q(&p.next_retry_at_column),
                );
                (
                    Some(format!(
                        "UPDATE {table} SET {retries} = {retries} + 1,
                            {next} = now() + least($2::float8 * power(2::float8, least({retries}, 40)), $3::float8) * interval '1 millisecond',
                            {status} = CASE WHEN {retries} + 1 >= $4::int4 THEN {failed} ELSE {status} END
                         WHERE {ctids}
                         RETURNING {id}::text, {status}::text, {retries}::int8",
                        failed = lit(FAILED),
                    )),
                    Some(format!(
                        "UPDATE {table} SET {retries} = {retries} + 1, {status} = {failed}
                         WHERE {ctids} RETURNING {id}::text",
                        failed = lit(FAILED),
                    )),
                )
            }
            _ => (None, None),
        };
        let stats = match p.mark {
            MarkMode::Status => format!(
                "SELECT count(*) FILTER (WHERE {stats_pending}),
                        coalesce(extract(epoch FROM now() - min({created_at}) FILTER (WHERE {stats_pending})), 0)::float8,
                        count(*) FILTER (WHERE {status} = {failed})
                 FROM {table} WHERE {status} IN ({pending_lit}, {failed})",
                status = q(&p.status_column),
                failed = lit(FAILED),
                pending_lit = lit(PENDING),
            ),
            _ => format!(
                "SELECT count(*), coalesce(extract(epoch FROM now() - min({created_at})), 0)::float8, 0::int8
                 FROM {table} WHERE {stats_pending}"
            ),
        };
        let purge = match (p.purge_published_after_secs, p.mark) {
            (Some(_), MarkMode::Status) => Some(format!(
                "{} = {} AND {} < now() - $1::float8 * interval '1 second'",
                q(&p.status_column),
                lit(PUBLISHED),
                q(&p.published_at_column)
            )),
            (Some(_), MarkMode::Flag) => Some(format!(
                "{} AND {created_at} < now() - $1::float8 * interval '1 second'",
                q(&p.published_column)
            )),
            _ => None,
        }
        .map(|published| {
            format!(
                "DELETE FROM {table} WHERE ctid = ANY(ARRAY(
                    SELECT ctid FROM {table} WHERE {published} LIMIT $2 FOR UPDATE SKIP LOCKED))"
            )
        });
        Ok(Statements {
            select,
            mark_published,
            mark_retry,
            mark_failed,
            stats,
            purge,
            payload_kind,
            extra_kinds,
        })
    }
}

fn lit(value: &str) -> String {
    quote_literal(value)
}

/// One selected row, and what became of it in this cycle.
struct Polled {
    ctid: String,
    event_id: String,
    /// Aggregate type and id; `None` for a NULL aggregate id (no order).
    key: Option<(Bytes, Bytes)>,
    outcome: Outcome,
}

#[derive(Debug)]
enum Outcome {
    /// Not published in this cycle: an earlier blocking row of its aggregate is not in the
    /// batch, or an earlier one of the batch failed.
    Held,
    /// Handed to the producer; no outcome yet.
    Sent,
    Acked,
    Failed(DeliveryError),
}

/// What one cycle did.
#[derive(Debug, Default)]
struct Cycle {
    fetched: usize,
    published: usize,
    /// A retryable failure without retry bookkeeping (`mark` other than `status`).
    retry_later: bool,
    /// Shutdown came and the shutdown timeout passed before every outcome arrived.
    abandoned: bool,
}

struct Poller<'a> {
    config: &'a PipelineConfig,
    polling: &'a PollingConfig,
    metrics: &'a PipelineMetrics,
    client: Client,
    sink: KafkaSink,
    router: Router,
    sql: Statements,
    /// Woken by LISTEN notifications.
    notified: Arc<Notify>,
    pace: Pace,
    next_stats: Instant,
    next_purge: Instant,
}

impl Poller<'_> {
    /// Polls until `shutdown`: a cycle at once while batches come back full, else after a
    /// wait that doubles from `min_interval_ms` to `max_interval_ms` while polls find
    /// nothing to publish, cut short by a notification.
    async fn poll_until_shutdown(&mut self, shutdown: &CancellationToken) -> Result<(), Error> {
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            let cycle = self.cycle(shutdown).await?;
            if cycle.abandoned {
                return Ok(());
            }
            self.maintenance(shutdown).await?;
            let delay = self.pace.next(self.polling, &cycle);
            if delay.is_zero() {
                continue;
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                _ = self.notified.notified() => self.pace.idle_streak = 0,
                _ = sleep(delay) => {}
            }
        }
    }

    /// One transaction: select, publish, await every outcome, mark, commit.
    async fn cycle(&mut self, shutdown: &CancellationToken) -> Result<Cycle, Error> {
        let batch_size = i64::try_from(self.polling.batch_size).unwrap_or(i64::MAX);
        // BEGIN and COMMIT by hand (the client stays shared with the rest of the poller); an
        // error before COMMIT ends the session, and with the connection the transaction.
        self.sql_batch("BEGIN").await?;
        let rows = self
            .client
            .query(&self.sql.select, &[&batch_size])
            .await
            .map_err(SourceError::Sql)?;
        self.metrics.polling.polls.inc();
        let mut cycle = Cycle {
            fetched: rows.len(),
            ..Cycle::default()
        };
        if rows.is_empty() {
            self.sql_batch("COMMIT").await?;
            return Ok(cycle);
        }

        // Send the eligible rows in order; hold the rest.
        let mut batch: Vec<Polled> = Vec::with_capacity(rows.len());
        let mut in_batch: HashMap<(Bytes, Bytes), i64> = HashMap::new();
        // Aggregates with a failed event in this batch: their later events are held.
        let mut failed_keys: Vec<(Bytes, Bytes)> = Vec::new();
        let mut stop: Option<Error> = None;
        for row in &rows {
            let (event, created_ms, older) = self.event(row)?;
            let key = event
                .aggregate_id
                .clone()
                .map(|id| (event.aggregate_type.clone(), id));
            let mut polled = Polled {
                ctid: row.get::<_, String>(COL_CTID),
                event_id: String::from_utf8_lossy(&event.id).into_owned(),
                key: key.clone(),
                outcome: Outcome::Held,
            };
            let eligible = match &key {
                None => true,
                Some(key) => {
                    let before = in_batch.entry(key.clone()).or_insert(0);
                    let eligible = older == *before && !failed_keys.contains(key);
                    *before += 1;
                    eligible
                }
            };
            if eligible && stop.is_none() {
                // Bounded memory: wait for outcomes while the bytes in flight are over the limit.
                while self.sink.in_flight().bytes >= self.config.max_in_flight_bytes {
                    match self.sink.next_delivery().await {
                        Some(delivery) => self.on_delivery(delivery, &mut batch),
                        None => break,
                    }
                }
                match self.send(&event, created_ms, &mut batch).await {
                    Ok(()) => polled.outcome = Outcome::Sent,
                    Err(NotSent::Rejected(e)) => {
                        self.metrics.delivery_failed(&e.topic, e.retryable);
                        if let Some(key) = &key {
                            if self.failure_blocks(&e) {
                                failed_keys.push(key.clone());
                            }
                        }
                        polled.outcome = Outcome::Failed(e);
                    }
                    Err(NotSent::Stop(e)) => stop = Some(e),
                }
            }
            batch.push(polled);
        }

        // Every outcome, or the shutdown timeout.
        let mut deadline: Option<tokio::time::Instant> = None;
        while self.sink.in_flight().events > 0 {
            tokio::select! {
                biased;
                _ = shutdown.cancelled(), if deadline.is_none() => {
                    info!(pipeline = %self.config.name, in_flight = self.sink.in_flight().events, "draining before shutdown");
                    deadline = Some(tokio::time::Instant::now() + self.config.shutdown_timeout());
                }
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                    warn!(pipeline = %self.config.name, in_flight = self.sink.in_flight().events, "shutdown timeout reached; the batch stays pending and is published again");
                    self.sql_batch("ROLLBACK").await?;
                    cycle.abandoned = true;
                    return Ok(cycle);
                }
                Some(delivery) = self.sink.next_delivery() => self.on_delivery(delivery, &mut batch),
            }
        }

        // An event acknowledged after an earlier one of its aggregate failed stays pending.
        let mut failed_keys: Vec<&(Bytes, Bytes)> = Vec::new();
        let (mut published, mut retry, mut failed) = (Vec::new(), Vec::new(), Vec::new());
        let mut halt: Option<DeliveryError> = None;
        let mut recreate_sink = false;
        for polled in &mut batch {
            match &polled.outcome {
                Outcome::Acked => match &polled.key {
                    Some(key) if failed_keys.contains(&key) => {
                        warn!(pipeline = %self.config.name, event_id = %polled.event_id, "event acknowledged after an earlier event of its aggregate failed; it stays pending and is published again after that one");
                    }
                    _ => published.push(polled.ctid.clone()),
                },
                Outcome::Failed(e) => {
                    if let Some(key) = &polled.key {
                        if self.failure_blocks(e) {
                            failed_keys.push(key);
                        }
                    }
                    recreate_sink |= e.retryable;
                    match (self.polling.mark, e.retryable) {
                        (MarkMode::Status, true) => retry.push(polled.ctid.clone()),
                        (MarkMode::Status, false) => {
                            error!(pipeline = %self.config.name, event_id = %polled.event_id, error = %e, "event marked FAILED: publishing it again cannot succeed");
                            failed.push(polled.ctid.clone());
                        }
                        (_, true) => {
                            warn!(pipeline = %self.config.name, event_id = %polled.event_id, error = %e, "delivery failed; the event stays pending");
                            cycle.retry_later = true;
                        }
                        (_, false) => {
                            halt.get_or_insert_with(|| DeliveryError {
                                event_id: e.event_id.clone(),
                                topic: e.topic.clone(),
                                reason: e.reason.clone(),
                                retryable: false,
                                too_large: e.too_large,
                                record: None,
                            });
                        }
                    }
                }
                Outcome::Held | Outcome::Sent => {}
            }
        }
        if !published.is_empty() {
            let n = self
                .client
                .execute(&self.sql.mark_published, &[&published])
                .await
                .map_err(SourceError::Sql)?;
            debug!(pipeline = %self.config.name, rows = n, "marked published");
        }
        if let (Some(sql), false) = (&self.sql.mark_retry, retry.is_empty()) {
            let p = self.polling;
            let rows = self
                .client
                .query(
                    sql,
                    &[
                        &retry,
                        &(p.retry_min_ms as f64),
                        &(p.retry_max_ms as f64),
                        &i32::try_from(p.max_attempts).unwrap_or(i32::MAX),
                    ],
                )
                .await
                .map_err(SourceError::Sql)?;
            for row in rows {
                let (event_id, status, attempts): (String, String, i64) =
                    (row.get(0), row.get(1), row.get(2));
                let reason = batch
                    .iter()
                    .find(|b| b.event_id == event_id)
                    .and_then(|b| match &b.outcome {
                        Outcome::Failed(e) => Some(e.reason.as_str()),
                        _ => None,
                    })
                    .unwrap_or("");
                if status == FAILED {
                    error!(pipeline = %self.config.name, %event_id, attempts, error = %reason, "event marked FAILED after its last attempt");
                    self.metrics.polling.failed(self.metrics.name(), true);
                } else {
                    warn!(pipeline = %self.config.name, %event_id, attempts, error = %reason, "delivery failed; retrying later");
                }
            }
        }
        if let (Some(sql), false) = (&self.sql.mark_failed, failed.is_empty()) {
            let rows = self
                .client
                .query(sql, &[&failed])
                .await
                .map_err(SourceError::Sql)?;
            for _ in rows {
                self.metrics.polling.failed(self.metrics.name(), false);
            }
        }
        self.sql_batch("COMMIT").await?;
        cycle.published = published.len();
        if recreate_sink {
            // After a timed-out record librdkafka may have reset the partition's sequence:
            // start the next cycle with a fresh producer, as a log-tailing session would.
            self.sink = new_sink(self.config)?;
        }
        if let Some(e) = stop {
            return Err(e);
        }
        if let Some(e) = halt {
            return Err(Error::Delivery(e));
        }
        Ok(cycle)
    }

    async fn sql_batch(&self, sql: &str) -> Result<(), Error> {
        self.client
            .batch_execute(sql)
            .await
            .map_err(|e| SourceError::Sql(e).into())
    }

    /// Whether later events of the aggregate must wait behind this failed one.
    fn failure_blocks(&self, e: &DeliveryError) -> bool {
        e.retryable || self.polling.mark != MarkMode::Status || self.polling.failed_blocks_aggregate
    }

    /// The event of a selected row, its created_at (Unix ms) and how many blocking rows of
    /// its aggregate come before it.
    ///
    /// Returns an error naming the event if its id or aggregate type is NULL.
    fn event(&self, row: &Row) -> Result<(OutboxEvent, Option<i64>, i64), Error> {
        let text = |i: usize| {
            row.get::<_, Option<&str>>(i)
                .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        };
        let c = &self.config.columns;
        let id = text(COL_ID).ok_or_else(|| PollingError::Null {
            event_id: format!("at ctid {}", row.get::<_, &str>(COL_CTID)),
            column: c.id.clone(),
        })?;
        let aggregate_type = text(COL_AGGREGATE_TYPE).ok_or_else(|| PollingError::Null {
            event_id: String::from_utf8_lossy(&id).into_owned(),
            column: c.aggregate_type.clone(),
        })?;
        let event = OutboxEvent {
            id,
            aggregate_type,
            aggregate_id: text(COL_AGGREGATE_ID),
            event_type: text(COL_EVENT_TYPE),
            payload: text(COL_PAYLOAD),
            headers: text(COL_HEADERS),
            routed_by: text(COL_ROUTED_BY),
            payload_kind: self.sql.payload_kind,
            columns: self
                .sql
                .extra_kinds
                .iter()
                .enumerate()
                .map(|(i, kind)| ColumnValue {
                    text: text(COL_EXTRA + i),
                    kind: *kind,
                })
                .collect(),
            lsn: Lsn::ZERO,
        };
        Ok((
            event,
            row.get::<_, Option<i64>>(COL_CREATED_MS),
            row.get::<_, i64>(COL_OLDER),
        ))
    }

    /// Routes `event` and hands it to the producer as event `index` of the batch.
    async fn send(
        &mut self,
        event: &OutboxEvent,
        created_ms: Option<i64>,
        batch: &mut [Polled],
    ) -> Result<(), NotSent> {
        let index = batch.len();
        self.metrics.events_decoded.inc();
        let time_ms = created_ms.unwrap_or_else(now_ms);
        if event.aggregate_id.is_none() {
            self.metrics.events_null_key.inc();
        }
        let mut record =
            route_or_dead_letter(&self.router, self.config, self.metrics, event, time_ms)
                .map_err(|e| NotSent::Stop(e.into()))?;
        let token = EventToken::from_index(index as u64);
        // The sink's queue is full: wait for an outcome (kept for the batch), offer it again.
        loop {
            match self.sink.send(record, token) {
                Ok(()) => break,
                Err(SendError::Full(returned)) => {
                    record = *returned;
                    match self.sink.next_delivery().await {
                        Some(delivery) => self.on_delivery(delivery, batch),
                        None => tokio::time::sleep(QUEUE_FULL_RETRY).await,
                    }
                }
                Err(SendError::Refused(e)) => return Err(NotSent::Rejected(e)),
            }
        }
        self.metrics
            .in_flight_events
            .set(self.sink.in_flight().events as i64);
        Ok(())
    }

    fn on_delivery(&mut self, delivery: Delivery, batch: &mut [Polled]) {
        self.metrics
            .in_flight_events
            .set(self.sink.in_flight().events as i64);
        self.metrics
            .in_flight_bytes
            .set(self.sink.in_flight().bytes as i64);
        let Some(polled) = usize::try_from(delivery.token.index())
            .ok()
            .and_then(|i| batch.get_mut(i))
        else {
            return;
        };
        observe_delivery(self.metrics, &delivery);
        polled.outcome = match delivery.result {
            Ok(()) => Outcome::Acked,
            Err(e) => Outcome::Failed(e),
        };
    }

    /// Refreshes the pending/failed gauges and runs the retention purge when they are due.
    async fn maintenance(&mut self, shutdown: &CancellationToken) -> Result<(), Error> {
        let now = Instant::now();
        if now >= self.next_stats {
            self.next_stats = now + Duration::from_millis(self.polling.stats_interval_ms);
            let row = self
                .client
                .query_one(&self.sql.stats, &[])
                .await
                .map_err(SourceError::Sql)?;
            let m = &self.metrics.polling;
            m.pending_rows.set(row.get(0));
            m.oldest_pending_age.set(row.get(1));
            m.failed_rows.set(row.get(2));
        }
        if let (Some(sql), Some(age)) = (&self.sql.purge, self.polling.purge_published_after_secs) {
            if now >= self.next_purge {
                self.next_purge = now + Duration::from_secs(self.polling.purge_interval_secs);
                let batch = i64::try_from(self.polling.purge_batch_size).unwrap_or(i64::MAX);
                loop {
                    let deleted = self
                        .client
                        .execute(sql, &[&(age as f64), &batch])
                        .await
                        .map_err(SourceError::Sql)?;
                    self.metrics.polling.rows_purged.inc_by(deleted);
                    if deleted > 0 {
                        debug!(pipeline = %self.config.name, rows = deleted, "purged published rows");
                    }
                    if deleted < batch as u64 || shutdown.is_cancelled() {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
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

/// Why an event was not handed to the producer.
enum NotSent {
    /// The producer refused the record (e.g. larger than `message.max.bytes`).
    Rejected(DeliveryError),
    /// Bad input under `on_bad_event = "halt"`: stop the pipeline after this cycle.
    Stop(Error),
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
            abandoned: false,
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
