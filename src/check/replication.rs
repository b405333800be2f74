//! `check`'s findings for a log-tailing pipeline: `wal_level`, a standby that decodes, free
//! slots and walsenders, the role's REPLICATION, the outbox table and its columns, the
//! publication, the slot and its record. Where the start stops, the finding's sentence is the
//! one the start stops with (shared functions in [`crate::source`]).

use tokio_postgres::Client;

use super::{finding, record, standby, Finding, Verdict};
use crate::config::PipelineConfig;
use crate::error::chain;
use crate::source::replication::quote_ident;
use crate::source::slot::failover::Invalidation;
use crate::source::{privileges, slot, slot_record, SourceError};

/// The server's version, as the first finding of a pipeline that connected.
pub(super) async fn connection_finding(client: &Client) -> Result<Finding, tokio_postgres::Error> {
    let version: String = client.query_one("SHOW server_version", &[]).await?.get(0);
    Ok(finding(
        "connection",
        Verdict::Ok,
        format!("PostgreSQL {version}"),
    ))
}

pub(super) async fn check(
    config: &PipelineConfig,
    client: &Client,
    out: &mut Vec<Finding>,
) -> Result<(), tokio_postgres::Error> {
    out.push(connection_finding(client).await?);

    let wal_level: String = client.query_one("SHOW wal_level", &[]).await?.get(0);
    out.push(match slot::wal_level_fix(&wal_level) {
        None => finding("wal_level", Verdict::Ok, "logical"),
        Some(fix) => finding("wal_level", Verdict::Fail, fix),
    });
    let standby = async {
        Ok::<_, SourceError>(match slot::standby::in_recovery(client).await? {
            true => Some(standby::decoding_standby(client, &config.slot).await?),
            false => None,
        })
    };
    match standby.await {
        Ok(Some(state)) => out.extend(standby::findings(&state)),
        Ok(None) => {}
        Err(e) => out.push(finding(
            "standby decoding",
            Verdict::Fail,
            format!("query failed: {}", chain(&e)),
        )),
    }

    let row = client
        .query_one(
            "SELECT current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)::int,
                    current_setting('max_wal_senders')::int - (SELECT count(*) FROM pg_stat_replication)::int,
                    EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)",
            &[&config.slot],
        )
        .await?;
    let (free_slots, free_senders, slot_exists): (i32, i32, bool) =
        (row.get(0), row.get(1), row.get(2));
    out.push(match (slot_exists, free_slots) {
        (true, _) => finding(
            "replication slots",
            Verdict::Ok,
            format!("slot {} exists; {free_slots} free", config.slot),
        ),
        (false, n) if n > 0 => finding(
            "replication slots",
            Verdict::Ok,
            format!("{n} free for slot {}", config.slot),
        ),
        _ => finding(
            "replication slots",
            Verdict::Fail,
            slot::no_free_slot(&config.slot),
        ),
    });
    out.push(if free_senders > 0 {
        finding("wal senders", Verdict::Ok, format!("{free_senders} free"))
    } else {
        finding(
            "wal senders",
            Verdict::Fail,
            "none free: raise max_wal_senders",
        )
    });

    let (role, replication) = privileges::replication_role(client).await?;
    out.push(if replication {
        finding("role", Verdict::Ok, format!("{role} has REPLICATION"))
    } else {
        finding("role", Verdict::Fail, privileges::no_replication(&role))
    });

    let table = config.table.quoted();
    let row = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL,
                    to_regclass($1) IS NOT NULL AND has_table_privilege(to_regclass($1), 'SELECT'),
                    (SELECT relreplident::text FROM pg_class WHERE oid = to_regclass($1))",
            &[&table],
        )
        .await?;
    let (exists, select, identity): (bool, bool, Option<String>) =
        (row.get(0), row.get(1), row.get(2));
    out.push(match (exists, select) {
        (false, _) => finding(
            "outbox table",
            Verdict::Fail,
            format!("{} does not exist (sql/outbox.sql)", config.table),
        ),
        // The walsender decodes without it; reading the table by hand (and the SQL kit) does.
        (true, false) => finding(
            "outbox table",
            Verdict::Warn,
            format!(
                "{} exists; {} may stream from it but not read it: GRANT SELECT ON {table} TO {} to look at rows as the relay's role (sql/roles.sql does)",
                config.table,
                quote_ident(&role),
                quote_ident(&role)
            ),
        ),
        (true, true) => finding(
            "outbox table",
            Verdict::Ok,
            format!(
                "{} readable; replica identity {}",
                config.table,
                match identity.as_deref() {
                    Some("d") => "default",
                    Some("f") => "full",
                    Some("i") => "index",
                    Some("n") => "nothing",
                    _ => "unknown",
                }
            ),
        ),
    });

    if exists {
        out.push(check_columns(config, client).await?);
        out.push(
            check_published_columns(config, client)
                .await
                .unwrap_or_else(|e| {
                    finding(
                        "published columns",
                        Verdict::Fail,
                        format!("query failed: {}", chain(&e)),
                    )
                }),
        );
    }

    let state = slot::publication::read(client, &config.publication, &config.table)
        .await
        .map_err(|e| match e {
            SourceError::Sql(e) => e,
            other => unreachable!("publication::read fails on queries only: {other}"),
        })?;
    let needs_updates = config.op_invalid_behavior.needs_updates();
    let problem =
        slot::publication::problem(&state, &config.publication, &config.table, needs_updates);
    out.push(match problem {
        Some(problem) => finding("publication", Verdict::Fail, problem),
        None if state.updates_and_deletes && !needs_updates => finding(
            "publication",
            Verdict::Warn,
            format!("{} also publishes updates/deletes, which the relay reads and passes over: WITH (publish = 'insert') saves work", config.publication),
        ),
        None if state.updates_and_deletes => finding("publication", Verdict::Ok, format!("{} publishes inserts, updates and deletes of {}", config.publication, config.table)),
        None => finding("publication", Verdict::Ok, format!("{} publishes inserts of {}", config.publication, config.table)),
    });

    let row = client
        .query_opt(
            "SELECT plugin, database = current_database(), wal_status, active_pid,
                    to_jsonb(s) ->> 'invalidation_reason', (to_jsonb(s) ->> 'conflicting')::bool,
                    coalesce((to_jsonb(s) ->> 'synced')::bool, false) AND pg_is_in_recovery(),
                    slot_type
             FROM pg_replication_slots s WHERE slot_name = $1",
            &[&config.slot],
        )
        .await?;
    // A missing slot the relay streamed from is never created again: the start refuses.
    let recorded = match (&row, config.slot_record) {
        (None, true) => recorded_slot(client, config).await,
        _ => Ok(None),
    };
    out.push(match (row, recorded) {
        // The start reads the record too, and stops on the same error.
        (None, Err(e)) => finding(
            "slot",
            Verdict::Fail,
            format!(
                "{} does not exist and its slot record cannot be read, so the start refuses: {}",
                config.slot,
                chain(&e)
            ),
        ),
        (None, Ok(Some(r))) => finding(
            "slot",
            Verdict::Fail,
            format!(
                "{} does not exist but the relay streamed from it (last confirmed LSN {} at {}): the relay will not create it again; reconcile the events after it, then outbox-relay setup --accept-slot-loss",
                config.slot, r.confirmed_lsn, r.confirmed_at
            ),
        ),
        (None, Ok(None)) if config.create_slot => finding(
            "slot",
            Verdict::Warn,
            format!(
                "{} does not exist; the relay will create it (outbox-relay setup does it ahead)",
                config.slot
            ),
        ),
        (None, Ok(None)) => finding(
            "slot",
            Verdict::Fail,
            format!(
                "{} does not exist and create_slot is off: outbox-relay setup",
                config.slot
            ),
        ),
        (Some(r), _) => {
            let (plugin, same_db, wal_status, pid): (
                Option<String>,
                Option<bool>,
                Option<String>,
                Option<i32>,
            ) = (r.get(0), r.get(1), r.get(2), r.get(3));
            if let Some(refusal) =
                slot::foreign_slot(&config.slot, r.get(7), plugin.as_deref(), same_db)
            {
                finding("slot", Verdict::Fail, refusal)
            } else if r.get::<_, bool>(6) {
                // The start refuses it (START_REPLICATION would, until a promotion).
                finding(
                    "slot",
                    Verdict::Fail,
                    slot::synced_copy_refused(&config.slot),
                )
            } else if wal_status.as_deref() == Some("lost") {
                // The start stops on it (exit code 4) with this sentence.
                finding(
                    "slot",
                    Verdict::Fail,
                    slot::failover::invalidated_error(
                        &config.slot,
                        &Invalidation::of_lost(r.get(4), r.get(5)),
                    ),
                )
            } else {
                let holder =
                    pid.map_or_else(|| "inactive".to_owned(), |pid| format!("held by pid {pid}"));
                finding(
                    "slot",
                    Verdict::Ok,
                    format!(
                        "{} pgoutput, wal_status {}, {holder}",
                        config.slot,
                        wal_status.unwrap_or_default()
                    ),
                )
            }
        }
    });
    if config.slot_record {
        out.push(record::record_finding(config, client).await?);
    }
    if let Some(prefix) = &config.message_prefix {
        out.push(check_message_writers(prefix, client).await?);
    }
    Ok(())
}

/// With `message_prefix`: whether PUBLIC may still call `pg_logical_emit_message` (its
/// default), which lets any role that can connect publish events under the prefix.
async fn check_message_writers(
    prefix: &str,
    client: &Client,
) -> Result<Finding, tokio_postgres::Error> {
    let public: Vec<String> = client
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
             WHERE p.proname = 'pg_logical_emit_message'
               AND p.pronamespace = 'pg_catalog'::regnamespace
               AND has_function_privilege('public', p.oid, 'EXECUTE')
             ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    Ok(match public.is_empty() {
        true => finding(
            "logical messages",
            Verdict::Ok,
            format!("only the roles granted pg_logical_emit_message can publish events with prefix {prefix:?}"),
        ),
        false => finding(
            "logical messages",
            Verdict::Warn,
            format!(
                "PUBLIC may execute {}: any role that can connect can publish events with prefix {prefix:?}, with any id, key and headers; revoke it from PUBLIC and grant it to the writer roles (sql/logical_messages.sql)",
                public.join(", ")
            ),
        ),
    })
}

/// Whether the outbox table has every column the mapping needs (the start stops without one).
async fn check_columns(
    config: &PipelineConfig,
    client: &Client,
) -> Result<Finding, tokio_postgres::Error> {
    let present = slot::columns::table_columns(client, config).await?;
    Ok(match slot::columns::missing_message(config, &present) {
        None => finding("outbox columns", Verdict::Ok, "every mapped column exists"),
        Some(missing) => finding("outbox columns", Verdict::Fail, missing),
    })
}

/// Whether the publication publishes every mapped column (see [`slot::columns`]): a
/// generated column is published only on PostgreSQL 18 with `publish_generated_columns =
/// stored`.
async fn check_published_columns(
    config: &PipelineConfig,
    client: &Client,
) -> Result<Finding, SourceError> {
    use slot::columns;
    let rows = columns::column_rows(client, config).await?;
    let unpublished = columns::unpublished(&columns::mapped_columns(config), &rows);
    let server = slot::failover::server(client).await?;
    let table = config.table.to_string();
    Ok(
        match columns::unpublished_message(&unpublished, &config.publication, &table, &server) {
            Some(message) => finding("published columns", Verdict::Fail, message),
            None if rows.is_empty() => finding(
                "published columns",
                Verdict::Ok,
                format!(
                    "nothing to check: {table} is not in publication {:?}, or has none of the mapped columns (see publication, outbox columns)",
                    config.publication
                ),
            ),
            None => finding(
                "published columns",
                Verdict::Ok,
                format!(
                    "publication {:?} publishes every mapped column",
                    config.publication
                ),
            ),
        },
    )
}

/// The record of the configured slot, read as the start reads it; `None` when there is none,
/// or no record table yet (the start creates it).
///
/// Returns the start's error for a record it cannot read (grants, an invalid row).
async fn recorded_slot(
    client: &Client,
    config: &PipelineConfig,
) -> Result<Option<slot_record::SlotRecord>, SourceError> {
    let table = slot_record::table(&config.slot_record_schema);
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await?
        .get(0);
    match exists {
        true => slot_record::read(client, &config.slot_record_schema, &config.slot).await,
        false => Ok(None),
    }
}
