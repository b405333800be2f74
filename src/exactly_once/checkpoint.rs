//! The exactly-once checkpoint: the commit end LSN of the newest PostgreSQL transaction whose
//! Kafka transaction committed, with the origin of that LSN (system identifier, timeline,
//! slot), and the decision whether a checkpoint read back belongs to the source at hand.
//!
//! An LSN means something only within one WAL history. A checkpoint read back under the same
//! pipeline name from another cluster (a new database, a point-in-time restore, a promoted
//! replica of another history) would make the relay pass over real events as "committed
//! before the last crash" and confirm past them: [`StoredCheckpoint::verify`] refuses it.
//! A promoted standby of the same cluster is the same history up to its switch point
//! (`TIMELINE_HISTORY`), so a checkpoint of an older timeline at or before that point stays
//! valid.
//!
//! Any producer that can write to the checkpoint topic could write a record under the
//! pipeline's key, and a checkpoint too high makes the relay pass over events: lose them. So
//! the relay marks its checkpoints and reads back only marked ones ([`classify`]):
//!
//! - Record (format version 2): key = pipeline name; headers [`FORMAT_HEADER`] = `2` and
//!   [`TRANSACTIONAL_ID_HEADER`] = the pipeline's `transactional_id`; value, JSON:
//!   `{"version":2,"lsn":"0/16B3748","system_id":"7301...","timeline":1,"slot":"s"}`.
//!   Rows never carry these headers (the router leaves out row headers named
//!   `outbox_relay_*`) and never route to a checkpoint topic.
//! - A record with another transactional id, or without the mark, is ignored with a warning
//!   naming its topic, partition and offset. One exception, for the upgrade: an unmarked
//!   version 1 value (the same JSON with `"version":1`, which relays before the mark wrote) is
//!   taken while the pipeline has no marked checkpoint in the topic, i.e. until its first
//!   commit after the upgrade.
//! - A bare LSN (`0/16B3748`, without origin) is never taken: nothing ties it to a source.
//! - A tombstone under the key deletes the checkpoint, marked or not (an operator's tool):
//!   the relay then publishes again what came after the slot's confirmed position, which
//!   duplicates and never loses.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::lsn::Lsn;

/// The position a sink transaction commits: the commit end LSN of its PostgreSQL
/// transaction. The origin it is written with belongs to the [`super::Transactions`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint(pub Lsn);

impl Checkpoint {
    /// Whether the transaction whose commit record starts at `final_lsn` (pgoutput's Begin) is
    /// at or below the checkpoint, i.e. already committed to Kafka. The transaction that ends
    /// at the checkpoint has its commit record before it; any later one starts at or after it.
    pub fn covers(&self, final_lsn: Lsn) -> bool {
        final_lsn < self.0
    }
}

/// Where a checkpoint's LSN comes from: the cluster (`IDENTIFY_SYSTEM`'s system identifier),
/// the timeline the relay streamed on, and the slot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub system_id: String,
    pub timeline: u32,
    pub slot: String,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "system {} timeline {} slot {:?}",
            self.system_id, self.timeline, self.slot
        )
    }
}

/// A checkpoint as read back from the checkpoint topic. Displays as its LSN.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCheckpoint {
    pub lsn: Lsn,
    pub origin: Origin,
    /// Written with the mark of this pipeline's transactional id (format version 2); `false`:
    /// an unmarked version 1 record, taken only until the first marked one.
    pub marked: bool,
}

impl fmt::Display for StoredCheckpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.lsn.fmt(f)
    }
}

/// One line of a timeline history file: `timeline` ended at `switch_lsn`, where the next
/// timeline of this history begins (WAL before it is shared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimelineSwitch {
    pub timeline: u32,
    pub switch_lsn: Lsn,
}

/// The record value of versions 1 and 2 (the same fields).
#[derive(Serialize, Deserialize)]
struct Value {
    version: u32,
    lsn: String,
    #[serde(flatten)]
    origin: Origin,
}

/// The format version [`StoredCheckpoint::encode`] writes.
pub const VERSION: u32 = 2;
/// The format version relays wrote before they marked their checkpoints.
const UNMARKED_VERSION: u32 = 1;
/// Header of a checkpoint record with its format version ([`VERSION`]).
pub const FORMAT_HEADER: &str = "outbox_relay_checkpoint_format";
/// Header of a checkpoint record with the `transactional_id` of the pipeline that wrote it.
pub const TRANSACTIONAL_ID_HEADER: &str = "outbox_relay_transactional_id";

/// The headers the relay writes with each checkpoint record of `transactional_id`.
pub fn mark(transactional_id: &str) -> [(&'static str, String); 2] {
    [
        (FORMAT_HEADER, VERSION.to_string()),
        (TRANSACTIONAL_ID_HEADER, transactional_id.to_owned()),
    ]
}

/// What a record under the pipeline's key in the checkpoint topic is to the reader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// No value: deletes the checkpoint.
    Tombstone,
    /// A checkpoint: marked by this pipeline's transactional id, or (`marked: false`) an
    /// unmarked version 1 one.
    Checkpoint(StoredCheckpoint),
    /// Not this pipeline's checkpoint, and why: the reader warns and passes over it.
    Ignored(String),
}

/// Decides what the record with `value` and `headers` (name, value) under the pipeline's key
/// is, for the pipeline whose `transactional_id` is given (see the module doc).
///
/// Returns an error naming the value if the record carries this pipeline's mark but its value
/// is not a checkpoint of that format, or of a newer format (upgrade the relay).
pub fn classify(
    value: Option<&[u8]>,
    headers: &[(&str, Option<&[u8]>)],
    transactional_id: &str,
) -> Result<Read, String> {
    let Some(value) = value else {
        return Ok(Read::Tombstone);
    };
    let header = |name: &str| {
        headers
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| String::from_utf8_lossy(v.unwrap_or_default()).into_owned())
    };
    let Some(format) = header(FORMAT_HEADER) else {
        return Ok(match StoredCheckpoint::decode(value) {
            Ok((UNMARKED_VERSION, lsn, origin)) => Read::Checkpoint(StoredCheckpoint {
                lsn,
                origin,
                marked: false,
            }),
            Ok((version, _, _)) => Read::Ignored(format!(
                "format version {version} without the {FORMAT_HEADER} header"
            )),
            Err(reason) => Read::Ignored(format!("no {FORMAT_HEADER} header, and {reason}")),
        });
    };
    match header(TRANSACTIONAL_ID_HEADER) {
        Some(id) if id == transactional_id => {}
        Some(id) => {
            return Ok(Read::Ignored(format!(
                "written by transactional id {id:?}, not this pipeline's {transactional_id:?}"
            )))
        }
        None => {
            return Ok(Read::Ignored(format!(
                "no {TRANSACTIONAL_ID_HEADER} header"
            )))
        }
    }
    if format != VERSION.to_string() {
        return Err(match format.parse::<u32>() {
            Ok(v) if v > VERSION => format!(
                "checkpoint format version {v}, this relay reads up to {VERSION} (upgrade the relay)"
            ),
            _ => format!("checkpoint format {format:?} in the {FORMAT_HEADER} header"),
        });
    }
    match StoredCheckpoint::decode(value)? {
        (VERSION, lsn, origin) => Ok(Read::Checkpoint(StoredCheckpoint {
            lsn,
            origin,
            marked: true,
        })),
        (version, _, _) => Err(format!(
            "checkpoint value of format version {version} under the {FORMAT_HEADER} header {VERSION}"
        )),
    }
}

impl StoredCheckpoint {
    /// The record value (JSON, format version [`VERSION`]); the record also carries [`mark`].
    pub fn encode(lsn: Lsn, origin: &Origin) -> String {
        serde_json::to_string(&Value {
            version: VERSION,
            lsn: lsn.to_string(),
            origin: origin.clone(),
        })
        .expect("a checkpoint value serializes")
    }

    /// Parses a record value of version 1 or 2 (JSON): its version, LSN and origin.
    ///
    /// Returns an error naming the value if it is not such JSON (a bare LSN included), or of
    /// a newer version.
    pub fn decode(value: &[u8]) -> Result<(u32, Lsn, Origin), String> {
        let text = std::str::from_utf8(value)
            .map_err(|_| format!("checkpoint value is not UTF-8: {value:?}"))?;
        if !text.starts_with('{') {
            return Err(format!(
                "checkpoint value {text:?} is not JSON (a bare LSN has no origin and is not read)"
            ));
        }
        let version: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("checkpoint value {text:?}: {e}"))?;
        let number = match version.get("version").and_then(serde_json::Value::as_u64) {
            Some(v) if v == u64::from(VERSION) || v == u64::from(UNMARKED_VERSION) => v as u32,
            Some(v) => {
                return Err(format!(
                    "checkpoint value {text:?}: format version {v}, this relay reads up to {VERSION} (upgrade the relay)"
                ))
            }
            None => return Err(format!("checkpoint value {text:?}: no version")),
        };
        let value: Value = serde_json::from_value(version)
            .map_err(|e| format!("checkpoint value {text:?}: {e}"))?;
        let lsn = value
            .lsn
            .parse()
            .map_err(|e| format!("checkpoint value {text:?}: {e}"))?;
        Ok((number, lsn, value.origin))
    }

    /// Decides whether this checkpoint belongs to the source at `here`, whose timeline's
    /// history is `history` (empty on timeline 1). Valid: same system and slot, and the
    /// same timeline, or an earlier one of this history with the checkpoint at or before
    /// its switch point (a promoted standby of the same cluster).
    ///
    /// Returns why not otherwise: another system or slot, a timeline this server's history
    /// does not contain (later, or another branch), or a checkpoint past the switch point.
    pub fn verify(&self, here: &Origin, history: &[TimelineSwitch]) -> Result<Checkpoint, String> {
        let origin = &self.origin;
        let at = format!("checkpoint {} was written for {origin}", self.lsn);
        if origin.system_id != here.system_id {
            return Err(format!(
                "{at}, but this source is system {} (another cluster)",
                here.system_id
            ));
        }
        if origin.slot != here.slot {
            return Err(format!(
                "{at}, but this pipeline streams from slot {:?}",
                here.slot
            ));
        }
        if origin.timeline == here.timeline {
            return Ok(Checkpoint(self.lsn));
        }
        let switch = history
            .iter()
            .find(|s| s.timeline == origin.timeline)
            .filter(|_| origin.timeline < here.timeline);
        match switch {
            None => Err(format!(
                "{at}, but this server is on timeline {}, whose history does not contain timeline {}",
                here.timeline, origin.timeline
            )),
            Some(s) if self.lsn > s.switch_lsn => Err(format!(
                "{at}, past the point {} where this server's history left timeline {} (those transactions are not in its WAL)",
                s.switch_lsn, origin.timeline
            )),
            Some(_) => Ok(Checkpoint(self.lsn)),
        }
    }
}

/// Parses a timeline history file (`TIMELINE_HISTORY`'s content): one `timeline<TAB>switch
/// LSN<TAB>reason` line per earlier timeline; blank lines and `#` comments are skipped.
///
/// Returns an error naming the line that is not of that form.
pub fn parse_timeline_history(content: &str) -> Result<Vec<TimelineSwitch>, String> {
    content
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let mut fields = line.split_whitespace();
            let timeline = fields.next().and_then(|t| t.parse().ok());
            let switch_lsn = fields.next().and_then(|l| l.parse().ok());
            match (timeline, switch_lsn) {
                (Some(timeline), Some(switch_lsn)) => Ok(TimelineSwitch {
                    timeline,
                    switch_lsn,
                }),
                _ => Err(format!("timeline history line {line:?}")),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(system_id: &str, timeline: u32, slot: &str) -> Origin {
        Origin {
            system_id: system_id.into(),
            timeline,
            slot: slot.into(),
        }
    }

    fn stored(lsn: u64, origin: Origin) -> StoredCheckpoint {
        StoredCheckpoint {
            lsn: Lsn(lsn),
            origin,
            marked: true,
        }
    }

    #[test]
    fn checkpoint_values_round_trip_and_bad_ones_are_named() {
        let o = origin("7301234567890123456", 2, "s");
        let value = StoredCheckpoint::encode(Lsn(0x16B_3748), &o);
        assert_eq!(
            value,
            r#"{"version":2,"lsn":"0/16B3748","system_id":"7301234567890123456","timeline":2,"slot":"s"}"#
        );
        assert_eq!(
            StoredCheckpoint::decode(value.as_bytes()),
            Ok((2, Lsn(0x16B_3748), o.clone()))
        );
        // The unmarked format before it: the same fields.
        assert_eq!(
            StoredCheckpoint::decode(value.replace("\"version\":2", "\"version\":1").as_bytes()),
            Ok((1, Lsn(0x16B_3748), o.clone()))
        );
        assert_eq!(stored(0x16B_3748, o).to_string(), "0/16B3748");
        for bad in [
            &b""[..],
            b"1A/0",
            b"16B3748",
            b"0/16B3748 ",
            b"\xff/0",
            b"0/zz",
            br#"{"version":1,"lsn":"0/zz","system_id":"1","timeline":1,"slot":"s"}"#,
            br#"{"version":1,"lsn":"0/1","timeline":1,"slot":"s"}"#,
            br#"{"lsn":"0/1","system_id":"1","timeline":1,"slot":"s"}"#,
            b"{",
        ] {
            let e = StoredCheckpoint::decode(bad).unwrap_err();
            assert!(e.starts_with("checkpoint value"), "{e}");
        }
        let newer = StoredCheckpoint::decode(br#"{"version":3,"lsn":"0/1"}"#).unwrap_err();
        assert!(
            newer.contains("format version 3") && newer.contains("upgrade"),
            "{newer}"
        );
    }

    #[test]
    fn checkpoint_covers_the_transaction_ending_there_and_not_the_next() {
        // A transaction whose commit record spans 0/100..0/138, and the next at 0/138.
        let c = Checkpoint(Lsn(0x138));
        assert!(c.covers(Lsn(0x100)), "the checkpointed transaction itself");
        assert!(c.covers(Lsn(0x10)), "earlier transactions");
        assert!(!c.covers(Lsn(0x138)), "a commit record starting at the end");
        assert!(!c.covers(Lsn(0x200)), "later transactions");
    }

    #[test]
    fn a_checkpoint_of_this_system_slot_and_timeline_is_valid() {
        let here = origin("73", 1, "s");
        assert_eq!(
            stored(0x500, here.clone()).verify(&here, &[]),
            Ok(Checkpoint(Lsn(0x500)))
        );
    }

    /// The headers of a record, as the reader hands them to `classify`.
    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> Vec<(&'a str, Option<&'a [u8]>)> {
        pairs
            .iter()
            .map(|(n, v)| (*n, Some(v.as_bytes())))
            .collect()
    }

    #[test]
    fn only_records_marked_with_this_transactional_id_are_checkpoints() {
        let o = origin("73", 1, "s");
        let value = StoredCheckpoint::encode(Lsn(0x500), &o);
        let mark = mark("outbox-relay-orders");
        let marked: Vec<(&str, &str)> = mark.iter().map(|(n, v)| (*n, v.as_str())).collect();
        assert_eq!(
            marked,
            vec![
                ("outbox_relay_checkpoint_format", "2"),
                ("outbox_relay_transactional_id", "outbox-relay-orders")
            ]
        );
        let read = |value: Option<&[u8]>, pairs: &[(&str, &str)]| {
            classify(value, &headers(pairs), "outbox-relay-orders")
        };
        assert_eq!(
            read(Some(value.as_bytes()), &marked),
            Ok(Read::Checkpoint(stored(0x500, o.clone())))
        );
        // A routed row's copy of a checkpoint: no mark, or another pipeline's id.
        let ignored = |result: Result<Read, String>, why: &str| match result {
            Ok(Read::Ignored(reason)) => assert!(reason.contains(why), "{reason}"),
            other => panic!("{other:?} instead of ignored for {why}"),
        };
        ignored(
            read(Some(value.as_bytes()), &[]),
            "format version 2 without",
        );
        ignored(read(Some(b"FF/0"), &[]), "bare LSN");
        ignored(
            read(Some(b"\"FF/0\""), &[("trace", "x")]),
            "no outbox_relay_checkpoint_format",
        );
        ignored(
            read(
                Some(value.as_bytes()),
                &[
                    (FORMAT_HEADER, "2"),
                    (TRANSACTIONAL_ID_HEADER, "outbox-relay-other"),
                ],
            ),
            "written by transactional id \"outbox-relay-other\"",
        );
        ignored(
            read(Some(value.as_bytes()), &[(FORMAT_HEADER, "2")]),
            "no outbox_relay_transactional_id header",
        );
        // The unmarked format of relays before the mark: a candidate for the upgrade.
        let unmarked = value.replace("\"version\":2", "\"version\":1");
        assert_eq!(
            read(Some(unmarked.as_bytes()), &[]),
            Ok(Read::Checkpoint(StoredCheckpoint {
                marked: false,
                ..stored(0x500, o.clone())
            }))
        );
        // Marked, but broken or newer: this pipeline's own, so an error, not a pass.
        assert!(read(Some(b"FF/0"), &marked)
            .unwrap_err()
            .contains("bare LSN"));
        assert!(read(Some(unmarked.as_bytes()), &marked)
            .unwrap_err()
            .contains("format version 1 under"));
        let newer = read(
            Some(value.as_bytes()),
            &[
                (FORMAT_HEADER, "3"),
                (TRANSACTIONAL_ID_HEADER, "outbox-relay-orders"),
            ],
        )
        .unwrap_err();
        assert!(newer.contains("upgrade the relay"), "{newer}");
        // A tombstone deletes, marked or not.
        assert_eq!(read(None, &[]), Ok(Read::Tombstone));
    }

    #[test]
    fn another_system_or_slot_is_refused_whatever_the_lsns() {
        let here = origin("73", 1, "s");
        let e = stored(0x500, origin("99", 1, "s"))
            .verify(&here, &[])
            .unwrap_err();
        assert!(
            e.contains("written for system 99 timeline 1 slot \"s\"")
                && e.contains("this source is system 73"),
            "{e}"
        );
        let e = stored(0x500, origin("73", 1, "old"))
            .verify(&here, &[])
            .unwrap_err();
        assert!(e.contains("streams from slot \"s\""), "{e}");
    }

    #[test]
    fn after_a_failover_a_checkpoint_before_the_switch_point_is_valid_and_one_past_it_is_not() {
        // Promoted twice: timeline 1 ended at 0/3000000, timeline 2 at 0/5000000.
        let history = parse_timeline_history(
            "1\t0/3000000\tno recovery target specified\n\n2\t0/5000000\tat restore point \"x\"\n",
        )
        .unwrap();
        let here = origin("73", 3, "s");
        let on = |timeline, lsn| stored(lsn, origin("73", timeline, "s"));
        assert_eq!(
            on(1, 0x2FF_FFFF).verify(&here, &history),
            Ok(Checkpoint(Lsn(0x2FF_FFFF)))
        );
        assert_eq!(
            on(1, 0x300_0000).verify(&here, &history),
            Ok(Checkpoint(Lsn(0x300_0000))),
            "a commit ending at the switch point is shared WAL"
        );
        assert_eq!(
            on(2, 0x400_0000).verify(&here, &history),
            Ok(Checkpoint(Lsn(0x400_0000)))
        );
        let e = on(1, 0x300_0001).verify(&here, &history).unwrap_err();
        assert!(
            e.contains("past the point 0/3000000 where this server's history left timeline 1"),
            "{e}"
        );
        assert!(on(2, 0x500_0008).verify(&here, &history).is_err());
    }

    #[test]
    fn a_timeline_outside_this_servers_history_is_refused() {
        let history = parse_timeline_history("1\t0/3000000\treason\n").unwrap();
        // The old primary after a failover, or another branch of the same cluster.
        let e = stored(0x100, origin("73", 3, "s"))
            .verify(&origin("73", 2, "s"), &history)
            .unwrap_err();
        assert!(
            e.contains("on timeline 2, whose history does not contain timeline 3"),
            "{e}"
        );
        let e = stored(0x100, origin("73", 4, "s"))
            .verify(&origin("73", 5, "s"), &history)
            .unwrap_err();
        assert!(e.contains("does not contain timeline 4"), "{e}");
    }

    #[test]
    fn timeline_history_lines_are_parsed_and_bad_ones_named() {
        assert_eq!(parse_timeline_history(""), Ok(vec![]));
        assert_eq!(
            parse_timeline_history("# comment\n1\t1/A0\tno recovery target specified\n"),
            Ok(vec![TimelineSwitch {
                timeline: 1,
                switch_lsn: Lsn((1 << 32) | 0xA0)
            }])
        );
        let e = parse_timeline_history("1\tnot-an-lsn\treason\n").unwrap_err();
        assert!(e.contains("not-an-lsn"), "{e}");
    }
}
