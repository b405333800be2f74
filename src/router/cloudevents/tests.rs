use bytes::Bytes;

use super::percent_encode;
use crate::config::sink::NatsUrl;
use crate::config::{
    CloudEventsConfig, CloudEventsMode, EmptyPayload, HttpConfig, NatsConfig, NullPayload,
    PipelineConfig, RabbitMqConfig, RedisConfig, SinkConfig, SinkUrl, ValueFormat,
};
use crate::lsn::Lsn;
use crate::router::{RouteError, Router};
use crate::sink::Record;
use crate::source::outbox::{OutboxEvent, ValueKind};

const ID: &str = "6f1c2b0e-8d0a-4c55-9a2e-0c7b1d2e3f40";
/// 2026-12-06T11:26:51.123Z.
const TIME_MS: i64 = 1_796_556_411_123;

fn event(payload: Option<&str>, kind: ValueKind) -> OutboxEvent {
    OutboxEvent {
        id: Bytes::from_static(ID.as_bytes()),
        aggregate_type: Bytes::from_static(b"Order"),
        aggregate_id: Some(Bytes::from_static(b"o-42")),
        aggregate_id_kind: ValueKind::Text,
        event_type: Some(Bytes::from_static(b"OrderCreated")),
        payload: payload.map(|p| Bytes::copy_from_slice(p.as_bytes())),
        headers: Some(Bytes::from_static(
            br#"{"tenant":"acme","ce_id":"forged","Content-Type":"text/html"}"#,
        )),
        routed_by: None,
        payload_kind: kind,
        columns: Vec::new(),
        lsn: Lsn(1),
        refused: None,
    }
}

fn config(mode: CloudEventsMode, sink: SinkConfig) -> PipelineConfig {
    PipelineConfig {
        value_format: ValueFormat::CloudEvents,
        cloudevents: CloudEventsConfig {
            mode,
            ..CloudEventsConfig::default()
        },
        sink,
        ..PipelineConfig::test_pipeline()
    }
}

fn route(config: PipelineConfig, event: &OutboxEvent) -> Record {
    Router::new(&config)
        .unwrap_or_else(|e| panic!("{e}"))
        .route(event, TIME_MS)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn headers(record: &Record) -> Vec<(String, String)> {
    record
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_deref().unwrap_or(b"<null>")).into_owned(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn http() -> SinkConfig {
    SinkConfig::Http(HttpConfig {
        url: SinkUrl("http://127.0.0.1:1/{destination}".into()),
        ..HttpConfig::default()
    })
}

#[test]
fn structured_mode_embeds_a_json_payload_byte_for_byte() {
    // Spacing and member order as PostgreSQL printed them: never parsed and written again.
    let payload = r#"{"b": 1.50, "a": [true, null]}"#;
    let record = route(
        config(CloudEventsMode::Structured, SinkConfig::Kafka),
        &event(Some(payload), ValueKind::Json),
    );
    let expected = format!(
        r#"{{"specversion":"1.0","id":"{ID}","source":"/outbox-relay/app/public.outbox","type":"OrderCreated","subject":"o-42","time":"2026-12-06T11:26:51.123Z","datacontenttype":"application/json","data":{payload}}}"#
    );
    assert_eq!(
        std::str::from_utf8(record.value.as_deref().unwrap()).unwrap(),
        expected
    );
    assert_eq!(record.key.as_deref(), Some(&b"o-42"[..]));
    assert_eq!(
        headers(&record),
        pairs(&[
            ("id", ID),
            ("event_type", "OrderCreated"),
            (
                "content-type",
                "application/cloudevents+json; charset=UTF-8"
            ),
            ("tenant", "acme"),
        ])
    );
}

#[test]
fn structured_mode_puts_bytea_in_data_base64_and_text_in_a_json_string() {
    let config = || config(CloudEventsMode::Structured, SinkConfig::Kafka);
    let bytea = route(config(), &event(Some("\\x0a05ff"), ValueKind::Bytea));
    let value = String::from_utf8(bytea.value.unwrap().to_vec()).unwrap();
    assert!(
        value.ends_with(r#","datacontenttype":"application/octet-stream","data_base64":"CgX/"}"#),
        "{value}"
    );
    let text = route(config(), &event(Some("line \"one\"\n"), ValueKind::Text));
    let value = String::from_utf8(text.value.unwrap().to_vec()).unwrap();
    assert!(
        value.ends_with(
            r#","datacontenttype":"text/plain; charset=utf-8","data":"line \"one\"\n"}"#
        ),
        "{value}"
    );
}

#[test]
fn a_json_data_content_type_makes_a_text_payload_json_data_and_refuses_one_that_is_not() {
    let mut config = config(CloudEventsMode::Structured, SinkConfig::Kafka);
    config.cloudevents.data_content_type = Some("application/vnd.order+json".into());
    config.cloudevents.source = Some("urn:shop:orders".into());
    let record = route(config.clone(), &event(Some("[1, 2]"), ValueKind::Text));
    let value = String::from_utf8(record.value.unwrap().to_vec()).unwrap();
    assert!(value.contains(r#""source":"urn:shop:orders""#), "{value}");
    assert!(
        value.ends_with(r#""datacontenttype":"application/vnd.order+json","data":[1, 2]}"#),
        "{value}"
    );
    let err = Router::new(&config)
        .unwrap()
        .route(&event(Some("not json"), ValueKind::Text), TIME_MS)
        .unwrap_err();
    assert!(
        matches!(&err, RouteError::CloudEvents { reason, .. } if reason.contains("not JSON")),
        "{err}"
    );
}

#[test]
fn an_event_without_data_has_no_data_members_in_structured_mode_and_no_value_in_binary_mode() {
    let mut without_key = event(None, ValueKind::Json);
    without_key.aggregate_id = None;
    let record = route(
        config(CloudEventsMode::Structured, SinkConfig::Kafka),
        &without_key,
    );
    assert_eq!(
        std::str::from_utf8(record.value.as_deref().unwrap()).unwrap(),
        format!(
            r#"{{"specversion":"1.0","id":"{ID}","source":"/outbox-relay/app/public.outbox","type":"OrderCreated","time":"2026-12-06T11:26:51.123Z"}}"#
        )
    );
    let mut config = config(CloudEventsMode::Binary, SinkConfig::Kafka);
    config.empty_payload = EmptyPayload::Tombstone;
    let record = route(config, &event(Some("  "), ValueKind::Text));
    assert_eq!(record.value, None);
    assert!(!headers(&record).iter().any(|(k, _)| k == "content-type"));
}

#[test]
fn binary_mode_on_kafka_has_ce_underscore_headers_and_the_payload_as_the_value() {
    let payload = r#"{"total": 10}"#;
    let record = route(
        config(CloudEventsMode::Binary, SinkConfig::Kafka),
        &event(Some(payload), ValueKind::Json),
    );
    assert_eq!(record.value.as_deref(), Some(payload.as_bytes()));
    assert_eq!(
        headers(&record),
        pairs(&[
            ("id", ID),
            ("event_type", "OrderCreated"),
            ("ce_specversion", "1.0"),
            ("ce_id", ID),
            ("ce_source", "/outbox-relay/app/public.outbox"),
            ("ce_type", "OrderCreated"),
            ("ce_subject", "o-42"),
            ("ce_time", "2026-12-06T11:26:51.123Z"),
            ("content-type", "application/json"),
            ("tenant", "acme"),
        ])
    );
}

#[test]
fn binary_mode_on_http_and_nats_has_ce_dash_headers_percent_encoded() {
    let mut event = event(Some("\\x00ff"), ValueKind::Bytea);
    event.aggregate_id = Some(Bytes::from("o 42 \"€\"".to_owned()));
    let record = route(config(CloudEventsMode::Binary, http()), &event);
    assert_eq!(record.value.as_deref(), Some(&[0x00, 0xff][..]));
    let http = headers(&record);
    assert!(
        http.contains(&("ce-subject".into(), "o%2042%20%22%E2%82%AC%22".into())),
        "{http:?}"
    );
    assert!(http.contains(&("content-type".into(), "application/octet-stream".into())));
    let nats = SinkConfig::Nats(NatsConfig {
        url: NatsUrl("nats://127.0.0.1:4222".into()),
        ..NatsConfig::default()
    });
    let nats = headers(&route(config(CloudEventsMode::Binary, nats), &event));
    assert!(
        nats.contains(&(
            "ce-datacontenttype".into(),
            "application/octet-stream".into()
        )),
        "{nats:?}"
    );
    assert!(nats.contains(&("ce-specversion".into(), "1.0".into())));
    assert!(!nats.iter().any(|(k, _)| k == "content-type"));
}

fn rabbitmq() -> SinkConfig {
    SinkConfig::RabbitMq(RabbitMqConfig {
        url: SinkUrl("amqp://127.0.0.1".into()),
        ..RabbitMqConfig::default()
    })
}

/// An event whose row headers try to pass for AMQP attribute headers, with both separators.
fn forging_amqp(payload: Option<&str>, kind: ValueKind) -> OutboxEvent {
    OutboxEvent {
        headers: Some(Bytes::from_static(
            br#"{"tenant":"acme","cloudEvents_id":"forged","CLOUDEVENTS:type":"forged","content-type":"text/html"}"#,
        )),
        ..event(payload, kind)
    }
}

#[test]
fn binary_mode_on_rabbitmq_has_cloud_events_underscore_headers_and_the_payload_as_the_body() {
    let mut event = forging_amqp(Some(r#"{"total": 10}"#), ValueKind::Json);
    event.aggregate_id = Some(Bytes::from("o 42 \"€\"".to_owned()));
    let record = route(config(CloudEventsMode::Binary, rabbitmq()), &event);
    assert_eq!(record.value.as_deref(), Some(&br#"{"total": 10}"#[..]));
    // Values as they are (AMQP strings, no percent-encoding); `content-type` is the sink's
    // `content_type` property.
    assert_eq!(
        headers(&record),
        pairs(&[
            ("id", ID),
            ("event_type", "OrderCreated"),
            ("cloudEvents_specversion", "1.0"),
            ("cloudEvents_id", ID),
            ("cloudEvents_source", "/outbox-relay/app/public.outbox"),
            ("cloudEvents_type", "OrderCreated"),
            ("cloudEvents_subject", "o 42 \"€\""),
            ("cloudEvents_time", "2026-12-06T11:26:51.123Z"),
            ("content-type", "application/json"),
            ("tenant", "acme"),
        ])
    );
    let without_data = route(
        config(CloudEventsMode::Binary, rabbitmq()),
        &forging_amqp(None, ValueKind::Json),
    );
    assert_eq!(without_data.value, None);
    assert!(!headers(&without_data)
        .iter()
        .any(|(k, _)| k == "content-type"));
}

#[test]
fn structured_mode_on_rabbitmq_has_the_event_format_and_its_media_type_only() {
    let record = route(
        config(CloudEventsMode::Structured, rabbitmq()),
        &forging_amqp(Some(r#"{"total": 10}"#), ValueKind::Json),
    );
    assert_eq!(
        std::str::from_utf8(record.value.as_deref().unwrap()).unwrap(),
        format!(
            r#"{{"specversion":"1.0","id":"{ID}","source":"/outbox-relay/app/public.outbox","type":"OrderCreated","subject":"o-42","time":"2026-12-06T11:26:51.123Z","datacontenttype":"application/json","data":{{"total": 10}}}}"#
        )
    );
    assert_eq!(
        headers(&record),
        pairs(&[
            ("id", ID),
            ("event_type", "OrderCreated"),
            (
                "content-type",
                "application/cloudevents+json; charset=UTF-8"
            ),
            ("tenant", "acme"),
        ])
    );
}

#[test]
fn an_event_without_a_type_is_not_a_cloudevent() {
    let mut event = event(Some("{}"), ValueKind::Json);
    event.event_type = None;
    let err = Router::new(&config(CloudEventsMode::Binary, SinkConfig::Kafka))
        .unwrap()
        .route(&event, TIME_MS)
        .unwrap_err();
    assert!(err.to_string().contains(ID), "{err}");
    assert!(err.to_string().contains("requires a type"), "{err}");
    assert_eq!(err.reason_label(), "cloudevents");
}

#[test]
fn options_that_cannot_make_cloudevents_are_refused_naming_the_field() {
    let refused = |config: PipelineConfig| match Router::new(&config) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    let redis = SinkConfig::Redis(RedisConfig {
        url: SinkUrl("redis://127.0.0.1".into()),
        ..RedisConfig::default()
    });
    assert!(refused(config(CloudEventsMode::Binary, redis)).contains("value_format"));
    let prefixed = SinkConfig::Http(HttpConfig {
        url: SinkUrl("http://127.0.0.1:1/{destination}".into()),
        header_prefix: "CE-".into(),
        ..HttpConfig::default()
    });
    assert!(refused(config(CloudEventsMode::Binary, prefixed)).contains("sink.header_prefix"));
    let mut null = config(CloudEventsMode::Structured, SinkConfig::Kafka);
    null.null_payload = NullPayload::Empty;
    assert!(refused(null).contains("null_payload"));
    let mut unused = PipelineConfig::test_pipeline();
    unused.cloudevents.mode = CloudEventsMode::Binary;
    assert!(refused(unused).contains("cloudevents: only used with"));
    let mut empty = config(CloudEventsMode::Structured, SinkConfig::Kafka);
    empty.cloudevents.source = Some(String::new());
    assert!(refused(empty).contains("cloudevents.source: must not be empty"));
    let mut spaced = config(CloudEventsMode::Structured, SinkConfig::Kafka);
    spaced.cloudevents.source = Some("/my source".into());
    spaced.cloudevents.data_content_type = Some("json".into());
    let e = refused(spaced);
    assert!(
        e.contains("cloudevents.source: \"/my source\" is not a URI-reference"),
        "{e}"
    );
    assert!(
        e.contains("cloudevents.data_content_type: \"json\" is not a media type"),
        "{e}"
    );
}

#[test]
fn the_default_source_percent_encodes_database_schema_and_table() {
    let mut config = config(CloudEventsMode::Structured, SinkConfig::Kafka);
    config.source_url = "postgres://relay@localhost/shop%20db".into();
    config.table = "\"Billing-Prod\".\"Out box\"".parse().unwrap();
    assert_eq!(
        super::default_source(&config),
        "/outbox-relay/shop%20db/Billing-Prod.Out%20box"
    );
}

#[test]
fn percent_encoding_follows_the_http_and_nats_bindings() {
    assert_eq!(
        percent_encode("Euro \u{20ac} \u{1f600}"),
        "Euro%20%E2%82%AC%20%F0%9F%98%80"
    );
    assert_eq!(percent_encode("a%b\"c\td"), "a%25b%22c%09d");
    assert_eq!(percent_encode("/x?y=1&z"), "/x?y=1&z");
}
