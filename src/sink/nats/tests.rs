use bytes::Bytes;

use super::*;
use crate::sink::ordered::Failure;

fn record(headers: Vec<(&'static str, Option<&'static [u8]>)>) -> Record {
    Record {
        topic: "Order.events".into(),
        key: Some(Bytes::from_static(b"o-1")),
        value: Some(Bytes::from_static(br#"{"a":1}"#)),
        headers: headers
            .into_iter()
            .map(|(n, v)| (n.into(), v.map(Bytes::from_static)))
            .collect(),
        timestamp_ms: None,
        partition: None,
    }
}

fn header<'a>((_, headers): &'a (Bytes, HeaderMap), name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.as_str())
}

#[test]
fn a_message_carries_the_headers_the_key_and_the_event_id_as_msg_id() {
    let record = record(vec![
        ("id", Some(b"e-1")),
        ("event_type", Some(b"Created")),
        ("key", Some(b"clash")),
        ("trace", None),
    ]);
    let message = message(&record, 1 << 20).unwrap();
    assert_eq!(header(&message, "id"), Some("e-1"));
    assert_eq!(header(&message, "event_type"), Some("Created"));
    assert_eq!(header(&message, "header.key"), Some("clash"));
    assert_eq!(header(&message, "trace"), Some(""));
    assert_eq!(header(&message, KEY_HEADER), Some("o-1"));
    assert_eq!(header(&message, MSG_ID_HEADER), Some("e-1"));
    assert_eq!(message.0, Bytes::from_static(br#"{"a":1}"#));
}

#[test]
fn a_tombstone_is_an_empty_message_and_a_null_key_no_key_header() {
    let mut record = record(vec![("id", Some(b"e-2"))]);
    record.key = None;
    record.value = None;
    let message = message(&record, 1 << 20).unwrap();
    assert_eq!(header(&message, KEY_HEADER), None);
    assert!(message.0.is_empty());
}

#[test]
fn headers_nats_cannot_carry_are_refusals_naming_the_event() {
    for (name, value, expected) in [
        ("a b", &b"v"[..], "cannot be a NATS header name"),
        ("a:b", b"v", "cannot be a NATS header name"),
        ("Nats-Expected-Stream", b"X", "steer JetStream"),
        ("nats-msg-id", b"X", "steer JetStream"),
        ("trace", b"line\r\nInjected: 1", "line break"),
        ("trace", b"\xff", "not UTF-8"),
    ] {
        let mut r = record(vec![("id", Some(b"e-3"))]);
        r.headers
            .push((name.into(), Some(Bytes::from_static(value))));
        let e = message(&r, 1 << 20)
            .err()
            .unwrap_or_else(|| panic!("{name:?} passed"));
        assert_eq!(e.failure, Failure::Refused { too_large: false }, "{e:?}");
        assert!(
            e.reason.contains("event e-3") && e.reason.contains(expected),
            "{e:?}"
        );
    }
}

#[test]
fn a_subject_nats_cannot_take_is_refused_before_sending() {
    let mut r = record(vec![("id", Some(b"e-4"))]);
    r.topic = "bad subject.events".into();
    let e = message(&r, 1 << 20).err().unwrap();
    assert_eq!(e.failure, Failure::Refused { too_large: false });
    assert!(e.reason.contains("\"bad subject.events\""), "{e:?}");
}

#[test]
fn a_message_over_max_payload_is_too_large_counting_the_headers() {
    let r = record(vec![("id", Some(b"e-5"))]);
    // NATS/1.0\r\n + "id: e-5\r\n" + "key: o-1\r\n" + "Nats-Msg-Id: e-5\r\n" + \r\n, then 7 payload bytes.
    let exact = 10 + 9 + 10 + 18 + 2 + 7;
    assert!(message(&r, exact).is_ok());
    let e = message(&r, exact - 1).err().unwrap();
    assert_eq!(e.failure, Failure::Refused { too_large: true });
    assert!(
        e.reason.contains(&format!("{exact} bytes"))
            && e.reason.contains(&format!("{}", exact - 1)),
        "{e:?}"
    );
}

/// "No responders" is a refusal only when JetStream has no stream for the subject; a stream
/// whose leader did not answer (its server restarting) and a failed lookup are retried.
#[test]
fn no_responders_is_a_refusal_only_without_a_stream_for_the_subject() {
    use async_nats::jetstream::context::{
        GetStreamByNameError, GetStreamByNameErrorKind, RequestError, RequestErrorKind,
    };

    let refused = no_responders(
        Err(GetStreamByNameError::new(
            GetStreamByNameErrorKind::NotFound,
        )),
        "Order.events",
        "nats://h:4222",
    );
    assert_eq!(refused.failure, Failure::Refused { too_large: false });
    assert!(refused
        .reason
        .contains("no stream takes subject \"Order.events\""));

    let leaderless = no_responders(Ok("OUTBOX".into()), "Order.events", "nats://h:4222");
    assert_eq!(leaderless.failure, Failure::Retry);
    assert!(
        leaderless.reason.contains("stream \"OUTBOX\""),
        "{}",
        leaderless.reason
    );

    let unknown = no_responders(
        Err(GetStreamByNameError::new(GetStreamByNameErrorKind::Request)),
        "Order.events",
        "nats://h:4222",
    );
    assert_eq!(unknown.failure, Failure::Retry);

    // Nothing answers the JetStream API either: no JetStream, nothing to wait for (async-nats
    // wraps the request's error once more, as here).
    let no_jetstream = no_responders(
        Err(GetStreamByNameError::with_source(
            GetStreamByNameErrorKind::Request,
            RequestError::with_source(
                RequestErrorKind::Other,
                RequestError::new(RequestErrorKind::NoResponders),
            ),
        )),
        "Order.events",
        "nats://h:4222",
    );
    assert_eq!(no_jetstream.failure, Failure::Refused { too_large: false });
    assert!(
        no_jetstream.reason.contains("JetStream is not enabled"),
        "{}",
        no_jetstream.reason
    );
}
