//! `outbox-relay setup --print-sql`: what `setup` does, as SQL a DBA can run, each part with
//! the role it needs, and the grants of the relay's own role (`sql/roles.sql`).

use super::failover;
use crate::config::{quote_ident, PipelineConfig};
use crate::source::replication::quote_literal;

/// `sql/logical_messages.sql`: who may emit logical decoding messages.
const LOGICAL_MESSAGES_SQL: &str = include_str!("../../../sql/logical_messages.sql");

/// The SQL of `outbox-relay setup` for `config`, in the order to run it, each part headed by
/// who runs it: the publication (when missing; the table's owner), the slot record table
/// (unless `slot_record` is off; the database owner), the relay's role and its grants (the
/// user of `source_url`, else `outbox_relay`), the slot (with `failover`, a failover slot,
/// PostgreSQL 17+; a role with REPLICATION) and, with `message_prefix`, the revocation of
/// `pg_logical_emit_message` from PUBLIC (a superuser).
pub fn setup_sql(config: &PipelineConfig) -> String {
    let role = config
        .source_config()
        .ok()
        .and_then(|c| c.pg.get_user().map(str::to_owned))
        .unwrap_or_else(|| "outbox_relay".to_owned());
    let role_ident = quote_ident(&role);
    let mut parts = vec![format!(
        "-- As the owner of {table} (a publication FOR TABLE needs ownership), unless the\n\
         -- publication exists already (sql/outbox.sql creates outbox_pub):\n\
         CREATE PUBLICATION {publication} FOR TABLE {table} WITH (publish = 'insert');",
        publication = quote_ident(&config.publication),
        table = config.table.quoted(),
    )];
    let record_schema = quote_ident(&config.slot_record_schema);
    if config.slot_record {
        let [schema, table] = crate::source::slot_record::ddl(&config.slot_record_schema);
        parts.push(format!(
            "-- As the database owner: the slot record (sql/slot_record.sql), where the relay\n\
             -- notes the slot it streams from, so that a lost slot is never re-created silently:\n\
             {schema};\n{table};"
        ));
    }
    let mut grants = format!(
        "-- The relay's role {role_ident} (sql/roles.sql): REPLICATION to stream, SELECT on the\n\
         -- outbox and nothing else. Set its password afterwards: ALTER ROLE {role_ident} PASSWORD '...';\n\
         DO $$ BEGIN\n\
         \x20 IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = {role_literal}) THEN\n\
         \x20   CREATE ROLE {role_ident} LOGIN REPLICATION;\n\
         \x20 END IF;\n\
         END $$;\n\
         GRANT USAGE ON SCHEMA {schema} TO {role_ident};\n\
         GRANT SELECT ON {table} TO {role_ident};",
        role_literal = quote_literal(&role),
        schema = quote_ident(&config.table.schema),
        table = config.table.quoted(),
    );
    if config.slot_record {
        grants.push_str(&format!(
            "\n-- The slot record, read and written while the relay streams (DELETE only for the\n\
             -- administrator who runs setup --accept-slot-loss or teardown):\n\
             GRANT USAGE ON SCHEMA {record_schema} TO {role_ident};\n\
             GRANT SELECT, INSERT, UPDATE ON {record_schema}.streamed_slots TO {role_ident};"
        ));
    }
    parts.push(grants);
    let (failover_args, alter) = if config.failover {
        (
            ", false, false, true",
            format!(
                "\n-- or, for an existing slot no walsender holds, on a replication connection (psql \"dbname=... replication=database\"):\n{};",
                failover::alter_failover_command(&config.slot)
            ),
        )
    } else {
        ("", String::new())
    };
    parts.push(format!(
        "-- As a role with REPLICATION (the relay's will do), in a transaction of its own (psql -f\n\
         -- runs each statement on its own): the slot, which keeps the WAL from now on until the\n\
         -- relay confirms it; events committed after it are published.\n\
         SELECT pg_create_logical_replication_slot({}, 'pgoutput'{failover_args});{alter}",
        quote_literal(&config.slot),
    ));
    if config.message_prefix.is_some() {
        parts.push(format!(
            "-- With message_prefix: only the roles that write events may emit logical messages.\n\
             {}",
            LOGICAL_MESSAGES_SQL.trim_end()
        ));
    }
    parts.join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_names_who_runs_it_and_the_relays_role_gets_its_grants() {
        let mut config = PipelineConfig::test_pipeline();
        config.source_url = "postgres://orders_relay@db/app".to_owned().into();
        let sql = setup_sql(&config);
        let order = [
            "CREATE PUBLICATION \"outbox_pub\" FOR TABLE \"public\".\"outbox\"",
            "CREATE TABLE IF NOT EXISTS \"outbox_relay\".streamed_slots",
            "CREATE ROLE \"orders_relay\" LOGIN REPLICATION;",
            "GRANT SELECT ON \"public\".\"outbox\" TO \"orders_relay\";",
            "GRANT SELECT, INSERT, UPDATE ON \"outbox_relay\".streamed_slots TO \"orders_relay\";",
            "SELECT pg_create_logical_replication_slot('outbox_relay', 'pgoutput');",
        ];
        let mut at = 0;
        for part in order {
            let found = sql[at..]
                .find(part)
                .unwrap_or_else(|| panic!("{part:?} missing, or out of order, in\n{sql}"));
            at += found + part.len();
        }
        for who in [
            "-- As the owner of",
            "-- As the database owner",
            "-- As a role with REPLICATION",
        ] {
            assert!(sql.contains(who), "{who:?} missing in\n{sql}");
        }
        assert!(!sql.contains("pg_logical_emit_message"), "{sql}");
        assert!(
            !sql.contains("DELETE ON"),
            "the relay's role gets no DELETE:\n{sql}"
        );
    }

    #[test]
    fn with_message_prefix_it_revokes_emitting_messages_from_public() {
        let mut config = PipelineConfig::test_pipeline();
        config.message_prefix = Some("outbox".into());
        let sql = setup_sql(&config);
        assert!(
            sql.contains("REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC"),
            "{sql}"
        );
    }
}
