//! Decodes pgoutput logical replication messages, protocol version 1.
//!
//! The wire format is the one in the PostgreSQL docs, 55.9 Logical Replication Message Formats
//! (PostgreSQL 15), for protocol version 1: no streaming (`S`, `E`, `c`, `A`) or two-phase
//! messages, and no xid in Insert, Update, Delete, Truncate or Message.
//!
//! The decoder is sans-IO: [`decode`] takes the bytes of one message (what the walsender puts
//! inside an XLogData frame, starting at the tag byte) and never panics, whatever those bytes
//! are. Every length and count is checked against the bytes that remain before it is used.
//!
//! Column values and logical message contents are zero-copy slices of the input, exactly as
//! PostgreSQL sent them: text values stay in the text form PostgreSQL printed them (jsonb as
//! jsonb_out wrote it, for instance). The relay relies on this to publish byte-exact payloads.

use std::fmt;

use bytes::Bytes;

use crate::lsn::Lsn;

const BEGIN_TAG: u8 = b'B';
const COMMIT_TAG: u8 = b'C';
const ORIGIN_TAG: u8 = b'O';
const RELATION_TAG: u8 = b'R';
const TYPE_TAG: u8 = b'Y';
const INSERT_TAG: u8 = b'I';
const UPDATE_TAG: u8 = b'U';
const DELETE_TAG: u8 = b'D';
const TRUNCATE_TAG: u8 = b'T';
const MESSAGE_TAG: u8 = b'M';

const NEW_TUPLE_TAG: u8 = b'N';
const KEY_TUPLE_TAG: u8 = b'K';
const OLD_TUPLE_TAG: u8 = b'O';

const NULL_VALUE_TAG: u8 = b'n';
const UNCHANGED_TOAST_VALUE_TAG: u8 = b'u';
const TEXT_VALUE_TAG: u8 = b't';
const BINARY_VALUE_TAG: u8 = b'b';

/// Smallest encoding of one Relation column: flags, an empty name, type oid and modifier.
const MIN_RELATION_COLUMN_LEN: usize = 1 + 1 + 4 + 4;

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogicalReplicationMessage {
    Begin(BeginBody),
    Commit(CommitBody),
    Origin(OriginBody),
    Relation(RelationBody),
    Type(TypeBody),
    Insert(InsertBody),
    Update(UpdateBody),
    Delete(DeleteBody),
    Truncate(TruncateBody),
    Message(MessageBody),
}

impl LogicalReplicationMessage {
    /// The message kind in lowercase (`"begin"`, `"insert"`, ...), for low-cardinality labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Begin(_) => "begin",
            Self::Commit(_) => "commit",
            Self::Origin(_) => "origin",
            Self::Relation(_) => "relation",
            Self::Type(_) => "type",
            Self::Insert(_) => "insert",
            Self::Update(_) => "update",
            Self::Delete(_) => "delete",
            Self::Truncate(_) => "truncate",
            Self::Message(_) => "message",
        }
    }
}

/// `B`: the start of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginBody {
    /// The LSN of the transaction's commit record.
    pub final_lsn: Lsn,
    /// Commit time in microseconds since 2000-01-01 00:00:00 UTC, as on the wire.
    pub timestamp_us: i64,
    pub xid: u32,
}

/// `C`: the end of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitBody {
    /// Currently unused by PostgreSQL (always 0).
    pub flags: u8,
    /// The LSN of the commit record.
    pub commit_lsn: Lsn,
    /// The LSN just past the commit record: the position to confirm once the transaction is done.
    pub end_lsn: Lsn,
    /// Commit time in microseconds since 2000-01-01 00:00:00 UTC, as on the wire.
    pub timestamp_us: i64,
}

/// `O`: the transaction was replayed under a replication origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginBody {
    /// The commit LSN on the origin server.
    pub commit_lsn: Lsn,
    pub name: String,
}

/// `R`: the schema of a relation, sent before its first change in a session and after DDL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationBody {
    pub rel_id: u32,
    /// Empty for `pg_catalog`.
    pub namespace: String,
    pub name: String,
    /// `d` default, `n` nothing, `f` full, `i` index (`relreplident`).
    pub replica_identity: u8,
    pub columns: Vec<RelationColumn>,
}

/// One column of a [`RelationBody`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// 1 = part of the key (replica identity).
    pub flags: u8,
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
}

/// `Y`: a non-built-in type used by a following Relation.
///
/// PostgreSQL sends the column's type oid (a domain's own oid) but the namespace and name of its
/// base type; the namespace is empty for `pg_catalog`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeBody {
    pub type_oid: u32,
    pub namespace: String,
    pub name: String,
}

/// `I`: an inserted row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertBody {
    pub rel_id: u32,
    pub new_tuple: TupleData,
}

/// `U`: an updated row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateBody {
    pub rel_id: u32,
    /// `K`: the old key, when the update changed it (replica identity default or index).
    pub key_tuple: Option<TupleData>,
    /// `O`: the whole old row (replica identity full).
    pub old_tuple: Option<TupleData>,
    pub new_tuple: TupleData,
}

/// `D`: a deleted row; exactly one of `key_tuple` and `old_tuple` is `Some`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteBody {
    pub rel_id: u32,
    /// `K`: the key of the deleted row; non-key columns are null.
    pub key_tuple: Option<TupleData>,
    /// `O`: the whole deleted row (replica identity full).
    pub old_tuple: Option<TupleData>,
}

/// `T`: truncated relations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TruncateBody {
    /// Bit 1 = `CASCADE`, bit 2 = `RESTART IDENTITY`.
    pub options: u8,
    pub rel_ids: Vec<u32>,
}

/// `M`: a logical decoding message (`pg_logical_emit_message`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageBody {
    /// Flags bit 1: the message was emitted inside a transaction (between Begin and Commit).
    pub transactional: bool,
    pub lsn: Lsn,
    pub prefix: String,
    pub content: Bytes,
}

/// The columns of one row, in the Relation's column order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TupleData {
    pub columns: Vec<TupleValue>,
}

/// One column value of a [`TupleData`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TupleValue {
    /// `n`: SQL NULL.
    Null,
    /// `u`: an unchanged TOASTed value that PostgreSQL did not send.
    UnchangedToast,
    /// `t`: the value in PostgreSQL's text output form.
    Text(Bytes),
    /// `b`: the value in PostgreSQL's binary send form.
    Binary(Bytes),
}

/// A message could not be decoded; `offset` is the byte offset into it (0 = the tag).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{kind} at offset {offset}")]
pub struct DecodeError {
    pub offset: usize,
    pub kind: DecodeErrorKind,
}

/// What was wrong with a message.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum DecodeErrorKind {
    #[error("empty message")]
    Empty,
    #[error("unknown message tag {}", ByteChar(*.0))]
    UnknownTag(u8),
    #[error("truncated message: needed {needed} bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("negative length {0}")]
    NegativeLength(i32),
    #[error("unknown tuple value kind {}", ByteChar(*.0))]
    UnknownTupleKind(u8),
    #[error("unexpected tuple marker {}, expected {expected}", ByteChar(*.found))]
    UnexpectedTupleMarker { expected: &'static str, found: u8 },
    #[error("unterminated string")]
    UnterminatedString,
    #[error("invalid utf-8 in string")]
    InvalidUtf8,
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
}

/// Prints a wire byte as `'X' (0x58)`, or `0x00` when it is not printable ASCII.
struct ByteChar(u8);

impl fmt::Display for ByteChar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_ascii_graphic() {
            write!(f, "'{}' (0x{:02x})", char::from(self.0), self.0)
        } else {
            write!(f, "0x{:02x}", self.0)
        }
    }
}

/// Decodes one pgoutput (protocol version 1) message, starting at its tag byte.
///
/// Column values and message content are slices of `buf`.
///
/// # Errors
///
/// Returns an error if `buf` is empty, starts with a tag that protocol version 1 does not define
/// (streaming and two-phase tags included), ends before a field or a value its lengths claim,
/// holds a negative length or count, an unknown tuple value kind or an unexpected tuple marker,
/// a string without its NUL terminator or that is not UTF-8, or has bytes left over after the
/// message.
pub fn decode(buf: Bytes) -> Result<LogicalReplicationMessage, DecodeError> {
    let mut r = Reader { buf, pos: 0 };
    if r.remaining() == 0 {
        return Err(r.err(DecodeErrorKind::Empty));
    }
    let message = match r.u8()? {
        BEGIN_TAG => LogicalReplicationMessage::Begin(BeginBody {
            final_lsn: r.lsn()?,
            timestamp_us: r.i64()?,
            xid: r.u32()?,
        }),
        COMMIT_TAG => LogicalReplicationMessage::Commit(CommitBody {
            flags: r.u8()?,
            commit_lsn: r.lsn()?,
            end_lsn: r.lsn()?,
            timestamp_us: r.i64()?,
        }),
        ORIGIN_TAG => LogicalReplicationMessage::Origin(OriginBody {
            commit_lsn: r.lsn()?,
            name: r.cstr()?,
        }),
        RELATION_TAG => LogicalReplicationMessage::Relation(relation(&mut r)?),
        TYPE_TAG => LogicalReplicationMessage::Type(TypeBody {
            type_oid: r.u32()?,
            namespace: r.cstr()?,
            name: r.cstr()?,
        }),
        INSERT_TAG => {
            let rel_id = r.u32()?;
            r.marker(&[NEW_TUPLE_TAG], "'N'")?;
            let new_tuple = r.tuple()?;
            LogicalReplicationMessage::Insert(InsertBody { rel_id, new_tuple })
        }
        UPDATE_TAG => LogicalReplicationMessage::Update(update(&mut r)?),
        DELETE_TAG => {
            let rel_id = r.u32()?;
            let marker = r.marker(&[KEY_TUPLE_TAG, OLD_TUPLE_TAG], "'K' or 'O'")?;
            let tuple = r.tuple()?;
            let (key_tuple, old_tuple) = if marker == KEY_TUPLE_TAG {
                (Some(tuple), None)
            } else {
                (None, Some(tuple))
            };
            LogicalReplicationMessage::Delete(DeleteBody {
                rel_id,
                key_tuple,
                old_tuple,
            })
        }
        TRUNCATE_TAG => {
            let count = r.len_i32()?;
            let options = r.u8()?;
            let mut rel_ids = Vec::with_capacity(count.min(r.remaining() / 4));
            for _ in 0..count {
                rel_ids.push(r.u32()?);
            }
            LogicalReplicationMessage::Truncate(TruncateBody { options, rel_ids })
        }
        MESSAGE_TAG => {
            let flags = r.u8()?;
            let lsn = r.lsn()?;
            let prefix = r.cstr()?;
            let len = r.len_i32()?;
            LogicalReplicationMessage::Message(MessageBody {
                transactional: flags & 1 != 0,
                lsn,
                prefix,
                content: r.bytes(len)?,
            })
        }
        tag => {
            return Err(DecodeError {
                offset: 0,
                kind: DecodeErrorKind::UnknownTag(tag),
            })
        }
    };
    match r.remaining() {
        0 => Ok(message),
        n => Err(r.err(DecodeErrorKind::TrailingBytes(n))),
    }
}

fn relation(r: &mut Reader) -> Result<RelationBody, DecodeError> {
    let rel_id = r.u32()?;
    let namespace = r.cstr()?;
    let name = r.cstr()?;
    let replica_identity = r.u8()?;
    let count = r.count_i16()?;
    let mut columns = Vec::with_capacity(count.min(r.remaining() / MIN_RELATION_COLUMN_LEN));
    for _ in 0..count {
        columns.push(RelationColumn {
            flags: r.u8()?,
            name: r.cstr()?,
            type_oid: r.u32()?,
            type_modifier: r.i32()?,
        });
    }
    Ok(RelationBody {
        rel_id,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn update(r: &mut Reader) -> Result<UpdateBody, DecodeError> {
    let rel_id = r.u32()?;
    let mut key_tuple = None;
    let mut old_tuple = None;
    let allowed = [KEY_TUPLE_TAG, OLD_TUPLE_TAG, NEW_TUPLE_TAG];
    match r.marker(&allowed, "'K', 'O' or 'N'")? {
        KEY_TUPLE_TAG => key_tuple = Some(r.tuple()?),
        OLD_TUPLE_TAG => old_tuple = Some(r.tuple()?),
        _ => {
            return Ok(UpdateBody {
                rel_id,
                key_tuple,
                old_tuple,
                new_tuple: r.tuple()?,
            })
        }
    }
    r.marker(&[NEW_TUPLE_TAG], "'N'")?;
    Ok(UpdateBody {
        rel_id,
        key_tuple,
        old_tuple,
        new_tuple: r.tuple()?,
    })
}

/// A cursor over one message; every read checks the bytes that remain and reports its offset.
struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn rest(&self) -> &[u8] {
        match self.buf.get(self.pos..) {
            Some(rest) => rest,
            None => &[],
        }
    }

    fn err(&self, kind: DecodeErrorKind) -> DecodeError {
        DecodeError {
            offset: self.pos,
            kind,
        }
    }

    fn truncated(&self, needed: usize) -> DecodeError {
        self.err(DecodeErrorKind::Truncated {
            needed,
            available: self.remaining(),
        })
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        match self.rest().first_chunk::<N>() {
            Some(&chunk) => {
                self.pos += N;
                Ok(chunk)
            }
            None => Err(self.truncated(N)),
        }
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        self.array::<1>().map(u8::from_be_bytes)
    }

    fn i16(&mut self) -> Result<i16, DecodeError> {
        self.array().map(i16::from_be_bytes)
    }

    fn i32(&mut self) -> Result<i32, DecodeError> {
        self.array().map(i32::from_be_bytes)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_be_bytes)
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        self.array().map(i64::from_be_bytes)
    }

    fn lsn(&mut self) -> Result<Lsn, DecodeError> {
        self.array().map(|b| Lsn(u64::from_be_bytes(b)))
    }

    /// The next `n` bytes, as a zero-copy slice of the message.
    fn bytes(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        if n > self.remaining() {
            return Err(self.truncated(n));
        }
        let start = self.pos;
        // Cannot overflow or exceed `buf.len()`: `n <= buf.len() - pos` was just checked.
        self.pos += n;
        Ok(self.buf.slice(start..self.pos))
    }

    /// A NUL-terminated UTF-8 string (`String` in the docs).
    fn cstr(&mut self) -> Result<String, DecodeError> {
        let rest = self.rest();
        let Some(nul) = rest.iter().position(|&b| b == 0) else {
            return Err(self.err(DecodeErrorKind::UnterminatedString));
        };
        let text = rest.get(..nul).map(std::str::from_utf8);
        let Some(Ok(text)) = text else {
            return Err(self.err(DecodeErrorKind::InvalidUtf8));
        };
        let text = text.to_owned();
        self.pos += nul + 1;
        Ok(text)
    }

    /// A signed 32-bit length or count, which must not be negative.
    fn len_i32(&mut self) -> Result<usize, DecodeError> {
        let offset = self.pos;
        let n = self.i32()?;
        non_negative(offset, n)
    }

    /// A signed 16-bit count, which must not be negative.
    fn count_i16(&mut self) -> Result<usize, DecodeError> {
        let offset = self.pos;
        let n = self.i16()?;
        non_negative(offset, i32::from(n))
    }

    /// A tuple marker byte (`N`, `K` or `O`), which must be one of `allowed`.
    fn marker(&mut self, allowed: &[u8], expected: &'static str) -> Result<u8, DecodeError> {
        let offset = self.pos;
        let found = self.u8()?;
        if allowed.contains(&found) {
            Ok(found)
        } else {
            Err(DecodeError {
                offset,
                kind: DecodeErrorKind::UnexpectedTupleMarker { expected, found },
            })
        }
    }

    /// `TupleData`: a column count, then one kind byte (and maybe a value) per column.
    fn tuple(&mut self) -> Result<TupleData, DecodeError> {
        let count = self.count_i16()?;
        // Every column takes at least its kind byte.
        let mut columns = Vec::with_capacity(count.min(self.remaining()));
        for _ in 0..count {
            let offset = self.pos;
            let value = match self.u8()? {
                NULL_VALUE_TAG => TupleValue::Null,
                UNCHANGED_TOAST_VALUE_TAG => TupleValue::UnchangedToast,
                TEXT_VALUE_TAG => {
                    let len = self.len_i32()?;
                    TupleValue::Text(self.bytes(len)?)
                }
                BINARY_VALUE_TAG => {
                    let len = self.len_i32()?;
                    TupleValue::Binary(self.bytes(len)?)
                }
                kind => {
                    return Err(DecodeError {
                        offset,
                        kind: DecodeErrorKind::UnknownTupleKind(kind),
                    })
                }
            };
            columns.push(value);
        }
        Ok(TupleData { columns })
    }
}

/// Converts a wire length or count read at `offset`; fails only for negative values, since any
/// non-negative `i32` fits a `usize` on the 32- and 64-bit targets the relay runs on.
fn non_negative(offset: usize, n: i32) -> Result<usize, DecodeError> {
    usize::try_from(n).map_err(|_| DecodeError {
        offset,
        kind: DecodeErrorKind::NegativeLength(n),
    })
}

/// The decoder's tests, and its inverse for other tests (the session simulation).
#[cfg(test)]
pub(crate) mod tests;
