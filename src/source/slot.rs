//! Checks the publication and the replication slot before streaming, over an ordinary SQL
//! connection (tokio-postgres).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::Notify;

use tokio_postgres::{AsyncMessage, Client};
use tracing::warn;

use super::replication::{quote_ident, ReplicationClient};
use super::SourceError;
use crate::config::{PipelineConfig, TableName};
use crate::lsn::Lsn;
use crate::shutdown::AbortOnDrop;

pub mod columns;
pub mod failover;
pub mod publication;
mod setup_sql;
pub mod standby;
pub mod teardown;

use failover::Invalidation;
pub use setup_sql::setup_sql;

/// What the relay needs to know about the server before `START_REPLICATION`.
#[derive(Debug, Clone)]
pub struct SlotState {
    /// The slot's `confirmed_flush_lsn`: streaming resumes after it, and the relay never
    /// reports a lower flush LSN.
    pub confirmed_flush_lsn: Lsn,
    /// `wal_sender_timeout`; zero when disabled.
    pub wal_sender_timeout: Duration,
}

/// Verifies that `wal_level` is `logical` and that `publication` exists, publishes inserts
/// (and updates and deletes with `needs_updates`) and includes `table`, then makes sure the
/// logical slot `slot` exists (creating it with pgoutput when `create` is set, as a failover
/// slot when `failover` is) and belongs to this database.
///
/// Returns an error naming the setting, publication, table or slot when one is missing or
/// wrong, with the sentence `check` prints, or the server's version when `failover` asks it
/// for a failover slot it cannot make.
#[allow(clippy::too_many_arguments)] // the names and switches of one pipeline's slot
pub async fn prepare(
    client: &Client,
    slot: &str,
    publication: &str,
    table: &TableName,
    create: bool,
    failover: bool,
    needs_updates: bool,
) -> Result<SlotState, SourceError> {
    let wal_level: String = client.query_one("SHOW wal_level", &[]).await?.get(0);
    if let Some(fix) = wal_level_fix(&wal_level) {
        return Err(SourceError::Config(format!("wal_level is {fix}")));
    }
    publication::check(client, publication, table, needs_updates).await?;

    let confirmed_flush_lsn = match read_slot(client, slot).await? {
        Some(lsn) => lsn,
        None if create => {
            // None: another replica created it first.
            if let Some(lsn) = create_slot(client, slot, failover).await? {
                warn!(
                    slot,
                    lsn,
                    failover,
                    "created replication slot: events committed before this LSN are not published; once the relay streamed from it, the slot record keeps a lost slot from being created again (slot_record)"
                );
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

/// What to do about `wal_level` (the server's setting, `SHOW wal_level`), or `None` when it
/// is `logical`: `run` stops with it and `check` prints it.
pub fn wal_level_fix(wal_level: &str) -> Option<String> {
    (wal_level != "logical").then(|| {
        format!("{wal_level}: set wal_level = logical (ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL")
    })
}

/// Verifies that `publication` exists, publishes inserts and includes `table`.
///
/// Returns [`SourceError::Config`] naming what is missing, with the fix
/// ([`publication::problem`]), or the query's error.
pub(crate) async fn check_publication(
    client: &Client,
    publication: &str,
    table: &TableName,
) -> Result<(), SourceError> {
    publication::check(client, publication, table, false).await
}

/// Creates the logical slot `slot` with pgoutput (a failover slot when `failover`) and
/// returns its consistent point; `None` if it exists already (another relay created it
/// first).
///
/// Returns an error naming the server's version and host if `failover` is asked of a server
/// older than PostgreSQL 17, or if the creation fails otherwise.
///
/// The creation waits for the transactions running on the server to end, and on a standby
/// for a running-transactions record from the primary: while it waits, it logs so (see
/// [`standby::CreationWait`]). A standby whose primary has `wal_level` below logical is an
/// error naming the standby and the setting. Not cancel-safe: dropped, the creation goes on
/// on the server until its connection closes.
pub async fn create_slot(
    client: &Client,
    slot: &str,
    failover: bool,
) -> Result<Option<String>, SourceError> {
    let server = failover::server(client).await?;
    let sql = failover::create_slot_sql(&server, failover).map_err(SourceError::Config)?;
    let in_recovery = standby::in_recovery(client).await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&slot];
    let creation = client.query_one(sql, &params);
    tokio::pin!(creation);
    let started = Instant::now();
    let mut wait = standby::CreationWait::new();
    let created = loop {
        let next_log = tokio::time::sleep(wait.next_delay());
        // The creation's outcome first; the timer only says that it still waits.
        tokio::select! {
            biased;
            created = &mut creation => break created,
            () = next_log => {
                let message = wait.message(slot, &server.host, in_recovery, started.elapsed());
                warn!(slot, "{message}");
            }
        }
    };
    match created {
        Ok(row) => Ok(Some(row.get(0))),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_OBJECT) => Ok(None),
        // Another actor may free one: retried (53xxx), with `check`'s sentence.
        Err(e)
            if e.code() == Some(&tokio_postgres::error::SqlState::CONFIGURATION_LIMIT_EXCEEDED) =>
        {
            Err(SourceError::Server {
                code: e.code().map(|c| c.code().to_owned()).unwrap_or_default(),
                message: no_free_slot(slot),
            })
        }
        Err(e)
            if in_recovery
                && e.as_db_error()
                    .is_some_and(|db| standby::is_primary_wal_level_error(db.message())) =>
        {
            Err(SourceError::Config(standby::primary_wal_level_error(
                slot,
                &server.host,
            )))
        }
        Err(e) => Err(e.into()),
    }
}

/// Before a session, with `failover` set: stops on what `check` fails in its `failover
/// slot` finding ([`failover::failover_refusal`]): a server without failover slots, a slot
/// without FAILOVER that the relay may not mend (`create_slot = false`), or a slot to be
/// created with it on a standby. A lost slot is left to [`prepare`], which stops on it with
/// its own sentence and exit code.
///
/// Returns [`SourceError::Config`] with `check`'s sentence, or an error if a query fails.
pub async fn check_failover(client: &Client, config: &PipelineConfig) -> Result<(), SourceError> {
    if !config.failover {
        return Ok(());
    }
    let (server, slot) = failover_state(client, &config.slot).await?;
    if slot.lost && server.has_failover_slots() {
        return Ok(());
    }
    match failover::failover_refusal(
        &config.slot,
        &server,
        slot.in_recovery,
        slot.is_failover,
        config.failover,
        config.create_slot,
    ) {
        Some(refusal) => Err(SourceError::Config(refusal)),
        None => Ok(()),
    }
}

/// Before a session, with `failover` and `create_slot` set, on a primary with failover slots:
/// turns FAILOVER on for the pipeline's slot (a logical pgoutput slot of this database) if it
/// exists without it and no walsender holds it (`ALTER_REPLICATION_SLOT` on the session's
/// `replication` connection, as `setup` does), so that a database failover keeps it. A slot
/// another relay holds is left to START_REPLICATION, which the session stands by on; a later
/// session turns FAILOVER on once the slot is free.
///
/// Returns an error if a query fails or the ALTER does; SQLSTATE 55006 (the session stands by)
/// if the ALTER waited [`ALTER_SLOT_WAIT`] for a walsender that took the slot meanwhile
/// (PostgreSQL's ALTER waits for the slot rather than failing).
pub async fn turn_failover_on(
    client: &Client,
    replication: &mut ReplicationClient,
    config: &PipelineConfig,
) -> Result<(), SourceError> {
    if !(config.failover && config.create_slot) {
        return Ok(());
    }
    let (server, slot) = failover_state(client, &config.slot).await?;
    if !server.has_failover_slots()
        || slot.in_recovery
        || slot.lost
        || slot.active
        || !slot.pipelines
        || slot.is_failover != Some(false)
    {
        return Ok(());
    }
    let command = failover::alter_failover_command(&config.slot);
    let alter = replication.simple_query(&command);
    match tokio::time::timeout(ALTER_SLOT_WAIT, alter).await {
        Ok(done) => {
            done?;
        }
        Err(_) => {
            return Err(SourceError::Server {
                code: "55006".into(),
                message: format!(
                    "replication slot {:?} was taken by another walsender while FAILOVER was being turned on; standing by",
                    config.slot
                ),
            })
        }
    }
    tracing::info!(pipeline = %config.name, slot = %config.slot, "the slot was not a failover slot although failover = true: turned FAILOVER on (ALTER_REPLICATION_SLOT)");
    Ok(())
}

/// How long the start's `ALTER_REPLICATION_SLOT` may wait for a slot that a walsender took
/// between the check that it was free and the ALTER.
const ALTER_SLOT_WAIT: Duration = Duration::from_secs(10);

/// What [`check_failover`] and [`turn_failover_on`] need to know of slot `slot`.
struct FailoverState {
    /// The server is a standby.
    in_recovery: bool,
    /// Whether the slot is a failover slot; `None`: there is no such slot.
    is_failover: Option<bool>,
    /// The slot's WAL is gone (`wal_status = 'lost'`).
    lost: bool,
    /// A walsender holds the slot.
    active: bool,
    /// The slot is a logical pgoutput slot of this database: one the pipeline may use.
    pipelines: bool,
}

async fn failover_state(
    client: &Client,
    slot: &str,
) -> Result<(failover::Server, FailoverState), SourceError> {
    let server = failover::server(client).await?;
    let row = client
        .query_one(
            "SELECT pg_catalog.pg_is_in_recovery(),
                    (SELECT COALESCE((to_jsonb(s) ->> 'failover')::bool, false)
                     FROM pg_catalog.pg_replication_slots s WHERE slot_name = $1),
                    EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots
                            WHERE slot_name = $1 AND wal_status = 'lost'),
                    EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots
                            WHERE slot_name = $1 AND active_pid IS NOT NULL),
                    EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots
                            WHERE slot_name = $1 AND slot_type = 'logical' AND plugin = 'pgoutput'
                              AND database = current_database())",
            &[&slot],
        )
        .await?;
    let state = FailoverState {
        in_recovery: row.get(0),
        is_failover: row.get(1),
        lost: row.get(2),
        active: row.get(3),
        pipelines: row.get(4),
    };
    Ok((server, state))
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
    /// Why the slot is invalidated; `None` unless `wal_status` is `lost`.
    pub invalidation: Option<Invalidation>,
    /// Whether it is a failover slot (false before PostgreSQL 17).
    pub failover: bool,
    /// Bytes of WAL from the slot's `confirmed_flush_lsn` to the server's end of WAL (the
    /// replayed end on a standby); `None` when the slot has confirmed nothing.
    pub lag_bytes: Option<i64>,
}

/// Reads `wal_status`, `safe_wal_size`, the invalidation reason, the failover flag and the
/// lag of `slot`; `Ok(None)` if there is no such slot.
///
/// Returns an error if the query fails.
pub async fn slot_wal(client: &Client, slot: &str) -> Result<Option<SlotWal>, SourceError> {
    let sql = format!(
        "SELECT wal_status, safe_wal_size, to_jsonb(s) ->> 'invalidation_reason',
                (to_jsonb(s) ->> 'conflicting')::bool,
                COALESCE((to_jsonb(s) ->> 'failover')::bool, false),
                pg_catalog.pg_wal_lsn_diff({}, confirmed_flush_lsn)::bigint
         FROM pg_catalog.pg_replication_slots s WHERE slot_name = $1",
        standby::WAL_END_SQL
    );
    let row = client.query_opt(&sql, &[&slot]).await?;
    Ok(row.map(|row| {
        let wal_status: Option<String> = row.get(0);
        SlotWal {
            invalidation: (wal_status.as_deref() == Some("lost"))
                .then(|| Invalidation::of_lost(row.get(2), row.get(3))),
            wal_status,
            safe_wal_size: row.get(1),
            failover: row.get(4),
            lag_bytes: row.get(5),
        }
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

/// Why the pipeline cannot stream from the existing slot `slot` of type `slot_type` with output
/// plugin `plugin`, which belongs to this database or not (`same_database`): not a logical
/// pgoutput slot of this database; `None` if it is one. The start stops with this sentence and
/// `check` fails its `slot` finding with it.
pub fn foreign_slot(
    slot: &str,
    slot_type: &str,
    plugin: Option<&str>,
    same_database: Option<bool>,
) -> Option<String> {
    if slot_type != "logical" || plugin != Some("pgoutput") {
        let plugin = plugin.map_or(String::new(), |p| format!(" with plugin {p:?}"));
        return Some(format!(
            "replication slot {slot:?} is a {slot_type} slot{plugin}, not a logical pgoutput slot: give the pipeline a slot name of its own (slot), or drop that slot if nothing reads it"
        ));
    }
    (same_database != Some(true)).then(|| format!(
        "replication slot {slot:?} belongs to another database: give the pipeline a slot name of its own (slot); a logical slot decodes the database it was created in"
    ))
}

/// Why `slot` cannot be created when every replication slot of the server is taken; the
/// start retries (a slot may be dropped) and `check` prints it.
pub fn no_free_slot(slot: &str) -> String {
    format!("no replication slot is free for slot {slot:?}: raise max_replication_slots (and restart PostgreSQL), or drop a slot nobody reads (pg_replication_slots); the relay retries meanwhile")
}

/// Why the relay refuses to stream from `slot` on a server in recovery that holds it as a
/// synchronized copy of the primary's failover slot (PostgreSQL 17+, `synced = true`).
pub fn synced_copy_refused(slot: &str) -> String {
    format!("replication slot {slot:?} on this server is a copy synchronized from the primary (a failover slot, synced = true): a standby cannot stream from it until it is promoted; connect to the primary (a multi-host source_url wants target_session_attrs=primary)")
}

/// Reads the slot's `confirmed_flush_lsn`; `None` if there is no such slot.
///
/// Returns an error if the slot is not a pgoutput logical slot of the current database, is
/// lost, or is a standby's synchronized copy of the primary's failover slot.
async fn read_slot(client: &Client, slot: &str) -> Result<Option<Lsn>, SourceError> {
    let row = client
        .query_opt(
            "SELECT plugin, slot_type, database = current_database(), confirmed_flush_lsn::text, wal_status,
                    to_jsonb(s) ->> 'invalidation_reason', (to_jsonb(s) ->> 'conflicting')::bool,
                    coalesce((to_jsonb(s) ->> 'synced')::bool, false) AND pg_is_in_recovery()
             FROM pg_catalog.pg_replication_slots s WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    if let Some(refusal) = foreign_slot(slot, row.get(1), row.get(0), row.get(2)) {
        return Err(SourceError::Config(refusal));
    }
    // PostgreSQL 17+: a standby's copy of the primary's failover slot, kept by slot
    // synchronization. START_REPLICATION refuses it (55000, retried forever) until the
    // standby is promoted.
    if row.get::<_, bool>(7) {
        return Err(SourceError::Config(synced_copy_refused(slot)));
    }
    let wal_status: Option<String> = row.get(4);
    if wal_status.as_deref() == Some("lost") {
        let invalidation = Invalidation::of_lost(row.get(5), row.get(6));
        return Err(SourceError::SlotLost(failover::invalidated_error(
            slot,
            &invalidation,
        )));
    }
    let lsn: Option<String> = row.get(3);
    let lsn =
        lsn.as_deref().unwrap_or("0/0").parse().map_err(|_| {
            SourceError::Protocol(format!("slot {slot:?} confirmed_flush_lsn {lsn:?}"))
        })?;
    Ok(Some(lsn))
}

/// An ordinary SQL connection to a pipeline's database, with the same URL, environment, TLS
/// settings and choice of host (`target_session_attrs`) as its replication connection and the
/// session settings the relay relies on (see [`SESSION_OPTIONS`](super::conninfo::SESSION_OPTIONS)). The connection task ends
/// when the returned guard is dropped.
///
/// Returns an error if the URL is invalid, TLS cannot be set up, no host fits or the server
/// refuses.
pub async fn connect(config: &PipelineConfig) -> Result<(Client, SqlConnection), crate::Error> {
    connect_notified(config, None).await
}

/// Like [`connect`], to `server` alone: the server the pipeline's replication connection
/// reached ([`ReplicationClient::server`](super::replication::ReplicationClient::server)).
/// The two connections choose their hosts each by themselves otherwise, and could reach
/// different servers (a host refusing ordinary connections but not walsenders, or the
/// reverse): the slot checks, the slot record and the confirmed LSN would then be another
/// server's than the WAL streamed.
pub async fn connect_to(
    config: &PipelineConfig,
    server: &super::target::Endpoint,
) -> Result<(Client, SqlConnection), crate::Error> {
    let (client, connection) =
        super::target::connect_sql_to(&config.source_config()?, server).await?;
    Ok(driven(client, connection, None))
}

/// Like [`connect`]; each notification (`LISTEN`) the server sends wakes `notified`.
pub async fn connect_notified(
    config: &PipelineConfig,
    notified: Option<Arc<Notify>>,
) -> Result<(Client, SqlConnection), crate::Error> {
    let (client, connection) = super::target::connect_sql(&config.source_config()?).await?;
    Ok(driven(client, connection, notified))
}

/// `client` with its `connection` driven by a task of its own, each notification waking
/// `notified`; the task ends when the returned guard is dropped.
fn driven(
    client: Client,
    mut connection: super::target::SqlConnectionIo,
    notified: Option<Arc<Notify>>,
) -> (Client, SqlConnection) {
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
    (client, connection)
}

/// Owns the task driving a tokio-postgres connection; aborts it when dropped.
pub type SqlConnection = AbortOnDrop;

/// What `setup` found and did for one pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupOutcome {
    /// The slot's `confirmed_flush_lsn` afterwards.
    pub confirmed_flush_lsn: Lsn,
    /// What it changed, one phrase each (`created publication "outbox_pub"`, ...); empty
    /// when everything existed as configured.
    pub done: Vec<String>,
}

/// Creates the publication of `config` if it does not exist, the slot record table (see
/// [`super::slot_record::setup`]) and the slot if it does not exist (with `failover`, a
/// failover slot); with `failover`, turns FAILOVER on for an existing slot no walsender holds
/// (`ALTER_REPLICATION_SLOT` on a replication connection). A slot the record says the relay
/// streamed from is created again only with `accept_slot_loss`, which clears its record.
///
/// Returns an error if the database is unreachable, the role may not create them, an
/// existing publication or slot does not fit (see [`prepare`]), the slot was lost and
/// `accept_slot_loss` is not set, `failover` is set and the server is older than PostgreSQL
/// 17 (naming its version), or a walsender holds a slot whose FAILOVER must be turned on
/// (naming its pid).
pub async fn setup(
    config: &PipelineConfig,
    accept_slot_loss: bool,
) -> Result<SetupOutcome, crate::Error> {
    let (client, _connection) = connect(config).await?;
    let mut done = Vec::new();
    let wal_level: String = client
        .query_one("SHOW wal_level", &[])
        .await
        .map_err(SourceError::Sql)?
        .get(0);
    if let Some(fix) = wal_level_fix(&wal_level) {
        return Err(SourceError::Config(format!("wal_level is {fix}")).into());
    }
    if config.failover {
        let server = failover::server(&client).await?;
        if !server.has_failover_slots() {
            return Err(SourceError::Config(server.failover_unsupported()).into());
        }
    }
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
            "CREATE PUBLICATION {} FOR TABLE {} WITH (publish = '{}')",
            quote_ident(&config.publication),
            config.table.quoted(),
            config.op_invalid_behavior.publish()
        );
        if let Err(refused) = client.batch_execute(&create).await {
            return Err(
                super::privileges::explain_publication_refusal(&client, config, refused)
                    .await
                    .into(),
            );
        }
        done.push(format!("created publication {:?}", config.publication));
    }
    // Before anything is created: an existing publication that does not fit stops here.
    publication::check(
        &client,
        &config.publication,
        &config.table,
        config.op_invalid_behavior.needs_updates(),
    )
    .await?;
    super::slot_record::setup(&client, config, accept_slot_loss).await?;
    if read_slot(&client, &config.slot).await?.is_none() {
        if let Some(lsn) = create_slot(&client, &config.slot, config.failover).await? {
            done.push(format!(
                "created {}slot {:?} at {lsn}",
                if config.failover { "failover " } else { "" },
                config.slot
            ));
        }
    } else if config.failover
        && failover::is_failover_slot(&client, &config.slot).await? == Some(false)
    {
        if let Some(holder) = client
            .query_opt(
                "SELECT active_pid FROM pg_catalog.pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL",
                &[&config.slot],
            )
            .await
            .map_err(SourceError::Sql)?
        {
            let pid: i32 = holder.get(0);
            return Err(SourceError::Config(format!(
                "slot {:?} is not a failover slot, and FAILOVER can only be turned on while no walsender holds it, but pid {pid} does: stop the relay streaming from it, then run setup again",
                config.slot
            ))
            .into());
        }
        let conninfo = config.source_config()?;
        let mut replication = ReplicationClient::connect(&conninfo).await?;
        replication
            .simple_query(&failover::alter_failover_command(&config.slot))
            .await?;
        done.push(format!(
            "turned FAILOVER on for slot {:?} (ALTER_REPLICATION_SLOT)",
            config.slot
        ));
    }
    let state = prepare(
        &client,
        &config.slot,
        &config.publication,
        &config.table,
        false,
        config.failover,
        config.op_invalid_behavior.needs_updates(),
    )
    .await?;
    Ok(SetupOutcome {
        confirmed_flush_lsn: state.confirmed_flush_lsn,
        done,
    })
}
