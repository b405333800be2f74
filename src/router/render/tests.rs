use bytes::Bytes;

use super::{is_json_number, Unrenderable};
use crate::config::{
    AdditionalPlacement, ByteaFormat, EmptyPayload, PipelineConfig, Placement, ValueFormat,
};
use crate::lsn::Lsn;
use crate::router::{RouteError, Router};
use crate::source::outbox::{ColumnValue, OutboxEvent, ValueKind};

const ID: &str = "00000000-0000-0000-0000-000000000001";

/// An event of a table whose aggregate id and payload are bytea, as PostgreSQL printed them.
fn bytea_event(key: &str, payload: Option<&str>) -> OutboxEvent {
    OutboxEvent {
        id: Bytes::from_static(ID.as_bytes()),
        aggregate_type: Bytes::from_static(b"Blob"),
        aggregate_id: Some(Bytes::copy_from_slice(key.as_bytes())),
        aggregate_id_kind: ValueKind::Bytea,
        event_type: Some(Bytes::from_static(b"Binary")),
        payload: payload.map(|p| Bytes::copy_from_slice(p.as_bytes())),
        headers: None,
        routed_by: None,
        payload_kind: ValueKind::Bytea,
        columns: Vec::new(),
        lsn: Lsn(1),
        refused: None,
    }
}

fn router(config: PipelineConfig) -> Router {
    Router::new(&config).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn bytea_keys_and_payloads_are_raw_bytes() {
    let record = router(PipelineConfig::test_pipeline())
        .route(&bytea_event("\\x00ff10", Some("\\x0a0568656c6c6f1001")), 0)
        .unwrap();
    assert_eq!(record.key.as_deref(), Some(&b"\x00\xff\x10"[..]));
    assert_eq!(record.value.as_deref(), Some(&b"\x0a\x05hello\x10\x01"[..]));
    let empty = router(PipelineConfig::test_pipeline())
        .route(&bytea_event("\\x", Some("\\x")), 0)
        .unwrap();
    assert_eq!(
        empty.key.as_deref(),
        Some(&b""[..]),
        "an empty key is not a null key"
    );
    assert_eq!(
        empty.value.as_deref(),
        Some(&b""[..]),
        "nor an empty value a tombstone"
    );
    // Upper-case digits are hex too.
    let upper = router(PipelineConfig::test_pipeline())
        .route(&bytea_event("\\xABcd", None), 0)
        .unwrap();
    assert_eq!(upper.key.as_deref(), Some(&b"\xab\xcd"[..]));
    assert_eq!(upper.value, None);
}

#[test]
fn bytea_format_hex_keeps_postgresqls_text() {
    let config = PipelineConfig {
        bytea_format: ByteaFormat::Hex,
        ..PipelineConfig::test_pipeline()
    };
    let record = router(config)
        .route(&bytea_event("\\x00ff10", Some("\\x0a05")), 0)
        .unwrap();
    assert_eq!(record.key.as_deref(), Some(&b"\\x00ff10"[..]));
    assert_eq!(record.value.as_deref(), Some(&b"\\x0a05"[..]));
}

#[test]
fn bytea_text_that_is_not_hex_is_an_error_naming_the_column_and_event() {
    for bad in ["00ff", "\\x0", "\\x0g", "\\000", "\\x\u{e9}"] {
        let err = router(PipelineConfig::test_pipeline())
            .route(&bytea_event("\\x00", Some(bad)), 0)
            .unwrap_err();
        assert!(
            matches!(&err, RouteError::Bytea { event_id, column } if event_id == ID && column == "payload"),
            "{bad:?}: {err}"
        );
        let err = router(PipelineConfig::test_pipeline())
            .route(&bytea_event(bad, None), 0)
            .unwrap_err();
        assert!(
            matches!(&err, RouteError::Bytea { column, .. } if column == "aggregate_id"),
            "{bad:?}: {err}"
        );
        assert!(err.to_string().contains(ID), "{err}");
    }
}

#[test]
fn a_bytea_payload_in_the_envelope_is_base64_as_jsonconverter_writes_bytes() {
    let config = PipelineConfig {
        value_format: ValueFormat::Envelope,
        additional_placement: vec![AdditionalPlacement {
            field: "n".into(),
            placement: Placement::Envelope,
            alias: None,
        }],
        ..PipelineConfig::test_pipeline()
    };
    let router = router(config);
    let mut event = bytea_event("\\x00", Some("\\x00ff10"));
    event.columns = vec![ColumnValue {
        text: Some(Bytes::from_static(b"1")),
        kind: ValueKind::Number,
        absent: false,
    }];
    let record = router.route(&event, 0).unwrap();
    assert_eq!(
        record.value.as_deref(),
        Some(&br#"{"payload":"AP8Q","n":1}"#[..])
    );
}

#[test]
fn json_numbers() {
    for good in [
        "0",
        "-1",
        "1.50",
        "1e10",
        "-0.5E-3",
        "123456789012345678901234567890",
    ] {
        assert!(is_json_number(good.as_bytes()), "{good}");
    }
    for bad in [
        "",
        "-",
        "01",
        "1.",
        ".5",
        "1e",
        "NaN",
        "Infinity",
        "-Infinity",
        "1 ",
    ] {
        assert!(!is_json_number(bad.as_bytes()), "{bad}");
    }
}

/// The header value of `text` of `kind`, as UTF-8.
fn header_of(text: &str, kind: ValueKind) -> String {
    let bytes = super::header(
        &Bytes::copy_from_slice(text.as_bytes()),
        kind,
        ByteaFormat::Raw,
    )
    .unwrap_or_else(|e| panic!("{text:?} as {kind:?}: {e:?}"));
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// `text` of `kind` as JSON.
fn json_of(text: &str, kind: ValueKind) -> String {
    let mut out = Vec::new();
    super::push_json(&mut out, text.as_bytes(), kind, ByteaFormat::Raw)
        .unwrap_or_else(|e| panic!("{text:?} as {kind:?}: {e:?}"));
    String::from_utf8(out).unwrap()
}

#[test]
fn booleans_are_true_and_false() {
    assert_eq!(header_of("t", ValueKind::Bool), "true");
    assert_eq!(header_of("f", ValueKind::Bool), "false");
    assert_eq!(json_of("t", ValueKind::Bool), "true");
}

/// PostgreSQL's shortest-exact float text, and what Java's `Double.toString` and
/// `Float.toString` (JDK 19 and later) print for the same value: what Kafka's
/// `SimpleHeaderConverter` and `JsonConverter` (through Jackson) write.
#[test]
fn floats_are_printed_as_java_prints_them() {
    for (pg, java) in [
        ("1e+20", "1.0E20"),
        ("100", "100.0"),
        ("0.1", "0.1"),
        ("-1.5", "-1.5"),
        ("1234567", "1234567.0"),
        ("9999999", "9999999.0"),
        ("10000000", "1.0E7"),
        ("123456789", "1.23456789E8"),
        ("0.001", "0.001"),
        ("0.0001", "1.0E-4"),
        ("1.2345e-05", "1.2345E-5"),
        ("0", "0.0"),
        ("-0", "-0.0"),
        // Java picks the closest of the one- and two-digit decimals that round to the value.
        ("5e-324", "4.9E-324"),
        ("2e+23", "2.0E23"),
        ("1.7976931348623157e+308", "1.7976931348623157E308"),
        ("NaN", "NaN"),
        ("Infinity", "Infinity"),
        ("-Infinity", "-Infinity"),
    ] {
        assert_eq!(header_of(pg, ValueKind::Float8), java, "float8 {pg}");
    }
    for (pg, java) in [
        ("3", "3.0"),
        ("1.1", "1.1"),
        ("16777216", "1.6777216E7"),
        ("3.4028235e+38", "3.4028235E38"),
        ("1e-45", "1.4E-45"),
        ("NaN", "NaN"),
    ] {
        assert_eq!(header_of(pg, ValueKind::Float4), java, "float4 {pg}");
    }
    // In JSON a number, but NaN and the infinities are strings, as Jackson writes them.
    assert_eq!(json_of("1e+20", ValueKind::Float8), "1.0E20");
    assert_eq!(json_of("NaN", ValueKind::Float8), r#""NaN""#);
    assert_eq!(json_of("-Infinity", ValueKind::Float4), r#""-Infinity""#);
}

#[test]
fn timestamptz_is_iso_8601_in_utc_with_the_columns_fractional_digits() {
    for (pg, precision, iso) in [
        ("2026-11-29 22:24:30.5+00", 6, "2026-11-29T22:24:30.500000Z"),
        ("2026-11-29 22:24:30+00", 6, "2026-11-29T22:24:30.000000Z"),
        ("2026-11-29 22:24:30.12+00", 3, "2026-11-29T22:24:30.120Z"),
        ("2026-11-29 22:24:30+00", 0, "2026-11-29T22:24:30Z"),
        (
            "2026-11-30 03:54:30.123456+05:30",
            6,
            "2026-11-29T22:24:30.123456Z",
        ),
        ("0099-01-01 00:00:00+00", 0, "0099-01-01T00:00:00Z"),
        // Debezium passes PostgreSQL's infinities through.
        ("infinity", 6, "infinity"),
        ("-infinity", 6, "-infinity"),
    ] {
        let kind = ValueKind::Timestamptz(precision);
        assert_eq!(header_of(pg, kind), iso, "{pg} ({precision})");
        assert_eq!(
            json_of(pg, kind),
            format!("\"{iso}\""),
            "{pg} ({precision})"
        );
    }
}

#[test]
fn timestamp_date_and_time_are_numbers_since_the_epoch_or_midnight() {
    for (pg, kind, number) in [
        // Microseconds since 1970 for precision 4 to 6, milliseconds for 0 to 3.
        (
            "2026-11-29 23:24:30.123456",
            ValueKind::Timestamp(6),
            "1795994670123456",
        ),
        (
            "2026-11-29 23:24:30.123",
            ValueKind::Timestamp(3),
            "1795994670123",
        ),
        ("1970-01-01 00:00:00", ValueKind::Timestamp(6), "0"),
        ("1969-12-31 23:59:59.5", ValueKind::Timestamp(6), "-500000"),
        ("1969-12-31 23:59:59.5", ValueKind::Timestamp(1), "-500"),
        // Days since 1970.
        ("2026-11-29", ValueKind::Date, "20786"),
        ("1969-12-31", ValueKind::Date, "-1"),
        // Microseconds (or milliseconds) since midnight; PostgreSQL's 24:00:00 is a day.
        ("23:24:30.5", ValueKind::Time(6), "84270500000"),
        ("23:24:30.123", ValueKind::Time(3), "84270123"),
        ("00:00:00", ValueKind::Time(6), "0"),
        ("24:00:00", ValueKind::Time(6), "86400000000"),
    ] {
        assert_eq!(header_of(pg, kind), number, "{pg} as {kind:?}");
        assert_eq!(json_of(pg, kind), number, "{pg} as {kind:?}");
    }
    // What has no such number stays PostgreSQL's text.
    assert_eq!(header_of("infinity", ValueKind::Timestamp(6)), "infinity");
    assert_eq!(json_of("-infinity", ValueKind::Date), r#""-infinity""#);
}

#[test]
fn placed_bytea_is_base64_or_hex_text_when_asked() {
    assert_eq!(header_of("\\x00ff10", ValueKind::Bytea), "AP8Q");
    assert_eq!(header_of("\\x", ValueKind::Bytea), "");
    assert_eq!(json_of("\\x00ff10", ValueKind::Bytea), r#""AP8Q""#);
    let hex = super::header(
        &Bytes::from_static(b"\\x00ff10"),
        ValueKind::Bytea,
        ByteaFormat::Hex,
    )
    .unwrap();
    assert_eq!(&hex[..], b"\\x00ff10");
    assert_eq!(
        super::header(
            &Bytes::from_static(b"00ff"),
            ValueKind::Bytea,
            ByteaFormat::Raw
        ),
        Err(Unrenderable::NotHex)
    );
}

#[test]
fn text_numbers_and_json_are_placed_as_postgresql_prints_them() {
    for (text, kind) in [
        ("1500000.10", ValueKind::Number),
        ("-42", ValueKind::Number),
        (r#"{"a": [1, 2.50]}"#, ValueKind::Json),
        ("1b4e28ba-2fa1-11d2-883f-0016d3cca427", ValueKind::Text),
        ("{1,2}", ValueKind::Text),
    ] {
        assert_eq!(header_of(text, kind), text);
    }
}

/// An event with a text payload `payload`.
fn text_event(payload: Option<&str>) -> OutboxEvent {
    let mut event = bytea_event("\\x6b", payload);
    event.payload_kind = ValueKind::Text;
    event
}

#[test]
fn empty_payload_tombstone_turns_empty_and_blank_text_into_tombstones() {
    let tombstones = |value_format| {
        router(PipelineConfig {
            empty_payload: EmptyPayload::Tombstone,
            value_format,
            ..PipelineConfig::test_pipeline()
        })
    };
    // Java's String.trim removes U+0000 to U+0020, not other white space.
    for (payload, tombstone) in [
        ("", true),
        (" ", true),
        (" \t\r\n\u{b}\u{c}\u{1f} ", true),
        (" x ", false),
        ("\u{a0}", false),
        ("\u{2003}", false),
        ("{}", false),
    ] {
        for format in [ValueFormat::Payload, ValueFormat::Envelope] {
            let value = tombstones(format)
                .route(&text_event(Some(payload)), 0)
                .unwrap()
                .value;
            assert_eq!(
                value.is_none(),
                tombstone,
                "{payload:?} in {format:?}: {value:?}"
            );
        }
    }
    // A zero-length bytea is bytes, not empty text: Debezium checks the payload's text.
    let mut bytea = bytea_event("\\x6b", Some("\\x"));
    bytea.payload_kind = ValueKind::Bytea;
    let value = tombstones(ValueFormat::Payload)
        .route(&bytea, 0)
        .unwrap()
        .value;
    assert_eq!(value.as_deref(), Some(&b""[..]));
    // Without the option an empty payload is a zero-byte value.
    let value = router(PipelineConfig::test_pipeline())
        .route(&text_event(Some("")), 0)
        .unwrap()
        .value;
    assert_eq!(value.as_deref(), Some(&b""[..]));
}

#[test]
fn placements_of_a_missing_column_are_left_out_with_missing_placement_column_ignore() {
    use crate::config::{MissingPlacementColumn, RouteConfig};
    let place = |field: &str, placement, alias: Option<&str>| AdditionalPlacement {
        field: field.into(),
        placement,
        alias: alias.map(str::to_owned),
    };
    let config = PipelineConfig {
        route: RouteConfig {
            topic_template: "${column:tenant}.events".into(),
            ..RouteConfig::default()
        },
        additional_placement: vec![
            place("tenant", Placement::Header, None),
            place("region", Placement::Header, None),
            place("region", Placement::Envelope, Some("r")),
            place("tenant", Placement::Envelope, None),
            place("shard", Placement::Partition, None),
        ],
        value_format: ValueFormat::Envelope,
        missing_placement_column: MissingPlacementColumn::Ignore,
        ..PipelineConfig::test_pipeline()
    };
    let router = router(config.clone());
    // The template needs tenant whatever the placements may lack.
    assert_eq!(router.optional_columns(), ["region", "region", "shard"]);
    let mut event = text_event(Some(r#"{"n": 1}"#));
    event.payload_kind = ValueKind::Json;
    event.columns = router
        .columns()
        .iter()
        .map(|name| ColumnValue {
            text: (name == "tenant").then(|| Bytes::from_static(b"acme")),
            kind: ValueKind::Text,
            absent: name != "tenant",
        })
        .collect();
    let record = router.route(&event, 0).unwrap();
    let names: Vec<&str> = record.headers.iter().map(|(k, _)| k.as_ref()).collect();
    assert_eq!(names, ["id", "event_type", "tenant"]);
    assert_eq!(
        record.value.as_deref(),
        Some(&br#"{"payload":{"n": 1},"tenant":"acme"}"#[..])
    );
    assert_eq!(record.partition, None);
    // By default every placement's column is required.
    let strict = Router::new(&PipelineConfig {
        missing_placement_column: MissingPlacementColumn::Error,
        ..config
    })
    .unwrap();
    assert!(strict.optional_columns().is_empty());
}
