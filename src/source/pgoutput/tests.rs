use super::*;
use proptest::prelude::*;

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/pgoutput-v1-stream.jsonl"
));

/// One line of the fixture; see `tests/fixtures/README.md` for the SQL behind it.
struct Line {
    lsn: Lsn,
    xid: u32,
    tag: u8,
    bytes: Bytes,
}

fn fixture() -> Vec<Line> {
    FIXTURE
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let tag = v["tag"].as_str().unwrap().as_bytes();
            assert_eq!(tag.len(), 1, "{line}");
            Line {
                lsn: v["lsn"].as_str().unwrap().parse().unwrap(),
                xid: v["xid"].as_str().unwrap().parse().unwrap(),
                tag: tag[0],
                bytes: hex::decode(v["hex"].as_str().unwrap()).unwrap().into(),
            }
        })
        .collect()
}

/// Decodes the fixture message on 1-based line `n` (as `nl` or an editor numbers them).
fn line(n: usize) -> LogicalReplicationMessage {
    decode(fixture()[n - 1].bytes.clone()).unwrap()
}

fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn err(bytes: &[u8]) -> DecodeError {
    decode(Bytes::copy_from_slice(bytes)).unwrap_err()
}

/// A byte string from parts: `&[u8]`/`&str` pieces concatenated.
fn msg(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

const UUID_1: &str = "00000000-0000-0000-0000-000000000001";
const OUTBOX_REL_ID: u32 = 16655;
const OTHER_REL_ID: u32 = 16665;
const TEXT_OID: u32 = 25;

#[test]
fn every_fixture_message_decodes_to_the_kind_of_its_tag() {
    let lines = fixture();
    assert_eq!(lines.len(), 40);
    for (i, l) in lines.iter().enumerate() {
        let m = decode(l.bytes.clone()).unwrap_or_else(|e| panic!("line {}: {e}", i + 1));
        // Type is the one kind whose tag ('Y') is not its first letter.
        let expected = if l.tag == TYPE_TAG {
            b't'
        } else {
            l.tag.to_ascii_lowercase()
        };
        assert_eq!(m.kind().as_bytes()[0], expected, "line {}", i + 1);
    }
}

#[test]
fn begin_and_commit_match_the_fixture_lsns_and_xids() {
    let mut begin = None;
    let (mut begins, mut commits) = (0, 0);
    for l in fixture() {
        match decode(l.bytes.clone()).unwrap() {
            LogicalReplicationMessage::Begin(b) => {
                assert_eq!(b.xid, l.xid);
                begin = Some(b);
                begins += 1;
            }
            LogicalReplicationMessage::Commit(c) => {
                let b = begin.take().expect("commit without begin");
                assert_eq!(c.end_lsn, l.lsn);
                assert_eq!(c.commit_lsn, b.final_lsn);
                assert!(c.commit_lsn < c.end_lsn);
                assert_eq!(c.timestamp_us, b.timestamp_us);
                assert_eq!(c.flags, 0);
                commits += 1;
            }
            LogicalReplicationMessage::Message(m) => assert_eq!(m.lsn, l.lsn),
            _ => {}
        }
    }
    assert_eq!((begins, commits), (10, 10));
    let LogicalReplicationMessage::Begin(first) = line(1) else {
        panic!()
    };
    assert_eq!(first.final_lsn.to_string(), "0/113E11D0");
    assert_eq!(first.xid, 340852);
}

#[test]
fn first_type_and_relation_describe_the_outbox() {
    let LogicalReplicationMessage::Type(ty) = line(2) else {
        panic!()
    };
    // pgoutput sends the domain's oid with its *base* type's name, and an empty namespace for
    // pg_catalog: not "public"."outbox_json".
    assert_eq!(
        ty,
        TypeBody {
            type_oid: 16654,
            namespace: String::new(),
            name: "jsonb".into()
        }
    );

    let LogicalReplicationMessage::Relation(rel) = line(3) else {
        panic!()
    };
    assert_eq!(rel.rel_id, OUTBOX_REL_ID);
    assert_eq!(
        (rel.namespace.as_str(), rel.name.as_str()),
        ("public", "outbox")
    );
    assert_eq!(rel.replica_identity, b'd');
    let names: Vec<_> = rel.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "id",
            "aggregate_type",
            "aggregate_id",
            "event_type",
            "payload",
            "headers",
            "created_at"
        ]
    );
    let flags: Vec<_> = rel.columns.iter().map(|c| c.flags).collect();
    assert_eq!(flags, [1, 0, 0, 0, 0, 0, 0]);
    let oids: Vec<_> = rel.columns.iter().map(|c| c.type_oid).collect();
    // uuid, text, text, text, jsonb, the outbox_json domain, timestamptz
    assert_eq!(oids, [2950, 25, 25, 25, 3802, ty.type_oid, 1184]);
    assert!(rel.columns.iter().all(|c| c.type_modifier == -1));
}

#[test]
fn first_insert_keeps_values_byte_exact_and_zero_copy() {
    let bytes = fixture()[3].bytes.clone();
    let LogicalReplicationMessage::Insert(ins) = decode(bytes.clone()).unwrap() else {
        panic!()
    };
    assert_eq!(ins.rel_id, OUTBOX_REL_ID);
    let payload = r#"{"s": "é😀", "total": 12.50}"#;
    assert_eq!(
        ins.new_tuple.columns,
        [
            text(UUID_1),
            text("Order"),
            TupleValue::Null,
            text("OrderCreated"),
            text(payload),
            text(r#"{"trace": "t-1"}"#),
            text("2026-01-02 03:04:05.678901+00"),
        ]
    );
    let TupleValue::Text(p) = &ins.new_tuple.columns[4] else {
        panic!()
    };
    assert_eq!(
        hex::encode(p),
        "7b2273223a2022c3a9f09f9880222c2022746f74616c223a2031322e35307d"
    );
    // The value is a slice of the input buffer, not a copy.
    let range = bytes.as_ptr_range();
    assert!(range.contains(&p.as_ptr()) && p.as_ptr_range().end <= range.end);
}

#[test]
fn multi_row_transaction_has_null_payload_and_delete_by_key() {
    let LogicalReplicationMessage::Insert(ins) = line(8) else {
        panic!()
    };
    assert_eq!(ins.new_tuple.columns[3], text("Deleted"));
    assert_eq!(ins.new_tuple.columns[4], TupleValue::Null);

    let LogicalReplicationMessage::Delete(del) = line(9) else {
        panic!()
    };
    assert_eq!(del.rel_id, OUTBOX_REL_ID);
    assert_eq!(del.old_tuple, None);
    let mut key = vec![text("00000000-0000-0000-0000-000000000002")];
    key.resize(7, TupleValue::Null);
    assert_eq!(del.key_tuple, Some(TupleData { columns: key }));
}

#[test]
fn full_identity_update_and_delete_send_the_old_tuple() {
    let big = "9dd4e461268c8034f5c8564e155c67a6".repeat(400); // repeat(md5('x'), 400)
    let LogicalReplicationMessage::Relation(rel) = line(12) else {
        panic!()
    };
    assert_eq!((rel.rel_id, rel.name.as_str()), (OTHER_REL_ID, "other"));
    assert_eq!(rel.replica_identity, b'f');
    assert!(rel.columns.iter().all(|c| c.flags == 1));

    let LogicalReplicationMessage::Update(up) = line(16) else {
        panic!()
    };
    assert_eq!(up.rel_id, OTHER_REL_ID);
    assert_eq!(up.key_tuple, None);
    let old = TupleData {
        columns: vec![text("1"), text(&big), text("1")],
    };
    assert_eq!(up.old_tuple, Some(old));
    // The fixture has no 'u' here: repeat(md5('x'), 400) compresses to far below the TOAST
    // threshold, is stored inline and never out of line, so PostgreSQL sends it in full.
    // `unchanged_toast_and_binary_values` covers 'u' with a synthetic message.
    let new = TupleData {
        columns: vec![text("1"), text(&big), text("2")],
    };
    assert_eq!(up.new_tuple, new);

    let LogicalReplicationMessage::Delete(del) = line(22) else {
        panic!()
    };
    assert_eq!(del.key_tuple, None);
    assert_eq!(del.old_tuple, Some(new));
}

#[test]
fn default_identity_update_sends_only_the_new_tuple() {
    let LogicalReplicationMessage::Update(up) = line(19) else {
        panic!()
    };
    assert_eq!(
        (up.rel_id, &up.key_tuple, &up.old_tuple),
        (OUTBOX_REL_ID, &None, &None)
    );
    assert_eq!(up.new_tuple.columns[0], text(UUID_1));
    assert_eq!(up.new_tuple.columns[3], text("Changed"));
}

#[test]
fn truncate_lists_the_relation() {
    assert_eq!(
        line(26),
        LogicalReplicationMessage::Truncate(TruncateBody {
            options: 0,
            rel_ids: vec![OTHER_REL_ID]
        })
    );
}

#[test]
fn logical_messages() {
    let LogicalReplicationMessage::Message(m) = line(29) else {
        panic!()
    };
    assert!(m.transactional);
    assert_eq!(m.prefix, "outbox");
    assert_eq!(
        m.content,
        r#"{"aggregate_type":"Order","aggregate_id":"o-m","event_type":"E1","payload":{}}"#
    );

    assert_eq!(
        line(31),
        LogicalReplicationMessage::Message(MessageBody {
            transactional: false,
            lsn: "0/113E27F0".parse().unwrap(),
            prefix: "heartbeat".into(),
            content: Bytes::from_static(b"ping"),
        })
    );
}

#[test]
fn relation_after_alter_table_has_the_new_column() {
    let LogicalReplicationMessage::Relation(rel) = line(34) else {
        panic!()
    };
    assert_eq!(rel.rel_id, OUTBOX_REL_ID);
    assert_eq!(rel.columns.len(), 8);
    let last = rel.columns.last().unwrap();
    assert_eq!(
        (last.name.as_str(), last.type_oid, last.flags),
        ("tenant_id", TEXT_OID, 0)
    );

    let LogicalReplicationMessage::Insert(ins) = line(35) else {
        panic!()
    };
    assert_eq!(ins.new_tuple.columns.len(), 8);
    assert_eq!(ins.new_tuple.columns[7], text("t-9"));
}

#[test]
fn origin_transaction() {
    assert_eq!(
        line(38),
        LogicalReplicationMessage::Origin(OriginBody {
            commit_lsn: Lsn(0xAB_CDEF),
            name: "upstream_a".into(),
        })
    );
    // pg_replication_origin_xact_setup's timestamp, 2026-01-01 00:00:00+00, becomes the
    // transaction's commit time.
    let LogicalReplicationMessage::Begin(b) = line(37) else {
        panic!()
    };
    assert_eq!(b.timestamp_us, 820_540_800_000_000);
    let LogicalReplicationMessage::Insert(ins) = line(39) else {
        panic!()
    };
    assert_eq!(ins.new_tuple.columns[7], TupleValue::Null);
}

#[test]
fn unchanged_toast_and_binary_values() {
    let bytes = msg(&[
        b"U\0\0\0\x07K\0\x01t\0\0\0\x011N\0\x03u",
        b"b\0\0\0\x02\x00\xff",
        b"n",
    ]);
    let expected = UpdateBody {
        rel_id: 7,
        key_tuple: Some(TupleData {
            columns: vec![text("1")],
        }),
        old_tuple: None,
        new_tuple: TupleData {
            columns: vec![
                TupleValue::UnchangedToast,
                TupleValue::Binary(Bytes::from_static(b"\x00\xff")),
                TupleValue::Null,
            ],
        },
    };
    assert_eq!(
        decode(bytes.into()).unwrap(),
        LogicalReplicationMessage::Update(expected)
    );
}

#[test]
fn empty_input() {
    let e = err(b"");
    assert_eq!(
        e,
        DecodeError {
            offset: 0,
            kind: DecodeErrorKind::Empty
        }
    );
    assert_eq!(e.to_string(), "empty message at offset 0");
}

#[test]
fn unknown_tags_including_streaming_and_two_phase() {
    assert_eq!(
        err(b"Z").to_string(),
        "unknown message tag 'Z' (0x5a) at offset 0"
    );
    assert_eq!(
        err(b"\0").to_string(),
        "unknown message tag 0x00 at offset 0"
    );
    // Stream start/stop/commit/abort and the two-phase tags (protocol versions 2 and 3).
    for &tag in b"SEcAbPKrs" {
        let e = err(&[tag, 0, 0, 0, 1, 1]);
        assert_eq!(
            e,
            DecodeError {
                offset: 0,
                kind: DecodeErrorKind::UnknownTag(tag)
            }
        );
    }
}

#[test]
fn every_proper_prefix_of_every_fixture_message_is_an_error() {
    // No prefix of a message is itself a complete message: every count and length in the
    // format is explicit, so a cut always falls short of something.
    for (i, l) in fixture().iter().enumerate() {
        for n in 1..l.bytes.len() {
            let e = decode(l.bytes.slice(..n)).expect_err("prefix decoded");
            assert!(
                matches!(
                    e.kind,
                    DecodeErrorKind::Truncated { .. } | DecodeErrorKind::UnterminatedString
                ),
                "line {} cut at {n}: {e}",
                i + 1
            );
            assert!(e.offset <= n, "line {} cut at {n}: {e}", i + 1);
        }
    }
}

#[test]
fn truncated_reports_needed_and_available() {
    let e = err(b"B\0\0\0\0\0\0\0\x01\0\0");
    let kind = DecodeErrorKind::Truncated {
        needed: 8,
        available: 2,
    };
    assert_eq!(e, DecodeError { offset: 9, kind });
    assert_eq!(
        e.to_string(),
        "truncated message: needed 8 bytes, 2 available at offset 9"
    );
    // A text value claiming far more bytes than there are.
    let e = err(b"I\0\0\0\x01N\0\x01t\x7f\xff\xff\xffabc");
    let kind = DecodeErrorKind::Truncated {
        needed: usize::try_from(i32::MAX).unwrap(),
        available: 3,
    };
    assert_eq!(e, DecodeError { offset: 13, kind });
}

#[test]
fn negative_tuple_value_length() {
    let e = err(b"I\0\0\0\x01N\0\x01t\xff\xff\xff\xfbxx");
    assert_eq!(
        e,
        DecodeError {
            offset: 9,
            kind: DecodeErrorKind::NegativeLength(-5)
        }
    );
    assert_eq!(e.to_string(), "negative length -5 at offset 9");
}

#[test]
fn negative_counts() {
    let e = err(b"I\0\0\0\x01N\xff\xfe");
    assert_eq!(
        e,
        DecodeError {
            offset: 6,
            kind: DecodeErrorKind::NegativeLength(-2)
        }
    );
    let e = err(b"T\x80\0\0\0\0");
    let kind = DecodeErrorKind::NegativeLength(i32::MIN);
    assert_eq!(e, DecodeError { offset: 1, kind });
}

#[test]
fn negative_message_content_length() {
    let bytes = msg(&[b"M\x01", &[0; 8], b"outbox\0", b"\xff\xff\xff\xff{}"]);
    let e = err(&bytes);
    assert_eq!(
        e,
        DecodeError {
            offset: 17,
            kind: DecodeErrorKind::NegativeLength(-1)
        }
    );
}

#[test]
fn huge_counts_with_few_bytes_are_truncated_without_allocating() {
    // 30000 columns claimed, one and a half present.
    let bytes = msg(&[
        b"R\0\0\0\x01public\0t\0d\x75\x30",
        b"\x01id\0\0\0\0\x19\xff\xff\xff\xff",
    ]);
    let bytes = msg(&[&bytes, b"\0x\0\0\0\x19"]);
    let e = err(&bytes);
    let kind = DecodeErrorKind::Truncated {
        needed: 4,
        available: 3,
    };
    assert_eq!(e, DecodeError { offset: 32, kind });
    // 2^31 - 1 relation ids claimed, one present.
    let e = err(b"T\x7f\xff\xff\xff\x01\0\0\0\x01");
    let kind = DecodeErrorKind::Truncated {
        needed: 4,
        available: 0,
    };
    assert_eq!(e, DecodeError { offset: 10, kind });
    // 32767 tuple columns claimed, none present.
    let e = err(b"I\0\0\0\x01N\x7f\xff");
    let kind = DecodeErrorKind::Truncated {
        needed: 1,
        available: 0,
    };
    assert_eq!(e, DecodeError { offset: 8, kind });
}

#[test]
fn trailing_bytes() {
    let begin = fixture()[0].bytes.clone();
    let e = err(&msg(&[&begin, b"xy"]));
    assert_eq!(
        e,
        DecodeError {
            offset: 21,
            kind: DecodeErrorKind::TrailingBytes(2)
        }
    );
    assert_eq!(
        e.to_string(),
        "2 trailing bytes after the message at offset 21"
    );
}

#[test]
fn invalid_utf8_and_unterminated_strings() {
    let e = err(b"R\0\0\0\x01public\0ou\xfftbox\0d\0\0");
    assert_eq!(
        e,
        DecodeError {
            offset: 12,
            kind: DecodeErrorKind::InvalidUtf8
        }
    );
    assert_eq!(e.to_string(), "invalid utf-8 in string at offset 12");
    let e = err(b"Y\0\0\0\x01pg\0json");
    assert_eq!(
        e,
        DecodeError {
            offset: 8,
            kind: DecodeErrorKind::UnterminatedString
        }
    );
    let e = err(b"M\0\0\0\0\0\0\0\0\x01\xc3\x28\0\0\0\0\0");
    assert_eq!(
        e,
        DecodeError {
            offset: 10,
            kind: DecodeErrorKind::InvalidUtf8
        }
    );
}

#[test]
fn unknown_tuple_value_kind() {
    let e = err(b"I\0\0\0\x01N\0\x02nx");
    assert_eq!(
        e,
        DecodeError {
            offset: 9,
            kind: DecodeErrorKind::UnknownTupleKind(b'x')
        }
    );
    assert_eq!(
        e.to_string(),
        "unknown tuple value kind 'x' (0x78) at offset 9"
    );
}

#[test]
fn unexpected_tuple_markers() {
    let marker = |expected, found| DecodeErrorKind::UnexpectedTupleMarker { expected, found };
    let e = err(b"I\0\0\0\x01K\0\0");
    assert_eq!(
        e,
        DecodeError {
            offset: 5,
            kind: marker("'N'", b'K')
        }
    );
    assert_eq!(
        e.to_string(),
        "unexpected tuple marker 'K' (0x4b), expected 'N' at offset 5"
    );
    let e = err(b"U\0\0\0\x01X\0\0");
    assert_eq!(
        e,
        DecodeError {
            offset: 5,
            kind: marker("'K', 'O' or 'N'", b'X')
        }
    );
    let e = err(b"U\0\0\0\x01O\0\0K\0\0");
    assert_eq!(
        e,
        DecodeError {
            offset: 8,
            kind: marker("'N'", b'K')
        }
    );
    let e = err(b"D\0\0\0\x01N\0\0");
    assert_eq!(
        e,
        DecodeError {
            offset: 5,
            kind: marker("'K' or 'O'", b'N')
        }
    );
}

/// Checks the decoder's contract on any input: no panic, and errors point inside it.
fn check(bytes: Vec<u8>) {
    let len = bytes.len();
    if let Err(e) = decode(bytes.into()) {
        assert!(e.offset <= len, "{e} for {len} bytes");
    }
}

const TAGS: &[u8] = b"BCORYIUDTM";

/// Test-only encoder: the inverse of [`decode`], written from the protocol docs (55.9
/// "Logical Replication Message Formats"), so decode(encode(m)) == m checks both.
pub(crate) fn encode(message: &LogicalReplicationMessage) -> Vec<u8> {
    fn cstr(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }
    fn tuple(out: &mut Vec<u8>, marker: u8, tuple: &TupleData) {
        out.push(marker);
        out.extend_from_slice(&i16::try_from(tuple.columns.len()).unwrap().to_be_bytes());
        for value in &tuple.columns {
            match value {
                TupleValue::Null => out.push(NULL_VALUE_TAG),
                TupleValue::UnchangedToast => out.push(UNCHANGED_TOAST_VALUE_TAG),
                TupleValue::Text(b) | TupleValue::Binary(b) => {
                    out.push(if matches!(value, TupleValue::Text(_)) {
                        TEXT_VALUE_TAG
                    } else {
                        BINARY_VALUE_TAG
                    });
                    out.extend_from_slice(&i32::try_from(b.len()).unwrap().to_be_bytes());
                    out.extend_from_slice(b);
                }
            }
        }
    }
    let mut out = Vec::new();
    match message {
        LogicalReplicationMessage::Begin(b) => {
            out.push(BEGIN_TAG);
            out.extend_from_slice(&b.final_lsn.0.to_be_bytes());
            out.extend_from_slice(&b.timestamp_us.to_be_bytes());
            out.extend_from_slice(&b.xid.to_be_bytes());
        }
        LogicalReplicationMessage::Commit(c) => {
            out.push(COMMIT_TAG);
            out.push(c.flags);
            out.extend_from_slice(&c.commit_lsn.0.to_be_bytes());
            out.extend_from_slice(&c.end_lsn.0.to_be_bytes());
            out.extend_from_slice(&c.timestamp_us.to_be_bytes());
        }
        LogicalReplicationMessage::Origin(o) => {
            out.push(ORIGIN_TAG);
            out.extend_from_slice(&o.commit_lsn.0.to_be_bytes());
            cstr(&mut out, &o.name);
        }
        LogicalReplicationMessage::Relation(r) => {
            out.push(RELATION_TAG);
            out.extend_from_slice(&r.rel_id.to_be_bytes());
            cstr(&mut out, &r.namespace);
            cstr(&mut out, &r.name);
            out.push(r.replica_identity);
            out.extend_from_slice(&i16::try_from(r.columns.len()).unwrap().to_be_bytes());
            for c in &r.columns {
                out.push(c.flags);
                cstr(&mut out, &c.name);
                out.extend_from_slice(&c.type_oid.to_be_bytes());
                out.extend_from_slice(&c.type_modifier.to_be_bytes());
            }
        }
        LogicalReplicationMessage::Type(t) => {
            out.push(TYPE_TAG);
            out.extend_from_slice(&t.type_oid.to_be_bytes());
            cstr(&mut out, &t.namespace);
            cstr(&mut out, &t.name);
        }
        LogicalReplicationMessage::Insert(i) => {
            out.push(INSERT_TAG);
            out.extend_from_slice(&i.rel_id.to_be_bytes());
            tuple(&mut out, NEW_TUPLE_TAG, &i.new_tuple);
        }
        LogicalReplicationMessage::Update(u) => {
            out.push(UPDATE_TAG);
            out.extend_from_slice(&u.rel_id.to_be_bytes());
            if let Some(k) = &u.key_tuple {
                tuple(&mut out, KEY_TUPLE_TAG, k);
            }
            if let Some(o) = &u.old_tuple {
                tuple(&mut out, OLD_TUPLE_TAG, o);
            }
            tuple(&mut out, NEW_TUPLE_TAG, &u.new_tuple);
        }
        LogicalReplicationMessage::Delete(d) => {
            out.push(DELETE_TAG);
            out.extend_from_slice(&d.rel_id.to_be_bytes());
            if let Some(k) = &d.key_tuple {
                tuple(&mut out, KEY_TUPLE_TAG, k);
            }
            if let Some(o) = &d.old_tuple {
                tuple(&mut out, OLD_TUPLE_TAG, o);
            }
        }
        LogicalReplicationMessage::Truncate(t) => {
            out.push(TRUNCATE_TAG);
            out.extend_from_slice(&i32::try_from(t.rel_ids.len()).unwrap().to_be_bytes());
            out.push(t.options);
            for id in &t.rel_ids {
                out.extend_from_slice(&id.to_be_bytes());
            }
        }
        LogicalReplicationMessage::Message(m) => {
            out.push(MESSAGE_TAG);
            out.push(u8::from(m.transactional));
            out.extend_from_slice(&m.lsn.0.to_be_bytes());
            cstr(&mut out, &m.prefix);
            out.extend_from_slice(&i32::try_from(m.content.len()).unwrap().to_be_bytes());
            out.extend_from_slice(&m.content);
        }
    }
    out
}

#[test]
fn every_fixture_message_re_encodes_to_its_exact_bytes() {
    let lines = fixture();
    let mut tags = std::collections::BTreeSet::new();
    for (n, line) in lines.iter().enumerate() {
        let message = decode(line.bytes.clone()).unwrap();
        assert_eq!(
            encode(&message),
            line.bytes.to_vec(),
            "fixture line {}",
            n + 1
        );
        tags.insert(line.tag);
    }
    assert_eq!(
        tags.len(),
        TAGS.len(),
        "the fixture covers every v1 message kind"
    );
}

fn arb_lsn() -> impl Strategy<Value = Lsn> {
    any::<u64>().prop_map(Lsn)
}

/// Strings as cstrings carry them: UTF-8 without NUL.
fn arb_name() -> impl Strategy<Value = String> {
    "[^\\x00]{0,12}"
}

fn arb_tuple() -> impl Strategy<Value = TupleData> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..12).prop_map(Bytes::from);
    let value = prop_oneof![
        Just(TupleValue::Null),
        Just(TupleValue::UnchangedToast),
        bytes().prop_map(TupleValue::Text),
        bytes().prop_map(TupleValue::Binary),
    ];
    proptest::collection::vec(value, 0..8).prop_map(|columns| TupleData { columns })
}

fn arb_message() -> impl Strategy<Value = LogicalReplicationMessage> {
    use LogicalReplicationMessage as M;
    let column = (any::<u8>(), arb_name(), any::<u32>(), any::<i32>()).prop_map(
        |(flags, name, type_oid, type_modifier)| RelationColumn {
            flags,
            name,
            type_oid,
            type_modifier,
        },
    );
    prop_oneof![
        (arb_lsn(), any::<i64>(), any::<u32>()).prop_map(|(final_lsn, timestamp_us, xid)| {
            M::Begin(BeginBody {
                final_lsn,
                timestamp_us,
                xid,
            })
        }),
        (any::<u8>(), arb_lsn(), arb_lsn(), any::<i64>()).prop_map(
            |(flags, commit_lsn, end_lsn, timestamp_us)| M::Commit(CommitBody {
                flags,
                commit_lsn,
                end_lsn,
                timestamp_us
            })
        ),
        (arb_lsn(), arb_name())
            .prop_map(|(commit_lsn, name)| M::Origin(OriginBody { commit_lsn, name })),
        (
            any::<u32>(),
            arb_name(),
            arb_name(),
            any::<u8>(),
            proptest::collection::vec(column, 0..6)
        )
            .prop_map(|(rel_id, namespace, name, replica_identity, columns)| {
                M::Relation(RelationBody {
                    rel_id,
                    namespace,
                    name,
                    replica_identity,
                    columns,
                })
            }),
        (any::<u32>(), arb_name(), arb_name()).prop_map(|(type_oid, namespace, name)| {
            M::Type(TypeBody {
                type_oid,
                namespace,
                name,
            })
        }),
        (any::<u32>(), arb_tuple())
            .prop_map(|(rel_id, new_tuple)| M::Insert(InsertBody { rel_id, new_tuple })),
        (any::<u32>(), 0..3u8, arb_tuple(), arb_tuple()).prop_map(
            |(rel_id, old, before, new_tuple)| M::Update(UpdateBody {
                rel_id,
                key_tuple: (old == 1).then(|| before.clone()),
                old_tuple: (old == 2).then_some(before),
                new_tuple,
            })
        ),
        (any::<u32>(), any::<bool>(), arb_tuple()).prop_map(|(rel_id, key, before)| {
            M::Delete(DeleteBody {
                rel_id,
                key_tuple: key.then(|| before.clone()),
                old_tuple: (!key).then_some(before),
            })
        }),
        (any::<u8>(), proptest::collection::vec(any::<u32>(), 0..6))
            .prop_map(|(options, rel_ids)| M::Truncate(TruncateBody { options, rel_ids })),
        (
            any::<bool>(),
            arb_lsn(),
            arb_name(),
            proptest::collection::vec(any::<u8>(), 0..32)
        )
            .prop_map(|(transactional, lsn, prefix, content)| {
                M::Message(MessageBody {
                    transactional,
                    lsn,
                    prefix,
                    content: content.into(),
                })
            }),
    ]
}

proptest! {
    #[test]
    fn every_message_kind_round_trips_through_the_encoder(message in arb_message()) {
        let bytes = encode(&message);
        prop_assert_eq!(decode(bytes.clone().into()).unwrap(), message);
        // Any shorter prefix is an error, never a panic or a different message.
        for cut in 0..bytes.len() {
            prop_assert!(decode(Bytes::copy_from_slice(&bytes[..cut])).is_err());
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        check(bytes);
    }

    #[test]
    fn arbitrary_bodies_after_a_valid_tag_never_panic(
        tag in proptest::sample::select(TAGS),
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        check(msg(&[&[tag], &body]));
    }

    #[test]
    fn mutated_fixture_messages_never_panic(
        n in 0..40usize,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<usize>(),
    ) {
        let mut bytes = fixture()[n].bytes.to_vec();
        let len = bytes.len();
        for (at, b) in edits {
            bytes[at % len] = b;
        }
        check(bytes.clone());
        bytes.truncate(cut % (len + 1));
        check(bytes);
    }

    #[test]
    fn insert_values_round_trip(
        values in proptest::collection::vec(
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
            0..20,
        ),
    ) {
        let mut bytes = msg(&[b"I\0\0\x01\x02N", &i16::try_from(values.len()).unwrap().to_be_bytes()]);
        for v in &values {
            match v {
                None => bytes.push(b'n'),
                Some(v) => {
                    bytes.push(b't');
                    bytes.extend_from_slice(&u32::try_from(v.len()).unwrap().to_be_bytes());
                    bytes.extend_from_slice(v);
                }
            }
        }
        let columns = values
            .into_iter()
            .map(|v| v.map_or(TupleValue::Null, |v| TupleValue::Text(v.into())))
            .collect();
        let expected = InsertBody { rel_id: 0x102, new_tuple: TupleData { columns } };
        prop_assert_eq!(
            decode(bytes.into()).unwrap(),
            LogicalReplicationMessage::Insert(expected)
        );
    }
}
