//! The slot record's table, as the start will find it: there, or creatable; readable;
//! writable on a primary.

use tokio_postgres::Client;

use super::{finding, Finding, Verdict};
use crate::config::PipelineConfig;
use crate::error::chain;
use crate::source::slot_record;

const CHECK: &str = "slot record";

/// What `check` reads of the record table and the relay's role.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TableState {
    /// The quoted table name.
    table: String,
    /// The schema as configured (unquoted).
    schema: String,
    schema_exists: bool,
    /// USAGE on the schema; `true` when the schema does not exist.
    usage: bool,
    exists: bool,
    standby: bool,
    /// CREATE on the database (what `CREATE SCHEMA` needs).
    create_on_database: bool,
    /// CREATE on the schema; `false` when it does not exist.
    create_on_schema: bool,
}

/// The `slot record` finding: fails where the start would stop (a table it can neither find
/// nor create, a record it cannot read, or, on a primary, cannot write).
///
/// Returns an error if reading the table's state fails.
pub(super) async fn record_finding(
    config: &PipelineConfig,
    client: &Client,
) -> Result<Finding, tokio_postgres::Error> {
    let schema = &config.slot_record_schema;
    let table = slot_record::table(schema);
    // USAGE first: to_regclass fails on a schema the role may not use.
    let row = client
        .query_one(
            "SELECT n.oid IS NOT NULL, COALESCE(has_schema_privilege(n.oid, 'USAGE'), true),
                    COALESCE(has_schema_privilege(n.oid, 'CREATE'), false),
                    has_database_privilege(current_database(), 'CREATE'),
                    pg_catalog.pg_is_in_recovery()
             FROM (SELECT 1) one
             LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = $1",
            &[schema],
        )
        .await?;
    let mut state = TableState {
        table: table.clone(),
        schema: schema.clone(),
        schema_exists: row.get(0),
        usage: row.get(1),
        create_on_schema: row.get(2),
        create_on_database: row.get(3),
        standby: row.get(4),
        exists: false,
    };
    if state.usage {
        state.exists = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
            .await?
            .get(0);
    }
    let (mut read, mut write) = (Ok(()), Ok(()));
    if state.usage && state.exists {
        read = slot_record::read(client, schema, &config.slot)
            .await
            .map(|_| ())
            .map_err(|e| chain(&e));
        if read.is_ok() && !state.standby {
            write = slot_record::may_write(client, schema)
                .await
                .map_err(|e| chain(&e));
        }
    }
    Ok(verdict(&state, read, write))
}

/// The finding for `state`, with the outcome of reading the record and of `EXPLAIN`ing the
/// statements that write it (each `Ok` when not tried).
fn verdict(state: &TableState, read: Result<(), String>, write: Result<(), String>) -> Finding {
    let TableState { table, schema, .. } = state;
    let quoted_schema = crate::config::quote_ident(schema);
    if !state.usage {
        return finding(
            CHECK,
            Verdict::Fail,
            format!(
                "the relay's role may not use schema {quoted_schema}, which holds {table}: {}",
                slot_record::grants_needed(schema)
            ),
        );
    }
    if !state.exists {
        return if state.standby {
            finding(CHECK, Verdict::Fail, format!("{table} does not exist and this server is a standby, where the relay cannot create it: run sql/slot_record.sql on the primary, or set slot_record = false (--no-slot-record)"))
        } else if state.schema_exists && !state.create_on_schema {
            finding(CHECK, Verdict::Fail, format!("{table} does not exist and the relay's role may not create it in schema {quoted_schema}: run sql/slot_record.sql as the database owner and grant what sql/roles.sql grants, or GRANT CREATE ON SCHEMA {quoted_schema} to the relay's role, or set slot_record = false (--no-slot-record)"))
        } else if !state.schema_exists && !state.create_on_database {
            finding(
                CHECK,
                Verdict::Fail,
                format!(
                    "{table} does not exist and the relay's role may not create its schema: {}",
                    slot_record::grants_needed(schema)
                ),
            )
        } else {
            finding(
                CHECK,
                Verdict::Ok,
                format!("{table} does not exist; the relay will create it"),
            )
        };
    }
    match (read, write) {
        (Err(e), _) | (Ok(()), Err(e)) => finding(CHECK, Verdict::Fail, e),
        (Ok(()), Ok(())) if state.standby => finding(
            CHECK,
            Verdict::Ok,
            format!("{table} readable; on this standby it is read, not written"),
        ),
        (Ok(()), Ok(())) => finding(CHECK, Verdict::Ok, format!("{table} readable and writable")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> TableState {
        TableState {
            table: "\"Relay State\".streamed_slots".into(),
            schema: "Relay State".into(),
            schema_exists: true,
            usage: true,
            exists: true,
            standby: false,
            create_on_database: false,
            create_on_schema: false,
        }
    }

    fn check(state: &TableState) -> Finding {
        verdict(state, Ok(()), Ok(()))
    }

    #[test]
    fn a_readable_writable_table_passes_and_a_standby_only_reads_it() {
        assert_eq!(check(&state()).verdict, Verdict::Ok);
        let standby = TableState {
            standby: true,
            ..state()
        };
        let finding = check(&standby);
        assert_eq!(finding.verdict, Verdict::Ok);
        assert!(finding.detail.contains("read, not written"), "{finding:?}");
    }

    #[test]
    fn a_read_or_write_error_fails_with_it() {
        let finding = verdict(&state(), Err("cannot read the slot record".into()), Ok(()));
        assert_eq!(finding.verdict, Verdict::Fail);
        assert_eq!(finding.detail, "cannot read the slot record");
        let finding = verdict(&state(), Ok(()), Err("cannot write the slot record".into()));
        assert_eq!(finding.verdict, Verdict::Fail);
        assert_eq!(finding.detail, "cannot write the slot record");
    }

    #[test]
    fn a_schema_without_usage_names_it() {
        let finding = check(&TableState {
            usage: false,
            exists: false,
            ..state()
        });
        assert_eq!(finding.verdict, Verdict::Fail);
        assert!(
            finding
                .detail
                .contains("may not use schema \"Relay State\"")
                && finding.detail.contains("USAGE ON SCHEMA"),
            "{finding:?}"
        );
    }

    #[test]
    fn a_missing_table_is_created_where_the_role_may_and_fails_with_the_grant_it_needs() {
        let missing = TableState {
            exists: false,
            ..state()
        };
        // The schema is there: CREATE on it, not on the database, is what helps.
        let finding = check(&missing);
        assert_eq!(finding.verdict, Verdict::Fail);
        assert!(
            finding
                .detail
                .contains("GRANT CREATE ON SCHEMA \"Relay State\""),
            "{finding:?}"
        );
        let creatable = TableState {
            create_on_schema: true,
            ..missing.clone()
        };
        assert_eq!(check(&creatable).verdict, Verdict::Ok);
        // No schema: CREATE on the database makes it.
        let no_schema = TableState {
            schema_exists: false,
            ..missing.clone()
        };
        let finding = check(&no_schema);
        assert_eq!(finding.verdict, Verdict::Fail);
        assert!(finding.detail.contains("CREATE ON DATABASE"), "{finding:?}");
        let creatable = TableState {
            create_on_database: true,
            ..no_schema
        };
        assert_eq!(check(&creatable).verdict, Verdict::Ok);
        // A standby creates nothing, whatever the grants.
        let standby = TableState {
            standby: true,
            create_on_schema: true,
            create_on_database: true,
            ..missing
        };
        let finding = check(&standby);
        assert_eq!(finding.verdict, Verdict::Fail);
        assert!(finding.detail.contains("standby"), "{finding:?}");
    }
}
