//! The slot record: a row per slot in the source database saying that this relay streamed
//! from it, so that a start that finds the slot gone refuses to create it again.
//!
//! A slot that disappears (`pg_drop_replication_slot`, a failover without a synced failover
//! slot, a database restored elsewhere) takes with it the only trace of where publishing
//! stopped: a new slot starts at the current end of WAL, and every outbox event committed in
//! between would never be published. The record (`<slot_record_schema>.streamed_slots`,
//! `sql/slot_record.sql`) outlives the slot: it lives in the same database as the outbox, so a
//! physical standby replicates it, and it holds the slot's last confirmed LSN as the relay knew
//! it. The record's LSN never passes what the slot confirmed (it is copied from the slot's
//! `confirmed_flush_lsn`, capped by what the relay sent), so every event before it reached
//! Kafka: what a lost slot may have missed is the WAL after it.
//!
//! The decision ([`decide`]) is pure; the rest is SQL. Writes are sparse: one upsert when
//! streaming starts, then at most one update per [`UPDATE_INTERVAL`], only after events were
//! delivered ([`Recorder`]), never on the per-event path.

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;
use tracing::warn;

use super::replication::{quote_ident, SystemIdentity};
use super::SourceError;
use crate::config::PipelineConfig;
use crate::lsn::Lsn;

mod recorder;

pub use recorder::{Recorder, RecorderTask, UPDATE_INTERVAL};

/// The record table's name inside `slot_record_schema`.
pub const TABLE: &str = "streamed_slots";

/// One row of the record table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRecord {
    pub slot: String,
    /// The pipeline that last streamed from the slot.
    pub pipeline: String,
    /// `IDENTIFY_SYSTEM`'s system identifier of the server it streamed from.
    pub system_identifier: String,
    /// Its timeline then.
    pub timeline: u32,
    /// The slot's confirmed flush LSN as last recorded: every event before it reached Kafka.
    pub confirmed_lsn: Lsn,
    /// When `confirmed_lsn` was recorded (UTC, as PostgreSQL prints `timestamptz`).
    pub confirmed_at: String,
    /// When the relay first streamed from the slot.
    pub first_streamed_at: String,
}

/// What a start may do about its slot ([`decide`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The slot exists: stream from it.
    Exists,
    /// The slot is missing and no record says the relay streamed from it: a first start,
    /// which may create it.
    NeverStreamed,
    /// The slot is missing although the relay streamed from it: never create it silently.
    Lost(SlotLoss),
}

/// A slot the record says the relay streamed from, missing on the server now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLoss {
    pub record: SlotRecord,
    /// The server's system identifier and timeline now.
    pub system_identifier: String,
    pub timeline: u32,
    /// The record table, schema-qualified and quoted, for the message.
    pub table: String,
}

impl std::fmt::Display for SlotLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = &self.record;
        write!(
            f,
            "replication slot {:?} does not exist, but pipeline {:?} streamed from it (recorded in {}: first streamed at {}, last confirmed LSN {} at {}, system identifier {}, timeline {}); ",
            r.slot, r.pipeline, self.table, r.first_streamed_at, r.confirmed_lsn, r.confirmed_at, r.system_identifier, r.timeline
        )?;
        if r.system_identifier != self.system_identifier {
            write!(
                f,
                "the record was written on another database system (this server's system identifier is {}): the database was restored or upgraded from another cluster (pg_dump, pg_upgrade) and the slot did not come along, so outbox events committed there after {} may never have been published",
                self.system_identifier, r.confirmed_lsn
            )?;
        } else {
            if self.timeline != r.timeline {
                write!(
                    f,
                    "the server is on timeline {} now (a failover or point-in-time recovery since), and its slot did not survive it; ",
                    self.timeline
                )?;
            }
            write!(
                f,
                "the slot was dropped or lost, so outbox events committed after LSN {} (after {}) may never have been published",
                r.confirmed_lsn, r.confirmed_at
            )?;
        }
        write!(
            f,
            "; the relay does not create the slot again: reconcile those events first (republish the outbox rows committed since then, e.g. by created_at, if they are still in the table), then run `outbox-relay setup --accept-slot-loss` to clear the record and create the slot"
        )
    }
}

/// Decides what a start may do about `slot`: whether it `exists`, what the record says (if it
/// holds a row for the slot) and which server the relay is connected to.
pub fn decide(
    exists: bool,
    record: Option<&SlotRecord>,
    identity: &SystemIdentity,
    table: &str,
) -> Verdict {
    match (exists, record) {
        (true, _) => Verdict::Exists,
        (false, None) => Verdict::NeverStreamed,
        (false, Some(record)) => Verdict::Lost(SlotLoss {
            record: record.clone(),
            system_identifier: identity.system_id.clone(),
            timeline: identity.timeline,
            table: table.to_owned(),
        }),
    }
}

/// What the relay's role needs for the record in `schema`, and the way out.
pub fn grants_needed(schema: &str) -> String {
    format!(
        "run sql/slot_record.sql as the database owner and grant the relay's role USAGE ON SCHEMA {} and SELECT, INSERT, UPDATE ON {} (DELETE too for `setup --accept-slot-loss`; sql/roles.sql), or GRANT CREATE ON DATABASE to it so that it creates them, or turn the record off with slot_record = false (--no-slot-record), after which a relay started after its slot was lost creates a new slot and never publishes the events in between",
        quote_ident(schema),
        table(schema)
    )
}

/// The record table of `schema`, quoted: `"outbox_relay"."streamed_slots"`.
pub fn table(schema: &str) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(TABLE))
}

/// `sql/slot_record.sql`: the DDL the relay runs is the one the operator reads.
const DDL: &str = include_str!("../../../sql/slot_record.sql");
/// The schema `sql/slot_record.sql` names, replaced by the configured one.
const DDL_SCHEMA: &str = "outbox_relay";

/// The statements of `sql/slot_record.sql` for `schema`: `CREATE SCHEMA` and `CREATE TABLE`.
pub fn ddl(schema: &str) -> [String; 2] {
    let statements: Vec<String> = DDL
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
        .split(';')
        .map(str::trim)
        .filter(|statement| !statement.is_empty())
        .map(|statement| statement.replace(DDL_SCHEMA, &quote_ident(schema)))
        .collect();
    match <[String; 2]>::try_from(statements) {
        Ok(statements) => statements,
        // The file is compiled in; the_ddl_is_that_of_sql_slot_record_sql checks its shape.
        Err(statements) => unreachable!("sql/slot_record.sql: {} statements", statements.len()),
    }
}

/// What the relay's role lacks, and the ways out, for an error on the record table.
fn privilege_error(schema: &str, doing: &str, error: tokio_postgres::Error) -> SourceError {
    let detail = error
        .as_db_error()
        .map_or_else(|| error.to_string(), |e| e.message().to_owned());
    match error.code() {
        Some(code) if *code == SqlState::INSUFFICIENT_PRIVILEGE => SourceError::Config(format!(
            "cannot {doing} the slot record {}: {detail}; {}",
            table(schema),
            grants_needed(schema)
        )),
        Some(code) if *code == SqlState::READ_ONLY_SQL_TRANSACTION => SourceError::Config(format!(
            "cannot {doing} the slot record {} on this server, a standby: run sql/slot_record.sql on the primary, or set slot_record = false (--no-slot-record)",
            table(schema)
        )),
        _ => SourceError::Sql(error),
    }
}

/// Creates the record table in `schema` (and the schema) unless it exists.
///
/// Returns an error naming the table, the grants and `slot_record = false` if the role may not
/// create it (or the server is a standby), or if a query fails.
pub async fn ensure_table(client: &Client, schema: &str) -> Result<(), SourceError> {
    let row = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL, EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $2)",
            &[&table(schema), &schema],
        )
        .await?;
    let (table_exists, schema_exists): (bool, bool) = (row.get(0), row.get(1));
    if table_exists {
        return Ok(());
    }
    let [create_schema, create_table] = ddl(schema);
    // CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema exists.
    if !schema_exists {
        client
            .batch_execute(&create_schema)
            .await
            .map_err(|e| privilege_error(schema, "create", e))?;
    }
    client
        .batch_execute(&create_table)
        .await
        .map_err(|e| privilege_error(schema, "create", e))
}

/// Reads the record of `slot` in `schema`; `None` if there is none.
///
/// Returns an error if the table is missing or unreadable (naming the grants), or holds an
/// unreadable row.
pub async fn read(
    client: &Client,
    schema: &str,
    slot: &str,
) -> Result<Option<SlotRecord>, SourceError> {
    let row = client
        .query_opt(
            &format!(
                "SELECT pipeline, system_identifier, timeline, confirmed_lsn::text, confirmed_at::text, first_streamed_at::text
                 FROM {} WHERE slot_name = $1",
                table(schema)
            ),
            &[&slot],
        )
        .await
        .map_err(|e| privilege_error(schema, "read", e))?;
    let Some(row) = row else { return Ok(None) };
    let lsn: String = row.get(3);
    let timeline: i64 = row.get(2);
    let bad = |what: &str| {
        SourceError::Config(format!(
            "the slot record of {slot:?} in {} has an invalid {what}",
            table(schema)
        ))
    };
    Ok(Some(SlotRecord {
        slot: slot.to_owned(),
        pipeline: row.get(0),
        system_identifier: row.get(1),
        timeline: u32::try_from(timeline).map_err(|_| bad("timeline"))?,
        confirmed_lsn: lsn.parse().map_err(|_| bad("confirmed_lsn"))?,
        confirmed_at: row.get(4),
        first_streamed_at: row.get(5),
    }))
}

/// The record of `config`'s slot, for `status`; `None` if there is none, the record is off,
/// or it cannot be read (the other columns of `status` say why).
pub async fn recorded(config: &PipelineConfig) -> Option<SlotRecord> {
    if !config.slot_record {
        return None;
    }
    let (client, _connection) = super::slot::connect(config).await.ok()?;
    read(&client, &config.slot_record_schema, &config.slot)
        .await
        .ok()
        .flatten()
}

/// The record's view of a start, from [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub verdict: Verdict,
    /// The record as it was (for a note when the slot exists but the record differs).
    pub record: Option<SlotRecord>,
    /// The server is a standby: the record is read, never written.
    pub standby: bool,
}

/// Makes sure the record table exists, reads the record of the pipeline's slot and whether
/// the slot exists, and decides ([`decide`]).
///
/// Returns an error if the table cannot be created or read (see [`ensure_table`]).
pub async fn check(
    client: &Client,
    config: &PipelineConfig,
    identity: &SystemIdentity,
) -> Result<Checked, SourceError> {
    let schema = &config.slot_record_schema;
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = $1), pg_catalog.pg_is_in_recovery()",
            &[&config.slot],
        )
        .await?;
    let (exists, standby): (bool, bool) = (row.get(0), row.get(1));
    ensure_table(client, schema).await?;
    let record = read(client, schema, &config.slot).await?;
    Ok(Checked {
        verdict: decide(exists, record.as_ref(), identity, &table(schema)),
        record,
        standby,
    })
}

/// Records that `config`'s pipeline streams from its slot on the server `identity` describes,
/// at the slot's `confirmed_flush_lsn` `confirmed` (read after `START_REPLICATION`); keeps
/// `first_streamed_at` of an existing row. Logs a warning when the row was of another system.
///
/// Returns an error if the row cannot be written (naming the grants).
pub async fn streaming(
    client: &Client,
    config: &PipelineConfig,
    identity: &SystemIdentity,
    previous: Option<&SlotRecord>,
    confirmed: Lsn,
) -> Result<(), SourceError> {
    let schema = &config.slot_record_schema;
    if let Some(previous) = previous.filter(|r| r.system_identifier != identity.system_id) {
        warn!(
            pipeline = %config.name,
            slot = %config.slot,
            recorded_system_identifier = %previous.system_identifier,
            system_identifier = %identity.system_id,
            "the slot record was written on another database system (a restored or upgraded database?); the slot exists here, so the relay streams from it and records this system"
        );
    }
    client
        .execute(
            &upsert_sql(schema),
            &[
                &config.slot,
                &config.name,
                &identity.system_id,
                &i64::from(identity.timeline),
                &confirmed.to_string(),
            ],
        )
        .await
        .map_err(|e| privilege_error(schema, "write", e))?;
    Ok(())
}

/// [`streaming`]'s statement: $1 slot, $2 pipeline, $3 system identifier, $4 timeline
/// (bigint), $5 confirmed LSN (text).
fn upsert_sql(schema: &str) -> String {
    format!(
        "INSERT INTO {} AS r (slot_name, pipeline, system_identifier, timeline, confirmed_lsn, confirmed_at, first_streamed_at)
         VALUES ($1, $2, $3, $4, $5::text::pg_lsn, now(), now())
         ON CONFLICT (slot_name) DO UPDATE SET pipeline = EXCLUDED.pipeline,
           system_identifier = EXCLUDED.system_identifier, timeline = EXCLUDED.timeline,
           confirmed_lsn = EXCLUDED.confirmed_lsn, confirmed_at = EXCLUDED.confirmed_at",
        table(schema)
    )
}

/// [`update`]'s statement: $1 slot, $2 LSN sent (text).
fn update_sql(schema: &str) -> String {
    format!(
        "UPDATE {} AS r SET confirmed_lsn = LEAST($2::text::pg_lsn, s.confirmed_flush_lsn), confirmed_at = now()
         FROM pg_catalog.pg_replication_slots s
         WHERE r.slot_name = $1 AND s.slot_name = $1
           AND LEAST($2::text::pg_lsn, s.confirmed_flush_lsn) > r.confirmed_lsn
         RETURNING r.confirmed_lsn::text",
        table(schema)
    )
}

/// Whether the role may run the statements that write the record (for `check`): `EXPLAIN`s
/// them, which checks their privileges, column grants included, and writes nothing.
///
/// Returns the error the start would meet (naming the grants), or a query's error.
pub async fn may_write(client: &Client, schema: &str) -> Result<(), SourceError> {
    let explain = |sql: String| format!("EXPLAIN {sql}");
    client
        .query(
            &explain(upsert_sql(schema)),
            &[&"", &"", &"", &0i64, &"0/0"],
        )
        .await
        .map_err(|e| privilege_error(schema, "write", e))?;
    client
        .query(&explain(update_sql(schema)), &[&"", &"0/0"])
        .await
        .map_err(|e| privilege_error(schema, "write", e))?;
    Ok(())
}

/// Moves the record's confirmed LSN of `slot` to `sent` (what the relay confirmed to the
/// slot), capped by the slot's `confirmed_flush_lsn` now, never backwards. Returns the LSN
/// recorded, `None` if nothing changed.
///
/// Returns an error if the query fails.
pub async fn update(
    client: &Client,
    schema: &str,
    slot: &str,
    sent: Lsn,
) -> Result<Option<Lsn>, SourceError> {
    let row = client
        .query_opt(&update_sql(schema), &[&slot, &sent.to_string()])
        .await
        .map_err(|e| privilege_error(schema, "write", e))?;
    row.map(|row| {
        let lsn: String = row.get(0);
        lsn.parse()
            .map_err(|_| SourceError::Protocol(format!("recorded confirmed_lsn {lsn:?}")))
    })
    .transpose()
}

/// Deletes the record of `slot` (`setup --accept-slot-loss`); returns it, `None` if there was
/// none.
///
/// Returns an error if the query fails (naming the grants).
pub async fn forget(
    client: &Client,
    schema: &str,
    slot: &str,
) -> Result<Option<SlotRecord>, SourceError> {
    let record = read(client, schema, slot).await?;
    if record.is_some() {
        client
            .execute(
                &format!("DELETE FROM {} WHERE slot_name = $1", table(schema)),
                &[&slot],
            )
            .await
            .map_err(|e| privilege_error(schema, "delete from", e))?;
    }
    Ok(record)
}

/// The record's part of `outbox-relay setup` for `config` (after the publication, before the
/// slot): creates the record table, and when the slot is missing although the relay streamed
/// from it, refuses unless `accept_slot_loss`, which clears the record (logged as a warning
/// with what was lost) so that the slot is created again. Returns the cleared record.
///
/// Returns an error with the [`SlotLoss`] message without `accept_slot_loss`, or if the
/// server or the record table cannot be reached (naming the grants).
pub async fn setup(
    client: &Client,
    config: &PipelineConfig,
    accept_slot_loss: bool,
) -> Result<Option<SlotRecord>, crate::Error> {
    if !config.slot_record {
        return Ok(None);
    }
    let identity = super::replication::ReplicationClient::connect(&config.source_config()?)
        .await?
        .identify_system()
        .await?;
    let Verdict::Lost(loss) = check(client, config, &identity).await?.verdict else {
        return Ok(None);
    };
    if !accept_slot_loss {
        return Err(SourceError::SlotLost(loss.to_string()).into());
    }
    let forgotten = forget(client, &config.slot_record_schema, &config.slot).await?;
    warn!(
        pipeline = %config.name,
        slot = %config.slot,
        last_confirmed_lsn = %loss.record.confirmed_lsn,
        confirmed_at = %loss.record.confirmed_at,
        "--accept-slot-loss: cleared the slot record; the slot is created anew, and outbox events committed after the last confirmed LSN were not published by the relay"
    );
    Ok(forgotten)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(system_id: &str, timeline: u32) -> SystemIdentity {
        SystemIdentity {
            system_id: system_id.into(),
            timeline,
            xlogpos: Lsn(0x3000000),
            dbname: Some("app".into()),
        }
    }

    fn record() -> SlotRecord {
        SlotRecord {
            slot: "outbox_relay".into(),
            pipeline: "orders".into(),
            system_identifier: "7301234567890123456".into(),
            timeline: 1,
            confirmed_lsn: Lsn(0x1_0000_0028),
            confirmed_at: "2026-12-01 20:00:00.5+00".into(),
            first_streamed_at: "2026-11-30 08:00:00+00".into(),
        }
    }

    const TABLE_NAME: &str = "\"outbox_relay\".\"streamed_slots\"";

    #[test]
    fn an_existing_slot_is_streamed_whatever_the_record_says() {
        let server = identity("999", 4);
        assert_eq!(decide(true, None, &server, TABLE_NAME), Verdict::Exists);
        assert_eq!(
            decide(true, Some(&record()), &server, TABLE_NAME),
            Verdict::Exists
        );
    }

    #[test]
    fn a_missing_slot_without_a_record_is_a_first_start() {
        assert_eq!(
            decide(false, None, &identity("7301234567890123456", 1), TABLE_NAME),
            Verdict::NeverStreamed
        );
    }

    #[test]
    fn a_missing_slot_with_a_record_is_lost_and_the_message_says_how_to_reconcile() {
        let Verdict::Lost(loss) = decide(
            false,
            Some(&record()),
            &identity("7301234567890123456", 1),
            TABLE_NAME,
        ) else {
            panic!("not refused")
        };
        let message = loss.to_string();
        for needle in [
            "replication slot \"outbox_relay\" does not exist",
            "pipeline \"orders\"",
            TABLE_NAME,
            "last confirmed LSN 1/28 at 2026-12-01 20:00:00.5+00",
            "first streamed at 2026-11-30 08:00:00+00",
            "events committed after LSN 1/28",
            "does not create the slot again",
            "outbox-relay setup --accept-slot-loss",
        ] {
            assert!(message.contains(needle), "{needle:?} missing in {message}");
        }
        assert!(!message.contains("timeline 2"), "{message}");
        assert!(!message.contains("another database system"), "{message}");
    }

    #[test]
    fn a_new_timeline_is_named_as_a_failover() {
        let Verdict::Lost(loss) = decide(
            false,
            Some(&record()),
            &identity("7301234567890123456", 2),
            TABLE_NAME,
        ) else {
            panic!("not refused")
        };
        let message = loss.to_string();
        assert!(
            message.contains("on timeline 2 now (a failover"),
            "{message}"
        );
        assert!(message.contains("--accept-slot-loss"), "{message}");
    }

    #[test]
    fn a_record_of_another_system_is_reported_and_still_refuses() {
        let Verdict::Lost(loss) = decide(false, Some(&record()), &identity("42", 1), TABLE_NAME)
        else {
            panic!("a record of another system must not be ignored")
        };
        let message = loss.to_string();
        assert!(
            message.contains("another database system (this server's system identifier is 42)"),
            "{message}"
        );
        assert!(
            message.contains("system identifier 7301234567890123456"),
            "{message}"
        );
        assert!(message.contains("--accept-slot-loss"), "{message}");
    }

    #[test]
    fn the_ddl_is_that_of_sql_slot_record_sql_in_the_schema_named() {
        let [schema, table] = ddl("Relay State");
        assert_eq!(schema, "CREATE SCHEMA IF NOT EXISTS \"Relay State\"");
        assert!(
            table.starts_with("CREATE TABLE IF NOT EXISTS \"Relay State\".streamed_slots ("),
            "{table}"
        );
        for column in [
            "slot_name         text        PRIMARY KEY",
            "confirmed_lsn     pg_lsn      NOT NULL",
            "first_streamed_at timestamptz NOT NULL",
        ] {
            assert!(table.contains(column), "{column:?} not in {table}");
        }
        assert!(!table.contains("outbox_relay"), "{table}");
    }

    #[test]
    fn names_are_quoted() {
        assert_eq!(
            table("Relay \"State\""),
            "\"Relay \"\"State\"\"\".\"streamed_slots\""
        );
        assert!(ddl("a b")[0].ends_with("\"a b\""));
    }
}
