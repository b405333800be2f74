//! How a connector's converters and value handling modes compare with what outbox-relay
//! publishes: the key and value as Debezium wrote them with `StringConverter` (text) or
//! `BinaryDataConverter` (bytea), placed columns as Kafka Connect's `SimpleHeaderConverter`
//! and `JsonConverter` write the values Debezium gives their types with its default modes
//! (docs/concepts/records.md, "Placed column types"), and an expanded JSON payload as
//! `JsonConverter` writes it without schemas.

use super::Severity::{self, Difference, Info};

/// What decides whether the connector's value converter wrote what the relay writes.
pub(super) struct Context {
    /// `table.expand.json.payload` is true (`json_payload = "debezium_expanded"`).
    pub expanded: bool,
    /// `value.converter.schemas.enable` (`JsonConverter`'s default: true).
    pub value_schemas: bool,
}

/// Converters that need a schema registry: none can run where outbox-relay is tested.
const REGISTRY_CONVERTERS: &[&str] = &[
    "AvroConverter",
    "ProtobufConverter",
    "JsonSchemaConverter",
    "AvroConverterV2",
];

/// How `option` (a converter, a converter setting, or a `*.handling.mode` /
/// `time.precision.mode` option of the connector) compares, and why; `None` if it is none of
/// those.
pub(super) fn reason(option: &str, value: &str, context: &Context) -> Option<(Severity, String)> {
    let simple = value.rsplit('.').next().unwrap_or(value).trim();
    let value = value.trim();
    let setting = |prefix: &str| option.strip_prefix(prefix);
    Some(match option {
        "key.converter" | "value.converter" => converter(option, value, simple, context),
        "header.converter" => match simple {
            "SimpleHeaderConverter" => (Info, "not needed: outbox-relay writes header placements as Kafka Connect's SimpleHeaderConverter does".into()),
            _ => (Difference, format!(
                "{value}: outbox-relay writes header placements as Kafka Connect's default SimpleHeaderConverter does (booleans true/false, bytea as base64, ...), not as {simple}: check your consumers"
            )),
        },
        "value.converter.schemas.enable" | "key.converter.schemas.enable" => {
            match super::boolean(value) {
                Some(false) => (Info, "no Kafka Connect schemas: outbox-relay writes none either".into()),
                _ => (Difference, format!("{value}: not supported: Kafka Connect schemas (the {{\"schema\":...,\"payload\":...}} wrapper); outbox-relay writes none")),
            }
        }
        _ if setting("key.converter.").or_else(|| setting("value.converter.")).or_else(|| setting("header.converter.")).is_some() => {
            (Difference, "converter setting (a schema registry, ...): not supported; outbox-relay publishes the columns' text without a converter".into())
        }
        "binary.handling.mode" if value.eq_ignore_ascii_case("bytes") => {
            (Info, "not needed: outbox-relay publishes a bytea key or payload as its bytes, and a placed bytea column as base64 (as Kafka Connect's converters write bytes)".into())
        }
        "binary.handling.mode" => (Difference, format!(
            "{value}: Debezium wrote bytea as {value} text; outbox-relay publishes a bytea key or payload as its bytes (bytea_format = \"raw\") or as PostgreSQL's hex text \\x... (bytea_format = \"hex\"), and a placed bytea column as base64 (or that hex text): check your consumers"
        )),
        "time.precision.mode" if value.eq_ignore_ascii_case("adaptive") => {
            (Info, "not needed: outbox-relay places timestamps, dates and times as Debezium's adaptive mode gives them".into())
        }
        "time.precision.mode" => (Difference, format!(
            "{value}: outbox-relay places timestamps, dates and times as Debezium's default adaptive mode gives them (timestamp as microseconds since 1970, date as days, time as microseconds since midnight, timestamptz as ISO 8601 in UTC), not as {value}: check your consumers"
        )),
        "decimal.handling.mode" => (Difference, format!(
            "{value}: outbox-relay places a numeric column as PostgreSQL prints it, in a header as text and in the envelope as a JSON number (Debezium's precise mode wrote base64 bytes there, string mode a JSON string, double mode a rounded float): check your consumers"
        )),
        _ => return None,
    })
}

fn converter(option: &str, value: &str, simple: &str, context: &Context) -> (Severity, String) {
    let what = if option == "key.converter" {
        "key (aggregate id)"
    } else {
        "payload"
    };
    match simple {
        "StringConverter" => (Info, format!("not needed: outbox-relay writes the {what} text too")),
        "JsonConverter" if option == "value.converter" && context.expanded && !context.value_schemas => (
            Info,
            "with table.expand.json.payload and schemas.enable=false, the same bytes as json_payload = \"debezium_expanded\" writes".into(),
        ),
        "JsonConverter" if context.value_schemas && option == "value.converter" => (
            Difference,
            "not supported with schemas.enable=true (JsonConverter's default): Debezium wrote a {\"schema\":...,\"payload\":...} wrapper, outbox-relay writes no Kafka Connect schemas".into(),
        ),
        "JsonConverter" => (Difference, format!(
            "Debezium wrote the {what} as a JSON string (quoted and escaped; in the envelope too), where outbox-relay writes its text (a json or jsonb payload in the envelope as JSON): check your consumers"
        )),
        "BinaryDataConverter" | "ByteArrayConverter" => (Info, format!(
            "not needed: outbox-relay publishes a bytea {what} as its bytes (bytea_format = \"raw\", the default), and a text one as its text"
        )),
        _ if REGISTRY_CONVERTERS.contains(&simple) => (Difference, format!(
            "{value}: not supported: Avro, Protobuf and JSON Schema with a schema registry; outbox-relay registers no schemas and writes the {what} as it is stored (a bytea as its bytes), because no schema registry can be run to test against"
        )),
        _ => (Difference, format!("{value}: outbox-relay publishes the {what} text as PostgreSQL prints it, without a converter")),
    }
}
