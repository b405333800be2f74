//! Events the decoder refuses before they are routed ([`Refusal`]): a row over
//! `max_event_bytes`, taken as a reference without copying its values, and text that is not
//! UTF-8 from a `SQL_ASCII` database.

use bytes::Bytes;

use super::{ColumnIndexes, OutboxDecoder, OutboxEvent, TupleValue};
use crate::config::{EventLimit, OutboxColumns};

/// Why an event is refused before it is routed ([`OutboxEvent::refused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The row's mapped values are `bytes` long, over `limit`. The event is a reference to
    /// the row: its id, aggregate type and aggregate id (copied, each cut to
    /// [`REFERENCE_FIELD_BYTES`]) and nothing else, so that it holds no part of the
    /// received message.
    TooLarge { bytes: usize, limit: EventLimit },
    /// The value of `column` of `relation` (`schema.table`) is not UTF-8: a `SQL_ASCII`
    /// database stores text as any bytes.
    NotUtf8 { relation: String, column: String },
}

/// Longest id, aggregate type and aggregate id a too large event's reference keeps, bytes.
pub const REFERENCE_FIELD_BYTES: usize = 1024;

/// `bytes` cut to [`REFERENCE_FIELD_BYTES`] (at a UTF-8 character's start when it is text),
/// copied: a reference must not keep the received message alive.
pub fn reference_field(bytes: &[u8]) -> Bytes {
    let mut end = bytes.len().min(REFERENCE_FIELD_BYTES);
    // Back to the start of a character the cut would split (a UTF-8 continuation byte).
    while end > 0
        && bytes
            .get(end)
            .is_some_and(|b| b & 0b1100_0000 == 0b1000_0000)
    {
        end -= 1;
    }
    Bytes::copy_from_slice(&bytes[..end])
}

impl ColumnIndexes {
    /// The bytes of the values of `values` that the event is made of (each mapped column
    /// once), as their length prefixes give them: nothing is copied.
    pub(super) fn value_bytes(&self, values: &[TupleValue]) -> usize {
        let mut indexes: Vec<usize> = [
            Some(self.id),
            Some(self.aggregate_type),
            Some(self.aggregate_id),
            Some(self.event_type),
            Some(self.payload),
            self.headers,
            self.routed_by,
        ]
        .into_iter()
        .flatten()
        .chain(self.extra.iter().filter_map(|(index, _)| *index))
        .collect();
        indexes.sort_unstable();
        indexes.dedup();
        indexes
            .iter()
            .filter_map(|&i| match values.get(i) {
                Some(TupleValue::Text(bytes) | TupleValue::Binary(bytes)) => Some(bytes.len()),
                _ => None,
            })
            .sum()
    }
}

impl OutboxDecoder {
    /// The first of `event`'s text values that is not UTF-8, as a refusal naming its column.
    pub(super) fn not_utf8(&self, event: &OutboxEvent) -> Option<Refusal> {
        not_utf8(
            event,
            &self.table.to_string(),
            &self.columns,
            self.route_by.as_deref(),
            &self.extra,
        )
    }
}

/// The first of `event`'s text values that is not UTF-8, as a refusal naming its column of
/// `relation` (`schema.table`): `columns` name the mapped ones, `route_by` the routing column
/// (when not the aggregate type's), `extra` those of [`OutboxEvent::columns`], in order.
pub fn not_utf8(
    event: &OutboxEvent,
    relation: &str,
    columns: &OutboxColumns,
    route_by: Option<&str>,
    extra: &[String],
) -> Option<Refusal> {
    let c = columns;
    let fixed = [
        (Some(&event.id), c.id.as_str()),
        (Some(&event.aggregate_type), c.aggregate_type.as_str()),
        (event.aggregate_id.as_ref(), c.aggregate_id.as_str()),
        (event.event_type.as_ref(), c.event_type.as_str()),
        (event.payload.as_ref(), c.payload.as_str()),
        (event.headers.as_ref(), c.headers.as_str()),
        (event.routed_by.as_ref(), route_by.unwrap_or_default()),
    ];
    let extra = event
        .columns
        .iter()
        .zip(extra)
        .map(|(value, name)| (value.text.as_ref(), name.as_str()));
    fixed
        .into_iter()
        .chain(extra)
        .find(|(value, _)| value.is_some_and(|v| std::str::from_utf8(v).is_err()))
        .map(|(_, column)| Refusal::NotUtf8 {
            relation: relation.to_owned(),
            column: column.to_owned(),
        })
}
