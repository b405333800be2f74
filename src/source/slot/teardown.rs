//! `outbox-relay teardown`: what a pipeline left in its database, removed once it is gone from
//! the config. A slot keeps WAL until it is dropped: a pipeline removed from the config with
//! its slot left behind fills the database's disk.
//!
//! In order: the slot (refused while a walsender holds it: a relay streams from it), then the
//! slot record's row (a relay started afterwards finds neither, and creates a new slot as on a
//! first start), then the publication, when it publishes the outbox table alone, no other
//! pipeline of the config uses it and no other logical slot of the database exists (which
//! might stream with it); otherwise it is kept, and said so.

use tokio_postgres::Client;

use super::super::replication::{quote_ident, quote_literal};
use super::super::slot_record;
use super::super::SourceError;
use crate::config::PipelineConfig;

/// One statement of a teardown and what it removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub sql: String,
    /// What it removes, for the confirmation prompt and the report.
    pub what: String,
}

/// What a teardown of one pipeline does, and what it leaves and why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// What is kept, one phrase each.
    pub kept: Vec<String>,
}

/// The statements of a teardown of `config`, for a DBA to run (`teardown --print-sql`),
/// without looking at the database: each removes what exists only.
pub fn sql(config: &PipelineConfig) -> String {
    let mut text = format!(
        "-- the slot (fails while a relay streams from it: stop the relay first):\nSELECT pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots WHERE slot_name = {} AND database = current_database();\n",
        quote_literal(&config.slot)
    );
    if config.slot_record {
        text.push_str(&format!(
            "-- its slot record:\nDELETE FROM {} WHERE slot_name = {};\n",
            slot_record::table(&config.slot_record_schema),
            quote_literal(&config.slot)
        ));
    }
    text.push_str(&format!(
        "-- the publication, only if no other slot of this database streams with it (check\n-- pg_replication_slots) and it publishes nothing others need:\n-- DROP PUBLICATION IF EXISTS {};",
        quote_ident(&config.publication)
    ));
    text
}

/// What a teardown of `config` would do in the database `client` is connected to; `others`
/// are the config's other pipelines (a publication one of them uses on the same database is
/// kept).
///
/// Returns an error naming the walsender's PID if a relay streams from the slot, or the
/// query's error.
pub async fn plan(
    client: &Client,
    config: &PipelineConfig,
    others: &[PipelineConfig],
) -> Result<Plan, SourceError> {
    let mut plan = Plan::default();
    let slot = client
        .query_opt(
            "SELECT active_pid FROM pg_catalog.pg_replication_slots WHERE slot_name = $1 AND database = current_database()",
            &[&config.slot],
        )
        .await?;
    match slot {
        Some(row) => {
            if let Some(pid) = row.get::<_, Option<i32>>(0) {
                return Err(SourceError::Config(format!(
                    "replication slot {:?} is in use by the walsender with PID {pid}: a relay streams from it; stop it (or remove the pipeline from its config and restart it) first",
                    config.slot
                )));
            }
            plan.steps.push(Step {
                sql: format!(
                    "SELECT pg_drop_replication_slot({})",
                    quote_literal(&config.slot)
                ),
                what: format!("replication slot {:?} (and the WAL it keeps)", config.slot),
            });
        }
        None => plan.kept.push(format!(
            "no replication slot {:?} in this database",
            config.slot
        )),
    }
    if config.slot_record {
        // A missing table or no right to read it: nothing recorded that this role can remove.
        if let Ok(Some(_)) =
            slot_record::read(client, &config.slot_record_schema, &config.slot).await
        {
            plan.steps.push(Step {
                sql: format!(
                    "DELETE FROM {} WHERE slot_name = {}",
                    slot_record::table(&config.slot_record_schema),
                    quote_literal(&config.slot)
                ),
                what: format!("the slot record of {:?}", config.slot),
            });
        }
    }
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1",
            &[&config.publication],
        )
        .await?
        .is_some();
    let tables: Option<Vec<(String, String)>> = match exists {
        false => None,
        true => Some(
            client
                .query(
                    "SELECT schemaname::text, tablename::text FROM pg_catalog.pg_publication_tables WHERE pubname = $1",
                    &[&config.publication],
                )
                .await?
                .iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect(),
        ),
    };
    let outbox_alone = |tables: &[(String, String)]| matches!(tables, [(schema, name)] if *schema == config.table.schema && *name == config.table.name);
    // Any other logical slot of this database may stream with this publication (another
    // relay with its own config, another consumer): its walsender would fail without it.
    let other_slots: Vec<String> = client
        .query(
            "SELECT slot_name::text FROM pg_catalog.pg_replication_slots WHERE database = current_database() AND slot_type = 'logical' AND slot_name <> $1",
            &[&config.slot],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let sharing: Vec<&str> = others
        .iter()
        .filter(|o| o.source_url == config.source_url && o.publication == config.publication)
        .map(|o| o.name.as_str())
        .collect();
    match tables {
        None => plan.kept.push(format!("no publication {:?}", config.publication)),
        Some(_) if !other_slots.is_empty() => plan.kept.push(format!(
            "publication {:?}: other logical slots of this database may stream with it ({})",
            config.publication,
            other_slots.join(", ")
        )),
        Some(_) if !sharing.is_empty() => plan.kept.push(format!(
            "publication {:?}: pipeline {} uses it too",
            config.publication,
            sharing.join(", ")
        )),
        Some(tables) if !outbox_alone(&tables) => plan.kept.push(format!(
            "publication {:?}: it publishes {} table(s), not the outbox table alone, so other consumers may use it",
            config.publication,
            tables.len()
        )),
        Some(_) => plan.steps.push(Step {
            sql: format!("DROP PUBLICATION {}", quote_ident(&config.publication)),
            what: format!("publication {:?}", config.publication),
        }),
    }
    Ok(plan)
}

/// Runs `plan`'s statements in order; returns what each removed.
///
/// Returns the first statement's error (the ones before it are done).
pub async fn run(client: &Client, plan: &Plan) -> Result<Vec<String>, SourceError> {
    let mut done = Vec::new();
    for step in &plan.steps {
        client.batch_execute(&step.sql).await?;
        done.push(format!("removed {}", step.what));
    }
    Ok(done)
}
