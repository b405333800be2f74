//! Checks the publication and the replication slot before streaming, over an ordinary SQL
//! connection (tokio-postgres).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;

use tokio_postgres::{AsyncMessage, Client};
use tracing::warn;

use super::replication::{quote_ident, quote_literal};
use super::SourceError;
use crate::config::{PipelineConfig, TableName};
use crate::lsn::Lsn;
use crate::shutdown::AbortOnDrop;

/// What the relay needs to know about the server before `START_REPLICATION`.
#[derive(Debug, Clone)]
pub struct SlotState {
    /// The slot's `confirmed_flush_lsn`: streaming resumes after it, and the relay never
    /// reports a lower flush LSN.
    pub confirmed_flush_lsn: Lsn,
    /// `wal_sender_timeout`; zero when disabled.
    pub wal_sender_timeout: Duration,
}

/// Verifies that `publication` exists, publishes inserts and includes `table`, then makes sure
/// the logical slot `slot` exists (creating it with pgoutput when `create` is set) and belongs
/// to this database.
///
/// Returns an error naming the publication, table or slot when one is missing or wrong.
pub async fn prepare(
    client: &Client,
    slot: &str,
    publication: &str,
    table: &TableName,
    create: bool,
) -> Result<SlotState, SourceError> {
    let row = client
        .query_opt(
            "SELECT pubinsert FROM pg_catalog.pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await?;
    match row {
        None => {
            return Err(SourceError::Config(format!(
                "publication {publication:?} does not exist in this database; create it, e.g. CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert')",
                quote_ident(publication),
                table.quoted()
            )))
        }
        Some(row) if !row.get::<_, bool>(0) => {
            return Err(SourceError::Config(format!(
                "publication {publication:?} does not publish inserts"
            )))
        }
        Some(_) => {}
    }
    let published = client
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
            &[&publication, &table.schema, &table.name],
        )
        .await?;
    if published.is_none() {
        return Err(SourceError::Config(format!(
            "table {table} is not in publication {publication:?} (or does not exist); ALTER PUBLICATION {} ADD TABLE {}",
            quote_ident(publication),
            table.quoted()
        )));
    }

    let confirmed_flush_lsn = match read_slot(client, slot).await? {
        Some(lsn) => lsn,
        None if create => {
            let created = client
                .query_one(
                    "SELECT lsn::text FROM pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')",
                    &[&slot],
                )
                .await;
            match created {
                Ok(row) => warn!(
                    slot,
                    lsn = row.get::<_, &str>(0),
                    "created replication slot: events committed before this LSN are not published; in production create the slot once with `outbox-relay setup` and run with --no-create-slot, so a dropped slot stops the relay instead of skipping events"
                ),
                // Another replica created it first.
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_OBJECT) => {}
                Err(e) => return Err(e.into()),
            }
            read_slot(client, slot).await?.ok_or_else(|| {
                SourceError::Config(format!("replication slot {slot:?} vanished after creation"))
            })?
        }
        None => {
            return Err(SourceError::Config(format!(
                "replication slot {slot:?} does not exist: before a first start create it with `outbox-relay setup`; if it existed before, it was dropped or lost (a failover?) and events committed since its confirmed LSN may be missing: reconcile them from the outbox table first"
            )))
        }
    };

    Ok(SlotState {
        confirmed_flush_lsn,
        wal_sender_timeout: wal_sender_timeout(client).await?,
    })
}

/// The oid of `table` (what pgoutput's Relation messages carry as the relation id), `None`
/// if it does not exist.
pub async fn table_oid(client: &Client, table: &TableName) -> Result<Option<u32>, SourceError> {
    Ok(client
        .query_one("SELECT to_regclass($1)::oid", &[&table.quoted()])
        .await?
        .get::<_, Option<u32>>(0))
}

/// The server's `wal_sender_timeout` for this database and role (zero: never).
pub async fn wal_sender_timeout(client: &Client) -> Result<Duration, SourceError> {
    let timeout_ms: i64 = client
        .query_one(
            "SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'wal_sender_timeout'",
            &[],
        )
        .await?
        .get(0);
    Ok(Duration::from_millis(
        u64::try_from(timeout_ms).unwrap_or(0),
    ))
}

/// How much WAL the slot holds and may still hold, from `pg_replication_slots`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotWal {
    /// `reserved`, `extended`, `unreserved` or `lost`; `None` on a slot that never reserved WAL.
    pub wal_status: Option<String>,
    /// Bytes of WAL that can be written before the slot is at risk; `None` when
    /// `max_slot_wal_keep_size` is unlimited (-1).
    pub safe_wal_size: Option<i64>,
}

/// Reads `wal_status` and `safe_wal_size` of `slot`; `Ok(None)` if there is no such slot.
///
/// Returns an error if the query fails.
pub async fn slot_wal(client: &Client, slot: &str) -> Result<Option<SlotWal>, SourceError> {
    let row = client
        .query_opt(
            "SELECT wal_status, safe_wal_size FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.map(|row| SlotWal {
        wal_status: row.get(0),
        safe_wal_size: row.get(1),
    }))
}

/// The walsender holding a slot, as `pg_stat_replication` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotHolder {
    pub pid: i32,
    pub application_name: String,
    /// `client_addr:client_port`, or `local` for a Unix socket.
    pub client: String,
    /// `reply_time` as text: when its client last sent a status update, by the client's
    /// clock; `None` if it never did (or this role may not see it).
    pub reply_time: Option<String>,
    /// Seconds since `reply_time`, or since `backend_start` when `reply_time` is NULL, by
    /// the server's clock; `None` when neither is visible to this role.
    pub reply_age_secs: Option<f64>,
    /// Whether this role may see the walsender's details (`reply_time`, `state`, ...):
    /// PostgreSQL shows them only to superusers and members of `pg_read_all_stats`.
    pub details_visible: bool,
}

/// The walsender streaming from `slot`; `Ok(None)` if no walsender holds it (free, or held by
/// an SQL backend).
///
/// Returns an error if the query fails.
pub async fn slot_holder(client: &Client, slot: &str) -> Result<Option<SlotHolder>, SourceError> {
    let row = client
        .query_opt(
            "SELECT r.pid, r.application_name,
                    COALESCE(host(r.client_addr) || ':' || r.client_port, 'local'),
                    r.reply_time::text,
                    EXTRACT(EPOCH FROM clock_timestamp() - COALESCE(r.reply_time, r.backend_start))::float8,
                    r.state IS NOT NULL
             FROM pg_catalog.pg_replication_slots s
             JOIN pg_catalog.pg_stat_replication r ON r.pid = s.active_pid
             WHERE s.slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.map(|row| SlotHolder {
        pid: row.get(0),
        application_name: row.get::<_, Option<String>>(1).unwrap_or_default(),
        client: row.get(2),
        reply_time: row.get(3),
        reply_age_secs: row.get(4),
        details_visible: row.get(5),
    }))
}

/// Terminates the walsender `holder` describes (`pg_terminate_backend`) if it is still the
/// same process and its client still sent no status update since `holder` was read (both in
/// one statement). Returns whether it was terminated.
///
/// Returns an error if this role may not signal it (SQLSTATE 42501: it needs
/// `pg_signal_backend`, the walsender's role, or superuser) or the query fails.
pub async fn terminate_stale_walsender(
    client: &Client,
    holder: &SlotHolder,
) -> Result<bool, SourceError> {
    let row = client
        .query_opt(
            "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_replication
             WHERE pid = $1 AND reply_time::text IS NOT DISTINCT FROM $2",
            &[&holder.pid, &holder.reply_time],
        )
        .await?;
    Ok(row.is_some_and(|row| row.get::<_, bool>(0)))
}

/// Reads the `confirmed_flush_lsn` of `slot`.
///
/// Returns an error if the slot does not exist (any more) or is not a pgoutput slot of this
/// database.
pub async fn confirmed_flush_lsn(client: &Client, slot: &str) -> Result<Lsn, SourceError> {
    read_slot(client, slot)
        .await?
        .ok_or_else(|| SourceError::Config(format!("replication slot {slot:?} disappeared")))
}

/// Reads the slot's `confirmed_flush_lsn`; `None` if there is no such slot.
///
/// Returns an error if the slot is not a pgoutput logical slot of the current database.
async fn read_slot(client: &Client, slot: &str) -> Result<Option<Lsn>, SourceError> {
    let row = client
        .query_opt(
            "SELECT plugin, slot_type, database = current_database(), confirmed_flush_lsn::text, wal_status
             FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let plugin: Option<String> = row.get(0);
    let slot_type: String = row.get(1);
    let same_database: Option<bool> = row.get(2);
    if slot_type != "logical" || plugin.as_deref() != Some("pgoutput") {
        return Err(SourceError::Config(format!(
            "replication slot {slot:?} is a {slot_type} slot with plugin {plugin:?}, not a logical pgoutput slot"
        )));
    }
    if same_database != Some(true) {
        return Err(SourceError::Config(format!(
            "replication slot {slot:?} belongs to another database"
        )));
    }
    let wal_status: Option<String> = row.get(4);
    if wal_status.as_deref() == Some("lost") {
        return Err(SourceError::Config(format!(
            "replication slot {slot:?} is invalidated (wal_status = 'lost'): PostgreSQL removed WAL it still needed (max_slot_wal_keep_size), so outbox events committed while the relay was behind may never be published; reconcile those events from the outbox table, then drop the slot (SELECT pg_drop_replication_slot('{slot}')) and start the relay again to create a new one"
        )));
    }
    let lsn: Option<String> = row.get(3);
    let lsn =
        lsn.as_deref().unwrap_or("0/0").parse().map_err(|_| {
            SourceError::Protocol(format!("slot {slot:?} confirmed_flush_lsn {lsn:?}"))
        })?;
    Ok(Some(lsn))
}

/// Session settings of the relay's SQL connections, so role and database defaults
/// (`ALTER ROLE ... SET`) cannot break them: catalog names resolve in `pg_catalog` only, no
/// timeout ends a slot creation waiting for running transactions or an idle connection kept
/// between status queries, and values print in one format. `idle_session_timeout` exists from
/// PostgreSQL 14, hence `set_config` over `pg_settings`.
pub(crate) const SESSION_SETTINGS: &str = "SET search_path = pg_catalog, pg_temp;
SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET TimeZone = 'UTC';
SET DateStyle = 'ISO, MDY';
SET IntervalStyle = 'postgres';
SELECT pg_catalog.set_config(name, '0', false) FROM pg_catalog.pg_settings WHERE name = 'idle_session_timeout';";

/// An ordinary SQL connection to a pipeline's database, with the same URL, environment, TLS
/// settings and choice of host (`target_session_attrs`) as its replication connection and the
/// session settings the relay relies on (see [`SESSION_SETTINGS`]). The connection task ends
/// when the returned guard is dropped.
///
/// Returns an error if the URL is invalid, TLS cannot be set up, no host fits or the server
/// refuses.
pub async fn connect(config: &PipelineConfig) -> Result<(Client, SqlConnection), crate::Error> {
    connect_notified(config, None).await
}

/// Like [`connect`]; each notification (`LISTEN`) the server sends wakes `notified`.
pub async fn connect_notified(
    config: &PipelineConfig,
    notified: Option<Arc<Notify>>,
) -> Result<(Client, SqlConnection), crate::Error> {
    let (client, mut connection) = super::target::connect_sql(&config.source_config()?).await?;
    let connection = AbortOnDrop(tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(_)) => {
                    if let Some(notified) = &notified {
                        notified.notify_one();
                    }
                }
                Ok(_) => {}
                // The client's next query reports the broken connection.
                Err(_) => break,
            }
        }
    }));
    client
        .batch_execute(SESSION_SETTINGS)
        .await
        .map_err(SourceError::Sql)?;
    Ok((client, connection))
}

/// Owns the task driving a tokio-postgres connection; aborts it when dropped.
pub type SqlConnection = AbortOnDrop;

/// The SQL `outbox-relay setup` runs for `config`: the publication (when missing) and the slot.
pub fn setup_sql(config: &PipelineConfig) -> String {
    format!(
        "-- unless the publication exists already (sql/outbox.sql creates outbox_pub):\nCREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert');\nSELECT pg_create_logical_replication_slot({}, 'pgoutput');",
        quote_ident(&config.publication),
        config.table.quoted(),
        quote_literal(&config.slot),
    )
}

/// Creates the publication of `config` if it does not exist and the slot if it does not
/// exist; returns the slot's `confirmed_flush_lsn`.
///
/// Returns an error if the database is unreachable, the role may not create them, or an
/// existing publication or slot does not fit (see [`prepare`]).
pub async fn setup(config: &PipelineConfig) -> Result<Lsn, crate::Error> {
    let (client, _connection) = connect(config).await?;
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1",
            &[&config.publication],
        )
        .await
        .map_err(SourceError::Sql)?
        .is_some();
    if !exists {
        let create = format!(
            "CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert')",
            quote_ident(&config.publication),
            config.table.quoted()
        );
        client
            .batch_execute(&create)
            .await
            .map_err(SourceError::Sql)?;
    }
    if read_slot(&client, &config.slot).await?.is_none() {
        client
            .query_one(
                "SELECT pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&config.slot],
            )
            .await
            .map_err(SourceError::Sql)?;
    }
    let state = prepare(
        &client,
        &config.slot,
        &config.publication,
        &config.table,
        false,
    )
    .await?;
    Ok(state.confirmed_flush_lsn)
}
