//! Checks the publication and the replication slot before streaming, over an ordinary SQL
//! connection (tokio-postgres).

use std::time::Duration;

use tokio_postgres::Client;
use tracing::warn;

use super::replication::{quote_ident, quote_literal};
use super::SourceError;
use crate::config::{PipelineConfig, TableName};
use crate::lsn::Lsn;

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
                "publication {publication:?} does not exist in this database; create it, e.g. CREATE PUBLICATION {publication} FOR TABLE {table} WITH (publish = 'insert')"
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
            "table {table} is not in publication {publication:?} (or does not exist); ALTER PUBLICATION {publication} ADD TABLE {table}"
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

    let timeout_ms: i64 = client
        .query_one(
            "SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'wal_sender_timeout'",
            &[],
        )
        .await?
        .get(0);
    Ok(SlotState {
        confirmed_flush_lsn,
        wal_sender_timeout: Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0)),
    })
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

/// An ordinary SQL connection to a pipeline's database, with the same URL, environment and
/// TLS settings as its replication connection and the session settings the relay relies on
/// (see [`SESSION_SETTINGS`]). The connection task ends when the returned guard is dropped.
///
/// Returns an error if the URL is invalid, TLS cannot be set up or the server refuses.
pub async fn connect(config: &PipelineConfig) -> Result<(Client, SqlConnection), crate::Error> {
    let (pg, tls) = config.source_config()?;
    let connector = tokio_postgres_rustls::MakeRustlsConnect::new(
        tls.client_config().map_err(SourceError::Tls)?,
    );
    let (client, connection) = pg.connect(connector).await.map_err(SourceError::Sql)?;
    let connection = SqlConnection(tokio::spawn(async move {
        let _ = connection.await;
    }));
    client
        .batch_execute(SESSION_SETTINGS)
        .await
        .map_err(SourceError::Sql)?;
    Ok((client, connection))
}

/// Owns the task driving a tokio-postgres connection; aborts it when dropped.
pub struct SqlConnection(tokio::task::JoinHandle<()>);

impl Drop for SqlConnection {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The SQL `outbox-relay setup` runs for `config`: the publication (when missing) and the slot.
pub fn setup_sql(config: &PipelineConfig) -> String {
    format!(
        "-- unless the publication exists already (sql/outbox.sql creates outbox_pub):\nCREATE PUBLICATION {} FOR TABLE {}.{} WITH (publish = 'insert');\nSELECT pg_create_logical_replication_slot({}, 'pgoutput');",
        quote_ident(&config.publication),
        quote_ident(&config.table.schema),
        quote_ident(&config.table.name),
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
            "CREATE PUBLICATION {} FOR TABLE {}.{} WITH (publish = 'insert')",
            quote_ident(&config.publication),
            quote_ident(&config.table.schema),
            quote_ident(&config.table.name)
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
