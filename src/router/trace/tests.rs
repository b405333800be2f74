use bytes::Bytes;

use super::{is_valid_traceparent, is_valid_tracestate, java_properties};
use crate::config::{OutboxColumns, PipelineConfig};
use crate::lsn::Lsn;
use crate::router::Router;
use crate::source::outbox::{ColumnValue, OutboxEvent, ValueKind};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn traceparent_validation_follows_w3c_trace_context() {
    assert!(is_valid_traceparent(PARENT.as_bytes()));
    // A later version may add fields after the flags.
    assert!(is_valid_traceparent(
        b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
    ));
    for bad in [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
    ] {
        assert!(!is_valid_traceparent(bad.as_bytes()), "{bad:?}");
    }
    assert!(is_valid_tracestate(
        b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    ));
    assert!(!is_valid_tracestate(b"a=1\nb=2"));
    assert!(!is_valid_tracestate(&[b'a'; 513]));
}

#[test]
fn java_properties_as_properties_store_writes_them() {
    let text = "#Sun Dec 06 11:26:51 UTC 2026\ntraceparent=00-ab\\\n  cd\ntracestate=congo\\=t61,rojo\\=1\n! comment\nkey : value\\u0041\n";
    assert_eq!(
        java_properties(text),
        vec![
            ("traceparent".to_owned(), "00-abcd".to_owned()),
            ("tracestate".to_owned(), "congo=t61,rojo=1".to_owned()),
            ("key".to_owned(), "valueA".to_owned()),
        ]
    );
}

fn router(columns: OutboxColumns) -> Router {
    Router::new(&PipelineConfig {
        columns,
        ..PipelineConfig::test_pipeline()
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

fn event(columns: &[Option<&str>]) -> OutboxEvent {
    OutboxEvent {
        id: Bytes::from_static(b"e-1"),
        aggregate_type: Bytes::from_static(b"Order"),
        aggregate_id: Some(Bytes::from_static(b"o-1")),
        aggregate_id_kind: ValueKind::Text,
        event_type: Some(Bytes::from_static(b"Created")),
        payload: Some(Bytes::from_static(b"{}")),
        headers: Some(Bytes::from_static(
            br#"{"traceparent":"forged","TraceState":"forged","x":"y"}"#,
        )),
        routed_by: None,
        payload_kind: ValueKind::Json,
        columns: columns
            .iter()
            .map(|text| ColumnValue {
                text: text.map(|t| Bytes::copy_from_slice(t.as_bytes())),
                kind: ValueKind::Text,
                absent: false,
            })
            .collect(),
        lsn: Lsn(1),
        refused: None,
    }
}

fn headers(router: &Router, event: &OutboxEvent) -> Vec<(String, String)> {
    router
        .route(event, 0)
        .unwrap()
        .headers
        .into_iter()
        .map(|(k, v)| {
            (
                k.into_owned(),
                String::from_utf8(v.unwrap_or_default().to_vec()).unwrap(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn trace_columns_become_the_last_headers_and_row_entries_of_those_names_are_left_out() {
    let router = router(OutboxColumns {
        traceparent: Some("traceparent".into()),
        tracestate: Some("tracestate".into()),
        ..OutboxColumns::default()
    });
    assert_eq!(router.columns(), ["traceparent", "tracestate"]);
    let with = |parent, state| headers(&router, &event(&[parent, state]));
    let base = [("id", "e-1"), ("event_type", "Created"), ("x", "y")];
    let mut expected = base.to_vec();
    expected.extend([("traceparent", PARENT), ("tracestate", "rojo=1")]);
    assert_eq!(with(Some(PARENT), Some("rojo=1")), pairs(&expected));
    // NULL, or not a traceparent: neither header, and the event goes on.
    assert_eq!(with(None, Some("rojo=1")), pairs(&base));
    assert_eq!(with(Some("00-bad"), Some("rojo=1")), pairs(&base));
    // A bad tracestate alone is left out.
    let mut expected = base.to_vec();
    expected.push(("traceparent", PARENT));
    assert_eq!(with(Some(PARENT), Some("a=1\r\nb")), pairs(&expected));
}

#[test]
fn debezium_s_span_context_column_gives_the_headers() {
    let router = router(OutboxColumns {
        tracing_span_context: Some("tracingspancontext".into()),
        ..OutboxColumns::default()
    });
    let context =
        format!("#Sun Dec 06 11:26:51 UTC 2026\ntraceparent={PARENT}\ntracestate=rojo\\=1\n");
    assert_eq!(
        headers(&router, &event(&[Some(&context)])),
        pairs(&[
            ("id", "e-1"),
            ("event_type", "Created"),
            ("x", "y"),
            ("traceparent", PARENT),
            ("tracestate", "rojo=1"),
        ])
    );
}

#[test]
fn trace_columns_are_refused_empty_or_with_message_prefix() {
    let mut config = PipelineConfig::test_pipeline();
    config.columns.traceparent = Some(String::new());
    let e = Router::new(&config).err().unwrap().to_string();
    assert!(e.contains("columns.traceparent: must not be empty"), "{e}");
    config.columns.traceparent = Some("tp".into());
    config.additional_placement = vec![crate::config::AdditionalPlacement {
        field: "tp".into(),
        placement: crate::config::Placement::Header,
        alias: Some("TraceParent".into()),
    }];
    let e = Router::new(&config).err().unwrap().to_string();
    assert!(e.contains("additional_placement[0].alias"), "{e}");
    config.additional_placement.clear();
    config.message_prefix = Some("outbox".into());
    let e = Router::new(&config).err().unwrap().to_string();
    assert!(e.contains("columns.traceparent: cannot be combined"), "{e}");
}
