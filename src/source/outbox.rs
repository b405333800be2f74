//! Maps pgoutput Insert messages on the outbox table to [`OutboxEvent`]s.
//!
//! Columns are found by name in the latest Relation message for the table, never by a
//! position remembered from an earlier one: PostgreSQL sends a new Relation message after
//! `ALTER TABLE`, before the first change that uses the new shape. Values stay the text
//! PostgreSQL printed (`payload::text` for jsonb), as shared slices of the received WAL bytes.

use std::collections::HashMap;

use bytes::Bytes;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::pgoutput::{InsertBody, MessageBody, RelationBody, TupleValue, TypeBody};
use crate::config::{EventLimit, OutboxColumns, TableName};
use crate::lsn::Lsn;

/// One outbox row, as text bytes PostgreSQL printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    /// The row's event id (`uuid` text).
    pub id: Bytes,
    pub aggregate_type: Bytes,
    /// `None` for SQL NULL.
    pub aggregate_id: Option<Bytes>,
    /// How the aggregate id column's type prints (bytea: hex).
    pub aggregate_id_kind: ValueKind,
    pub event_type: Option<Bytes>,
    /// `None` for SQL NULL (a tombstone).
    pub payload: Option<Bytes>,
    /// The `headers` column (jsonb text); `None` for SQL NULL or a table without it.
    pub headers: Option<Bytes>,
    /// The `route.by_field` column's value, when routing is by another column than the
    /// aggregate type.
    pub routed_by: Option<Bytes>,
    /// How the payload column's type prints: JSON for json, jsonb or a domain over them.
    pub payload_kind: ValueKind,
    /// The extra columns the router needs (template columns, `columns.timestamp`,
    /// `additional_placement`), in [`OutboxDecoder::with_columns`] order; empty for
    /// logical decoding messages.
    pub columns: Vec<ColumnValue>,
    /// Where the Insert is in the WAL.
    pub lsn: Lsn,
    /// Why the relay refuses the event before routing it, if it does: the router turns it
    /// into an error, so that the event is dead-lettered or halts the pipeline
    /// (`on_bad_event`) like any bad row.
    pub refused: Option<Refusal>,
}

/// One extra column's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnValue {
    /// The text PostgreSQL printed; `None` for SQL NULL.
    pub text: Option<Bytes>,
    pub kind: ValueKind,
    /// The table has no such column (one that may be missing: see
    /// [`OutboxDecoder::with_optional_columns`]); `text` is `None`.
    pub absent: bool,
}

/// What a column's text is, by its type (or a domain's base type): how the router renders it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ValueKind {
    /// Anything else: put in JSON as a string.
    #[default]
    Text,
    /// json, jsonb: JSON text already.
    Json,
    /// int2, int4, int8, numeric: the text is the number.
    Number,
    /// float4, printed shortest-exact (`extra_float_digits` > 0).
    Float4,
    /// float8, printed shortest-exact.
    Float8,
    /// bool, printed `t` or `f`.
    Bool,
    /// bytea, printed as hex (`\x0aff`; `bytea_output = hex`).
    Bytea,
    /// timestamptz with its fractional digits (the type modifier, 6 without one).
    Timestamptz(u8),
    /// timestamp with its fractional digits.
    Timestamp(u8),
    /// date.
    Date,
    /// time with its fractional digits.
    Time(u8),
}

/// Fractional digits of a time type without a type modifier.
const DEFAULT_TIME_PRECISION: u8 = 6;

impl ValueKind {
    /// The kind of a built-in type by name (a `pg_catalog` type in a Type message), with the
    /// column's type modifier (`atttypmod`, -1 for none).
    pub(crate) fn of_name(name: &str, typmod: i32) -> ValueKind {
        let precision = precision(typmod);
        match name {
            "json" | "jsonb" => ValueKind::Json,
            "int2" | "int4" | "int8" | "numeric" => ValueKind::Number,
            "float4" => ValueKind::Float4,
            "float8" => ValueKind::Float8,
            "bool" => ValueKind::Bool,
            "bytea" => ValueKind::Bytea,
            "timestamptz" => ValueKind::Timestamptz(precision),
            "timestamp" => ValueKind::Timestamp(precision),
            "date" => ValueKind::Date,
            "time" => ValueKind::Time(precision),
            _ => ValueKind::Text,
        }
    }

    /// The kind of a built-in type by oid (pg_type.dat), with the column's type modifier.
    fn of_oid(oid: u32, typmod: i32) -> Option<ValueKind> {
        let name = match oid {
            114 => "json",
            3802 => "jsonb",
            20 => "int8",
            21 => "int2",
            23 => "int4",
            1700 => "numeric",
            700 => "float4",
            701 => "float8",
            16 => "bool",
            17 => "bytea",
            1184 => "timestamptz",
            1114 => "timestamp",
            1082 => "date",
            1083 => "time",
            _ => return None,
        };
        Some(ValueKind::of_name(name, typmod))
    }
}

/// The fractional digits of a time type with type modifier `typmod`: the modifier is the
/// precision (0 to 6), -1 is none.
fn precision(typmod: i32) -> u8 {
    u8::try_from(typmod)
        .ok()
        .filter(|p| *p <= DEFAULT_TIME_PRECISION)
        .unwrap_or(DEFAULT_TIME_PRECISION)
}

/// An outbox row the relay cannot turn into an event; the pipeline stops before confirming it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OutboxError {
    #[error(
        "insert at LSN {lsn} for relation {rel_id} that was never described by a Relation message"
    )]
    UnknownRelation { rel_id: u32, lsn: Lsn },
    #[error("outbox table {table} has no column {column:?} (columns.{field}) at LSN {lsn}{}; its columns are {present}: set columns.{field} to the column's name", event(.event_id))]
    MissingColumn {
        table: String,
        /// The config field that names the column (`event_type`, `route.by_field`, ...).
        field: &'static str,
        column: String,
        /// The table's columns in that Relation message, comma-separated.
        present: String,
        lsn: Lsn,
        /// The row's `columns.id` value, if the table has that column and it is not NULL.
        event_id: Option<String>,
    },
    #[error("insert at LSN {lsn}{} into {renamed}, which was the outbox table {table} earlier in this stream: set table to its new name (or insert into {table})", event(.event_id))]
    Renamed {
        table: String,
        renamed: String,
        lsn: Lsn,
        /// As in `MissingColumn`.
        event_id: Option<String>,
    },
    #[error(
        "outbox row at LSN {lsn} (event id {event_id}) has NULL in required column {column:?}"
    )]
    Null {
        column: String,
        event_id: String,
        lsn: Lsn,
    },
    #[error("outbox row at LSN {lsn} has a non-text value in column {column:?}")]
    NotText { column: String, lsn: Lsn },
    #[error(
        "outbox row at LSN {lsn} has {columns} values, fewer than its Relation message's columns"
    )]
    ShortTuple { columns: usize, lsn: Lsn },
    #[error("{op} of an outbox row at LSN {lsn} (op_invalid_behavior = error); outbox rows are only inserted")]
    InvalidOp { op: &'static str, lsn: Lsn },
    #[error("outbox message at LSN {lsn} is not a valid event: {reason}")]
    InvalidMessage { lsn: Lsn, reason: String },
}

/// " (event id X)", or nothing when the row's id is not known.
fn event(event_id: &Option<String>) -> String {
    event_id
        .as_ref()
        .map_or_else(String::new, |id| format!(" (event id {id})"))
}

#[derive(Debug)]
struct ColumnIndexes {
    id: usize,
    aggregate_type: usize,
    aggregate_id: usize,
    event_type: usize,
    payload: usize,
    /// Optional: a table without the column has no extra headers.
    headers: Option<usize>,
    routed_by: Option<usize>,
    payload_kind: ValueKind,
    aggregate_id_kind: ValueKind,
    /// The configured extra columns, in order; `None` for an optional one the table lacks.
    extra: Vec<(Option<usize>, ValueKind)>,
}

#[derive(Debug)]
enum RelationKind {
    Other,
    /// The outbox table; `Err` when a mapped column is missing.
    Outbox(Result<ColumnIndexes, Missing>),
    /// The outbox table earlier in this stream, now under another name (`schema.table`):
    /// an insert into it stops the pipeline instead of passing unpublished. `id_index`: the
    /// `columns.id` column's place, to name the row.
    Renamed {
        name: String,
        id_index: Option<usize>,
    },
}

/// A mapped column the table's latest Relation message does not have.
#[derive(Debug)]
struct Missing {
    field: &'static str,
    column: String,
    present: String,
    /// The `columns.id` column's place, to name the row (`None`: that column is missing).
    id_index: Option<usize>,
}

/// Relation cache plus the mapping of outbox rows to events.
#[derive(Debug)]
pub struct OutboxDecoder {
    table: TableName,
    columns: OutboxColumns,
    relations: HashMap<u32, RelationKind>,
    /// Logical decoding messages with this prefix are outbox events too.
    message_prefix: Option<String>,
    /// Column routing the event, when not the aggregate type's.
    route_by: Option<String>,
    /// Extra columns events carry ([`OutboxEvent::columns`]).
    extra: Vec<String>,
    /// Those of `extra` the table may lack.
    optional: Vec<String>,
    /// Kinds of non-built-in types (domains) from Type messages, by oid.
    types: HashMap<u32, ValueKind>,
    /// The outbox table's oid when the session started (a Relation message's id is the
    /// table's oid): a Relation with this id under another name is the outbox as it was named
    /// then, e.g. before the rename that `table` now follows.
    oid: Option<u32>,
    /// Where a message event without an id gets its id; `None`: `lsn-<LSN>`.
    message_origin: Option<MessageOrigin>,
    /// Events over this are refused ([`Refusal::TooLarge`]).
    max_event_bytes: EventLimit,
    /// Whether text values must be checked for UTF-8 ([`Refusal::NotUtf8`]): the database is
    /// `SQL_ASCII`, and its walsender sends text as stored.
    check_utf8: bool,
}

/// The cluster a message event came from, for its default id `pg-<system identifier>-
/// <timeline>-<LSN>`: unique across clusters, and across the timelines of a failover, since
/// each LSN is named with the timeline that wrote it (the same on every replay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageOrigin {
    /// `IDENTIFY_SYSTEM`'s `systemid`.
    pub system_id: String,
    /// The server's current timeline.
    pub timeline: u32,
    /// Where each earlier timeline of the current one's history ended (`TIMELINE_HISTORY`,
    /// PostgreSQL docs 55.4): (timeline, the LSN where the next one begins), in order.
    pub switches: Vec<(u32, Lsn)>,
}

impl MessageOrigin {
    /// The timeline that wrote `lsn`: the first earlier timeline that ended after it, else
    /// the current one.
    pub fn timeline_of(&self, lsn: Lsn) -> u32 {
        self.switches
            .iter()
            .find(|(_, end)| lsn < *end)
            .map_or(self.timeline, |(timeline, _)| *timeline)
    }

    /// The default id of a message event at `lsn`.
    pub fn id(&self, lsn: Lsn) -> String {
        format!("pg-{}-{}-{lsn}", self.system_id, self.timeline_of(lsn))
    }
}

/// An outbox event in a logical decoding message (`pg_logical_emit_message(true, prefix,
/// content)`): a JSON object with these fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageEvent<'a> {
    /// Defaults to [`MessageOrigin::id`] (or `lsn-<message LSN>`), the same on every replay
    /// of the message.
    id: Option<String>,
    aggregate_type: String,
    aggregate_id: Option<String>,
    event_type: Option<String>,
    /// Any JSON value, published as its text; absent or `null` gives a tombstone.
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
    /// A JSON object, as the headers column.
    #[serde(borrow)]
    headers: Option<&'a RawValue>,
}

impl OutboxDecoder {
    pub fn new(table: TableName, columns: OutboxColumns, message_prefix: Option<String>) -> Self {
        OutboxDecoder {
            table,
            columns,
            relations: HashMap::new(),
            message_prefix,
            route_by: None,
            extra: Vec::new(),
            optional: Vec::new(),
            types: HashMap::new(),
            oid: None,
            message_origin: None,
            max_event_bytes: EventLimit::NONE,
            check_utf8: false,
        }
    }

    /// Refuses events whose mapped values are over `limit` bytes ([`Refusal::TooLarge`]):
    /// such an event is a reference to its row, with no value copied.
    pub fn with_max_event_bytes(mut self, limit: EventLimit) -> Self {
        self.max_event_bytes = limit;
        self
    }

    /// Refuses events with a text value that is not UTF-8 ([`Refusal::NotUtf8`]): for a
    /// `SQL_ASCII` database, whose text the walsender sends as stored. (From any other
    /// database, PostgreSQL sends text in the relay's `client_encoding`, UTF-8.)
    pub fn with_utf8_check(mut self, check: bool) -> Self {
        self.check_utf8 = check;
        self
    }

    /// Gives message events without an id the id `origin` makes ([`MessageOrigin::id`])
    /// instead of `lsn-<LSN>`.
    pub fn with_message_origin(mut self, origin: Option<MessageOrigin>) -> Self {
        self.message_origin = origin;
        self
    }

    /// Also takes the relation with id `oid` (the outbox table's oid when the session
    /// started) as the outbox, whatever its name in the stream, unless this stream showed
    /// it under the configured name first (then another name is a rename: an error).
    pub fn with_oid(mut self, oid: Option<u32>) -> Self {
        self.oid = oid;
        self
    }

    /// Puts these columns' values in every event's [`OutboxEvent::columns`], in this order;
    /// a Relation of the outbox table without one of them is an error at its first insert.
    pub fn with_columns(mut self, columns: Vec<String>) -> Self {
        self.extra = columns;
        self
    }

    /// Lets the table lack these of the [`OutboxDecoder::with_columns`] columns: an event of a
    /// table without one carries it as [`ColumnValue::absent`].
    pub fn with_optional_columns(mut self, columns: Vec<String>) -> Self {
        self.optional = columns;
        self
    }

    /// Records a Type message: the kind of a domain or other non-built-in type, for the
    /// Relation messages that follow.
    pub fn on_type(&mut self, ty: &TypeBody) {
        let kind = if ty.namespace.is_empty() {
            ValueKind::of_name(&ty.name, -1)
        } else {
            ValueKind::Text
        };
        self.types.insert(ty.type_oid, kind);
    }

    fn kind(&self, oid: u32, typmod: i32) -> ValueKind {
        ValueKind::of_oid(oid, typmod)
            .or_else(|| self.types.get(&oid).copied())
            .unwrap_or_default()
    }

    /// Routes by `column` instead of the aggregate type (`None`: the aggregate type).
    pub fn with_route_by(mut self, column: Option<String>) -> Self {
        self.route_by = column.filter(|c| *c != self.columns.aggregate_type);
        self
    }

    /// Whether `rel_id` is the outbox table.
    pub fn is_outbox(&self, rel_id: u32) -> bool {
        matches!(self.relations.get(&rel_id), Some(RelationKind::Outbox(_)))
    }

    /// Whether `message` carries an outbox event (its prefix is the configured one).
    pub fn is_outbox_message(&self, message: &MessageBody) -> bool {
        self.message_prefix.as_deref() == Some(message.prefix.as_str())
    }

    /// Maps a logical decoding message at `lsn` to an event.
    ///
    /// Returns an error naming the LSN if the content is not a JSON object with at least
    /// `aggregate_type`, or has fields of the wrong type or unknown fields.
    pub fn on_message(&self, message: &MessageBody, lsn: Lsn) -> Result<OutboxEvent, OutboxError> {
        let invalid = |reason: String| OutboxError::InvalidMessage { lsn, reason };
        let event: MessageEvent<'_> =
            serde_json::from_slice(&message.content).map_err(|e| invalid(e.to_string()))?;
        let text = |raw: &RawValue| Bytes::copy_from_slice(raw.get().as_bytes());
        let id = Bytes::from(event.id.unwrap_or_else(|| match &self.message_origin {
            Some(origin) => origin.id(message.lsn),
            None => format!("lsn-{}", message.lsn),
        }));
        // The whole content is what the event is made of; nothing of it is copied yet.
        let bytes = message.content.len();
        if bytes > self.max_event_bytes.bytes {
            return Ok(OutboxEvent {
                id: reference_field(&id),
                aggregate_type: reference_field(event.aggregate_type.as_bytes()),
                aggregate_id: event.aggregate_id.map(|id| reference_field(id.as_bytes())),
                aggregate_id_kind: ValueKind::Text,
                event_type: None,
                payload: None,
                headers: None,
                routed_by: None,
                payload_kind: ValueKind::Json,
                columns: Vec::new(),
                lsn,
                refused: Some(Refusal::TooLarge {
                    bytes,
                    limit: self.max_event_bytes,
                }),
            });
        }
        Ok(OutboxEvent {
            id,
            aggregate_type: Bytes::from(event.aggregate_type),
            aggregate_id: event.aggregate_id.map(Bytes::from),
            aggregate_id_kind: ValueKind::Text,
            event_type: event.event_type.map(Bytes::from),
            payload: event.payload.map(text),
            headers: event.headers.map(text),
            routed_by: None,
            payload_kind: ValueKind::Json,
            columns: Vec::new(),
            lsn,
            refused: None,
        })
    }

    /// Records a Relation message, replacing what was known about that relation id.
    pub fn on_relation(&mut self, relation: &RelationBody) {
        let named = relation.namespace == self.table.schema && relation.name == self.table.name;
        let renamed_here = !named
            && matches!(
                self.relations.get(&relation.rel_id),
                Some(RelationKind::Outbox(_) | RelationKind::Renamed { .. })
            );
        let id_index = relation
            .columns
            .iter()
            .position(|c| c.name == self.columns.id);
        let kind = if named || (!renamed_here && self.oid == Some(relation.rel_id)) {
            let find = |field: &'static str, name: &str| {
                relation
                    .columns
                    .iter()
                    .position(|c| c.name == name)
                    .ok_or_else(|| Missing {
                        field,
                        column: name.to_owned(),
                        present: relation
                            .columns
                            .iter()
                            .map(|c| c.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        id_index,
                    })
            };
            let c = &self.columns;
            let kind = |index: usize| {
                let column = &relation.columns[index];
                self.kind(column.type_oid, column.type_modifier)
            };
            RelationKind::Outbox((|| {
                let payload = find("payload", &c.payload)?;
                let aggregate_id = find("aggregate_id", &c.aggregate_id)?;
                Ok(ColumnIndexes {
                    payload_kind: kind(payload),
                    aggregate_id_kind: kind(aggregate_id),
                    extra: self
                        .extra
                        .iter()
                        .map(|name| {
                            match find("route, additional_placement or columns.timestamp", name) {
                                Ok(i) => Ok((Some(i), kind(i))),
                                Err(_) if self.optional.contains(name) => {
                                    Ok((None, ValueKind::Text))
                                }
                                Err(missing) => Err(missing),
                            }
                        })
                        .collect::<Result<_, _>>()?,
                    id: find("id", &c.id)?,
                    aggregate_type: find("aggregate_type", &c.aggregate_type)?,
                    aggregate_id,
                    event_type: find("event_type", &c.event_type)?,
                    payload,
                    headers: if c.headers_optional() {
                        find("headers", &c.headers).ok()
                    } else {
                        Some(find("headers", &c.headers)?)
                    },
                    routed_by: match self.route_by.as_deref() {
                        Some(column) => Some(find("route.by_field", column)?),
                        None => None,
                    },
                })
            })())
        } else if renamed_here {
            RelationKind::Renamed {
                name: TableName {
                    schema: relation.namespace.clone(),
                    name: relation.name.clone(),
                }
                .to_string(),
                id_index,
            }
        } else {
            RelationKind::Other
        };
        self.relations.insert(relation.rel_id, kind);
    }

    /// Maps an Insert at `lsn` to an event; `Ok(None)` when it is not on the outbox table.
    ///
    /// Returns an error if the relation is unknown, a mapped column is missing, `id` or
    /// `aggregate_type` is NULL, or a value is not in text format.
    pub fn on_insert(
        &self,
        insert: &InsertBody,
        lsn: Lsn,
    ) -> Result<Option<OutboxEvent>, OutboxError> {
        let values = &insert.new_tuple.columns;
        let event_id = |index: Option<usize>| match index.and_then(|i| values.get(i)) {
            Some(TupleValue::Text(id)) => Some(String::from_utf8_lossy(id).into_owned()),
            _ => None,
        };
        let indexes = match self.relations.get(&insert.rel_id) {
            None => {
                return Err(OutboxError::UnknownRelation {
                    rel_id: insert.rel_id,
                    lsn,
                })
            }
            Some(RelationKind::Other) => return Ok(None),
            Some(RelationKind::Renamed { name, id_index }) => {
                return Err(OutboxError::Renamed {
                    table: self.table.to_string(),
                    renamed: name.clone(),
                    lsn,
                    event_id: event_id(*id_index),
                })
            }
            Some(RelationKind::Outbox(Err(missing))) => {
                return Err(OutboxError::MissingColumn {
                    table: self.table.to_string(),
                    field: missing.field,
                    column: missing.column.clone(),
                    present: missing.present.clone(),
                    lsn,
                    event_id: event_id(missing.id_index),
                })
            }
            Some(RelationKind::Outbox(Ok(indexes))) => indexes,
        };
        let text = |index: usize, name: &str| -> Result<Option<Bytes>, OutboxError> {
            match values.get(index) {
                Some(TupleValue::Text(bytes)) => Ok(Some(bytes.clone())),
                Some(TupleValue::Null) => Ok(None),
                Some(_) => Err(OutboxError::NotText {
                    column: name.to_owned(),
                    lsn,
                }),
                // pgoutput sends every column of the Relation: a shorter tuple is corrupt.
                None => Err(OutboxError::ShortTuple {
                    columns: values.len(),
                    lsn,
                }),
            }
        };
        let c = &self.columns;
        let id = text(indexes.id, &c.id)?;
        let required = |value: Option<Bytes>, column: &str| {
            value.ok_or_else(|| OutboxError::Null {
                column: column.to_owned(),
                event_id: id.as_deref().map_or_else(
                    || "NULL".to_owned(),
                    |id| String::from_utf8_lossy(id).into_owned(),
                ),
                lsn,
            })
        };
        let event_id = required(id.clone(), &c.id)?;
        let aggregate_type = required(
            text(indexes.aggregate_type, &c.aggregate_type)?,
            &c.aggregate_type,
        )?;
        let bytes = indexes.value_bytes(values);
        if bytes > self.max_event_bytes.bytes {
            return Ok(Some(OutboxEvent {
                id: reference_field(&event_id),
                aggregate_type: reference_field(&aggregate_type),
                aggregate_id: text(indexes.aggregate_id, &c.aggregate_id)?
                    .map(|id| reference_field(&id)),
                aggregate_id_kind: indexes.aggregate_id_kind,
                event_type: None,
                payload: None,
                headers: None,
                routed_by: None,
                payload_kind: indexes.payload_kind,
                columns: Vec::new(),
                lsn,
                refused: Some(Refusal::TooLarge {
                    bytes,
                    limit: self.max_event_bytes,
                }),
            }));
        }
        let mut event = OutboxEvent {
            id: event_id,
            aggregate_type,
            aggregate_id: text(indexes.aggregate_id, &c.aggregate_id)?,
            aggregate_id_kind: indexes.aggregate_id_kind,
            event_type: text(indexes.event_type, &c.event_type)?,
            payload: text(indexes.payload, &c.payload)?,
            headers: match indexes.headers {
                Some(index) => text(index, &c.headers)?,
                None => None,
            },
            routed_by: match (indexes.routed_by, self.route_by.as_deref()) {
                (Some(index), Some(column)) => Some(required(text(index, column)?, column)?),
                _ => None,
            },
            payload_kind: indexes.payload_kind,
            columns: indexes
                .extra
                .iter()
                .zip(&self.extra)
                .map(|(&(index, kind), name)| {
                    Ok(ColumnValue {
                        text: match index {
                            Some(index) => text(index, name)?,
                            None => None,
                        },
                        kind,
                        absent: index.is_none(),
                    })
                })
                .collect::<Result<_, OutboxError>>()?,
            lsn,
            refused: None,
        };
        if self.check_utf8 {
            event.refused = self.not_utf8(&event);
        }
        Ok(Some(event))
    }
}

mod refusal;
pub use refusal::{not_utf8, reference_field, Refusal, REFERENCE_FIELD_BYTES};

#[cfg(test)]
mod tests;
