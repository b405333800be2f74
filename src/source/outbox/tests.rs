use super::*;
use crate::source::pgoutput::{decode, LogicalReplicationMessage};

/// The captured PostgreSQL 15 stream (tests/fixtures/README.md).
fn fixture() -> Vec<LogicalReplicationMessage> {
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/pgoutput-v1-stream.jsonl"
    ))
    .lines()
    .map(|line| {
        let hex = line
            .split("\"hex\" : \"")
            .nth(1)
            .unwrap()
            .trim_end_matches("\"}");
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        decode(Bytes::from(bytes)).unwrap()
    })
    .collect()
}

fn events(decoder: &mut OutboxDecoder) -> Vec<Result<OutboxEvent, OutboxError>> {
    let mut out = Vec::new();
    for message in fixture() {
        match message {
            LogicalReplicationMessage::Relation(r) => decoder.on_relation(&r),
            LogicalReplicationMessage::Insert(i) => {
                if let Some(e) = decoder.on_insert(&i, Lsn(0)).transpose() {
                    out.push(e);
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn maps_fixture_inserts_by_column_name() {
    let mut decoder = OutboxDecoder::new(
        "public.outbox".parse().unwrap(),
        OutboxColumns::default(),
        None,
    );
    let events: Vec<OutboxEvent> = events(&mut decoder)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let ids: Vec<&[u8]> = events.iter().map(|e| &e.id[..]).collect();
    assert_eq!(
        ids,
        [1, 2, 3, 4, 5]
            .map(|n| format!("00000000-0000-0000-0000-00000000000{n}"))
            .iter()
            .map(|s| s.as_bytes())
            .collect::<Vec<_>>()
    );
    let first = &events[0];
    assert_eq!(&first.aggregate_type[..], b"Order");
    assert_eq!(first.aggregate_id, None);
    assert_eq!(first.event_type.as_deref(), Some(&b"OrderCreated"[..]));
    assert_eq!(
        first.payload.as_deref(),
        Some("{\"s\": \"é😀\", \"total\": 12.50}".as_bytes())
    );
    assert_eq!(events[2].payload, None, "NULL payload is a tombstone");
    assert_eq!(
        first.headers.as_deref(),
        Some(&b"{\"trace\": \"t-1\"}"[..]),
        "a DOMAIN over jsonb is text too"
    );
    // After ALTER TABLE ... ADD COLUMN tenant_id, columns are found by name again.
    assert_eq!(&events[3].aggregate_type[..], b"Customer");
    assert_eq!(events[3].aggregate_id.as_deref(), Some(&b"c-1"[..]));
}

#[test]
fn missing_column_is_an_error_naming_it() {
    let columns = OutboxColumns {
        aggregate_type: "aggregatetype".into(),
        ..OutboxColumns::default()
    };
    let mut decoder = OutboxDecoder::new("public.outbox".parse().unwrap(), columns, None);
    let first = events(&mut decoder).remove(0).unwrap_err();
    let OutboxError::MissingColumn {
        column, event_id, ..
    } = &first
    else {
        panic!("{first}")
    };
    assert_eq!(column, "aggregatetype");
    // The row is named by its id, which the table still has.
    let id = event_id.clone().expect("the row's id");
    assert!(
        first.to_string().contains(&format!(
            "has no column \"aggregatetype\" (columns.aggregate_type) at LSN 0/0 (event id {id}); its columns are id, aggregate_type, "
        )),
        "{first}"
    );
}

/// The `headers` column may be missing under its default name (Debezium's table has none);
/// another `columns.headers` must exist: a misspelling is a missing column, not headers
/// silently left out.
#[test]
fn only_the_default_headers_column_may_be_missing() {
    let columns = OutboxColumns {
        headers: "hdrs".into(),
        ..OutboxColumns::default()
    };
    let mut decoder = OutboxDecoder::new("public.outbox".parse().unwrap(), columns, None);
    let first = events(&mut decoder).remove(0).unwrap_err();
    assert!(
        matches!(&first, OutboxError::MissingColumn { column, field: "headers", .. } if column == "hdrs"),
        "{first}"
    );
}

#[test]
fn other_tables_are_not_events() {
    let mut decoder = OutboxDecoder::new(
        "public.other".parse().unwrap(),
        OutboxColumns::default(),
        None,
    );
    // `other` has none of the outbox columns: its insert is an error, outbox inserts are not events.
    let results = events(&mut decoder);
    assert_eq!(results.len(), 1);
    assert!(matches!(
        &results[0],
        Err(OutboxError::MissingColumn { .. })
    ));
}

#[test]
fn inserts_into_the_renamed_outbox_are_errors() {
    let mut decoder = OutboxDecoder::new(
        "public.outbox".parse().unwrap(),
        OutboxColumns::default(),
        None,
    );
    let mut relation = fixture()
        .into_iter()
        .find_map(|m| match m {
            LogicalReplicationMessage::Relation(r) if r.name == "outbox" => Some(r),
            _ => None,
        })
        .unwrap();
    let insert = InsertBody {
        rel_id: relation.rel_id,
        new_tuple: crate::source::pgoutput::TupleData { columns: vec![] },
    };
    decoder.on_relation(&relation);
    assert!(decoder.is_outbox(relation.rel_id));
    relation.name = "Outbox_Old".into();
    decoder.on_relation(&relation);
    let err = decoder.on_insert(&insert, Lsn(5)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "insert at LSN 0/5 into public.\"Outbox_Old\", which was the outbox table public.outbox earlier in this stream: set table to its new name (or insert into public.outbox)"
    );
    // A row with an id is named by it.
    let id_at = relation
        .columns
        .iter()
        .position(|c| c.name == "id")
        .unwrap();
    let mut values = vec![crate::source::pgoutput::TupleValue::Null; relation.columns.len()];
    values[id_at] = crate::source::pgoutput::TupleValue::Text(bytes::Bytes::from_static(b"e-42"));
    let with_id = InsertBody {
        rel_id: relation.rel_id,
        new_tuple: crate::source::pgoutput::TupleData { columns: values },
    };
    let err = decoder.on_insert(&with_id, Lsn(5)).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("insert at LSN 0/5 (event id e-42) into public.\"Outbox_Old\""),
        "{err}"
    );
    // Renamed again, still not passed over; a table never the outbox is.
    relation.name = "elsewhere".into();
    decoder.on_relation(&relation);
    assert!(decoder.on_insert(&insert, Lsn(6)).is_err());
    relation.rel_id += 1;
    decoder.on_relation(&relation);
    let other = InsertBody {
        rel_id: relation.rel_id,
        ..insert
    };
    assert_eq!(decoder.on_insert(&other, Lsn(7)), Ok(None));
}

/// After `table` follows a rename and the relay restarts, WAL from before the rename still
/// names the old table: the oid says it is the outbox.
#[test]
fn the_outbox_under_its_old_name_is_found_by_its_oid() {
    let relation = fixture()
        .into_iter()
        .find_map(|m| match m {
            LogicalReplicationMessage::Relation(r) if r.name == "outbox" => Some(r),
            _ => None,
        })
        .unwrap();
    let renamed = || {
        OutboxDecoder::new(
            "public.outbox_v2".parse().unwrap(),
            OutboxColumns::default(),
            None,
        )
    };
    let mut by_name_only = renamed();
    by_name_only.on_relation(&relation);
    assert!(!by_name_only.is_outbox(relation.rel_id));
    let mut with_oid = renamed().with_oid(Some(relation.rel_id));
    with_oid.on_relation(&relation);
    assert!(with_oid.is_outbox(relation.rel_id));
    let mut other_oid = renamed().with_oid(Some(relation.rel_id + 1));
    other_oid.on_relation(&relation);
    assert!(!other_oid.is_outbox(relation.rel_id));
}

#[test]
fn insert_before_relation_is_an_error() {
    let decoder = OutboxDecoder::new(
        "public.outbox".parse().unwrap(),
        OutboxColumns::default(),
        None,
    );
    let insert = fixture()
        .into_iter()
        .find_map(|m| match m {
            LogicalReplicationMessage::Insert(i) => Some(i),
            _ => None,
        })
        .unwrap();
    assert!(matches!(
        decoder.on_insert(&insert, Lsn(7)),
        Err(OutboxError::UnknownRelation { lsn: Lsn(7), .. })
    ));
}

#[test]
fn logical_messages_with_the_prefix_are_events() {
    let decoder = OutboxDecoder::new(
        "public.outbox".parse().unwrap(),
        OutboxColumns::default(),
        Some("outbox".into()),
    );
    let messages: Vec<MessageBody> = fixture()
        .into_iter()
        .filter_map(|m| match m {
            LogicalReplicationMessage::Message(m) => Some(m),
            _ => None,
        })
        .collect();
    let (outbox, heartbeat) = (&messages[0], &messages[1]);
    assert!(decoder.is_outbox_message(outbox) && outbox.transactional);
    assert!(!decoder.is_outbox_message(heartbeat));
    let event = decoder.on_message(outbox, Lsn(1)).unwrap();
    assert_eq!(&event.aggregate_type[..], b"Order");
    assert_eq!(event.aggregate_id.as_deref(), Some(&b"o-m"[..]));
    assert_eq!(event.event_type.as_deref(), Some(&b"E1"[..]));
    assert_eq!(event.payload.as_deref(), Some(&b"{}"[..]));
    assert_eq!(
        event.id,
        Bytes::from(format!("lsn-{}", outbox.lsn)),
        "a replay gets the same id"
    );
    // With the cluster's origin: its system identifier and the timeline of the LSN.
    let origin = MessageOrigin {
        system_id: "7312345678901234567".into(),
        timeline: 3,
        switches: Vec::new(),
    };
    let decoder = decoder.with_message_origin(Some(origin));
    let event = decoder.on_message(outbox, Lsn(1)).unwrap();
    assert_eq!(
        event.id,
        Bytes::from(format!("pg-7312345678901234567-3-{}", outbox.lsn))
    );
}

/// An LSN is named with the timeline that wrote it: after a failover, a message replayed
/// from before the switch keeps the id it had on the old timeline, and the same LSN on the
/// new timeline (other WAL) gets another.
#[test]
fn a_message_id_names_the_timeline_that_wrote_its_lsn() {
    let origin = MessageOrigin {
        system_id: "42".into(),
        timeline: 3,
        switches: vec![(1, Lsn(0x100)), (2, Lsn(0x200))],
    };
    assert_eq!(origin.timeline_of(Lsn(0xFF)), 1);
    assert_eq!(
        origin.timeline_of(Lsn(0x100)),
        2,
        "the switch LSN begins the next timeline"
    );
    assert_eq!(origin.timeline_of(Lsn(0x1FF)), 2);
    assert_eq!(origin.timeline_of(Lsn(0x200)), 3);
    assert_eq!(origin.id(Lsn(0x150)), "pg-42-2-0/150");
}

#[test]
fn invalid_messages_are_errors_naming_the_lsn() {
    let decoder = OutboxDecoder::new(
        "public.outbox".parse().unwrap(),
        OutboxColumns::default(),
        Some("outbox".into()),
    );
    for content in [
        &b"not json"[..],
        b"[]",
        br#"{"aggregate_id": "x"}"#,
        br#"{"aggregate_type": 5}"#,
        br#"{"aggregate_type": "A", "typo": 1}"#,
    ] {
        let message = MessageBody {
            transactional: true,
            lsn: Lsn(9),
            prefix: "outbox".into(),
            content: Bytes::copy_from_slice(content),
        };
        let err = decoder.on_message(&message, Lsn(9)).unwrap_err();
        assert!(
            matches!(err, OutboxError::InvalidMessage { lsn: Lsn(9), .. }),
            "{err}"
        );
    }
    let message = MessageBody {
        transactional: true,
        lsn: Lsn(9),
        prefix: "outbox".into(),
        content: Bytes::from_static(br#"{"id": "e-1", "aggregate_type": "A", "payload": {"n": 1.50}, "headers": {"h": "v"}}"#),
    };
    let event = decoder.on_message(&message, Lsn(9)).unwrap();
    assert_eq!(
        (&event.id[..], event.payload.as_deref()),
        (&b"e-1"[..], Some(&br#"{"n": 1.50}"#[..]))
    );
    assert_eq!(event.headers.as_deref(), Some(&br#"{"h": "v"}"#[..]));
    assert_eq!(event.aggregate_id, None);
}

#[test]
fn extra_columns_carry_text_and_kind_with_domains_from_type_messages() {
    let mut decoder = OutboxDecoder::new(
        "public.outbox".parse().unwrap(),
        OutboxColumns::default(),
        None,
    )
    .with_columns(vec![
        "created_at".into(),
        "headers".into(),
        "payload".into(),
    ]);
    let mut events = Vec::new();
    for message in fixture() {
        match message {
            LogicalReplicationMessage::Type(t) => decoder.on_type(&t),
            LogicalReplicationMessage::Relation(r) => decoder.on_relation(&r),
            LogicalReplicationMessage::Insert(i) => {
                events.extend(decoder.on_insert(&i, Lsn(0)).unwrap())
            }
            _ => {}
        }
    }
    let first = &events[0];
    assert_eq!(first.payload_kind, ValueKind::Json, "jsonb payload");
    let kinds: Vec<ValueKind> = first.columns.iter().map(|c| c.kind).collect();
    assert_eq!(
        kinds,
        [ValueKind::Timestamptz(6), ValueKind::Json, ValueKind::Json],
        "timestamptz with its precision; the domain over jsonb is JSON (from its Type message)"
    );
    let created_at = first.columns[0].text.as_deref().unwrap();
    assert!(
        crate::router::parse_timestamp_ms(created_at).is_some(),
        "{created_at:?} parses"
    );
    assert_eq!(first.columns[1].text, first.headers);
    assert_eq!(first.columns[2].text, first.payload);
    assert_eq!(events[2].columns[2].text, None, "NULL stays NULL");
    // Without the Type message the domain's kind is unknown: text.
    let mut plain = OutboxDecoder::new(
        "public.outbox".parse().unwrap(),
        OutboxColumns::default(),
        None,
    )
    .with_columns(vec!["headers".into()]);
    let kinds: Vec<ValueKind> = events_with(&mut plain)
        .iter()
        .map(|e| e.columns[0].kind)
        .collect();
    assert_eq!(kinds[0], ValueKind::Text);
}

#[test]
fn a_missing_extra_column_is_an_error_naming_it() {
    let mut decoder = OutboxDecoder::new(
        "public.outbox".parse().unwrap(),
        OutboxColumns::default(),
        None,
    )
    .with_columns(vec!["no_such_column".into()]);
    let err = events(&mut decoder).remove(0).unwrap_err();
    assert!(
        matches!(&err, OutboxError::MissingColumn { column, .. } if column == "no_such_column"),
        "{err}"
    );
}

fn events_with(decoder: &mut OutboxDecoder) -> Vec<OutboxEvent> {
    events(decoder).into_iter().map(Result::unwrap).collect()
}

#[test]
fn kinds_follow_the_type_and_its_modifier() {
    let cases = [
        (16, -1, ValueKind::Bool),
        (17, -1, ValueKind::Bytea),
        (20, -1, ValueKind::Number),
        (1700, 786_438, ValueKind::Number),
        (700, -1, ValueKind::Float4),
        (701, -1, ValueKind::Float8),
        (1184, -1, ValueKind::Timestamptz(6)),
        (1184, 0, ValueKind::Timestamptz(0)),
        (1114, 3, ValueKind::Timestamp(3)),
        (1114, -1, ValueKind::Timestamp(6)),
        (1082, -1, ValueKind::Date),
        (1083, 2, ValueKind::Time(2)),
        (2950, -1, ValueKind::Text),
    ];
    for (oid, typmod, kind) in cases {
        assert_eq!(
            ValueKind::of_oid(oid, typmod).unwrap_or_default(),
            kind,
            "oid {oid} typmod {typmod}"
        );
    }
    assert_eq!(ValueKind::of_name("timestamp", 9), ValueKind::Timestamp(6));
}

#[test]
fn an_optional_extra_column_the_table_lacks_is_absent_and_others_are_still_required() {
    let mut decoder = OutboxDecoder::new(
        "public.outbox".parse().unwrap(),
        OutboxColumns::default(),
        None,
    )
    .with_columns(vec!["no_such_column".into(), "headers".into()])
    .with_optional_columns(vec!["no_such_column".into()]);
    let decoded = events_with(&mut decoder);
    let first = &decoded[0];
    assert_eq!(
        first.columns[0],
        ColumnValue {
            text: None,
            kind: ValueKind::Text,
            absent: true
        }
    );
    assert!(!first.columns[1].absent);
    assert_eq!(first.columns[1].text, first.headers);
    // Optional only where the table lacks it: a present column is read as any other.
    let mut decoder = OutboxDecoder::new(
        "public.outbox".parse().unwrap(),
        OutboxColumns::default(),
        None,
    )
    .with_columns(vec!["headers".into(), "missing_too".into()])
    .with_optional_columns(vec!["headers".into()]);
    let err = events(&mut decoder).remove(0).unwrap_err();
    assert!(
        matches!(&err, OutboxError::MissingColumn { column, .. } if column == "missing_too"),
        "{err}"
    );
}

/// The fixture's outbox Relation, and an insert into it of `values` by column name (the
/// others NULL), every value a slice of one received message (`frame`).
fn outbox_insert(values: &[(&str, &[u8])]) -> (RelationBody, InsertBody, Bytes) {
    let relation = fixture()
        .into_iter()
        .find_map(|m| match m {
            LogicalReplicationMessage::Relation(r) if r.name == "outbox" => Some(r),
            _ => None,
        })
        .unwrap();
    let frame = Bytes::from(
        values
            .iter()
            .flat_map(|(_, v)| v.to_vec())
            .collect::<Vec<u8>>(),
    );
    let mut columns = vec![TupleValue::Null; relation.columns.len()];
    let mut at = 0;
    for (name, value) in values {
        let i = relation
            .columns
            .iter()
            .position(|c| c.name == *name)
            .unwrap();
        columns[i] = TupleValue::Text(frame.slice(at..at + value.len()));
        at += value.len();
    }
    let insert = InsertBody {
        rel_id: relation.rel_id,
        new_tuple: crate::source::pgoutput::TupleData { columns },
    };
    (relation, insert, frame)
}

fn limit(bytes: usize) -> EventLimit {
    EventLimit {
        bytes,
        from: "max_event_bytes",
    }
}

/// A row over `max_event_bytes` is a reference: id, aggregate type and id copied (the
/// received message is not kept alive by it), nothing else; a row at the limit is an event.
#[test]
fn a_row_over_max_event_bytes_is_a_reference_that_copies_no_value() {
    let payload = format!("{{\"blob\": \"{}\"}}", "x".repeat(2_000));
    let values: &[(&str, &[u8])] = &[
        ("id", b"e-big"),
        ("aggregate_type", b"Order"),
        ("aggregate_id", b"o-1"),
        ("event_type", b"OrderCreated"),
        ("payload", payload.as_bytes()),
        ("headers", b"{\"trace\": \"t\"}"),
    ];
    let (relation, insert, frame) = outbox_insert(values);
    let size: usize = values.iter().map(|(_, v)| v.len()).sum();
    let decoder = |bytes: usize| {
        let mut decoder = OutboxDecoder::new(
            "public.outbox".parse().unwrap(),
            OutboxColumns::default(),
            None,
        )
        .with_max_event_bytes(limit(bytes));
        decoder.on_relation(&relation);
        decoder
    };
    let event = decoder(size - 1)
        .on_insert(&insert, Lsn(0x42))
        .unwrap()
        .unwrap();
    assert_eq!(
        event.refused,
        Some(Refusal::TooLarge {
            bytes: size,
            limit: limit(size - 1)
        })
    );
    assert_eq!(&event.id[..], b"e-big");
    assert_eq!(&event.aggregate_type[..], b"Order");
    assert_eq!(event.aggregate_id.as_deref(), Some(&b"o-1"[..]));
    assert_eq!(
        (&event.payload, &event.headers, &event.event_type),
        (&None, &None, &None)
    );
    assert_eq!(event.lsn, Lsn(0x42));
    let in_frame = |b: &Bytes| frame.as_ptr_range().contains(&b.as_ptr());
    assert!(
        !in_frame(&event.id)
            && !in_frame(&event.aggregate_type)
            && !event.aggregate_id.as_ref().is_some_and(in_frame),
        "the reference holds copies, not slices of the received message"
    );
    // At the limit: an event like any other, its values slices of the message.
    let event = decoder(size)
        .on_insert(&insert, Lsn(0x42))
        .unwrap()
        .unwrap();
    assert_eq!(event.refused, None);
    assert_eq!(event.payload.as_deref(), Some(payload.as_bytes()));
}

/// A reference keeps at most `REFERENCE_FIELD_BYTES` of each of its fields, cut before a
/// character.
#[test]
fn a_reference_cuts_its_fields_at_a_character() {
    let long = "é".repeat(REFERENCE_FIELD_BYTES);
    let cut = reference_field(long.as_bytes());
    assert_eq!(cut.len(), REFERENCE_FIELD_BYTES);
    let odd = format!("x{long}");
    let cut = reference_field(odd.as_bytes());
    assert_eq!(cut.len(), REFERENCE_FIELD_BYTES - 1);
    assert!(std::str::from_utf8(&cut).is_ok());
    assert_eq!(&reference_field(b"short")[..], b"short");
}

/// A logical message over the limit is a reference too.
#[test]
fn a_message_over_max_event_bytes_is_a_reference() {
    let content = format!(
        r#"{{"id": "m-1", "aggregate_type": "Order", "aggregate_id": "o-1", "payload": {{"blob": "{}"}}}}"#,
        "x".repeat(500)
    );
    let message = MessageBody {
        transactional: true,
        lsn: Lsn(7),
        prefix: "outbox".into(),
        content: Bytes::from(content.clone()),
    };
    let decoder = OutboxDecoder::new(
        "public.outbox".parse().unwrap(),
        OutboxColumns::default(),
        Some("outbox".into()),
    )
    .with_max_event_bytes(limit(100));
    let event = decoder.on_message(&message, Lsn(7)).unwrap();
    assert_eq!(
        event.refused,
        Some(Refusal::TooLarge {
            bytes: content.len(),
            limit: limit(100)
        })
    );
    assert_eq!((&event.id[..], event.payload), (&b"m-1"[..], None));
}

/// From a SQL_ASCII database, a text value that is not UTF-8 is refused, naming its column;
/// from any other (no check) the bytes are the server's, UTF-8 already.
#[test]
fn a_value_that_is_not_utf8_is_refused_naming_its_column() {
    let values: &[(&str, &[u8])] = &[
        ("id", b"e-1"),
        ("aggregate_type", b"Order"),
        ("aggregate_id", b"o-1"),
        ("event_type", b"Caf\xe9"),
        ("payload", b"{\"s\": \"\xff\"}"),
    ];
    let (relation, insert, _) = outbox_insert(values);
    let mut decoder = OutboxDecoder::new(
        "public.outbox".parse().unwrap(),
        OutboxColumns::default(),
        None,
    )
    .with_utf8_check(true);
    decoder.on_relation(&relation);
    let event = decoder.on_insert(&insert, Lsn(1)).unwrap().unwrap();
    assert_eq!(
        event.refused,
        Some(Refusal::NotUtf8 {
            relation: "public.outbox".into(),
            column: "event_type".into()
        }),
        "the first such column"
    );
    assert_eq!(
        event.payload.as_deref(),
        Some(&b"{\"s\": \"\xff\"}"[..]),
        "kept: its dead-letter copy carries it"
    );
    let mut unchecked = OutboxDecoder::new(
        "public.outbox".parse().unwrap(),
        OutboxColumns::default(),
        None,
    );
    unchecked.on_relation(&relation);
    let event = unchecked.on_insert(&insert, Lsn(1)).unwrap().unwrap();
    assert_eq!(event.refused, None);
}
