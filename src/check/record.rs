//! The slot record's table, as the start will find it: there, or creatable; readable;
//! writable on a primary.

use tokio_postgres::Client;

use super::{finding, Finding, Verdict};
use crate::config::PipelineConfig;
use crate::error::chain;
use crate::source::slot_record;

/// The `slot record` finding: fails where the start would stop (a table it can neither find
/// nor create, a record it cannot read, or, on a primary, cannot write).
///
/// Returns an error if a query other than the record's read fails.
pub(super) async fn record_finding(
    config: &PipelineConfig,
    client: &Client,
) -> Result<Finding, tokio_postgres::Error> {
    const CHECK: &str = "slot record";
    let schema = &config.slot_record_schema;
    let table = slot_record::table(schema);
    let row = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL,
                    EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $2),
                    pg_catalog.pg_is_in_recovery(),
                    has_database_privilege(current_database(), 'CREATE'),
                    CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $2)
                         THEN has_schema_privilege($2, 'CREATE') END,
                    CASE WHEN to_regclass($1) IS NOT NULL
                         THEN has_table_privilege($1, 'INSERT') AND has_table_privilege($1, 'UPDATE') END",
            &[&table, schema],
        )
        .await?;
    let (exists, schema_exists, standby, create_db): (bool, bool, bool, bool) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    let (create_schema, writable): (Option<bool>, Option<bool>) = (row.get(4), row.get(5));
    if !exists {
        return Ok(if standby {
            finding(CHECK, Verdict::Fail, format!("{table} does not exist and this server is a standby, where the relay cannot create it: run sql/slot_record.sql on the primary, or set slot_record = false (--no-slot-record)"))
        } else if (schema_exists && create_schema == Some(true)) || (!schema_exists && create_db) {
            finding(
                CHECK,
                Verdict::Ok,
                format!("{table} does not exist; the relay will create it"),
            )
        } else {
            finding(
                CHECK,
                Verdict::Fail,
                format!(
                    "{table} does not exist and the relay's role may not create it: {}",
                    slot_record::grants_needed(schema)
                ),
            )
        });
    }
    if let Err(e) = slot_record::read(client, schema, &config.slot).await {
        return Ok(finding(CHECK, Verdict::Fail, chain(&e)));
    }
    Ok(match (standby, writable) {
        (true, _) => finding(
            CHECK,
            Verdict::Ok,
            format!("{table} readable; on this standby it is read, not written"),
        ),
        (false, Some(true)) => {
            finding(CHECK, Verdict::Ok, format!("{table} readable and writable"))
        }
        (false, _) => finding(
            CHECK,
            Verdict::Fail,
            format!(
                "{table} is readable but the relay's role may not INSERT and UPDATE it: {}",
                slot_record::grants_needed(schema)
            ),
        ),
    })
}
