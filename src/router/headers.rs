//! The row's `headers` jsonb object as record headers.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::RESERVED_HEADER_PREFIX;
use crate::sink::Header;

/// Turns a jsonb object's text into headers, in the object's order.
pub(super) fn row_headers_to_kafka(json: &[u8]) -> Result<Vec<Header>, String> {
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let entries = deserializer
        .deserialize_map(EntriesVisitor)
        .map_err(|e| e.to_string())?;
    deserializer.end().map_err(|e| e.to_string())?;
    let mut headers = Vec::with_capacity(entries.len());
    for (key, raw) in entries {
        // The relay's own names in any case: HTTP lower-cases header names on the way.
        let reserved = key
            .get(..RESERVED_HEADER_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_HEADER_PREFIX));
        if key == "id" || key == "event_type" || reserved {
            continue;
        }
        let text = raw.get();
        let value = match text.as_bytes().first() {
            Some(b'"') => Some(Bytes::from(
                serde_json::from_str::<String>(text).map_err(|e| e.to_string())?,
            )),
            _ if text == "null" => None,
            _ => Some(Bytes::copy_from_slice(text.as_bytes())),
        };
        headers.push((Cow::Owned(key), value));
    }
    Ok(headers)
}

/// A JSON object's entries in order, values as their raw JSON text.
struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Vec<(String, Box<RawValue>)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(entry) = map.next_entry::<String, Box<RawValue>>()? {
            entries.push(entry);
        }
        Ok(entries)
    }
}
