use bytes::Bytes;

use super::is_json_number;
use crate::config::{AdditionalPlacement, ByteaFormat, PipelineConfig, Placement, ValueFormat};
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
