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

/// Appends `text` of a column of `kind` as JSON: json and jsonb as they are, numbers and
/// booleans as JSON, a bytea as a base64 string (as Kafka's `JsonConverter` writes bytes),
/// anything else as a JSON string.
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
        ValueKind::Number | ValueKind::Float4 | ValueKind::Float8 if is_json_number(text) => {
            out.extend_from_slice(text)
        }
        ValueKind::Bool if text == b"t" => out.extend_from_slice(b"true"),
        ValueKind::Bool if text == b"f" => out.extend_from_slice(b"false"),
        ValueKind::Bytea if bytea == ByteaFormat::Raw => {
            push_string(out, &base64(&decode_hex(text)?))
        }
        // Text, and numbers JSON has no form for (NaN, Infinity).
        _ => push_string(
            out,
            std::str::from_utf8(text).map_err(|_| Unrenderable::NotUtf8)?,
        ),
    }
    Ok(())
}

fn push_string(out: &mut Vec<u8>, text: &str) {
    serde_json::to_writer(&mut *out, text).expect("writing to a Vec cannot fail");
}

fn base64(bytes: &[u8]) -> String {
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
