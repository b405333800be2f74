//! Whether the publication publishes every outbox column the relay maps: a column that pgoutput
//! does not send arrives missing, and an event cannot be routed or keyed without it.
//!
//! A column is left out of what pgoutput sends when it is generated (`GENERATED ALWAYS AS
//! (...) STORED`) and the publication does not say `publish_generated_columns = stored`
//! (PostgreSQL 18; before 18 generated columns are never published, and virtual ones, new in
//! 18, never are), or when the publication's column list for the table (15+) omits it.
//! `pg_publication_tables.attnames` lists what is published; the relay checks before it
//! streams, and `check` reports the same.

use tokio_postgres::Client;

use super::failover::Server;
use crate::config::{MissingPlacementColumn, PipelineConfig};
use crate::source::replication::quote_ident;
use crate::source::SourceError;

/// `server_version_num` of PostgreSQL 18, the first that publishes generated columns.
pub const PUBLISH_GENERATED_MIN_VERSION_NUM: i32 = 180_000;

/// A column the relay maps: the config field naming it, the column, and whether the relay
/// stops at an insert without it (`columns.headers` is optional under its default name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped<'a> {
    pub field: &'static str,
    pub column: &'a str,
    pub required: bool,
}

/// Every outbox column `config` maps: `columns.*`, `route.by_field`, `columns.timestamp` and
/// each `additional_placement` field (not required with `missing_placement_column = "ignore"`).
pub fn mapped_columns(config: &PipelineConfig) -> Vec<Mapped<'_>> {
    fn required<'a>(field: &'static str, column: &'a str) -> Mapped<'a> {
        Mapped {
            field,
            column,
            required: true,
        }
    }
    let c = &config.columns;
    let mut mapped = vec![
        required("columns.id", &c.id),
        required("columns.aggregate_type", &c.aggregate_type),
        required("columns.aggregate_id", &c.aggregate_id),
        required("columns.event_type", &c.event_type),
        required("columns.payload", &c.payload),
        Mapped {
            field: "columns.headers",
            column: &c.headers,
            required: !c.headers_optional(),
        },
    ];
    mapped.extend(
        config
            .route
            .by_field
            .as_deref()
            .map(|column| required("route.by_field", column)),
    );
    mapped.extend(
        c.timestamp
            .as_deref()
            .map(|column| required("columns.timestamp", column)),
    );
    // With missing_placement_column = "ignore" a placement's column may be missing.
    let ignore = config.missing_placement_column == MissingPlacementColumn::Ignore;
    mapped.extend(config.additional_placement.iter().map(|placement| Mapped {
        field: "additional_placement",
        column: &placement.field,
        required: !ignore,
    }));
    mapped
}

/// A column of the outbox table as the publication sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnRow {
    pub name: String,
    /// `attgenerated`: empty, `s` (stored) or `v` (virtual, 18).
    pub generated: String,
    pub published: bool,
}

/// A mapped column that exists but is not published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpublished {
    pub field: &'static str,
    pub column: String,
    /// `attgenerated`, as in [`ColumnRow`].
    pub generated: String,
}

/// The mapped columns among `rows` that are not published (a column the table does not have
/// is the decoder's "has no column" error, not this).
pub fn unpublished(mapped: &[Mapped<'_>], rows: &[ColumnRow]) -> Vec<Unpublished> {
    mapped
        .iter()
        .filter_map(|m| {
            let row = rows.iter().find(|r| r.name == m.column)?;
            (!row.published).then(|| Unpublished {
                field: m.field,
                column: row.name.clone(),
                generated: row.generated.clone(),
            })
        })
        .collect()
}

/// Why each of `unpublished` does not reach the relay and what to change, for publication
/// `publication` of `table` on `server`; `None` when the list is empty.
pub fn unpublished_message(
    unpublished: &[Unpublished],
    publication: &str,
    table: &str,
    server: &Server,
) -> Option<String> {
    if unpublished.is_empty() {
        return None;
    }
    let quoted = quote_ident(publication);
    let each: Vec<String> = unpublished
        .iter()
        .map(|u| {
            let column = format!("column {:?} ({}) of {table}", u.column, u.field);
            match u.generated.as_str() {
                "" => format!("{column} is not in the column list of publication {publication:?}: add it (ALTER PUBLICATION {quoted} SET TABLE {table} (...)), or drop the column list"),
                "v" => format!("{column} is a virtual generated column, which no publication publishes: make it GENERATED ALWAYS AS (...) STORED and set publish_generated_columns = stored on publication {publication:?}"),
                _ if server.version_num >= PUBLISH_GENERATED_MIN_VERSION_NUM => format!("{column} is a generated column, and publication {publication:?} does not publish generated columns: ALTER PUBLICATION {quoted} SET (publish_generated_columns = stored)"),
                _ => format!("{column} is a generated column, and PostgreSQL {} never publishes generated columns (18 does, with publish_generated_columns = stored): make it an ordinary column filled by the application or a BEFORE INSERT trigger", server.version),
            }
        })
        .collect();
    Some(format!(
        "{}; without it every event would arrive without that value",
        each.join("; ")
    ))
}

/// Reads the outbox table's mapped columns of `config` with whether its publication
/// publishes each; empty when the table is not in the publication.
///
/// Returns an error if the query fails.
pub async fn column_rows(
    client: &Client,
    config: &PipelineConfig,
) -> Result<Vec<ColumnRow>, SourceError> {
    let names: Vec<&str> = mapped_columns(config).iter().map(|m| m.column).collect();
    // `attnames` exists from 15; before, only generated columns are left out.
    let rows = client
        .query(
            "SELECT a.attname::text, a.attgenerated::text,
                    CASE WHEN to_jsonb(t) ? 'attnames'
                         THEN COALESCE((to_jsonb(t) -> 'attnames') ? a.attname::text, false)
                         ELSE a.attgenerated = '' END
             FROM pg_catalog.pg_publication_tables t
             JOIN pg_catalog.pg_attribute a ON a.attrelid = to_regclass($4)
             WHERE t.pubname = $1 AND t.schemaname = $2 AND t.tablename = $3
               AND a.attnum > 0 AND NOT a.attisdropped AND a.attname::text = ANY($5)",
            &[
                &config.publication,
                &config.table.schema,
                &config.table.name,
                &config.table.quoted(),
                &names,
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| ColumnRow {
            name: row.get(0),
            generated: row.get(1),
            published: row.get(2),
        })
        .collect())
}

/// The columns of the outbox table of `config`, in table order; empty when it does not exist.
///
/// Returns an error if the query fails.
pub async fn table_columns(
    client: &Client,
    config: &PipelineConfig,
) -> Result<Vec<String>, tokio_postgres::Error> {
    Ok(client
        .query(
            "SELECT attname::text FROM pg_catalog.pg_attribute
             WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[&config.table.quoted()],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect())
}

/// The required mapped columns `present` (the table's columns) lacks, with the fix; `None`
/// when it has them all. `run` stops with it and `check` prints it.
pub fn missing_message(config: &PipelineConfig, present: &[String]) -> Option<String> {
    let missing: Vec<String> = mapped_columns(config)
        .iter()
        .filter(|m| m.required && !present.iter().any(|p| p == m.column))
        .map(|m| format!("{:?} ({})", m.column, m.field))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "missing {} in the outbox table {}, which has {}: add the columns (sql/outbox.sql) or map the fields to columns it has ([pipelines.columns])",
            missing.join(", "),
            config.table,
            present.join(", ")
        )
    })
}

/// Before streaming: fails if the outbox table lacks a required mapped column (an insert
/// without it would stop the pipeline). A table that does not exist is left to the
/// publication's check.
///
/// Returns [`SourceError::Config`] with [`missing_message`], or the query's error.
pub async fn check_present(client: &Client, config: &PipelineConfig) -> Result<(), SourceError> {
    let present = table_columns(client, config).await?;
    if present.is_empty() {
        return Ok(());
    }
    match missing_message(config, &present) {
        Some(message) => Err(SourceError::Config(message)),
        None => Ok(()),
    }
}

/// Before streaming: fails if the publication of `config` leaves out a mapped column.
///
/// Returns an error naming each such column, its config field, the publication and what to
/// change, or if a query fails.
pub async fn check_published(client: &Client, config: &PipelineConfig) -> Result<(), SourceError> {
    let rows = column_rows(client, config).await?;
    let unpublished = unpublished(&mapped_columns(config), &rows);
    if unpublished.is_empty() {
        return Ok(());
    }
    let server = super::failover::server(client).await?;
    let message = unpublished_message(
        &unpublished,
        &config.publication,
        &config.table.to_string(),
        &server,
    )
    .unwrap_or_default();
    Err(SourceError::Config(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(version_num: i32, version: &str) -> Server {
        Server {
            version_num,
            version: version.into(),
            host: "10.0.0.1:5432".into(),
        }
    }

    fn row(name: &str, generated: &str, published: bool) -> ColumnRow {
        ColumnRow {
            name: name.into(),
            generated: generated.into(),
            published,
        }
    }

    #[test]
    fn maps_every_column_the_decoder_reads() {
        let mut config = PipelineConfig::test_pipeline();
        config.route.by_field = Some("tenant".into());
        config.columns.timestamp = Some("created_at".into());
        let mapped = mapped_columns(&config);
        let fields: Vec<&str> = mapped.iter().map(|m| m.field).collect();
        assert_eq!(
            fields,
            [
                "columns.id",
                "columns.aggregate_type",
                "columns.aggregate_id",
                "columns.event_type",
                "columns.payload",
                "columns.headers",
                "route.by_field",
                "columns.timestamp"
            ]
        );
        assert!(mapped
            .iter()
            .all(|m| m.required != (m.field == "columns.headers")));
        // Another name than the default is required: a misspelling is a missing column.
        config.columns.headers = "hdrs".into();
        assert!(mapped_columns(&config).iter().all(|m| m.required));
    }

    #[test]
    fn an_unpublished_column_is_explained_by_why() {
        let config = PipelineConfig::test_pipeline();
        let mapped = mapped_columns(&config);
        let rows = [
            row("id", "", true),
            row("aggregate_type", "s", false),
            row("aggregate_id", "", false),
            row("event_type", "v", false),
            row("payload", "", true),
        ];
        let found = unpublished(&mapped, &rows);
        let columns: Vec<&str> = found.iter().map(|u| u.column.as_str()).collect();
        assert_eq!(columns, ["aggregate_type", "aggregate_id", "event_type"]);

        let on_18 = unpublished_message(
            &found,
            "outbox_pub",
            "public.outbox",
            &server(180_006, "18.6"),
        )
        .unwrap();
        for part in [
            "column \"aggregate_type\" (columns.aggregate_type) of public.outbox is a generated column",
            "ALTER PUBLICATION \"outbox_pub\" SET (publish_generated_columns = stored)",
            "column \"aggregate_id\" (columns.aggregate_id) of public.outbox is not in the column list of publication \"outbox_pub\"",
            "\"event_type\" (columns.event_type) of public.outbox is a virtual generated column",
        ] {
            assert!(on_18.contains(part), "{part:?} missing in {on_18}");
        }
        let on_16 = unpublished_message(
            &found[..1],
            "outbox_pub",
            "public.outbox",
            &server(160_002, "16.2"),
        )
        .unwrap();
        assert!(
            on_16.contains("PostgreSQL 16.2 never publishes generated columns")
                && on_16.contains("BEFORE INSERT trigger"),
            "{on_16}"
        );
        assert!(!on_16.contains("ALTER PUBLICATION"), "{on_16}");
        assert_eq!(
            unpublished_message(&[], "p", "t", &server(180_006, "18.6")),
            None
        );
    }

    #[test]
    fn a_missing_column_or_an_unmapped_one_is_not_this_check() {
        let config = PipelineConfig::test_pipeline();
        let rows = [row("payload", "", true), row("other", "s", false)];
        assert!(unpublished(&mapped_columns(&config), &rows).is_empty());
    }
}
