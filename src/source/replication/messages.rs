//! The CopyData messages of a logical replication stream (PostgreSQL docs 55.4 "Streaming
//! Replication Protocol": XLogData, primary keepalive, standby status update) and the
//! `START_REPLICATION` command.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::lsn::Lsn;
use crate::source::SourceError;

/// Seconds from the Unix epoch to PostgreSQL's epoch, 2000-01-01 00:00:00 UTC.
pub const PG_EPOCH_OFFSET_SECS: i64 = 946_684_800;

const XLOG_DATA_TAG: u8 = b'w';
const PRIMARY_KEEPALIVE_TAG: u8 = b'k';
const STANDBY_STATUS_UPDATE_TAG: u8 = b'r';

/// A message of the replication stream, carried in CopyData (docs 55.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationMessage {
    /// WAL data: here one pgoutput message starting at `wal_start`.
    XLogData {
        wal_start: Lsn,
        /// The current end of WAL on the server.
        wal_end: Lsn,
        /// Server clock, microseconds since 2000-01-01 UTC.
        send_time_us: i64,
        data: Bytes,
    },
    /// A keepalive; with `reply_requested` the walsender disconnects unless a status update
    /// follows before `wal_sender_timeout`.
    PrimaryKeepalive {
        wal_end: Lsn,
        send_time_us: i64,
        reply_requested: bool,
    },
}

/// Parses the payload of one CopyData message of the replication stream.
///
/// Returns an error if the tag is neither `w` nor `k` or the message is truncated.
pub fn parse_copy_data(mut buf: Bytes) -> Result<ReplicationMessage, SourceError> {
    let protocol = |what: &str| SourceError::Protocol(format!("{what} in replication CopyData"));
    if buf.is_empty() {
        return Err(protocol("empty message"));
    }
    match buf.get_u8() {
        XLOG_DATA_TAG => {
            if buf.len() < 24 {
                return Err(protocol("truncated XLogData header"));
            }
            Ok(ReplicationMessage::XLogData {
                wal_start: Lsn(buf.get_u64()),
                wal_end: Lsn(buf.get_u64()),
                send_time_us: buf.get_i64(),
                data: buf,
            })
        }
        PRIMARY_KEEPALIVE_TAG => {
            if buf.len() != 17 {
                return Err(protocol("malformed primary keepalive"));
            }
            Ok(ReplicationMessage::PrimaryKeepalive {
                wal_end: Lsn(buf.get_u64()),
                send_time_us: buf.get_i64(),
                reply_requested: buf.get_u8() != 0,
            })
        }
        tag => Err(protocol(&format!("unknown tag 0x{tag:02x}"))),
    }
}

/// Encodes a standby status update (docs 55.4): `write` is the last LSN received, `flush`
/// and `apply` the LSN the relay confirms (everything before it is in Kafka).
pub fn standby_status_update(write: Lsn, flush: Lsn, apply: Lsn, now_us: i64) -> Bytes {
    let mut buf = BytesMut::with_capacity(34);
    buf.put_u8(STANDBY_STATUS_UPDATE_TAG);
    buf.put_u64(write.0);
    buf.put_u64(flush.0);
    buf.put_u64(apply.0);
    buf.put_i64(now_us);
    buf.put_u8(0);
    buf.freeze()
}

/// Microseconds from 2000-01-01 UTC to `time`, the clock unit of the replication protocol.
pub fn pg_timestamp_us(time: SystemTime) -> i64 {
    let since_unix = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since_unix.as_micros()).unwrap_or(i64::MAX) - PG_EPOCH_OFFSET_SECS * 1_000_000
}

pub use crate::config::quote_ident;

/// Quotes an SQL string literal (`'it''s'`).
pub fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// The `START_REPLICATION` command for pgoutput protocol version 1 with logical messages.
pub fn start_replication_command(slot: &str, start: Lsn, publication: &str) -> String {
    format!(
        "START_REPLICATION SLOT {} LOGICAL {} (proto_version '1', publication_names {}, messages 'true')",
        quote_ident(slot),
        start,
        quote_literal(&quote_ident(publication)),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn parses_xlogdata_and_keepalive() {
        let mut buf = BytesMut::new();
        buf.put_u8(b'w');
        buf.put_u64(0x10);
        buf.put_u64(0x20);
        buf.put_i64(7);
        buf.put_slice(b"Bdata");
        assert_eq!(
            parse_copy_data(buf.freeze()).unwrap(),
            ReplicationMessage::XLogData {
                wal_start: Lsn(0x10),
                wal_end: Lsn(0x20),
                send_time_us: 7,
                data: Bytes::from_static(b"Bdata"),
            }
        );
        let mut buf = BytesMut::new();
        buf.put_u8(b'k');
        buf.put_u64(0x30);
        buf.put_i64(9);
        buf.put_u8(1);
        assert_eq!(
            parse_copy_data(buf.freeze()).unwrap(),
            ReplicationMessage::PrimaryKeepalive {
                wal_end: Lsn(0x30),
                send_time_us: 9,
                reply_requested: true
            }
        );
    }

    #[test]
    fn rejects_truncated_and_unknown_copy_data() {
        for bad in [&b""[..], b"w\0\0", b"k\0\0\0\0\0\0\0\0", b"x123"] {
            assert!(
                parse_copy_data(Bytes::copy_from_slice(bad)).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn encodes_standby_status_update() {
        let update = standby_status_update(Lsn(1), Lsn(2), Lsn(3), 4);
        let mut expected = vec![b'r'];
        for n in [1u64, 2, 3, 4] {
            expected.extend_from_slice(&n.to_be_bytes());
        }
        expected.push(0);
        assert_eq!(&update[..], &expected[..]);
    }

    #[test]
    fn quotes_identifiers_in_start_replication() {
        assert_eq!(
            start_replication_command("s1", Lsn(0x1_0000_0010), "my \"pub\" 'x'"),
            "START_REPLICATION SLOT \"s1\" LOGICAL 1/10 (proto_version '1', publication_names '\"my \"\"pub\"\" ''x''\"', messages 'true')"
        );
    }

    #[test]
    fn postgres_epoch_clock() {
        let t = UNIX_EPOCH
            + Duration::from_secs(PG_EPOCH_OFFSET_SECS as u64)
            + Duration::from_micros(5);
        assert_eq!(pg_timestamp_us(t), 5);
    }
}
