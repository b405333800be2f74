//! The SQL of a polling pipeline, built once from the configuration and the table's columns,
//! and the mapping of a selected row to an [`OutboxEvent`].

use std::collections::HashMap;

use bytes::Bytes;
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::{Client, Row};

use super::{PollingError, FAILED, PENDING, PUBLISHED};
use crate::config::{EventLimit, MarkMode, OutboxColumns, PipelineConfig};
use crate::error::Error;
use crate::lsn::Lsn;
use crate::router::Router;
use crate::source::outbox::{
    not_utf8, reference_field, ColumnValue, OutboxEvent, Refusal, ValueKind, REFERENCE_FIELD_BYTES,
};
use crate::source::replication::{quote_ident, quote_literal};
use crate::source::SourceError;

/// The SQL of one pipeline, built once from the configuration and the table's columns.
#[derive(Debug)]
pub(crate) struct Statements {
    /// `$1`: the batch size (int8), `$2`: `max_event_bytes` (int8). A row over it comes with
    /// its id, aggregate type and id (cut to 1024 characters) and NULL for its other values:
    /// they are never sent ([`Statements::event`]).
    pub(super) select: String,
    /// `$1`: ctids (text[]).
    pub(super) mark_published: String,
    /// `$1`: ctids, `$2`: retry_min_ms, `$3`: retry_max_ms (float8), `$4`: max_attempts
    /// (int4). Returns id, status, retry_count. `None` unless `mark = "status"`.
    pub(super) mark_retry: Option<String>,
    /// `$1`: ctids. Returns id. `None` unless `mark = "status"`.
    pub(super) mark_failed: Option<String>,
    /// Pending rows, age of the oldest (s), failed rows.
    pub(super) stats: String,
    /// `$1`: age (float8 s), `$2`: batch (int8). `None` without a purge.
    pub(super) purge: Option<String>,
    payload_kind: ValueKind,
    aggregate_id_kind: ValueKind,
    /// Each of the router's columns: its kind, and whether the table lacks it (an optional
    /// one, selected as NULL).
    extra_kinds: Vec<(ValueKind, bool)>,
    /// The router's columns, by name, in the order of `extra_kinds`.
    extra_names: Vec<String>,
    /// The column routing the event, when not the aggregate type's.
    route_by: Option<String>,
    /// The table, `schema.table`, for errors.
    relation: String,
    /// Whether the connection receives text as stored (`client_encoding` `SQL_ASCII`, from a
    /// `SQL_ASCII` database): each value is checked for UTF-8 ([`Refusal::NotUtf8`]).
    check_utf8: bool,
}

/// Characters of the id, aggregate type and id the select keeps of a row over
/// `max_event_bytes` (the reference is cut to [`REFERENCE_FIELD_BYTES`] bytes from them).
const REFERENCE_CHARS: usize = REFERENCE_FIELD_BYTES;

/// Positions in the SELECT's row.
pub(super) const COL_CTID: usize = 0;
pub(super) const COL_ID: usize = 1;
pub(super) const COL_AGGREGATE_TYPE: usize = 2;
pub(super) const COL_AGGREGATE_ID: usize = 3;
pub(super) const COL_EVENT_TYPE: usize = 4;
pub(super) const COL_PAYLOAD: usize = 5;
pub(super) const COL_HEADERS: usize = 6;
pub(super) const COL_ROUTED_BY: usize = 7;
pub(super) const COL_CREATED_MS: usize = 8;
pub(super) const COL_OLDER: usize = 9;
pub(super) const COL_EXTRA: usize = 10;

impl Statements {
    /// Reads the table's columns and builds the statements, selecting the columns `router`
    /// needs ([`Router::columns`]).
    ///
    /// Returns an error naming the table or the column if one the configuration needs is
    /// not there (an optional one of `router`'s may be), or the table if it is not a plain one (partitioned, with child tables, a
    /// view, a foreign table).
    pub(crate) async fn prepare(
        client: &Client,
        config: &PipelineConfig,
        router: &Router,
    ) -> Result<Statements, Error> {
        let table = format!(
            "{}.{}",
            quote_ident(&config.table.schema),
            quote_ident(&config.table.name)
        );
        let rows = client
            .query(
                "SELECT a.attname::text, coalesce(bt.typname, t.typname)::text,
                        coalesce(bt.typnamespace, t.typnamespace) = 'pg_catalog'::regnamespace,
                        a.atttypmod
                 FROM pg_catalog.pg_attribute a
                 JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
                 LEFT JOIN pg_catalog.pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype
                 WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
                &[&table],
            )
            .await
            .map_err(SourceError::Sql)?;
        if rows.is_empty() {
            return Err(PollingError::MissingTable {
                table: config.table.to_string(),
            }
            .into());
        }
        let split = client
            .query_one(
                "SELECT c.relkind <> 'r' OR EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i WHERE i.inhparent = c.oid)
                 FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass($1)",
                &[&table],
            )
            .await
            .map_err(SourceError::Sql)?;
        if split.get::<_, bool>(0) {
            return Err(PollingError::NotPlain {
                table: config.table.to_string(),
            }
            .into());
        }
        let columns: HashMap<String, ValueKind> = rows
            .iter()
            .map(|r| {
                let builtin: bool = r.get(2);
                let kind = if builtin {
                    ValueKind::of_name(r.get(1), r.get(3))
                } else {
                    ValueKind::Text
                };
                (r.get::<_, String>(0), kind)
            })
            .collect();
        let need = |field: &str, column: &str| -> Result<(String, ValueKind), Error> {
            match columns.get(column) {
                Some(kind) => Ok((quote_ident(column), *kind)),
                None => Err(PollingError::MissingColumn {
                    table: config.table.to_string(),
                    column: column.to_owned(),
                    field: field.to_owned(),
                }
                .into()),
            }
        };
        let c = &config.columns;
        let p = &config.polling;
        let (id, _) = need("columns.id", &c.id)?;
        let (aggregate_type, _) = need("columns.aggregate_type", &c.aggregate_type)?;
        let (aggregate_id, aggregate_id_kind) = need("columns.aggregate_id", &c.aggregate_id)?;
        let (event_type, _) = need("columns.event_type", &c.event_type)?;
        let (payload, payload_kind) = need("columns.payload", &c.payload)?;
        let (created_at, _) = need("polling.created_at_column", &p.created_at_column)?;
        // Only the default name may be missing (see `OutboxColumns::headers`).
        let headers = if c.headers_optional() && !columns.contains_key(&c.headers) {
            "NULL::text".to_owned()
        } else {
            format!("o.{}::text", need("columns.headers", &c.headers)?.0)
        };
        let routed_by = match config.route.by_field.as_deref() {
            Some(column) if column != c.aggregate_type => {
                format!("o.{}::text", need("route.by_field", column)?.0)
            }
            _ => "NULL::text".to_owned(),
        };
        let mut extra_select = String::new();
        let mut extra_kinds = Vec::new();
        let mut extra_names = Vec::new();
        let optional = router.optional_columns();
        for column in router.columns() {
            extra_names.push(column.to_string());
            if optional.contains(column) && !columns.contains_key(column) {
                extra_select.push_str(", NULL::text");
                extra_kinds.push((ValueKind::Text, true));
                continue;
            }
            let (quoted, kind) = need("routing and record options", column)?;
            extra_select.push_str(&format!(", o.{quoted}::text"));
            extra_kinds.push((kind, false));
        }

        // The pending condition on the table under `alias` (`o.` or nothing).
        let pending_on = |alias: &str| -> Result<String, Error> {
            Ok(match p.mark {
                MarkMode::Status => format!(
                    "{alias}{} = {}",
                    need("polling.status_column", &p.status_column)?.0,
                    lit(PENDING)
                ),
                MarkMode::Flag => format!(
                    "NOT {alias}{}",
                    need("polling.published_column", &p.published_column)?.0
                ),
                MarkMode::Delete => "true".to_owned(),
            })
        };
        let (pending, stats_pending) = (pending_on("o.")?, pending_on("")?);
        // `blocking`: an earlier row of the aggregate its later ones wait behind; `stuck`: one
        // this cycle cannot take (FAILED, when it blocks, or waiting for its retry), whose
        // followers are left out of the batch rather than fill it (see `select`).
        let (blocking, due, stuck) = match p.mark {
            MarkMode::Status => {
                let (status, _) = need("polling.status_column", &p.status_column)?;
                need("polling.published_at_column", &p.published_at_column)?;
                need("polling.retry_count_column", &p.retry_count_column)?;
                let (next_retry_at, _) =
                    need("polling.next_retry_at_column", &p.next_retry_at_column)?;
                let blocking = if p.failed_blocks_aggregate {
                    format!("p.{status} IN ({}, {})", lit(PENDING), lit(FAILED))
                } else {
                    format!("p.{status} = {}", lit(PENDING))
                };
                let waiting = format!(
                    "(p.{status} = {} AND p.{next_retry_at} > now())",
                    lit(PENDING)
                );
                let stuck = if p.failed_blocks_aggregate {
                    format!("(p.{status} = {} OR {waiting})", lit(FAILED))
                } else {
                    waiting
                };
                (
                    blocking,
                    format!(" AND (o.{next_retry_at} IS NULL OR o.{next_retry_at} <= now())"),
                    Some(stuck),
                )
            }
            MarkMode::Flag => (pending_on("p.")?, String::new(), None),
            MarkMode::Delete => ("true".to_owned(), String::new(), None),
        };
        // Rows behind a stuck predecessor would only be held after the LIMIT took them, and
        // `batch_size` of them would keep every other aggregate out of every batch.
        let behind_stuck = match stuck {
            Some(stuck) => format!(
                " AND NOT EXISTS (SELECT 1 FROM {table} p
                    WHERE p.{aggregate_id} = o.{aggregate_id}
                      AND p.{aggregate_type} = o.{aggregate_type} AND {stuck}
                      AND (p.{created_at}, p.{id}) < (o.{created_at}, o.{id}))"
            ),
            None => String::new(),
        };
        // The count stops at the batch size: a row with more blocking predecessors cannot
        // have them all in its batch anyway.
        let rows = format!(
            "SELECT o.ctid::text, o.{id}::text, o.{aggregate_type}::text, o.{aggregate_id}::text,
                    o.{event_type}::text, o.{payload}::text, {headers}, {routed_by},
                    (extract(epoch FROM o.{created_at}) * 1000)::int8,
                    (SELECT count(*) FROM (SELECT 1 FROM {table} p
                        WHERE p.{aggregate_id} = o.{aggregate_id}
                          AND p.{aggregate_type} = o.{aggregate_type} AND {blocking}
                          AND (p.{created_at}, p.{id}) < (o.{created_at}, o.{id})
                        LIMIT $1) older)::int8
                    {extra_select}
             FROM {table} o
             WHERE {pending}{due}{behind_stuck}
             ORDER BY o.{created_at}, o.{id}
             LIMIT $1
             FOR UPDATE OF o SKIP LOCKED"
        );
        // Around it, the size check: a row over `max_event_bytes` leaves the server as a
        // reference (its id, aggregate type and id), its other values never sent. The rows
        // keep the inner query's order (a subquery scan does not reorder).
        let width = COL_EXTRA + extra_kinds.len();
        let column = |i: usize| format!("b.c{i}");
        let bytes = (COL_ID..=COL_ROUTED_BY)
            .chain(COL_EXTRA..width)
            .map(|i| format!("coalesce(octet_length({}), 0)", column(i)))
            .collect::<Vec<_>>()
            .join(" + ");
        let over = format!("({bytes})::int8 > $2::int8");
        let outer: Vec<String> = (0..width)
            .map(|i| match i {
                COL_CTID | COL_CREATED_MS | COL_OLDER => column(i),
                COL_ID | COL_AGGREGATE_TYPE | COL_AGGREGATE_ID => format!(
                    "CASE WHEN {over} THEN left({c}, {REFERENCE_CHARS}) ELSE {c} END",
                    c = column(i)
                ),
                _ => format!("CASE WHEN {over} THEN NULL ELSE {} END", column(i)),
            })
            .chain([format!("({bytes})::int8")])
            .collect();
        let aliases = (0..width)
            .map(|i| format!("c{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let select = format!("SELECT {} FROM ({rows}) b({aliases})", outer.join(", "));
        let ctids = "ctid = ANY($1::text[]::tid[])";
        let q = |column: &str| quote_ident(column);
        let mark_published = match p.mark {
            MarkMode::Status => format!(
                "UPDATE {table} SET {} = {}, {} = clock_timestamp() WHERE {ctids}",
                q(&p.status_column),
                lit(PUBLISHED),
                q(&p.published_at_column)
            ),
            MarkMode::Flag => format!(
                "UPDATE {table} SET {} = true WHERE {ctids}",
                q(&p.published_column)
            ),
            MarkMode::Delete => format!("DELETE FROM {table} WHERE {ctids}"),
        };
        let (mark_retry, mark_failed) = match p.mark {
            MarkMode::Status => {
                let (status, retries, next) = (
                    q(&p.status_column),
                    q(&p.retry_count_column),
                    q(&p.next_retry_at_column),
                );
                (
                    Some(format!(
                        "UPDATE {table} SET {retries} = {retries} + 1,
                            {next} = clock_timestamp() + least($2::float8 * power(2::float8, least({retries}, 40)), $3::float8) * interval '1 millisecond',
                            {status} = CASE WHEN {retries} + 1 >= $4::int4 THEN {failed} ELSE {status} END
                         WHERE {ctids}
                         RETURNING {id}::text, {status}::text, {retries}::int8",
                        failed = lit(FAILED),
                    )),
                    Some(format!(
                        "UPDATE {table} SET {retries} = {retries} + 1, {status} = {failed}
                         WHERE {ctids} RETURNING {id}::text",
                        failed = lit(FAILED),
                    )),
                )
            }
            _ => (None, None),
        };
        let stats = match p.mark {
            MarkMode::Status => format!(
                "SELECT count(*) FILTER (WHERE {stats_pending}),
                        coalesce(extract(epoch FROM now() - min({created_at}) FILTER (WHERE {stats_pending})), 0)::float8,
                        count(*) FILTER (WHERE {status} = {failed})
                 FROM {table} WHERE {status} IN ({pending_lit}, {failed})",
                status = q(&p.status_column),
                failed = lit(FAILED),
                pending_lit = lit(PENDING),
            ),
            _ => format!(
                "SELECT count(*), coalesce(extract(epoch FROM now() - min({created_at})), 0)::float8, 0::int8
                 FROM {table} WHERE {stats_pending}"
            ),
        };
        let purge = match (p.purge_published_after_secs, p.mark) {
            (Some(_), MarkMode::Status) => Some(format!(
                "{} = {} AND {} < now() - $1::float8 * interval '1 second'",
                q(&p.status_column),
                lit(PUBLISHED),
                q(&p.published_at_column)
            )),
            (Some(_), MarkMode::Flag) => Some(format!(
                "{} AND {created_at} < now() - $1::float8 * interval '1 second'",
                q(&p.published_column)
            )),
            _ => None,
        }
        .map(|published| {
            format!(
                "DELETE FROM {table} WHERE ctid = ANY(ARRAY(
                    SELECT ctid FROM {table} WHERE {published} LIMIT $2 FOR UPDATE SKIP LOCKED))"
            )
        });
        Ok(Statements {
            select,
            mark_published,
            mark_retry,
            mark_failed,
            stats,
            purge,
            payload_kind,
            aggregate_id_kind,
            extra_kinds,
            extra_names,
            route_by: config
                .route
                .by_field
                .clone()
                .filter(|column| *column != c.aggregate_type),
            relation: config.table.to_string(),
            check_utf8: client_encoding(client).await? == "SQL_ASCII",
        })
    }

    /// The event of a selected row, its created_at (Unix ms) and how many blocking rows of
    /// its aggregate come before it.
    ///
    /// A row over `max_event_bytes` is an event refused as too large, with no value but its
    /// id, aggregate type and id ([`Refusal::TooLarge`]).
    ///
    /// From a `SQL_ASCII` database, a row with a value that is not UTF-8 is an event refused
    /// naming its column ([`Refusal::NotUtf8`]), its values as they are stored.
    ///
    /// Returns an error naming the event if its id or aggregate type is NULL.
    pub(super) fn event(
        &self,
        columns: &OutboxColumns,
        limit: EventLimit,
        row: &Row,
    ) -> Result<(OutboxEvent, Option<i64>, i64), Error> {
        // As bytes: from a `SQL_ASCII` database, text as stored, maybe not UTF-8.
        let text = |i: usize| {
            row.get::<_, Option<RawText>>(i)
                .map(|RawText(s)| Bytes::copy_from_slice(s))
        };
        let c = columns;
        let id = text(COL_ID).ok_or_else(|| PollingError::Null {
            event_id: format!("at ctid {}", row.get::<_, &str>(COL_CTID)),
            column: c.id.clone(),
        })?;
        let aggregate_type = text(COL_AGGREGATE_TYPE).ok_or_else(|| PollingError::Null {
            event_id: String::from_utf8_lossy(&id).into_owned(),
            column: c.aggregate_type.clone(),
        })?;
        let event = OutboxEvent {
            id,
            aggregate_type,
            aggregate_id: text(COL_AGGREGATE_ID),
            aggregate_id_kind: self.aggregate_id_kind,
            event_type: text(COL_EVENT_TYPE),
            payload: text(COL_PAYLOAD),
            headers: text(COL_HEADERS),
            routed_by: text(COL_ROUTED_BY),
            payload_kind: self.payload_kind,
            columns: self
                .extra_kinds
                .iter()
                .enumerate()
                .map(|(i, &(kind, absent))| ColumnValue {
                    text: text(COL_EXTRA + i),
                    kind,
                    absent,
                })
                .collect(),
            lsn: Lsn::ZERO,
            refused: None,
        };
        let bytes = usize::try_from(row.get::<_, i64>(COL_EXTRA + self.extra_kinds.len()))
            .unwrap_or(usize::MAX);
        let event = match bytes > limit.bytes {
            false if self.check_utf8 => OutboxEvent {
                refused: not_utf8(
                    &event,
                    &self.relation,
                    columns,
                    self.route_by.as_deref(),
                    &self.extra_names,
                ),
                ..event
            },
            false => event,
            true => OutboxEvent {
                id: reference_field(&event.id),
                aggregate_type: reference_field(&event.aggregate_type),
                aggregate_id: event.aggregate_id.as_deref().map(reference_field),
                event_type: None,
                payload: None,
                headers: None,
                routed_by: None,
                columns: Vec::new(),
                refused: Some(Refusal::TooLarge { bytes, limit }),
                ..event
            },
        };
        Ok((
            event,
            row.get::<_, Option<i64>>(COL_CREATED_MS),
            row.get::<_, i64>(COL_OLDER),
        ))
    }
}

/// The connection's `client_encoding`: `SQL_ASCII` when the polling connection of a
/// `SQL_ASCII` database takes text as stored ([`super::connect`]).
async fn client_encoding(client: &Client) -> Result<String, Error> {
    let row = client
        .query_one("SHOW client_encoding", &[])
        .await
        .map_err(SourceError::Sql)?;
    Ok(row.get(0))
}

/// A text value's bytes as the server sent them: from a `SQL_ASCII` database (and
/// `client_encoding` `SQL_ASCII`), not necessarily UTF-8, which `&str` would refuse.
struct RawText<'a>(&'a [u8]);

impl<'a> FromSql<'a> for RawText<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(RawText(raw))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TEXT
    }
}

fn lit(value: &str) -> String {
    quote_literal(value)
}
