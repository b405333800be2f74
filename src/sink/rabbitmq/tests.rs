use bytes::Bytes;

use super::*;
use crate::sink::ordered::Failure;

fn record(headers: Vec<crate::sink::Header>) -> Record {
    Record {
        topic: "Order.events".into(),
        key: Some(Bytes::from_static(b"o-1")),
        value: Some(Bytes::from_static(br#"{"a":1}"#)),
        headers,
        timestamp_ms: Some(1_700_000_000_123),
        partition: None,
    }
}

fn header(properties: &BasicProperties, name: &str) -> Option<AMQPValue> {
    properties.headers().as_ref()?.inner().get(name).cloned()
}

fn long(text: &[u8]) -> AMQPValue {
    AMQPValue::LongString(text.to_vec().into())
}

#[test]
fn a_message_is_persistent_with_the_event_id_headers_and_key() {
    let json: ShortString = "application/json".into();
    let properties = message(
        &record(vec![
            ("id".into(), Some(Bytes::from_static(b"e-1"))),
            ("event_type".into(), Some(Bytes::from_static(b"Created"))),
            ("key".into(), Some(Bytes::from_static(b"clash"))),
            ("trace".into(), None),
            ("bin".into(), Some(Bytes::from_static(b"\xff\x00"))),
        ]),
        Some(&json),
        false,
        1 << 20,
    )
    .unwrap();
    assert_eq!(properties.delivery_mode(), &Some(2));
    assert_eq!(
        properties.message_id().as_ref().map(|s| s.as_str()),
        Some("e-1")
    );
    assert_eq!(
        properties.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(properties.timestamp(), &Some(1_700_000_000));
    assert_eq!(header(&properties, "id"), Some(long(b"e-1")));
    assert_eq!(header(&properties, "event_type"), Some(long(b"Created")));
    assert_eq!(header(&properties, "header.key"), Some(long(b"clash")));
    assert_eq!(header(&properties, "key"), Some(long(b"o-1")));
    assert_eq!(header(&properties, "trace"), Some(AMQPValue::Void));
    assert_eq!(header(&properties, "bin"), Some(long(b"\xff\x00")));
}

#[test]
fn a_tombstone_has_no_content_type_and_a_null_key_no_key_header() {
    let json: ShortString = "application/json".into();
    let mut tombstone = record(vec![("id".into(), Some(Bytes::from_static(b"e-2")))]);
    tombstone.value = None;
    tombstone.key = None;
    let properties = message(&tombstone, Some(&json), false, 1 << 20).unwrap();
    assert_eq!(properties.content_type(), &None);
    assert_eq!(header(&properties, "key"), None);
}

#[test]
fn a_name_given_twice_keeps_both_values_in_order() {
    let properties = message(
        &record(vec![
            ("id".into(), Some(Bytes::from_static(b"e-3"))),
            ("tenant".into(), Some(Bytes::from_static(b"a"))),
            ("tenant".into(), Some(Bytes::from_static(b"b"))),
            ("tenant".into(), None),
        ]),
        None,
        false,
        1 << 20,
    )
    .unwrap();
    assert_eq!(
        header(&properties, "tenant"),
        Some(AMQPValue::FieldArray(
            vec![long(b"a"), long(b"b"), AMQPValue::Void].into()
        ))
    );
    assert_eq!(properties.content_type(), &None);
}

/// `CC` and `BCC` are RabbitMQ's sender-selected routing (an array of more routing keys: a row
/// would send its event to any queue), `x-` names its and its plugins' (`x-delay`): a row's
/// headers of those names reach the broker under `header.`, never as routing instructions.
#[test]
fn a_row_s_cc_bcc_and_x_headers_are_no_routing_instructions() {
    let properties = message(
        &record(vec![
            ("id".into(), Some(Bytes::from_static(b"e-4"))),
            ("CC".into(), Some(Bytes::from_static(b"payments.q"))),
            ("CC".into(), Some(Bytes::from_static(b"audit.q"))),
            ("bcc".into(), Some(Bytes::from_static(b"x"))),
            ("x-delay".into(), Some(Bytes::from_static(b"600000"))),
        ]),
        None,
        false,
        1 << 20,
    )
    .unwrap();
    for name in ["CC", "bcc", "x-delay"] {
        assert_eq!(header(&properties, name), None, "{name} reached the broker");
    }
    assert_eq!(
        header(&properties, "header.CC"),
        Some(AMQPValue::FieldArray(
            vec![long(b"payments.q"), long(b"audit.q")].into()
        ))
    );
    assert_eq!(header(&properties, "header.bcc"), Some(long(b"x")));
    assert_eq!(header(&properties, "header.x-delay"), Some(long(b"600000")));
}

/// With CloudEvents the rendering's `content-type` header is the `content_type` property (the
/// binding's place for `datacontenttype` and the event format's media type), not a header;
/// without, it is a header like any other.
#[test]
fn with_cloudevents_the_content_type_header_is_the_content_type_property() {
    let json: ShortString = "application/json".into();
    let r = record(vec![
        ("id".into(), Some(Bytes::from_static(b"e-5"))),
        (
            "cloudEvents_type".into(),
            Some(Bytes::from_static(b"Created")),
        ),
        (
            "content-type".into(),
            Some(Bytes::from_static(
                b"application/cloudevents+json; charset=UTF-8",
            )),
        ),
    ]);
    let properties = message(&r, Some(&json), true, 1 << 20).unwrap();
    assert_eq!(
        properties.content_type().as_ref().map(|s| s.as_str()),
        Some("application/cloudevents+json; charset=UTF-8")
    );
    assert_eq!(header(&properties, "content-type"), None);
    assert_eq!(
        header(&properties, "cloudEvents_type"),
        Some(long(b"Created"))
    );

    let properties = message(&r, Some(&json), false, 1 << 20).unwrap();
    assert_eq!(
        properties.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(
        header(&properties, "content-type"),
        Some(long(b"application/cloudevents+json; charset=UTF-8"))
    );

    let mut without_data = record(vec![("id".into(), Some(Bytes::from_static(b"e-6")))]);
    without_data.value = None;
    let properties = message(&without_data, Some(&json), true, 1 << 20).unwrap();
    assert_eq!(properties.content_type(), &None);
}

#[test]
fn too_large_records_and_long_names_are_refused_before_sending() {
    let r = record(vec![("id".into(), Some(Bytes::from_static(b"e-4")))]);
    let e = message(&r, None, false, r.size() - 1).unwrap_err();
    assert_eq!(e.failure, Failure::Refused { too_large: true }, "{e:?}");
    assert!(e.reason.contains("sink.max_message_bytes"), "{e:?}");

    let long_name = "h".repeat(256);
    let e = message(
        &record(vec![(
            long_name.clone().into(),
            Some(Bytes::from_static(b"v")),
        )]),
        None,
        false,
        1 << 20,
    )
    .unwrap_err();
    assert_eq!(e.failure, Failure::Refused { too_large: false });
    assert!(e.reason.contains("255"), "{e:?}");

    let mut long_key = record(vec![]);
    long_key.topic = "k".repeat(256);
    let e = message(&long_key, None, false, 1 << 20).unwrap_err();
    assert!(e.reason.contains("routing key"), "{e:?}");
}

#[test]
fn a_returned_message_is_a_refusal_naming_where_it_went_and_a_nack_is_retried() {
    assert_eq!(outcome(Confirmation::Ack(None), "x"), Ok(()));
    let e = outcome(Confirmation::Nack(None), "h: exchange \"\"").unwrap_err();
    assert_eq!(e.failure, Failure::Retry);
    assert_eq!(
        outcome(Confirmation::NotRequested, "x")
            .unwrap_err()
            .failure,
        Failure::Broken
    );
}

#[test]
fn a_refused_login_or_vhost_is_permanent_and_an_unreachable_server_is_not() {
    use lapin::protocol::AMQPError;
    let protocol =
        |kind| lapin::Error::from(ErrorKind::ProtocolError(AMQPError::new(kind, "x".into())));
    assert!(!connect_retryable(&protocol(AMQPErrorKind::Soft(
        AMQPSoftError::ACCESSREFUSED
    ))));
    assert!(!connect_retryable(&protocol(AMQPErrorKind::Hard(
        AMQPHardError::NOTALLOWED
    ))));
    assert!(connect_retryable(&protocol(AMQPErrorKind::Hard(
        AMQPHardError::CONNECTIONFORCED
    ))));
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    assert!(connect_retryable(&lapin::Error::from(refused)));
}
