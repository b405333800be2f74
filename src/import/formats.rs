//! How a connector's converters and value handling modes compare with what outbox-relay
//! publishes: the key and value as Debezium wrote them with `StringConverter` (text) or
//! `BinaryDataConverter` (bytea), placed columns as Kafka Connect's `SimpleHeaderConverter`
//! and `JsonConverter` write the values Debezium gives their types with its default modes
//! (docs/concepts/records.md, "Placed column types").

/// Why `option` (a converter or a `*.handling.mode` / `time.precision.mode` option of the
/// connector) is not carried over, or `None` if it is none of those.
pub(super) fn reason(option: &str, value: &str) -> Option<String> {
    let simple = value.rsplit('.').next().unwrap_or(value);
    let value = value.trim();
    Some(match option {
        "key.converter" | "value.converter" => converter(option, value, simple),
        "header.converter" => match simple {
            "SimpleHeaderConverter" => "not needed: outbox-relay writes header placements as Kafka Connect's SimpleHeaderConverter does".into(),
            _ => format!(
                "{value}: outbox-relay writes header placements as Kafka Connect's default SimpleHeaderConverter does (booleans true/false, bytea as base64, ...), not as {simple}: check your consumers"
            ),
        },
        "binary.handling.mode" if value.eq_ignore_ascii_case("bytes") => {
            "not needed: outbox-relay publishes a bytea key or payload as its bytes, and a placed bytea column as base64 (as Kafka Connect's converters write bytes)".into()
        }
        "binary.handling.mode" => format!(
            "{value}: Debezium wrote bytea as {value} text; outbox-relay publishes a bytea key or payload as its bytes (bytea_format = \"raw\") or as PostgreSQL's hex text \\x... (bytea_format = \"hex\"), and a placed bytea column as base64 (or that hex text): check your consumers"
        ),
        "time.precision.mode" if value.eq_ignore_ascii_case("adaptive") => {
            "not needed: outbox-relay places timestamps, dates and times as Debezium's adaptive mode gives them".into()
        }
        "time.precision.mode" => format!(
            "{value}: outbox-relay places timestamps, dates and times as Debezium's default adaptive mode gives them (timestamp as microseconds since 1970, date as days, time as microseconds since midnight, timestamptz as ISO 8601 in UTC), not as {value}: check your consumers"
        ),
        "decimal.handling.mode" => format!(
            "{value}: outbox-relay places a numeric column as PostgreSQL prints it, in a header as text and in the envelope as a JSON number (Debezium's precise mode wrote base64 bytes there, string mode a JSON string, double mode a rounded float): check your consumers"
        ),
        _ => return None,
    })
}

fn converter(option: &str, value: &str, simple: &str) -> String {
    let what = if option == "key.converter" {
        "key (aggregate id)"
    } else {
        "payload"
    };
    match simple {
        "StringConverter" => format!("not needed: outbox-relay writes the {what} text too"),
        "JsonConverter" => format!(
            "Debezium wrote the {what} as a JSON string (quoted and escaped, with a schema envelope unless schemas.enable=false); outbox-relay writes its text itself: check your consumers"
        ),
        "BinaryDataConverter" | "ByteArrayConverter" => format!(
            "not needed: outbox-relay publishes a bytea {what} as its bytes (bytea_format = \"raw\", the default), and a text one as its text"
        ),
        _ => format!("{value}: outbox-relay publishes the {what} text as PostgreSQL prints it, without a converter"),
    }
}
