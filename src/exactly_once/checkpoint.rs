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
//! Record value (version 1), JSON: `{"version":1,"lsn":"0/16B3748",
//! "system_id":"7301...","timeline":1,"slot":"s"}`. Version 0, a bare LSN (`0/16B3748`),
//! was written before the origin was stored: it is accepted with a warning and replaced at
//! the next commit.

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
    /// `None`: written in the old format (a bare LSN), before the origin was stored.
    pub origin: Option<Origin>,
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

/// The record value of version 1.
#[derive(Serialize, Deserialize)]
struct Value {
    version: u32,
    lsn: String,
    #[serde(flatten)]
    origin: Origin,
}

/// The format version [`StoredCheckpoint::encode`] writes.
const VERSION: u32 = 1;

impl StoredCheckpoint {
    /// The record value (JSON, format version 1).
    pub fn encode(lsn: Lsn, origin: &Origin) -> String {
        serde_json::to_string(&Value {
            version: VERSION,
            lsn: lsn.to_string(),
            origin: origin.clone(),
        })
        .expect("a checkpoint value serializes")
    }

    /// Parses a record value: version 1 (JSON) or the old bare LSN.
    ///
    /// Returns an error naming the value if it is neither, or of a newer version.
    pub fn decode(value: &[u8]) -> Result<StoredCheckpoint, String> {
        let text = std::str::from_utf8(value)
            .map_err(|_| format!("checkpoint value is not UTF-8: {value:?}"))?;
        if !text.starts_with('{') {
            return text
                .parse()
                .map(|lsn| StoredCheckpoint { lsn, origin: None })
                .map_err(|e| format!("checkpoint value: {e}"));
        }
        let version: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("checkpoint value {text:?}: {e}"))?;
        match version.get("version").and_then(serde_json::Value::as_u64) {
            Some(v) if v == u64::from(VERSION) => {}
            Some(v) => {
                return Err(format!(
                    "checkpoint value {text:?}: format version {v}, this relay reads up to {VERSION} (upgrade the relay)"
                ))
            }
            None => return Err(format!("checkpoint value {text:?}: no version")),
        }
        let value: Value = serde_json::from_value(version)
            .map_err(|e| format!("checkpoint value {text:?}: {e}"))?;
        let lsn = value
            .lsn
            .parse()
            .map_err(|e| format!("checkpoint value {text:?}: {e}"))?;
        Ok(StoredCheckpoint {
            lsn,
            origin: Some(value.origin),
        })
    }

    /// Decides whether this checkpoint belongs to the source at `here`, whose timeline's
    /// history is `history` (empty on timeline 1). Valid: same system and slot, and the
    /// same timeline, or an earlier one of this history with the checkpoint at or before
    /// its switch point (a promoted standby of the same cluster). An old-format checkpoint
    /// (no origin) is taken as it is; the caller warns.
    ///
    /// Returns why not otherwise: another system or slot, a timeline this server's history
    /// does not contain (later, or another branch), or a checkpoint past the switch point.
    pub fn verify(&self, here: &Origin, history: &[TimelineSwitch]) -> Result<Checkpoint, String> {
        let Some(origin) = &self.origin else {
            return Ok(Checkpoint(self.lsn));
        };
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

    fn stored(lsn: u64, origin: Option<Origin>) -> StoredCheckpoint {
        StoredCheckpoint {
            lsn: Lsn(lsn),
            origin,
        }
    }

    #[test]
    fn checkpoint_values_round_trip_and_bad_ones_are_named() {
        let o = origin("7301234567890123456", 2, "s");
        let value = StoredCheckpoint::encode(Lsn(0x16B_3748), &o);
        assert_eq!(
            value,
            r#"{"version":1,"lsn":"0/16B3748","system_id":"7301234567890123456","timeline":2,"slot":"s"}"#
        );
        assert_eq!(
            StoredCheckpoint::decode(value.as_bytes()),
            Ok(stored(0x16B_3748, Some(o)))
        );
        // The old format: a bare LSN, no origin.
        assert_eq!(
            StoredCheckpoint::decode(b"1A/0"),
            Ok(stored(0x1A << 32, None))
        );
        assert_eq!(stored(0x16B_3748, None).to_string(), "0/16B3748");
        for bad in [
            &b""[..],
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
        let newer = StoredCheckpoint::decode(br#"{"version":2,"lsn":"0/1"}"#).unwrap_err();
        assert!(
            newer.contains("format version 2") && newer.contains("upgrade"),
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
            stored(0x500, Some(here.clone())).verify(&here, &[]),
            Ok(Checkpoint(Lsn(0x500)))
        );
    }

    #[test]
    fn an_old_format_checkpoint_is_taken_as_it_is() {
        assert_eq!(
            stored(0x500, None).verify(&origin("73", 3, "s"), &[]),
            Ok(Checkpoint(Lsn(0x500)))
        );
    }

    #[test]
    fn another_system_or_slot_is_refused_whatever_the_lsns() {
        let here = origin("73", 1, "s");
        let e = stored(0x500, Some(origin("99", 1, "s")))
            .verify(&here, &[])
            .unwrap_err();
        assert!(
            e.contains("written for system 99 timeline 1 slot \"s\"")
                && e.contains("this source is system 73"),
            "{e}"
        );
        let e = stored(0x500, Some(origin("73", 1, "old")))
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
        let on = |timeline, lsn| stored(lsn, Some(origin("73", timeline, "s")));
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
        let e = stored(0x100, Some(origin("73", 3, "s")))
            .verify(&origin("73", 2, "s"), &history)
            .unwrap_err();
        assert!(
            e.contains("on timeline 2, whose history does not contain timeline 3"),
            "{e}"
        );
        let e = stored(0x100, Some(origin("73", 4, "s")))
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
