use super::*;
use crate::lsn::Lsn;
use crate::source::outbox::ValueKind;

fn event(aggregate_type: &str) -> OutboxEvent {
    OutboxEvent {
        id: Bytes::from_static(b"00000000-0000-0000-0000-000000000001"),
        aggregate_type: Bytes::copy_from_slice(aggregate_type.as_bytes()),
        aggregate_id: Some(Bytes::from_static(b"42")),
        aggregate_id_kind: ValueKind::Text,
        event_type: Some(Bytes::from_static(b"CreditDisbursed")),
        payload: Some(Bytes::from_static(b"{\"amount\": 1500000.10}")),
        headers: Some(Bytes::from_static(b"{}")),
        routed_by: None,
        payload_kind: ValueKind::Json,
        columns: Vec::new(),
        lsn: Lsn(1),
        refused: None,
    }
}

#[test]
fn routes_by_aggregate_type_preserving_case_and_bytes() {
    let record = Router::default().route(&event("Order"), 1234).unwrap();
    assert_eq!(record.topic, "Order.events");
    assert_eq!(record.key.as_deref(), Some(&b"42"[..]));
    assert_eq!(
        record.value.as_deref(),
        Some(&b"{\"amount\": 1500000.10}"[..])
    );
    assert_eq!(
        record.headers,
        vec![
            (
                Cow::Borrowed("id"),
                Some(Bytes::from_static(b"00000000-0000-0000-0000-000000000001"))
            ),
            (
                Cow::Borrowed("event_type"),
                Some(Bytes::from_static(b"CreditDisbursed"))
            ),
        ]
    );
    assert_eq!(record.timestamp_ms, Some(1234));
}

#[test]
fn row_headers_follow_in_order_with_json_text_for_non_strings() {
    let mut e = event("Order");
    e.headers = Some(Bytes::from_static(
        br#"{"n": 12.50, "id": "spoofed", "trace": "t-\"1\" \u00e9", "none": null, "obj": {"a": [1, 2]}}"#,
    ));
    let record = Router::default().route(&e, 0).unwrap();
    let headers: Vec<(&str, Option<&[u8]>)> = record
        .headers
        .iter()
        .map(|(k, v)| (k.as_ref(), v.as_deref()))
        .collect();
    assert_eq!(
        headers,
        vec![
            ("id", Some(&b"00000000-0000-0000-0000-000000000001"[..])),
            ("event_type", Some(&b"CreditDisbursed"[..])),
            ("n", Some(&b"12.50"[..])),
            ("trace", Some("t-\"1\" é".as_bytes())),
            ("none", None),
            ("obj", Some(&br#"{"a": [1, 2]}"#[..])),
        ]
    );
}

#[test]
fn headers_that_are_not_an_object_are_an_error_naming_the_event() {
    for bad in [&b"[1]"[..], b"\"x\"", b"{\"a\": ", b"{} trailing"] {
        let mut e = event("Order");
        e.headers = Some(Bytes::copy_from_slice(bad));
        let err = Router::default().route(&e, 0).unwrap_err();
        assert!(
            matches!(&err, RouteError::Headers { event_id, .. } if event_id == "00000000-0000-0000-0000-000000000001"),
            "{err}"
        );
    }
}

#[test]
fn templates_case_and_route_by_field() {
    let router = |template: &str, case| {
        with(
            RouteConfig {
                by_field: None,
                topic_template: template.into(),
                topic_case: case,
                topic_regex: None,
                allowed_destinations: None,
            },
            None,
            pipeline(),
        )
    };
    assert_eq!(
        router("outbox.${routedByValue}", TopicCase::Lower)
            .route(&event("OrderLine"), 0)
            .unwrap()
            .topic,
        "outbox.orderline"
    );
    assert_eq!(
        router("${routedByValue}-v1", TopicCase::Upper)
            .route(&event("order"), 0)
            .unwrap()
            .topic,
        "ORDER-v1"
    );
    assert_eq!(
        router("all.events", TopicCase::Preserve)
            .route(&event("x"), 0)
            .unwrap()
            .topic,
        "all.events"
    );
    let mut e = event("Order");
    e.routed_by = Some(Bytes::from_static(b"tenant-7"));
    assert_eq!(
        Router::default().route(&e, 0).unwrap().topic,
        "tenant-7.events"
    );
    let kelvin = router("${routedByValue}", TopicCase::Lower).route(&event("\u{212A}unde"), 0);
    assert!(
        kelvin.is_err(),
        "a non-ASCII name must not fold into a legal one"
    );
    let mut e = event("Order");
    e.routed_by = Some(Bytes::new());
    assert!(
        matches!(
            Router::default().route(&e, 0),
            Err(RouteError::IllegalTopic { .. })
        ),
        "an empty routing value is bad input"
    );
}

#[test]
fn null_payload_is_a_tombstone_and_null_id_a_null_key() {
    let mut e = event("order");
    e.payload = None;
    e.aggregate_id = None;
    let record = Router::default().route(&e, 0).unwrap();
    assert_eq!(record.value, None);
    assert_eq!(record.key, None);
}

#[test]
fn illegal_topic_names_are_errors_naming_the_event() {
    for bad in ["", "has space", "ünicode", "a/b", &"x".repeat(250)] {
        let err = Router::default().route(&event(bad), 0).unwrap_err();
        assert!(
            matches!(&err, RouteError::IllegalTopic { event_id, value, .. } if event_id == "00000000-0000-0000-0000-000000000001" && value == bad)
        );
        assert!(err
            .to_string()
            .contains("00000000-0000-0000-0000-000000000001"));
    }
    assert!(validate_topic("..").is_err());
    assert!(validate_topic("a-b_c.D9").is_ok());
}

#[test]
fn the_sink_kind_decides_which_topics_are_legal() {
    let mut config = pipeline();
    config.sink = crate::config::SinkConfig::Nats(Default::default());
    let nats = Router::new(&config).unwrap();
    // Legal for Kafka, not a NATS subject (an empty token), and the other way round.
    assert!(Router::default().route(&event("a..b"), 0).is_ok());
    let err = nats.route(&event("a..b"), 0).unwrap_err();
    assert!(
        err.to_string()
            .contains("not a legal NATS subject: a token is empty"),
        "{err}"
    );
    assert_eq!(
        nats.route(&event("Bestellung:ü"), 0).unwrap().topic,
        "Bestellung:ü.events"
    );
    for bad in ["a b", "*", "a.>", "$JS.API"] {
        assert!(
            matches!(
                nats.route(&event(bad), 0),
                Err(RouteError::IllegalTopic {
                    noun: "NATS subject",
                    ..
                })
            ),
            "{bad:?} passed"
        );
    }
    // At start: the template's literal parts and the dead-letter subject.
    config.route.topic_template = "events.>.${routedByValue}".into();
    config.on_bad_event = crate::config::OnBadEvent::DeadLetter;
    config.dead_letter_topic = Some("dead letters".into());
    let problems = Router::new(&config).unwrap_err().0;
    let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        ["route.topic_template", "dead_letter_topic"],
        "{problems:?}"
    );
    assert!(
        problems[0].problem.contains("gives no legal NATS subject"),
        "{problems:?}"
    );
}

#[test]
fn the_sink_kind_decides_which_destinations_are_legal() {
    let mut config = pipeline();
    config.sink = SinkConfig::Http(crate::config::HttpConfig {
        url: crate::config::SinkUrl("https://h/hooks/{destination}".into()),
        ..Default::default()
    });
    let router = Router::new(&config).unwrap();
    let record = router.route(&event("has space/ünicode"), 0).unwrap();
    assert_eq!(record.topic, "has space/ünicode.events");
    let err = router.route(&event("tab\there"), 0).unwrap_err();
    assert!(
        matches!(
            &err,
            RouteError::IllegalTopic {
                noun: "webhook destination",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("00000000-0000-0000-0000-000000000001"),
        "{err}"
    );
    // Kafka's rules for Kafka.
    let err = Router::default().route(&event("has space"), 0).unwrap_err();
    assert!(
        err.to_string().contains("not a legal Kafka topic name"),
        "{err}"
    );
}

use crate::config::{AdditionalPlacement, RouteConfig};

/// A pipeline with the default routing and record options.
fn pipeline() -> PipelineConfig {
    PipelineConfig::test_pipeline()
}

/// The router of `config` with `route` and the timestamp column `timestamp`.
fn with(route: RouteConfig, timestamp: Option<&str>, mut config: PipelineConfig) -> Router {
    config.route = route;
    config.columns.timestamp = timestamp.map(str::to_owned);
    Router::new(&config).unwrap_or_else(|e| panic!("{e}"))
}

fn route(template: &str, regex: Option<&str>) -> RouteConfig {
    RouteConfig {
        topic_template: template.into(),
        topic_regex: regex.map(str::to_owned),
        ..RouteConfig::default()
    }
}

fn placement(field: &str, placement: Placement, alias: Option<&str>) -> AdditionalPlacement {
    AdditionalPlacement {
        field: field.into(),
        placement,
        alias: alias.map(str::to_owned),
    }
}

/// `event` with extra column values for `router`'s columns, by name.
fn with_columns(
    router: &Router,
    mut e: OutboxEvent,
    values: &[(&str, Option<&str>, ValueKind)],
) -> OutboxEvent {
    e.columns = router
        .columns()
        .iter()
        .map(|name| {
            let (_, text, kind) = values
                .iter()
                .find(|(n, _, _)| n == name)
                .unwrap_or_else(|| panic!("no test value for column {name}"));
            ColumnValue {
                text: text.map(|t| Bytes::copy_from_slice(t.as_bytes())),
                kind: *kind,
                absent: false,
            }
        })
        .collect();
    e
}

const ID: &str = "00000000-0000-0000-0000-000000000001";

#[test]
fn timestamp_column_sets_the_record_time_and_null_falls_back_to_the_commit_time() {
    let router = with(RouteConfig::default(), Some("created_at"), pipeline());
    assert_eq!(router.columns(), ["created_at"]);
    let cases = [
        (Some("2026-11-29 23:24:30.123456+00"), 1_795_994_670_123),
        (Some("2026-11-29 23:24:30+00"), 1_795_994_670_000),
        (Some("2026-11-30 04:54:30.5+05:30"), 1_795_994_670_500),
        (Some("2026-11-29 20:24:30.123-03"), 1_795_994_670_123),
        (Some("2026-11-29T23:24:30.123456+00:00"), 1_795_994_670_123),
        // timestamp without time zone: UTC.
        (Some("2026-11-29 23:24:30.123456"), 1_795_994_670_123),
        (Some("1970-01-01 05:53:28+05:53:28"), 0),
        (None, 42),
    ];
    for (text, expected) in cases {
        let e = with_columns(
            &router,
            event("Order"),
            &[("created_at", text, ValueKind::Text)],
        );
        assert_eq!(
            router.route(&e, 42).unwrap().timestamp_ms,
            Some(expected),
            "{text:?}"
        );
    }
    for bad in [
        "infinity",
        "2026-11-29",
        "29/11/2026 23:24:30",
        "2026-11-29 23:24:30+00 BC",
        "",
        // Kafka refuses timestamps before 1970.
        "1969-12-31 23:59:59.999+00",
    ] {
        let e = with_columns(
            &router,
            event("Order"),
            &[("created_at", Some(bad), ValueKind::Text)],
        );
        let err = router.route(&e, 42).unwrap_err();
        assert!(
            matches!(&err, RouteError::Timestamp { event_id, column, value } if event_id == ID && column == "created_at" && value == bad),
            "{err}"
        );
        assert_eq!(err.reason_label(), "timestamp");
    }
}

/// A `route.topic_regex` with a group named `routedByValue` gives `${routedByValue}` that
/// group, as Debezium's `route.topic.regex` does; without one it is the whole value.
#[test]
fn a_routed_by_value_group_of_the_regex_is_what_routed_by_value_stands_for() {
    let router = with(
        route(
            "outbox.event.${routedByValue}",
            Some(r"(?<routedByValue>[a-z]+)_v[0-9]+"),
        ),
        None,
        pipeline(),
    );
    assert_eq!(
        router.route(&event("order_v2"), 0).unwrap().topic,
        "outbox.event.order"
    );
    // A group that took no part in the match is empty, as any group is (and as in Java).
    let optional = with(
        route(
            "outbox.${routedByValue}events",
            Some(r"(?:(?<routedByValue>[a-z]+)\.)?[0-9]+"),
        ),
        None,
        pipeline(),
    );
    assert_eq!(
        optional.route(&event("42"), 0).unwrap().topic,
        "outbox.events"
    );
}

#[test]
fn topic_regex_groups_by_name_and_number_after_the_case() {
    let router = with(
        route(
            "${domain}.${2}.events",
            Some(r"(?P<domain>[a-z]+)_(v[0-9]+)"),
        ),
        None,
        pipeline(),
    );
    assert_eq!(
        router.route(&event("billing_v2"), 0).unwrap().topic,
        "billing.v2.events"
    );
    let lower = with(
        RouteConfig {
            topic_case: TopicCase::Lower,
            ..route("${routedByValue}-${kind}", Some("(?P<kind>[a-z]+)"))
        },
        None,
        pipeline(),
    );
    assert_eq!(
        lower.route(&event("Order"), 0).unwrap().topic,
        "order-order"
    );
    // The whole value must match: the regex is anchored.
    for bad in ["billing_v2x", "billing_v2_v3", "Billing_v2"] {
        let err = router.route(&event(bad), 0).unwrap_err();
        assert!(
            matches!(&err, RouteError::RegexMismatch { event_id, value, .. } if event_id == ID && value == bad),
            "{err}"
        );
        assert!(err.to_string().contains(bad));
        assert_eq!(err.reason_label(), "topic_regex");
    }
    // A group that takes no part in the match is empty, and an empty topic is illegal.
    let optional = with(route("${1}", Some("(a)?b")), None, pipeline());
    assert!(matches!(
        optional.route(&event("b"), 0),
        Err(RouteError::IllegalTopic { .. })
    ));
    // Group placeholders need the regex and an existing group.
    let none = Router::new(&PipelineConfig {
        route: route("${x}.events", None),
        ..pipeline()
    });
    assert!(none.unwrap_err().to_string().contains("route.topic_regex"));
    let missing = Router::new(&PipelineConfig {
        route: route("${3}", Some("(a)(b)")),
        ..pipeline()
    });
    assert!(missing.unwrap_err().to_string().contains("${3}"));
}

#[test]
fn column_placeholders_insert_the_column_text_and_null_or_missing_is_bad_input() {
    let router = with(
        route(
            "${column:tenant_id}.${routedByValue}.${column:tenant_id}",
            None,
        ),
        None,
        pipeline(),
    );
    assert_eq!(router.columns(), ["tenant_id"], "a column is carried once");
    let e = with_columns(
        &router,
        event("Order"),
        &[("tenant_id", Some("acme"), ValueKind::Text)],
    );
    assert_eq!(router.route(&e, 0).unwrap().topic, "acme.Order.acme");
    let e = with_columns(
        &router,
        event("Order"),
        &[("tenant_id", None, ValueKind::Text)],
    );
    let err = router.route(&e, 0).unwrap_err();
    assert_eq!(
        err,
        RouteError::TemplateColumn {
            event_id: ID.into(),
            column: "tenant_id".into(),
            problem: "NULL"
        }
    );
    assert_eq!(err.reason_label(), "template_column");
    // A logical decoding message carries no columns.
    let err = router.route(&event("Order"), 0).unwrap_err();
    assert!(
        matches!(
            err,
            RouteError::TemplateColumn {
                problem: "missing",
                ..
            }
        ),
        "{err}"
    );
    // A column value that makes an illegal topic is bad input like the routing value.
    let e = with_columns(
        &router,
        event("Order"),
        &[("tenant_id", Some("a b"), ValueKind::Text)],
    );
    assert!(matches!(
        router.route(&e, 0),
        Err(RouteError::IllegalTopic { .. })
    ));
}

#[test]
fn template_parsing() {
    assert!(Template::parse("${routedByValue")
        .unwrap_err()
        .contains("unclosed"));
    assert!(Template::parse("${column:}").is_err());
    assert!(Template::parse("${a-b}")
        .unwrap_err()
        .contains("unknown placeholder"));
    let t = Template::parse("t.${column:c}.${routedByValue}.${g}.${1}").unwrap();
    assert_eq!(t.sample(), "t.x.x.x.x");
    assert_eq!(t.columns().collect::<Vec<_>>(), ["c"]);
}

#[test]
fn header_placements_follow_the_other_headers_with_null_as_a_null_value() {
    let record = PipelineConfig {
        additional_placement: vec![
            placement("tenant_id", Placement::Header, Some("tenant")),
            placement("region", Placement::Header, None),
        ],
        ..pipeline()
    };
    let router = with(RouteConfig::default(), None, record);
    let mut e = with_columns(
        &router,
        event("Order"),
        &[
            ("tenant_id", Some("acme"), ValueKind::Text),
            ("region", None, ValueKind::Text),
        ],
    );
    e.headers = Some(Bytes::from_static(br#"{"trace": "t-1"}"#));
    let headers: Vec<(String, Option<Vec<u8>>)> = router
        .route(&e, 0)
        .unwrap()
        .headers
        .into_iter()
        .map(|(k, v)| (k.into_owned(), v.map(|v| v.to_vec())))
        .collect();
    assert_eq!(
        headers,
        vec![
            ("id".into(), Some(ID.as_bytes().to_vec())),
            ("event_type".into(), Some(b"CreditDisbursed".to_vec())),
            ("trace".into(), Some(b"t-1".to_vec())),
            ("tenant".into(), Some(b"acme".to_vec())),
            ("region".into(), None),
        ]
    );
}

#[test]
fn partition_placement_takes_a_non_negative_integer_and_null_partitions_by_key() {
    let record = PipelineConfig {
        additional_placement: vec![placement("shard", Placement::Partition, None)],
        ..pipeline()
    };
    let router = with(RouteConfig::default(), None, record);
    for (text, expected) in [(Some("3"), Some(3)), (Some("0"), Some(0)), (None, None)] {
        let e = with_columns(
            &router,
            event("Order"),
            &[("shard", text, ValueKind::Number)],
        );
        assert_eq!(router.route(&e, 0).unwrap().partition, expected);
    }
    for bad in ["-1", "1.5", "x", "2147483648", ""] {
        let e = with_columns(
            &router,
            event("Order"),
            &[("shard", Some(bad), ValueKind::Number)],
        );
        let err = router.route(&e, 0).unwrap_err();
        assert!(
            matches!(&err, RouteError::Partition { event_id, column, value } if event_id == ID && column == "shard" && value == bad),
            "{err}"
        );
        assert_eq!(err.reason_label(), "partition");
    }
    assert_eq!(
        Router::default()
            .route(&event("Order"), 0)
            .unwrap()
            .partition,
        None
    );
}

fn envelope_router(null_payload: NullPayload) -> Router {
    with(
        RouteConfig::default(),
        None,
        PipelineConfig {
            additional_placement: vec![
                placement("tenant_id", Placement::Envelope, Some("tenant")),
                placement("meta", Placement::Envelope, None),
                placement("amount", Placement::Envelope, None),
                placement("ratio", Placement::Envelope, None),
                placement("active", Placement::Envelope, None),
                placement("note", Placement::Envelope, None),
            ],
            value_format: ValueFormat::Envelope,
            null_payload,
            ..pipeline()
        },
    )
}

fn envelope_event(router: &Router, payload: Option<&str>, kind: ValueKind) -> OutboxEvent {
    let mut e = with_columns(
        router,
        event("Order"),
        &[
            ("tenant_id", Some("ac\"me"), ValueKind::Text),
            ("meta", Some(r#"{"a": [1, 2.50]}"#), ValueKind::Json),
            ("amount", Some("1500000.10"), ValueKind::Number),
            ("ratio", Some("NaN"), ValueKind::Number),
            ("active", Some("t"), ValueKind::Bool),
            ("note", None, ValueKind::Text),
        ],
    );
    e.payload = payload.map(|p| Bytes::copy_from_slice(p.as_bytes()));
    e.payload_kind = kind;
    e
}

#[test]
fn envelope_embeds_json_verbatim_and_other_values_as_valid_json() {
    let router = envelope_router(NullPayload::Tombstone);
    let payload = r#"{"amount": 1500000.10, "s": "é"}"#;
    let value = router
        .route(&envelope_event(&router, Some(payload), ValueKind::Json), 0)
        .unwrap()
        .value
        .unwrap();
    let expected = r#"{"payload":{"amount": 1500000.10, "s": "é"},"tenant":"ac\"me","meta":{"a": [1, 2.50]},"amount":1500000.10,"ratio":"NaN","active":true,"note":null}"#;
    assert_eq!(std::str::from_utf8(&value).unwrap(), expected);
    serde_json::from_slice::<serde_json::Value>(&value).expect("valid JSON");
    // A text payload is a JSON string.
    let value = router
        .route(
            &envelope_event(&router, Some("plain \"text\""), ValueKind::Text),
            0,
        )
        .unwrap()
        .value
        .unwrap();
    assert!(
        value.starts_with(br#"{"payload":"plain \"text\"","tenant""#),
        "{value:?}"
    );
    // A NULL payload is still a tombstone.
    let record = router
        .route(&envelope_event(&router, None, ValueKind::Json), 0)
        .unwrap();
    assert_eq!(record.value, None);
    // Text that is not UTF-8 cannot be a JSON string.
    let mut e = envelope_event(&router, Some("x"), ValueKind::Text);
    e.payload = Some(Bytes::from_static(b"\xff"));
    assert!(matches!(
        router.route(&e, 0),
        Err(RouteError::NotUtf8 { column, .. }) if column == "payload"
    ));
}

#[test]
fn null_payload_empty_gives_a_zero_byte_value_in_both_formats() {
    let mut e = event("Order");
    e.payload = None;
    let empty = with(
        RouteConfig::default(),
        None,
        PipelineConfig {
            null_payload: NullPayload::Empty,
            ..pipeline()
        },
    );
    assert_eq!(empty.route(&e, 0).unwrap().value, Some(Bytes::new()));
    let router = envelope_router(NullPayload::Empty);
    let record = router
        .route(&envelope_event(&router, None, ValueKind::Json), 0)
        .unwrap();
    assert_eq!(record.value, Some(Bytes::new()));
    assert_eq!(
        Router::default().route(&e, 0).unwrap().value,
        None,
        "default: tombstone"
    );
}

#[test]
fn null_payload_json_null_keeps_the_envelope_as_debezium_does() {
    let router = envelope_router(NullPayload::JsonNull);
    let record = router
        .route(&envelope_event(&router, None, ValueKind::Json), 0)
        .unwrap();
    let value = record.value.expect("not a tombstone");
    assert!(value.starts_with(b"{\"payload\":null,"), "{value:?}");
    let parsed: serde_json::Value = serde_json::from_slice(&value).unwrap();
    assert!(parsed["payload"].is_null());
    let mut e = event("Order");
    e.payload = None;
    let plain = with(
        RouteConfig::default(),
        None,
        PipelineConfig {
            null_payload: NullPayload::JsonNull,
            ..pipeline()
        },
    );
    assert_eq!(
        plain.route(&e, 0).unwrap().value.as_deref(),
        Some(&b"null"[..])
    );
}

/// A pipeline with a bare `${routedByValue}` template, dead-lettering to `outbox.dlq`.
fn bare_template(exactly_once: bool) -> PipelineConfig {
    let mut config = pipeline();
    config.route = route("${routedByValue}", None);
    config.on_bad_event = crate::config::OnBadEvent::DeadLetter;
    config.dead_letter_topic = Some("outbox.dlq".into());
    if exactly_once {
        config.exactly_once = true;
        config.checkpoint_topic = Some("relay.checkpoints".into());
    }
    config
}

/// An HTTP dead-letter URL of its own is reserved by the request URL too: the destination that
/// renders to it is refused, however it is spelled in the URL. (Only the URL string itself was
/// reserved, which no destination equals.)
#[test]
fn no_destination_renders_to_the_http_dead_letter_url() {
    let mut config = bare_template(false);
    config.sink = SinkConfig::Http(crate::config::HttpConfig {
        url: crate::config::SinkUrl("https://h/hooks/{destination}?v=1".into()),
        ..Default::default()
    });
    config.dead_letter_topic = Some("https://h/hooks/dead%20letters?v=1".into());
    let router = Router::new(&config).unwrap();
    let error = router.route(&event("dead letters"), 0).unwrap_err();
    assert!(
        matches!(
            &error,
            RouteError::Reserved {
                field: "dead_letter_topic",
                ..
            }
        ),
        "{error:?}"
    );
    assert!(router.route(&event("orders"), 0).is_ok());
}

#[test]
fn a_bare_template_never_reaches_the_dead_letter_or_checkpoint_topics() {
    let router = Router::new(&bare_template(true)).unwrap();
    for (value, field) in [
        ("outbox.dlq", "dead_letter_topic"),
        ("relay.checkpoints", "checkpoint_topic"),
        // The default checkpoint topic, which the relays of a cluster share.
        ("outbox-relay.checkpoints", "checkpoint_topic"),
    ] {
        let error = router.route(&event(value), 0).unwrap_err();
        assert_eq!(
            error,
            RouteError::Reserved {
                event_id: "00000000-0000-0000-0000-000000000001".into(),
                destination: value.into(),
                field,
            }
        );
        assert_eq!(error.reason_label(), "reserved_destination");
        assert_eq!(
            error.to_string(),
            format!("event 00000000-0000-0000-0000-000000000001: destination {value:?} is the pipeline's {field}, where rows never route")
        );
    }
    // At-least-once too: the default checkpoint topic belongs to the cluster's relays.
    let router = Router::new(&bare_template(false)).unwrap();
    assert!(matches!(
        router.route(&event("outbox-relay.checkpoints"), 0),
        Err(RouteError::Reserved { .. })
    ));
    assert_eq!(
        router.route(&event("Order.events"), 0).unwrap().topic,
        "Order.events"
    );
}

#[test]
fn a_destination_outside_the_allow_list_is_refused() {
    let mut config = bare_template(false);
    config.route.allowed_destinations = Some(vec!["Order.events".into(), "billing.*.v1".into()]);
    let router = Router::new(&config).unwrap();
    for good in ["Order.events", "billing.invoice.v1", "billing..v1"] {
        assert_eq!(router.route(&event(good), 0).unwrap().topic, good);
    }
    for bad in [
        "order.events",
        "Payment.events",
        "billing.invoice.v2",
        "x.billing.a.v1",
    ] {
        let error = router.route(&event(bad), 0).unwrap_err();
        assert_eq!(
            error,
            RouteError::NotAllowed {
                event_id: "00000000-0000-0000-0000-000000000001".into(),
                destination: bad.into(),
            }
        );
        assert_eq!(error.reason_label(), "not_allowed");
        assert!(
            error.to_string().contains("route.allowed_destinations"),
            "{error}"
        );
    }
    // Reserved whatever the list says (a list admitting it is refused at start).
    assert!(matches!(
        router.route(&event("outbox.dlq"), 0),
        Err(RouteError::Reserved { .. })
    ));
}

#[test]
fn destination_patterns_take_star_for_any_run_of_characters() {
    use crate::config::matches_destination as m;
    assert!(m("Order.events", "Order.events"));
    assert!(!m("Order.events", "Order.events2"));
    assert!(!m("Order.events", "xOrder.events"));
    assert!(m("*", ""));
    assert!(m("*", "anything.at all"));
    assert!(m("*.events", ".events"));
    assert!(!m("*.events", "Order.events.dlq"));
    assert!(m("a*b*c", "abc"));
    assert!(m("a*b*c", "a-b-b-c"));
    assert!(!m("a*b*c", "a-c-b"));
    assert!(!m("ab*ba", "aba"));
    assert!(m("ab*ba", "abba"));
    assert!(m("a**", "a"));
    // `?`, `[` and regex characters are themselves.
    assert!(m("a?.[x]", "a?.[x]"));
    assert!(!m("a?", "ab"));
}

#[test]
fn row_headers_cannot_pass_for_the_relays_own() {
    let mut e = event("Order");
    e.headers = Some(Bytes::from_static(
        br#"{"outbox_relay_checkpoint_version": "2", "outbox_relay_transactional_id": "outbox-relay-main", "outbox_relay_error": "x", "OUTBOX_RELAY_TOPIC": "y", "trace": "t"}"#,
    ));
    let record = Router::default().route(&e, 0).unwrap();
    let names: Vec<&str> = record.headers.iter().map(|(k, _)| k.as_ref()).collect();
    assert_eq!(names, vec!["id", "event_type", "trace"]);
}

#[test]
fn debezium_expanded_payloads_are_expanded_in_both_formats_and_failures_are_bad_input() {
    let payload = r#"{"amount": 1500000.10, "gone": null, "tags": []}"#;
    let plain = with(
        RouteConfig::default(),
        None,
        PipelineConfig {
            json_payload: JsonPayload::DebeziumExpanded,
            ..pipeline()
        },
    );
    let mut e = event("Order");
    e.payload = Some(Bytes::from_static(payload.as_bytes()));
    let value = plain.route(&e, 0).unwrap().value.unwrap();
    assert_eq!(&value[..], br#"{"amount":1500000.1}"#);
    // A text payload is expanded too; a number payload is not (Debezium expands strings only).
    e.payload_kind = ValueKind::Text;
    assert_eq!(
        &plain.route(&e, 0).unwrap().value.unwrap()[..],
        br#"{"amount":1500000.1}"#
    );
    e.payload_kind = ValueKind::Number;
    e.payload = Some(Bytes::from_static(b"12"));
    assert_eq!(&plain.route(&e, 0).unwrap().value.unwrap()[..], b"12");

    let mut envelope = envelope_router(NullPayload::Tombstone);
    envelope.json_payload = JsonPayload::DebeziumExpanded;
    let value = envelope
        .route(
            &envelope_event(&envelope, Some(payload), ValueKind::Json),
            0,
        )
        .unwrap()
        .value
        .unwrap();
    assert!(
        value.starts_with(br#"{"payload":{"amount":1500000.1},"tenant":"ac\"me""#),
        "{value:?}"
    );

    let err = plain
        .route(&envelope_event(&plain, Some("[1, 2]"), ValueKind::Json), 0)
        .unwrap_err();
    assert!(
        matches!(&err, RouteError::JsonExpansion { reason, .. } if reason.contains("not a JSON object")),
        "{err}"
    );
    assert_eq!(err.reason_label(), "json_expansion");
    assert!(
        err.to_string()
            .starts_with("event 00000000-0000-0000-0000-000000000001: json_payload"),
        "{err}"
    );
}
