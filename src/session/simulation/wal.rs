//! The WAL of one schedule: transactions of random sizes, keys and kinds of change, with
//! their LSNs and the virtual time each commits at, generated from the seed up front.

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use fastrand::Rng;

use crate::lsn::Lsn;
use crate::source::pgoutput::tests::encode;
use crate::source::pgoutput::{
    BeginBody, CommitBody, InsertBody, LogicalReplicationMessage as Pg, MessageBody, RelationBody,
    RelationColumn, TupleData, TupleValue,
};

/// Where the slot starts.
pub(super) const START: Lsn = Lsn(0x1_0000);
/// The outbox table's oid (its Relation messages' id); the other table's.
pub(super) const OUTBOX_OID: u32 = 16_384;
pub(super) const OTHER_OID: u32 = 16_390;
/// The prefix of logical decoding messages that carry outbox events.
pub(super) const MESSAGE_PREFIX: &str = "outbox";
/// The topic of good events (aggregate type `order`).
pub(super) const TOPIC: &str = "order.events";
pub(super) const DEAD_LETTER_TOPIC: &str = "outbox.dead_letter";

/// An outbox event as the model knows it.
#[derive(Clone, Debug)]
pub(super) struct EventSpec {
    pub id: String,
    /// `None`: a NULL aggregate id (a null key: no order promised).
    pub key: Option<String>,
    /// `order`, or one that is not a legal topic name (bad input).
    pub aggregate_type: &'static str,
    /// Bytes of the payload (a JSON string padded to this length).
    pub payload_len: usize,
}

/// One change of a transaction, in WAL order.
#[derive(Clone, Debug)]
pub(super) enum Change {
    /// An INSERT into the outbox table.
    Insert(EventSpec),
    /// A transactional logical decoding message with the outbox prefix.
    Message(EventSpec),
    /// An INSERT into another published table: no event.
    OtherTable,
    /// A transactional logical decoding message with another prefix: no event.
    OtherMessage,
}

impl Change {
    pub fn event(&self) -> Option<&EventSpec> {
        match self {
            Change::Insert(e) | Change::Message(e) => Some(e),
            Change::OtherTable | Change::OtherMessage => None,
        }
    }
}

/// One committed transaction.
#[derive(Clone, Debug)]
pub(super) struct Txn {
    /// Where its commit record starts (Begin's `final_lsn`).
    pub final_lsn: Lsn,
    pub end_lsn: Lsn,
    /// LSNs of its changes, in order (they may lie below the previous transaction's end:
    /// transactions overlap in the WAL, commit order is what counts).
    pub change_lsns: Vec<Lsn>,
    pub changes: Vec<Change>,
    /// The outbox table's shape in effect (0, or 1 after ALTER TABLE: a column dropped before
    /// the mapped ones, one added after them).
    pub schema: u8,
    /// Virtual time since the schedule started at which it commits.
    pub commit_at: Duration,
    /// Its pgoutput messages, encoded once per schedule.
    pub encoded: Encoded,
}

/// A transaction's pgoutput messages, as the walsender puts them in XLogData (the Relation
/// messages are the session's affair: [`RELATIONS`]).
#[derive(Clone, Debug)]
pub(super) struct Encoded {
    /// A non-transactional logical message with the outbox prefix just before its Begin (not
    /// an event: emitted whether or not a transaction commits).
    pub non_transactional_before: Option<Bytes>,
    pub begin: Bytes,
    /// One per change.
    pub changes: Vec<Bytes>,
    pub commit: Bytes,
}

impl Txn {
    pub fn events(&self) -> impl Iterator<Item = &EventSpec> {
        self.changes.iter().filter_map(Change::event)
    }
}

/// What a schedule may generate.
#[derive(Clone, Copy, Debug)]
pub(super) struct WalShape {
    /// Bad events (an illegal topic name, payloads too large for the producer or the broker).
    pub bad_input: bool,
    /// Exactly-once: up to two transactions more, and bursts of commits a few ms apart, so
    /// that batches of several transactions form.
    pub bursts: bool,
}

/// The whole WAL of a schedule.
#[derive(Debug)]
pub(super) struct Wal {
    pub txns: Vec<Txn>,
    /// The end of WAL once everything committed (other tables' WAL after the last commit).
    pub end: Lsn,
}

impl Wal {
    pub fn generate(rng: &mut Rng, shape: WalShape) -> Wal {
        let count = rng.usize(1..=4) + if shape.bursts { rng.usize(0..=2) } else { 0 };
        let schema_change = rng.usize(0..count + 2);
        let keys = rng.usize(1..=4);
        let mut txns: Vec<Txn> = Vec::with_capacity(count);
        let mut at = Duration::ZERO;
        let mut end = START;
        for i in 0..count {
            let size = match rng.u8(0..10) {
                0 => 0,
                1..=6 => rng.usize(1..=2),
                _ => rng.usize(3..=5),
            };
            let changes: Vec<Change> = (0..size)
                .map(|n| {
                    let event = |rng: &mut Rng| {
                        // Bad: an illegal topic name (its dead-letter copy keeps the
                        // payload: a small one), or a payload too large for a limit.
                        let (bad_topic, large) = match shape.bad_input && rng.u8(0..20) == 0 {
                            true => (rng.bool(), rng.bool()),
                            false => (false, false),
                        };
                        EventSpec {
                            id: format!("e{i}.{n}"),
                            key: (rng.u8(0..20) != 0).then(|| format!("k{}", rng.usize(0..keys))),
                            aggregate_type: if bad_topic { "bad type" } else { "order" },
                            payload_len: if large && !bad_topic {
                                rng.usize(1200..3600)
                            } else {
                                rng.usize(2..60)
                            },
                        }
                    };
                    match rng.u8(0..10) {
                        0 => Change::OtherTable,
                        1 => Change::OtherMessage,
                        2 | 3 => Change::Message(event(rng)),
                        _ => Change::Insert(event(rng)),
                    }
                })
                .collect();
            // Overlapping: the changes started before the previous transaction committed.
            let first = match txns.last() {
                Some(previous) if rng.u8(0..4) == 0 => Lsn(previous.final_lsn.0 - 0x8),
                _ => Lsn(end.0 + rng.u64(0x10..0x400)),
            };
            let change_lsns: Vec<Lsn> = (0..size as u64).map(|n| Lsn(first.0 + 0x10 * n)).collect();
            let final_lsn = Lsn((first.0 + 0x10 * (size as u64 + 1)).max(end.0 + 0x10));
            let end_lsn = Lsn(final_lsn.0 + 0x30);
            at += Duration::from_millis(match shape.bursts && rng.bool() {
                true => rng.u64(0..5),
                false => rng.u64(0..300),
            });
            let schema = u8::from(i >= schema_change);
            let non_transactional_before = rng.u8(0..10) == 0;
            let encoded = encode_txn(
                i,
                final_lsn,
                end_lsn,
                at,
                &changes,
                &change_lsns,
                schema,
                non_transactional_before,
            );
            txns.push(Txn {
                final_lsn,
                end_lsn,
                change_lsns,
                changes,
                schema,
                commit_at: at,
                encoded,
            });
            end = end_lsn;
        }
        Wal {
            txns,
            end: Lsn(end.0 + rng.u64(0..0x100)),
        }
    }

    /// The last transaction's end LSN: where the flush LSN must get to.
    pub fn last_commit(&self) -> Lsn {
        self.txns.last().map_or(START, |t| t.end_lsn)
    }
}

/// Encodes transaction number `index`'s messages.
#[allow(clippy::too_many_arguments)]
fn encode_txn(
    index: usize,
    final_lsn: Lsn,
    end_lsn: Lsn,
    commit_at: Duration,
    changes: &[Change],
    change_lsns: &[Lsn],
    schema: u8,
    non_transactional_before: bool,
) -> Encoded {
    let bytes = |message: &Pg| Bytes::from(encode(message));
    let timestamp_us = 800_000_000_000_000 + commit_at.as_micros() as i64;
    let message = |transactional: bool, lsn: Lsn, prefix: &str, content: String| {
        bytes(&Pg::Message(MessageBody {
            transactional,
            lsn,
            prefix: prefix.into(),
            content: Bytes::from(content),
        }))
    };
    Encoded {
        non_transactional_before: non_transactional_before.then(|| {
            message(
                false,
                Lsn(final_lsn.0 - 0x4),
                MESSAGE_PREFIX,
                r#"{"aggregate_type":"order","aggregate_id":"k0"}"#.into(),
            )
        }),
        begin: bytes(&Pg::Begin(BeginBody {
            final_lsn,
            timestamp_us,
            xid: 1000 + index as u32,
        })),
        changes: changes
            .iter()
            .zip(change_lsns)
            .map(|(change, &lsn)| match change {
                Change::Insert(event) => bytes(&Pg::Insert(InsertBody {
                    rel_id: OUTBOX_OID,
                    new_tuple: outbox_row(event, schema),
                })),
                Change::OtherTable => bytes(&Pg::Insert(InsertBody {
                    rel_id: OTHER_OID,
                    new_tuple: TupleData {
                        columns: vec![text("1"), text("x")],
                    },
                })),
                Change::Message(event) => {
                    let key = event.key.as_deref().map_or("null".into(), |k| format!("\"{k}\""));
                    let content = format!(
                        r#"{{"id":"{}","aggregate_type":"{}","aggregate_id":{key},"event_type":"created","payload":{}}}"#,
                        event.id,
                        event.aggregate_type,
                        payload(event),
                    );
                    message(true, lsn, MESSAGE_PREFIX, content)
                }
                Change::OtherMessage => message(true, lsn, "audit", "{}".into()),
            })
            .collect(),
        commit: bytes(&Pg::Commit(CommitBody {
            flags: 0,
            commit_lsn: final_lsn,
            end_lsn,
            timestamp_us,
        })),
    }
}

/// The Relation messages: the outbox in each of its shapes, and the other table.
pub(super) struct Relations {
    pub outbox: [Bytes; 2],
    pub other: Bytes,
}

pub(super) static RELATIONS: LazyLock<Relations> = LazyLock::new(|| Relations {
    outbox: [0, 1].map(|schema| Bytes::from(encode(&outbox_relation(schema)))),
    other: Bytes::from(encode(&Pg::Relation(RelationBody {
        rel_id: OTHER_OID,
        namespace: "public".into(),
        name: "orders".into(),
        replica_identity: b'd',
        columns: vec![column("id", TEXT), column("state", TEXT)],
    }))),
});

/// Type oids of the outbox's columns.
const UUID: u32 = 2950;
const TEXT: u32 = 25;
const JSONB: u32 = 3802;

fn text(value: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(value.as_bytes()))
}

fn column(name: &str, type_oid: u32) -> RelationColumn {
    RelationColumn {
        flags: u8::from(name == "id"),
        name: name.into(),
        type_oid,
        type_modifier: -1,
    }
}

/// Schema 0: `legacy` before the mapped columns; schema 1 (after ALTER TABLE): `legacy`
/// dropped, `note` added at the end. A mapping by position would misread every column.
fn outbox_relation(schema: u8) -> Pg {
    let mut columns = vec![column("id", UUID)];
    if schema == 0 {
        columns.push(column("legacy", TEXT));
    }
    columns.extend([
        column("aggregate_type", TEXT),
        column("aggregate_id", TEXT),
        column("event_type", TEXT),
        column("payload", JSONB),
        column("headers", JSONB),
    ]);
    if schema == 1 {
        columns.push(column("note", TEXT));
    }
    Pg::Relation(RelationBody {
        rel_id: OUTBOX_OID,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns,
    })
}

/// The payload: a JSON string of `payload_len` bytes.
fn payload(event: &EventSpec) -> String {
    format!("\"{}\"", "x".repeat(event.payload_len.saturating_sub(2)))
}

fn outbox_row(event: &EventSpec, schema: u8) -> TupleData {
    let mut columns = vec![text(&event.id)];
    if schema == 0 {
        columns.push(text("old"));
    }
    columns.extend([
        text(event.aggregate_type),
        event.key.as_deref().map_or(TupleValue::Null, text),
        text("created"),
        text(&payload(event)),
        text("{}"),
    ]);
    if schema == 1 {
        columns.push(TupleValue::Null);
    }
    TupleData { columns }
}
