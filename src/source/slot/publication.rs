//! The publication a log-tailing pipeline streams through: whether it exists, publishes
//! inserts (and updates and deletes when `op_invalid_behavior` wants to see them) and includes
//! the outbox table. `run` stops with [`problem`]'s sentence and `check` prints it.

use tokio_postgres::Client;

use crate::config::TableName;
use crate::source::replication::quote_ident;
use crate::source::SourceError;

/// What the catalogs say about a publication and the outbox table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublicationState {
    /// The publication exists in this database.
    pub exists: bool,
    /// `pubinsert`.
    pub inserts: bool,
    /// `pubupdate` and `pubdelete`.
    pub updates_and_deletes: bool,
    /// The table is among `pg_publication_tables` of the publication.
    pub includes_table: bool,
    /// The table exists.
    pub table_exists: bool,
}

/// Reads the state of `publication` and `table`.
///
/// Returns an error if a query fails.
pub async fn read(
    client: &Client,
    publication: &str,
    table: &TableName,
) -> Result<PublicationState, SourceError> {
    let row = client
        .query_one(
            "SELECT p.oid IS NOT NULL, coalesce(p.pubinsert, false),
                    coalesce(p.pubupdate AND p.pubdelete, false),
                    EXISTS (SELECT 1 FROM pg_catalog.pg_publication_tables t
                            WHERE t.pubname = $1 AND t.schemaname = $2 AND t.tablename = $3),
                    to_regclass($4) IS NOT NULL
             FROM (SELECT 1) one
             LEFT JOIN pg_catalog.pg_publication p ON p.pubname = $1",
            &[&publication, &table.schema, &table.name, &table.quoted()],
        )
        .await?;
    Ok(PublicationState {
        exists: row.get(0),
        inserts: row.get(1),
        updates_and_deletes: row.get(2),
        includes_table: row.get(3),
        table_exists: row.get(4),
    })
}

/// What is wrong with the publication for a pipeline, with the fix; `None` when nothing is.
/// `needs_updates`: the pipeline reads updates and deletes (`op_invalid_behavior` other than
/// `ignore`), so the publication must publish them.
pub fn problem(
    state: &PublicationState,
    publication: &str,
    table: &TableName,
    needs_updates: bool,
) -> Option<String> {
    let quoted = quote_ident(publication);
    if !state.exists {
        return Some(format!(
            "publication {publication:?} does not exist in this database: outbox-relay setup creates it, or CREATE PUBLICATION {quoted} FOR TABLE {} WITH (publish = 'insert')",
            table.quoted()
        ));
    }
    if !state.inserts {
        return Some(format!(
            "publication {publication:?} does not publish inserts: ALTER PUBLICATION {quoted} SET (publish = 'insert')"
        ));
    }
    if !state.includes_table && !state.table_exists {
        return Some(format!(
            "table {table} does not exist in this database: create it (sql/outbox.sql), then ALTER PUBLICATION {quoted} ADD TABLE {}",
            table.quoted()
        ));
    }
    if !state.includes_table {
        return Some(format!(
            "table {table} is not in publication {publication:?}: ALTER PUBLICATION {quoted} ADD TABLE {}",
            table.quoted()
        ));
    }
    if needs_updates && !state.updates_and_deletes {
        return Some(format!(
            "publication {publication:?} does not publish updates and deletes, which op_invalid_behavior = warn or error needs to see: ALTER PUBLICATION {quoted} SET (publish = 'insert, update, delete'), or op_invalid_behavior = \"ignore\""
        ));
    }
    None
}

/// Verifies that `publication` exists, publishes inserts (and updates and deletes with
/// `needs_updates`, see [`problem`]) and includes `table`.
///
/// Returns [`SourceError::Config`] with [`problem`]'s sentence, or the query's error.
pub async fn check(
    client: &Client,
    publication: &str,
    table: &TableName,
    needs_updates: bool,
) -> Result<(), SourceError> {
    let state = read(client, publication, table).await?;
    match problem(&state, publication, table, needs_updates) {
        Some(problem) => Err(SourceError::Config(problem)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FINE: PublicationState = PublicationState {
        exists: true,
        inserts: true,
        updates_and_deletes: false,
        includes_table: true,
        table_exists: true,
    };

    fn outbox() -> TableName {
        TableName {
            schema: "public".into(),
            name: "outbox".into(),
        }
    }

    #[test]
    fn each_problem_names_its_fix() {
        let says = |state: PublicationState, needs_updates: bool| {
            problem(&state, "outbox_pub", &outbox(), needs_updates)
        };
        assert_eq!(says(FINE, false), None);
        let missing = says(
            PublicationState {
                exists: false,
                ..FINE
            },
            false,
        )
        .unwrap();
        assert!(
            missing.contains("outbox-relay setup creates it"),
            "{missing}"
        );
        let no_inserts = says(
            PublicationState {
                inserts: false,
                ..FINE
            },
            false,
        )
        .unwrap();
        assert!(
            no_inserts.ends_with("SET (publish = 'insert')"),
            "{no_inserts}"
        );
        let not_in = says(
            PublicationState {
                includes_table: false,
                ..FINE
            },
            false,
        )
        .unwrap();
        assert!(
            not_in.contains("ADD TABLE \"public\".\"outbox\""),
            "{not_in}"
        );
        let no_table = PublicationState {
            includes_table: false,
            table_exists: false,
            ..FINE
        };
        assert!(says(no_table, false).unwrap().contains("does not exist"));
        let updates = says(FINE, true).unwrap();
        assert!(updates.contains("'insert, update, delete'"), "{updates}");
    }
}
