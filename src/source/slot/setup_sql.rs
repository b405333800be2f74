//! `outbox-relay setup --print-sql`: what `setup` does, as a script a DBA runs with `psql -f`
//! (each statement in its own transaction), each part headed by the role that may run it, with
//! the grants of the relay's own role (`sql/roles.sql`). Every part may run again.

use super::failover;
use super::publication::{self, PublicationState};
use crate::config::{quote_ident, PipelineConfig};
use crate::source::replication::quote_literal;

/// `sql/logical_messages.sql`: who may emit logical decoding messages.
const LOGICAL_MESSAGES_SQL: &str = include_str!("../../../sql/logical_messages.sql");
/// The example writer role of `sql/logical_messages.sql`, which the printed script must not
/// grant to: the DBA names the real ones.
const EXAMPLE_WRITERS: &str = "ARRAY['orders_service'];";

/// The role the script creates and grants to when the source URL names no user.
const DEFAULT_ROLE: &str = "outbox_relay";

/// The script of `outbox-relay setup` for `config`, in the order to run it: the publication
/// (when missing; the table's owner), the slot record table (unless `slot_record` is off; the
/// database owner), the relay's role and its grants (the user the source URL names, else
/// `outbox_relay`), the slot (when missing; with `failover`, a failover slot, PostgreSQL 17+;
/// a role with REPLICATION) and, with `message_prefix`, the revocation of
/// `pg_logical_emit_message` from PUBLIC (a superuser, after naming the writer roles).
///
/// Names go into the SQL quoted, never into comments, and no name can end a `DO` block's
/// dollar quoting; a role name holding a control character is left to the DBA.
pub fn setup_sql(config: &PipelineConfig) -> String {
    let table = config.table.quoted();
    let mut parts = vec![publication_sql(config)];
    if config.slot_record {
        let [schema, record] = crate::source::slot_record::ddl(&config.slot_record_schema);
        parts.push(format!(
            "-- As the database owner: the slot record (sql/slot_record.sql), where the relay\n\
             -- notes the slot it streams from, so that a lost slot is never re-created silently:\n\
             {schema};\n{record};"
        ));
    }
    parts.push(role_sql(config, &table));
    let (failover_args, alter) = if config.failover {
        (
            ", false, false, true",
            format!(
                "\n-- Or, for an existing slot no walsender holds, on a replication connection\n\
                 -- (psql \"dbname=... replication=database\"), not in this script:\n\
                 -- {};",
                failover::alter_failover_command(&config.slot)
            ),
        )
    } else {
        ("", String::new())
    };
    parts.push(format!(
        "-- As a role with REPLICATION (the relay's will do), in a transaction of its own (psql -f\n\
         -- runs each statement on its own), unless it exists: the slot, which keeps the WAL from\n\
         -- now on until the relay confirms it; events committed after it are published.\n\
         SELECT pg_create_logical_replication_slot({slot}, 'pgoutput'{failover_args})\n\
         WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_replication_slots WHERE slot_name = {slot});{alter}",
        slot = quote_literal(&config.slot),
    ));
    if config.message_prefix.is_some() {
        parts.push(logical_messages_sql());
    }
    parts.join("\n\n")
}

/// The publication, created when missing; an existing one that leaves out the outbox table or
/// what the pipeline reads stops the script with the sentence `check` prints for it.
fn publication_sql(config: &PipelineConfig) -> String {
    let publication_literal = quote_literal(&config.publication);
    let needs_updates = config.op_invalid_behavior.needs_updates();
    let stop_unless = |condition: &str, wrong: PublicationState| {
        let sentence =
            publication::problem(&wrong, &config.publication, &config.table, needs_updates)
                .expect("a publication state with a problem");
        format!(
            "\x20 ELSIF NOT EXISTS (SELECT FROM {condition}) THEN\n\
             \x20   RAISE EXCEPTION USING MESSAGE = {};\n",
            quote_literal(&sentence)
        )
    };
    let fits = PublicationState {
        exists: true,
        inserts: true,
        updates_and_deletes: true,
        includes_table: true,
        table_exists: true,
    };
    // In the order publication::problem judges them, so that the sentence is check's.
    let mut checks = stop_unless(
        &format!("pg_catalog.pg_publication WHERE pubname = {publication_literal} AND pubinsert"),
        PublicationState {
            inserts: false,
            ..fits
        },
    );
    checks.push_str(&stop_unless(
        &format!(
            "pg_catalog.pg_class WHERE oid = to_regclass({})",
            quote_literal(&config.table.quoted())
        ),
        PublicationState {
            includes_table: false,
            table_exists: false,
            ..fits
        },
    ));
    checks.push_str(&stop_unless(
        &format!(
            "pg_catalog.pg_publication_tables WHERE pubname = {publication_literal} \
             AND schemaname = {} AND tablename = {}",
            quote_literal(&config.table.schema),
            quote_literal(&config.table.name)
        ),
        PublicationState {
            includes_table: false,
            ..fits
        },
    ));
    if needs_updates {
        checks.push_str(&stop_unless(
            &format!(
                "pg_catalog.pg_publication WHERE pubname = {publication_literal} \
                 AND pubupdate AND pubdelete"
            ),
            PublicationState {
                updates_and_deletes: false,
                ..fits
            },
        ));
    }
    format!(
        "-- As the outbox table's owner (a publication FOR TABLE needs ownership), unless the\n\
         -- publication exists already (sql/outbox.sql creates outbox_pub); an existing one must\n\
         -- publish the outbox table's inserts{updates}:\n\
         {}",
        do_block(&format!(
            "BEGIN\n\
             \x20 IF NOT EXISTS (SELECT FROM pg_catalog.pg_publication WHERE pubname = {publication_literal}) THEN\n\
             \x20   CREATE PUBLICATION {publication} FOR TABLE {table} WITH (publish = '{publish}');\n\
             {checks}\
             \x20 END IF;\n\
             END",
            publication = quote_ident(&config.publication),
            table = config.table.quoted(),
            publish = config.op_invalid_behavior.publish(),
        )),
        updates = if needs_updates {
            ", updates and deletes"
        } else {
            ""
        },
    )
}

/// `DO <tag>body<tag>;` with a dollar-quote tag the body does not hold, so that no name in it
/// can end the quoting.
fn do_block(body: &str) -> String {
    let tag = (0..)
        .map(|n| match n {
            0 => "$$".to_owned(),
            n => format!("$setup{n}$"),
        })
        .find(|tag| !body.contains(tag.as_str()))
        .expect("a tag the body does not hold");
    format!("DO {tag} {body} {tag};")
}

/// The relay's role, created when missing, and its grants.
fn role_sql(config: &PipelineConfig, table: &str) -> String {
    let named = config.url_user();
    let role = named.clone().unwrap_or_else(|| DEFAULT_ROLE.to_owned());
    let whose = match named {
        Some(_) => "the user the source URL names",
        None => "the source URL names no user: outbox_relay",
    };
    let role_ident = quote_ident(&role);
    let create = if role.chars().any(char::is_control) {
        "-- The role's name holds characters this script does not print: create it by hand\n\
         -- (LOGIN REPLICATION) before the grants below."
            .to_owned()
    } else {
        do_block(&format!(
            "BEGIN\n\
             \x20 IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = {role_literal}) THEN\n\
             \x20   CREATE ROLE {role_ident} LOGIN REPLICATION;\n\
             \x20 END IF;\n\
             END",
            role_literal = quote_literal(&role),
        ))
    };
    let mut sql = format!(
        "-- The relay's role ({whose}; sql/roles.sql): REPLICATION to stream, SELECT on the\n\
         -- outbox and nothing else. Creating it takes a superuser (PostgreSQL 16 and later: a\n\
         -- role with CREATEROLE and REPLICATION); the grants, the owner of each object. Set its\n\
         -- password afterwards with ALTER ROLE ... PASSWORD (or psql's \\password).\n\
         {create}\n\
         GRANT USAGE ON SCHEMA {schema} TO {role_ident};\n\
         GRANT SELECT ON {table} TO {role_ident};",
        schema = quote_ident(&config.table.schema),
    );
    if config.slot_record {
        let record_schema = quote_ident(&config.slot_record_schema);
        sql.push_str(&format!(
            "\n-- The slot record, read and written while the relay streams (DELETE only for the\n\
             -- administrator who runs setup --accept-slot-loss or teardown):\n\
             GRANT USAGE ON SCHEMA {record_schema} TO {role_ident};\n\
             GRANT SELECT, INSERT, UPDATE ON {record_schema}.streamed_slots TO {role_ident};"
        ));
    }
    sql
}

/// `sql/logical_messages.sql` with no writer role: it stops, naming what to edit, until the
/// DBA lists the roles that write events (revoking from PUBLIC alone would stop them).
fn logical_messages_sql() -> String {
    assert!(
        LOGICAL_MESSAGES_SQL.contains(EXAMPLE_WRITERS),
        "sql/logical_messages.sql names its example writer roles as {EXAMPLE_WRITERS}"
    );
    let script = LOGICAL_MESSAGES_SQL
        .trim_end()
        .replace(
            EXAMPLE_WRITERS,
            "ARRAY[]::text[];  -- EDIT: name them, e.g. ARRAY['orders_service']",
        )
        .replace(
            "BEGIN\n  FOR fn IN",
            "BEGIN\n  IF cardinality(writer_roles) = 0 THEN\n    RAISE EXCEPTION 'edit writer_roles first: the roles that write events keep EXECUTE on pg_logical_emit_message, PUBLIC loses it';\n  END IF;\n  FOR fn IN",
        );
    format!(
        "-- With message_prefix: only the roles that write events may emit logical messages. Edit\n\
         -- writer_roles below first; as printed, this part stops without changing anything.\n\
         {script}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::InvalidOpBehavior;

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
            "SELECT pg_create_logical_replication_slot('outbox_relay', 'pgoutput')",
        ];
        let mut at = 0;
        for part in order {
            let found = sql[at..]
                .find(part)
                .unwrap_or_else(|| panic!("{part:?} missing, or out of order, in\n{sql}"));
            at += found + part.len();
        }
        for who in [
            "-- As the outbox table's owner",
            "-- As the database owner",
            "-- The relay's role (the user the source URL names",
            "takes a superuser",
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

    /// An existing publication is judged as `check` judges it, in the same order, so that the
    /// script stops with the sentence `check` prints: inserts, the table's existence, its
    /// membership, then the updates and deletes a warning or stopping pipeline reads.
    #[test]
    fn an_existing_publication_is_judged_in_checks_order() {
        let mut config = PipelineConfig::test_pipeline();
        config.op_invalid_behavior = InvalidOpBehavior::Warn;
        let sql = setup_sql(&config);
        let mut at = 0;
        for (condition, sentence) in [
            ("AND pubinsert)", "does not publish inserts"),
            (
                "to_regclass('\"public\".\"outbox\"'))",
                "does not exist in this database",
            ),
            ("AND tablename = 'outbox')", "is not in publication"),
            (
                "AND pubupdate AND pubdelete)",
                "does not publish updates and deletes",
            ),
        ] {
            let found = sql[at..]
                .find(condition)
                .unwrap_or_else(|| panic!("{condition:?} missing, or out of order, in\n{sql}"));
            at += found + condition.len();
            // The condition's line ends with THEN; the next one raises.
            let raise = sql[at..].lines().nth(1).unwrap_or_default();
            assert!(raise.contains(sentence), "{condition:?} raises {raise:?}");
        }
    }

    /// A table or publication name holding `$$` cannot end the publication part's DO block:
    /// the block is quoted with a tag the names do not hold.
    #[test]
    fn a_name_holding_the_dollar_quote_does_not_end_the_do_block() {
        let mut config = PipelineConfig::test_pipeline();
        config.table = "public.\"a$$b\"".parse().unwrap();
        let sql = setup_sql(&config);
        assert!(sql.contains("DO $setup1$ BEGIN"), "{sql}");
        assert!(sql.contains("END $setup1$;"), "{sql}");
        assert_eq!(do_block("BEGIN END"), "DO $$ BEGIN END $$;");
    }

    /// A pipeline that warns or stops on updates and deletes of the outbox reads them: the
    /// publication the script creates publishes them, else the relay refuses it at start.
    #[test]
    fn the_publication_publishes_what_op_invalid_behavior_reads() {
        let mut config = PipelineConfig::test_pipeline();
        assert!(setup_sql(&config).contains("WITH (publish = 'insert');"));
        for behavior in [InvalidOpBehavior::Warn, InvalidOpBehavior::Error] {
            config.op_invalid_behavior = behavior;
            let sql = setup_sql(&config);
            assert!(
                sql.contains("WITH (publish = 'insert, update, delete');"),
                "{behavior:?}:\n{sql}"
            );
        }
    }

    #[test]
    fn the_role_is_the_urls_user_never_one_from_the_environment() {
        let mut config = PipelineConfig::test_pipeline();
        config.source_url = "postgres://db/app".to_owned().into();
        let sql = setup_sql(&config);
        assert!(sql.contains("CREATE ROLE \"outbox_relay\""), "{sql}");
        assert!(sql.contains("the source URL names no user"), "{sql}");
    }

    #[test]
    fn names_never_reach_comments_and_a_dollar_in_the_role_does_not_end_its_do_block() {
        let mut config = PipelineConfig::test_pipeline();
        config.table = "\"evil\nDROP TABLE x; --\".\"outbox\"".parse().unwrap();
        config.source_url = "postgres://a%24%24b@db/app".to_owned().into();
        let sql = setup_sql(&config);
        for line in sql.lines().filter(|l| l.starts_with("--")) {
            assert!(!line.contains("evil") && !line.contains("a$$b"), "{line}");
        }
        assert!(
            sql.contains("DO $setup1$ BEGIN\n  IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'a$$b')"),
            "{sql}"
        );
        config.source_url = "postgres://a%0Ab@db/app".to_owned().into();
        let sql = setup_sql(&config);
        assert!(sql.contains("create it by hand"), "{sql}");
        assert!(!sql.contains("rolname = 'a\nb'"), "{sql}");
    }

    #[test]
    fn with_message_prefix_it_stops_until_the_writer_roles_are_named() {
        let mut config = PipelineConfig::test_pipeline();
        config.message_prefix = Some("outbox".into());
        let sql = setup_sql(&config);
        assert!(
            sql.contains("REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC"),
            "{sql}"
        );
        assert!(
            !sql.contains("ARRAY['orders_service'];"),
            "grants to the example role:\n{sql}"
        );
        assert!(
            sql.contains("RAISE EXCEPTION 'edit writer_roles first"),
            "{sql}"
        );
    }

    #[test]
    fn the_failover_command_of_the_replication_protocol_is_a_comment() {
        let mut config = PipelineConfig::test_pipeline();
        config.failover = true;
        let sql = setup_sql(&config);
        assert!(
            sql.contains("-- ALTER_REPLICATION_SLOT \"outbox_relay\" (FAILOVER true);"),
            "{sql}"
        );
    }
}
