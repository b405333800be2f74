//! The dead-letter copy: the record that goes to `dead_letter_topic` in place of an event that
//! cannot be routed ([`Router::dead_letter`]) or a record the sink refused for good
//! ([`Router::dead_letter_refused`]).
//!
//! The copy must always be deliverable (DESIGN.md, I8): whatever made the original
//! undeliverable came from the row (a header the sink cannot carry, an id with a control
//! character, headers over the size limit), so nothing of the row goes into the copy's own
//! key or headers unless it is plain text that every sink carries. Everything of the original
//! is in the copy's value instead, as one JSON document:
//!
//! ```json
//! {"error":"...","topic":"orders.events","id":"e-1","key":"42",
//!  "headers":[{"name":"id","value":"e-1"},{"name":"trace","value":null}],"value":"{\"a\":1}"}
//! ```
//!
//! - `error`: why (the routing error, or the sink's refusal with size and limit);
//! - `topic`: the destination the record was meant for (`null` for a routing error);
//! - `id`, `key`, `value` and each header's `value`: a JSON string when the bytes are UTF-8,
//!   else `{"base64":"..."}`; `null` for SQL NULL;
//! - `headers`: the original headers in order (a routing error's copy: `id` and `event_type`);
//! - for a record refused as too large, `value` and `headers` are left out and `id` and `key`
//!   are cut to [`TOO_LARGE_FIELD_BYTES`], with `"truncated":true`: the copy of a too large
//!   record must not be too large itself;
//! - a row over `max_event_bytes` is a reference, refused before its values were read: `id`
//!   and `key` (cut), `aggregate_type`, its size in `bytes` and its `lsn` (log tailing), no
//!   value or headers.
//!
//! The copy's own headers are the relay's: `outbox_relay_error` and (refused records)
//! `outbox_relay_topic`, escaped to printable ASCII and cut to [`HEADER_TEXT_BYTES`], and `id`
//! when the event id is plain. Its key is the original key when plain, else null. Plain: 1 to
//! [`PLAIN_BYTES`] bytes of printable ASCII (space to `~`).

use std::borrow::Cow;

use base64::Engine;
use bytes::Bytes;
use serde::Serialize;

use super::{RouteError, Router};
use crate::sink::{DeliveryError, Header, Record};
use crate::source::outbox::{OutboxEvent, Refusal};

/// The dead-letter copy's header with the reason.
pub const ERROR_HEADER: &str = "outbox_relay_error";
/// The dead-letter copy's header with the destination a refused record was meant for.
pub const TOPIC_HEADER: &str = "outbox_relay_topic";
/// Longest text of the copy's own header values, bytes: well under every sink's header limits
/// (HTTP servers commonly take 8 KiB of headers in all).
pub const HEADER_TEXT_BYTES: usize = 1024;
/// Longest key or event id kept as the copy's own key or `id` header, bytes (AMQP's short
/// strings, the shortest limit of the sinks, hold 255).
pub const PLAIN_BYTES: usize = 255;
/// Longest `id` and `key` in the document of a record refused as too large, bytes.
pub const TOO_LARGE_FIELD_BYTES: usize = 1024;

/// A byte string in the document: text when it is UTF-8, else base64.
#[derive(Serialize)]
#[serde(untagged)]
enum Text<'a> {
    Utf8(&'a str),
    Binary { base64: String },
}

impl<'a> Text<'a> {
    fn of(bytes: &'a [u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => Text::Utf8(text),
            Err(_) => Text::Binary {
                base64: base64::engine::general_purpose::STANDARD.encode(bytes),
            },
        }
    }
}

#[derive(Serialize)]
struct HeaderDoc<'a> {
    name: &'a str,
    value: Option<Text<'a>>,
}

/// The copy's value.
#[derive(Serialize)]
struct Document<'a> {
    error: &'a str,
    topic: Option<&'a str>,
    id: Text<'a>,
    key: Option<Text<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<Vec<HeaderDoc<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<Option<Text<'a>>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
    /// A reference to a row refused as too large: its aggregate type, size and LSN.
    #[serde(skip_serializing_if = "Option::is_none")]
    aggregate_type: Option<Text<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lsn: Option<String>,
}

/// What the copy is made of.
struct Original<'a> {
    error: &'a str,
    topic: Option<&'a str>,
    id: &'a [u8],
    key: Option<&'a Bytes>,
    headers: &'a [Header],
    value: Option<&'a Bytes>,
    too_large: bool,
    /// A row refused as too large: (aggregate type, bytes, LSN if it has one).
    reference: Option<(&'a [u8], usize, Option<String>)>,
}

impl Router {
    /// The dead-letter copy of an event that cannot be routed (`error`), to `topic`, at the
    /// commit time (see the module docs for its parts).
    pub fn dead_letter(
        event: &OutboxEvent,
        error: &RouteError,
        topic: &str,
        commit_time_ms: i64,
    ) -> Record {
        let mut headers = vec![(Cow::Borrowed("id"), Some(event.id.clone()))];
        if let Some(event_type) = &event.event_type {
            headers.push((Cow::Borrowed("event_type"), Some(event_type.clone())));
        }
        let reason = error.to_string();
        let reference = match &event.refused {
            Some(Refusal::TooLarge { bytes, .. }) => Some((
                event.aggregate_type.as_ref(),
                *bytes,
                (event.lsn != crate::lsn::Lsn::ZERO).then(|| event.lsn.to_string()),
            )),
            _ => None,
        };
        let original = Original {
            error: &reason,
            topic: None,
            id: &event.id,
            key: event.aggregate_id.as_ref(),
            headers: &headers,
            value: event.payload.as_ref(),
            too_large: reference.is_some(),
            reference,
        };
        copy(&original, topic, Some(commit_time_ms))
    }

    /// The dead-letter copy of a record the sink refused for good (`error`), to `topic`, at
    /// the producer's clock: the original timestamp may be why Kafka refused it
    /// (`log.message.timestamp.*`). See the module docs for its parts.
    pub fn dead_letter_refused(record: Record, error: &DeliveryError, topic: &str) -> Record {
        let id = record
            .headers
            .iter()
            .find(|(name, _)| name == "id")
            .and_then(|(_, value)| value.as_deref())
            .unwrap_or_default();
        let original = Original {
            error: &error.reason,
            topic: Some(&record.topic),
            id,
            key: record.key.as_ref(),
            headers: &record.headers,
            value: record.value.as_ref(),
            too_large: error.too_large,
            reference: None,
        };
        copy(&original, topic, None)
    }
}

/// `bytes`, cut to [`TOO_LARGE_FIELD_BYTES`] when `too_large`.
fn cut(bytes: &[u8], too_large: bool) -> &[u8] {
    match too_large {
        true => &bytes[..bytes.len().min(TOO_LARGE_FIELD_BYTES)],
        false => bytes,
    }
}

impl Router {
    /// The too-large form of `copy`, a dead-letter copy that the sink refused as too large
    /// (`error`): its document's error, topic, id and key, without value and headers. A copy's
    /// document escapes its value (quotes, base64) and so may outgrow a record the sink
    /// refused for another reason.
    ///
    /// Returns `None` if `copy` is in that form already, or holds no document of a copy.
    pub fn dead_letter_shrunk(copy: &Record, error: &DeliveryError) -> Option<Record> {
        let document: serde_json::Value = serde_json::from_slice(copy.value.as_deref()?).ok()?;
        document.get("headers")?;
        let bytes = |value: &serde_json::Value| -> Option<Bytes> {
            match value {
                serde_json::Value::String(text) => Some(Bytes::from(text.clone())),
                other => base64::engine::general_purpose::STANDARD
                    .decode(other.get("base64")?.as_str()?)
                    .ok()
                    .map(Bytes::from),
            }
        };
        let id = bytes(&document["id"]).unwrap_or_default();
        let key = bytes(&document["key"]);
        let reason = format!(
            "{} (its dead-letter copy was refused too: {})",
            document["error"].as_str().unwrap_or_default(),
            error.reason
        );
        let original = Original {
            error: &reason,
            topic: document["topic"].as_str(),
            id: &id,
            key: key.as_ref(),
            headers: &[],
            value: None,
            too_large: true,
            reference: None,
        };
        Some(self::copy(&original, &copy.topic, copy.timestamp_ms))
    }
}

fn copy(original: &Original, topic: &str, timestamp_ms: Option<i64>) -> Record {
    let cut = |bytes| cut(bytes, original.too_large);
    let document = Document {
        error: original.error,
        topic: original.topic,
        id: Text::of(cut(original.id)),
        key: original.key.map(|key| Text::of(cut(key))),
        headers: (!original.too_large).then(|| {
            original
                .headers
                .iter()
                .map(|(name, value)| HeaderDoc {
                    name: name.as_ref(),
                    value: value.as_deref().map(Text::of),
                })
                .collect()
        }),
        value: (!original.too_large).then(|| original.value.map(|v| Text::of(v.as_ref()))),
        truncated: original.too_large
            && (original.id.len() > TOO_LARGE_FIELD_BYTES
                || original
                    .key
                    .is_some_and(|k| k.len() > TOO_LARGE_FIELD_BYTES)),
        aggregate_type: original.reference.as_ref().map(|r| Text::of(r.0)),
        bytes: original.reference.as_ref().map(|r| r.1),
        lsn: original.reference.as_ref().and_then(|r| r.2.clone()),
    };
    let value = serde_json::to_vec(&document).expect("a document of strings serializes");

    let mut headers: Vec<Header> = Vec::with_capacity(3);
    if plain(original.id) {
        headers.push((
            Cow::Borrowed("id"),
            Some(Bytes::copy_from_slice(original.id)),
        ));
    }
    headers.push((
        Cow::Borrowed(ERROR_HEADER),
        Some(header_text(original.error)),
    ));
    if let Some(destination) = original.topic {
        headers.push((Cow::Borrowed(TOPIC_HEADER), Some(header_text(destination))));
    }
    Record {
        topic: topic.to_owned(),
        key: original.key.filter(|key| plain(key)).cloned(),
        value: Some(Bytes::from(value)),
        headers,
        timestamp_ms,
        partition: None,
    }
}

/// Whether every sink carries `bytes` as a key or header value as they are.
fn plain(bytes: &[u8]) -> bool {
    (1..=PLAIN_BYTES).contains(&bytes.len()) && bytes.iter().all(|b| (b' '..=b'~').contains(b))
}

/// `text` as a header value every sink carries: printable ASCII, anything else escaped
/// (`\n`, `\u{e9}`), cut to [`HEADER_TEXT_BYTES`] with a trailing `...`.
fn header_text(text: &str) -> Bytes {
    let mut out = String::with_capacity(text.len().min(HEADER_TEXT_BYTES));
    for c in text.chars() {
        let start = out.len();
        match c {
            ' '..='~' => out.push(c),
            _ => out.extend(c.escape_default()),
        }
        if out.len() > HEADER_TEXT_BYTES - 3 {
            out.truncate(start);
            out.push_str("...");
            break;
        }
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests;
