//! `outbox-relay teardown`: what a pipeline left in its database, removed once it is gone from
//! the config. A slot keeps WAL until it is dropped: a pipeline removed from the config with
//! its slot left behind fills the database's disk.
//!
//! In order: the slot (refused while a walsender holds it: a relay streams from it), then the
//! slot record's row (a relay started afterwards finds neither, and creates a new slot as on a
//! first start), then the publication, when it publishes the outbox table alone, no other
//! pipeline of the config uses it and no other logical slot of the database exists (which
//! might stream with it); otherwise it is kept, and said so.
//!
//! All or nothing as far as the catalogs can tell: the plan checks that the role may do every
//! step (REPLICATION for the slot, USAGE, SELECT and DELETE on the record table, ownership of
//! the publication) before anything is removed. A slot without its record would make a
//! relay started with the same names create a new slot as on a first start; a publication
//! left behind is only clutter, but an operator must be told which of the three are gone.

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
    /// When the role may not run it: what it may not do and who may, a phrase that follows
    /// "may not" (`drop publication "p" (only its owner "app" or a superuser may)`).
    pub refused: Option<String>,
}

/// What a teardown of one pipeline does, and what it leaves and why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// What is kept, one phrase each.
    pub kept: Vec<String>,
    /// The role the plan was made for (the connection's `current_user`).
    pub role: String,
}

impl Plan {
    /// Why the role may not carry the plan out: a [`SourceError::Privilege`] naming the role,
    /// each step it may not run and who may; `None` when it may run them all.
    pub fn refusal(&self) -> Option<SourceError> {
        let refused: Vec<&str> = self
            .steps
            .iter()
            .filter_map(|step| step.refused.as_deref())
            .collect();
        if refused.is_empty() {
            return None;
        }
        Some(SourceError::Privilege(format!(
            "role {:?} may not {}; nothing was removed: run teardown as a role that may do every step, or have one run what teardown --print-sql prints",
            self.role,
            refused.join(", nor ")
        )))
    }
}

/// A teardown stopped at a statement that failed after the plan found it allowed (another
/// session changed the database in between, or the server refused it anyway): what was
/// removed before it, and what was not.
#[derive(Debug, thiserror::Error)]
#[error("{}could not remove {failed} (running teardown again removes the rest)", removed_before(.removed))]
pub struct Stopped {
    /// What the statements before it removed, in order.
    pub removed: Vec<String>,
    /// What the failed statement would have removed.
    pub failed: String,
    #[source]
    pub source: tokio_postgres::Error,
}

/// "removed a and b, then " or "nothing was removed: ".
fn removed_before(removed: &[String]) -> String {
    match removed {
        [] => "nothing was removed: ".to_string(),
        [one] => format!("removed {one}, then "),
        [first @ .., last] => format!("removed {} and {last}, then ", first.join(", ")),
    }
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
/// Each step says whether the role may run it ([`Plan::refusal`]): a slot needs REPLICATION
/// (or a superuser), the slot record row USAGE on its schema and SELECT and DELETE on the
/// table (a record table the role may not read is listed as a step it may not run, since
/// whether it holds a row cannot be known), the publication its owner (or a superuser).
///
/// Returns an error naming the walsender's PID if a relay streams from the slot, or the
/// query's error.
pub async fn plan(
    client: &Client,
    config: &PipelineConfig,
    others: &[PipelineConfig],
) -> Result<Plan, SourceError> {
    let row = client
        .query_one(
            "SELECT current_user::text, rolreplication OR rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user",
            &[],
        )
        .await?;
    let mut plan = Plan {
        role: row.get(0),
        ..Plan::default()
    };
    let may_replicate: bool = row.get(1);
    let role = quote_ident(&plan.role);
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
                refused: (!may_replicate).then(|| {
                    format!(
                        "drop replication slot {:?} (a role with REPLICATION or a superuser may: ALTER ROLE {role} REPLICATION)",
                        config.slot
                    )
                }),
            });
        }
        None => plan.kept.push(format!(
            "no replication slot {:?} in this database",
            config.slot
        )),
    }
    if config.slot_record {
        if let Some(step) = record_step(client, config, &role).await? {
            plan.steps.push(step);
        }
    }
    let owner = client
        .query_opt(
            "SELECT pg_catalog.pg_get_userbyid(pubowner)::text, pg_catalog.pg_has_role(pubowner, 'USAGE') FROM pg_catalog.pg_publication WHERE pubname = $1",
            &[&config.publication],
        )
        .await?
        .map(|row| (row.get::<_, String>(0), row.get::<_, bool>(1)));
    let tables: Option<Vec<(String, String)>> = match owner {
        None => None,
        Some(_) => Some(
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
            // pg_has_role is true for a superuser.
            refused: match owner {
                Some((owner, false)) => Some(format!(
                    "drop publication {:?} (only its owner {owner:?} or a superuser may)",
                    config.publication
                )),
                _ => None,
            },
        }),
    }
    Ok(plan)
}

/// The step that deletes the slot record row of `config`'s slot, `role` (quoted) being the
/// current role: `None` when the record table is absent or the role may read it and it
/// holds no such row.
///
/// Returns an error if a query fails.
async fn record_step(
    client: &Client,
    config: &PipelineConfig,
    role: &str,
) -> Result<Option<Step>, SourceError> {
    let schema = &config.slot_record_schema;
    let table = slot_record::table(schema);
    // From the catalogs, which every role may read: to_regclass fails without USAGE on the
    // schema. A DELETE ... WHERE slot_name = reads the column, so it needs SELECT too.
    let row = client
        .query_one(
            "SELECT c.oid IS NOT NULL,
                    coalesce(pg_catalog.has_schema_privilege(n.oid, 'USAGE'), false),
                    coalesce(pg_catalog.has_column_privilege(c.oid, 'slot_name', 'SELECT'), false),
                    coalesce(pg_catalog.has_table_privilege(c.oid, 'DELETE'), false)
             FROM (SELECT 1) one
             LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = $1
             LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = $2",
            &[schema, &slot_record::TABLE],
        )
        .await?;
    let (exists, usage, select, delete): (bool, bool, bool, bool) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    if !exists {
        return Ok(None);
    }
    let sql = format!(
        "DELETE FROM {table} WHERE slot_name = {}",
        quote_literal(&config.slot)
    );
    let what = format!("the slot record of {:?}", config.slot);
    let mut grants = Vec::new();
    if !usage {
        grants.push(format!(
            "GRANT USAGE ON SCHEMA {} TO {role}",
            quote_ident(schema)
        ));
    }
    let missing: Vec<&str> = [("SELECT", select), ("DELETE", delete)]
        .into_iter()
        .filter_map(|(privilege, granted)| (!granted).then_some(privilege))
        .collect();
    if !missing.is_empty() {
        grants.push(format!("GRANT {} ON {table} TO {role}", missing.join(", ")));
    }
    let refused = (!grants.is_empty()).then(|| {
        format!(
            "delete the slot record of {:?} from {table} (the table's owner or a superuser may, or this role after {})",
            config.slot,
            grants.join("; ")
        )
    });
    if !(usage && select) {
        return Ok(Some(Step {
            sql,
            what: format!("{what}, if {table} holds one (this role may not read it)"),
            refused,
        }));
    }
    let recorded = client
        .query_opt(
            &format!("SELECT 1 FROM {table} WHERE slot_name = $1"),
            &[&config.slot],
        )
        .await?
        .is_some();
    Ok(recorded.then_some(Step { sql, what, refused }))
}

/// Runs `plan`'s statements in order; returns what each removed.
///
/// Returns a [`Stopped`] naming what was removed before the first statement that failed, what
/// that one would have removed, and its error.
pub async fn run(client: &Client, plan: &Plan) -> Result<Vec<String>, Stopped> {
    let mut removed = Vec::new();
    for step in &plan.steps {
        if let Err(source) = client.batch_execute(&step.sql).await {
            return Err(Stopped {
                removed,
                failed: step.what.clone(),
                source,
            });
        }
        removed.push(step.what.clone());
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(what: &str, refused: Option<&str>) -> Step {
        Step {
            sql: String::new(),
            what: what.into(),
            refused: refused.map(str::to_owned),
        }
    }

    #[test]
    fn a_plan_is_refused_naming_the_role_and_every_step_it_may_not_run() {
        let mut plan = Plan {
            steps: vec![step("slot", None), step("publication", None)],
            kept: vec![],
            role: "ops".into(),
        };
        assert!(plan.refusal().is_none());
        plan.steps[0].refused = Some("delete the slot record (GRANT ...)".into());
        plan.steps[1].refused =
            Some("drop publication \"p\" (only its owner \"app\" or a superuser may)".into());
        assert_eq!(
            plan.refusal().map(|e| e.to_string()).as_deref(),
            Some("role \"ops\" may not delete the slot record (GRANT ...), nor drop publication \"p\" (only its owner \"app\" or a superuser may); nothing was removed: run teardown as a role that may do every step, or have one run what teardown --print-sql prints")
        );
    }

    #[test]
    fn a_stopped_teardown_says_what_it_removed_first() {
        assert_eq!(removed_before(&[]), "nothing was removed: ");
        assert_eq!(
            removed_before(&["slot \"s\"".into()]),
            "removed slot \"s\", then "
        );
        assert_eq!(
            removed_before(&["a".into(), "b".into(), "c".into()]),
            "removed a, b and c, then "
        );
    }
}
