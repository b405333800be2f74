//! Renders a column's text, as PostgreSQL printed it, into the bytes of a record: the key and
//! value as they are (bytea decoded), and placed columns as Debezium's default converters
//! render a value of the column's type.
//!
//! The text is what the relay's session settings make PostgreSQL print (`bytea_output = hex`,
//! `DateStyle = ISO`, `TimeZone = UTC`, `extra_float_digits = 1`), so every form here is one
//! PostgreSQL prints; anything else is refused ([`Unrenderable`]), never guessed at.

use bytes::Bytes;

use crate::config::ByteaFormat;
use crate::source::outbox::ValueKind;

pub(crate) mod expand;
mod float;
pub(crate) mod time;

/// Why a column's text cannot be rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unrenderable {
    /// It must be a JSON string and is not UTF-8.
    NotUtf8,
    /// A bytea whose text is not `\x` and pairs of hex digits.
    NotHex,
}

/// The key or value bytes of a column of `kind`: a bytea's bytes (unless `bytea` is
/// [`ByteaFormat::Hex`]), any other type's text as it is.
///
/// Returns an error if a bytea's text is not PostgreSQL's hex form.
pub(super) fn raw(
    text: &Bytes,
    kind: ValueKind,
    bytea: ByteaFormat,
) -> Result<Bytes, Unrenderable> {
    match (kind, bytea) {
        (ValueKind::Bytea, ByteaFormat::Raw) => decode_hex(text).map(Bytes::from),
        _ => Ok(text.clone()),
    }
}

/// The header value of a column of `kind`, as Kafka Connect's `SimpleHeaderConverter` writes
/// the value Debezium gives that type: booleans `true` and `false`, floats as Java prints them,
/// timestamptz as ISO 8601 in UTC, timestamp, date and time as numbers, bytea as base64 (or
/// its hex text with [`ByteaFormat::Hex`]); any other type as PostgreSQL printed it.
///
/// Returns an error if a bytea's text is not PostgreSQL's hex form.
pub(super) fn header(
    text: &Bytes,
    kind: ValueKind,
    bytea: ByteaFormat,
) -> Result<Bytes, Unrenderable> {
    Ok(match debezium(text, kind, bytea)? {
        Some(Debezium::Number(s) | Debezium::String(s)) => Bytes::from(s),
        Some(Debezium::Bool(b)) => Bytes::from_static(if b { b"true" } else { b"false" }),
        None => text.clone(),
    })
}

/// Appends `text` of a column of `kind` as JSON, as Kafka's `JsonConverter` writes the value
/// Debezium gives that type (see [`header`]; bytea as a base64 string), except json and jsonb,
/// which go in as they are, and numerics, which are JSON numbers (see the module docs of
/// `router`); NaN and the infinities are strings, as Jackson writes them. Any other type is
/// a JSON string of PostgreSQL's text.
///
/// Returns an error if a string is not UTF-8 or a bytea's text is not hex.
pub(super) fn push_json(
    out: &mut Vec<u8>,
    text: &[u8],
    kind: ValueKind,
    bytea: ByteaFormat,
) -> Result<(), Unrenderable> {
    match kind {
        ValueKind::Json => out.extend_from_slice(text),
        ValueKind::Number if is_json_number(text) => out.extend_from_slice(text),
        _ => match debezium(text, kind, bytea)? {
            Some(Debezium::Number(n)) if is_json_number(n.as_bytes()) => {
                out.extend_from_slice(n.as_bytes())
            }
            Some(Debezium::Bool(b)) => out.extend_from_slice(if b { b"true" } else { b"false" }),
            Some(Debezium::Number(s) | Debezium::String(s)) => push_string(out, &s),
            None => push_string(
                out,
                std::str::from_utf8(text).map_err(|_| Unrenderable::NotUtf8)?,
            ),
        },
    }
    Ok(())
}

/// A value in the form Debezium gives its type.
enum Debezium {
    /// A number (JSON number when it is one: not `NaN`).
    Number(String),
    Bool(bool),
    String(String),
}

/// The form Debezium's PostgreSQL connector gives `text` of `kind` with its default options;
/// `None` where it is PostgreSQL's text (or a value without another form, like `infinity`).
fn debezium(
    text: &[u8],
    kind: ValueKind,
    bytea: ByteaFormat,
) -> Result<Option<Debezium>, Unrenderable> {
    let number = |n: Option<i64>| n.map(|n| Debezium::Number(n.to_string()));
    Ok(match kind {
        ValueKind::Bool => match text {
            b"t" => Some(Debezium::Bool(true)),
            b"f" => Some(Debezium::Bool(false)),
            _ => None,
        },
        ValueKind::Float4 | ValueKind::Float8 => std::str::from_utf8(text)
            .ok()
            .and_then(|t| float::java_float(t, kind == ValueKind::Float8))
            .map(Debezium::Number),
        ValueKind::Bytea if bytea == ByteaFormat::Raw => {
            Some(Debezium::String(base64(&decode_hex(text)?)))
        }
        ValueKind::Timestamptz(precision) => {
            time::zoned_timestamp(text, precision).map(Debezium::String)
        }
        ValueKind::Timestamp(precision) => number(time::epoch_timestamp(text, precision)),
        ValueKind::Date => number(time::epoch_day(text)),
        ValueKind::Time(precision) => number(time::time_of_day(text, precision)),
        ValueKind::Text | ValueKind::Json | ValueKind::Number | ValueKind::Bytea => None,
    })
}

fn push_string(out: &mut Vec<u8>, text: &str) {
    serde_json::to_writer(&mut *out, text).expect("writing to a Vec cannot fail");
}

pub(super) fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The bytes of a bytea printed as hex: `\x` and two hex digits (either case) per byte.
///
/// Returns an error for anything else (the escape form, an odd digit count).
pub(super) fn decode_hex(text: &[u8]) -> Result<Vec<u8>, Unrenderable> {
    let digits = text.strip_prefix(b"\\x").ok_or(Unrenderable::NotHex)?;
    if digits.len() % 2 != 0 {
        return Err(Unrenderable::NotHex);
    }
    let nibble = |d: u8| {
        char::from(d)
            .to_digit(16)
            .and_then(|n| u8::try_from(n).ok())
            .ok_or(Unrenderable::NotHex)
    };
    digits
        .chunks_exact(2)
        .map(|pair| Ok(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

/// Whether `text` is a JSON number: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
pub(super) fn is_json_number(text: &[u8]) -> bool {
    fn digits(s: &[u8]) -> usize {
        s.iter().take_while(|b| b.is_ascii_digit()).count()
    }
    let mut s = text.strip_prefix(b"-").unwrap_or(text);
    match digits(s) {
        0 => return false,
        n if n > 1 && s[0] == b'0' => return false,
        n => s = &s[n..],
    }
    if let Some(fraction) = s.strip_prefix(b".") {
        let n = digits(fraction);
        if n == 0 {
            return false;
        }
        s = &fraction[n..];
    }
    if let Some(exponent) = s.strip_prefix(b"e").or_else(|| s.strip_prefix(b"E")) {
        let exponent = exponent
            .strip_prefix(b"+")
            .or_else(|| exponent.strip_prefix(b"-"))
            .unwrap_or(exponent);
        let n = digits(exponent);
        if n == 0 {
            return false;
        }
        s = &exponent[n..];
    }
    s.is_empty()
}

#[cfg(test)]
mod tests;
