//! Failover slots (PostgreSQL 17+), `synchronized_standby_slots`, and why a slot was
//! invalidated: the SQL the relay, `setup` and `check` share, and the pure parts of reading it.
//!
//! A failover slot is kept in sync on a physical standby with `sync_replication_slots = on`,
//! so a promotion keeps it. On the primary, `synchronized_standby_slots` makes the walsender
//! of every failover slot hold back each change until the physical slots it names confirmed
//! it: one name there whose slot is missing, inactive or invalidated stalls the relay with
//! nothing in its logs but idleness, which is why [`standby_slots`] exists.
//!
//! Catalog columns that only some majors have (`failover`, `synced`, `invalidation_reason`
//! 17+, `conflicting` 16+) are read through `to_jsonb(row) ->> 'column'`, NULL where the
//! column does not exist, so that one SQL text serves every major.

use std::fmt;

use tokio_postgres::Client;

use crate::source::replication::quote_ident;
use crate::source::SourceError;

/// `server_version_num` of PostgreSQL 17, the first major with failover slots.
pub const FAILOVER_MIN_VERSION_NUM: i32 = 170_000;

/// The server a SQL connection reached: what errors and findings name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// `server_version_num`, e.g. 170010.
    pub version_num: i32,
    /// `server_version`, e.g. `17.10`.
    pub version: String,
    /// `address:port` as the server sees itself, or `a Unix socket`.
    pub host: String,
}

/// Reads the version and address of the server `client` is connected to.
///
/// Returns an error if the query fails.
pub async fn server(client: &Client) -> Result<Server, SourceError> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int, current_setting('server_version'),
                    COALESCE(host(inet_server_addr()) || ':' || inet_server_port(), 'a Unix socket')",
            &[],
        )
        .await?;
    Ok(Server {
        version_num: row.get(0),
        version: row.get(1),
        host: row.get(2),
    })
}

impl Server {
    /// Whether this server has failover slots.
    pub fn has_failover_slots(&self) -> bool {
        self.version_num >= FAILOVER_MIN_VERSION_NUM
    }

    /// The error for `failover = true` on a server without failover slots.
    pub fn failover_unsupported(&self) -> String {
        format!(
            "failover = true (--failover) needs PostgreSQL 17 or later, but the server at {} runs PostgreSQL {}: set failover = false, or upgrade",
            self.host, self.version
        )
    }
}

/// Why a pipeline with `failover = true` cannot use its slot `slot` on `server`
/// (`in_recovery`: a standby, where the pipeline decodes), whose slot is a failover slot or
/// not (`is_failover`; `None`: there is no such slot); `None` when it can, and always with
/// `failover = false`. The start stops with this sentence (exit code 3) and `check` fails its
/// `failover slot` finding with it: retrying cannot turn FAILOVER on. With `create_slot`
/// (the relay manages its slot) a primary's slot without FAILOVER is no refusal: the start
/// turns FAILOVER on ([`super::turn_failover_on`]).
pub fn failover_refusal(
    slot: &str,
    server: &Server,
    in_recovery: bool,
    is_failover: Option<bool>,
    failover: bool,
    create_slot: bool,
) -> Option<String> {
    let host = &server.host;
    if !failover {
        return None;
    }
    if !server.has_failover_slots() {
        return Some(server.failover_unsupported());
    }
    match (is_failover, in_recovery) {
        (Some(true), _) | (None, false) => None,
        (Some(false), false) if create_slot => None,
        (None, true) => Some(format!(
            "{slot} cannot be created with FAILOVER on {host}, a standby (PostgreSQL refuses: a slot for decoding on a standby cannot be a failover slot); set failover = false, or create the failover slot on the primary"
        )),
        (Some(false), true) => Some(format!(
            "{slot} on {host}, a standby, is not a failover slot although failover = true, and PostgreSQL cannot make it one there (ALTER_REPLICATION_SLOT: 'cannot enable failover for a replication slot on the standby'); set failover = false, or stream from the primary's failover slot"
        )),
        (Some(false), false) => Some(format!(
            "{slot} on {host} is not a failover slot although failover = true, so a database failover loses it, and create_slot = false leaves the slot to you: stop every relay streaming from it, then run outbox-relay setup, which turns FAILOVER on (ALTER_REPLICATION_SLOT {} (FAILOVER true))",
            quote_ident(slot)
        )),
    }
}

/// The query creating logical slot `$1` with pgoutput, returning its consistent point as
/// text; with `failover`, a failover slot (`pg_create_logical_replication_slot(name,
/// 'pgoutput', temporary => false, twophase => false, failover => true)`).
///
/// Returns the error of [`Server::failover_unsupported`] if `failover` is asked of a server
/// older than 17.
pub fn create_slot_sql(server: &Server, failover: bool) -> Result<&'static str, String> {
    match failover {
        false => Ok("SELECT lsn::text FROM pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')"),
        true if server.has_failover_slots() => Ok("SELECT lsn::text FROM pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"),
        true => Err(server.failover_unsupported()),
    }
}

/// The replication command that turns FAILOVER on for an existing slot (PostgreSQL docs
/// 55.4, `ALTER_REPLICATION_SLOT`); it waits while a walsender holds the slot, so check
/// `active_pid` first.
pub fn alter_failover_command(slot: &str) -> String {
    format!(
        "ALTER_REPLICATION_SLOT {} (FAILOVER true)",
        quote_ident(slot)
    )
}

/// Reads whether `slot` is a failover slot: `None` if there is no such slot, `Some(false)`
/// also before PostgreSQL 17.
///
/// Returns an error if the query fails.
pub async fn is_failover_slot(client: &Client, slot: &str) -> Result<Option<bool>, SourceError> {
    let row = client
        .query_opt(
            "SELECT COALESCE((to_jsonb(s) ->> 'failover')::bool, false)
             FROM pg_catalog.pg_replication_slots s WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.map(|row| row.get(0)))
}

/// Why a slot was invalidated, from `invalidation_reason` (17+) or `conflicting` (16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalidation {
    /// `wal_removed`, `rows_removed`, `wal_level_insufficient`, `idle_timeout` (18), or
    /// `conflict` (16: one of the two conflict reasons, which 16 does not tell apart).
    pub reason: String,
}

impl Invalidation {
    /// The reason of a slot whose `wal_status` is `lost`, from its `invalidation_reason`
    /// (17+, NULL before) and `conflicting` (16+, NULL before). Before 16 and for a
    /// non-conflicting slot on 16, removed WAL is the only cause.
    pub fn of_lost(invalidation_reason: Option<&str>, conflicting: Option<bool>) -> Self {
        let reason = match (invalidation_reason, conflicting) {
            (Some(reason), _) => reason,
            (None, Some(true)) => "conflict",
            (None, _) => "wal_removed",
        };
        Invalidation {
            reason: reason.to_owned(),
        }
    }

    /// What happened and what to change, as a phrase after "invalidated: ".
    pub fn explanation(&self) -> String {
        match self.reason.as_str() {
            "wal_removed" => "wal_removed: PostgreSQL removed WAL the slot still needed (max_slot_wal_keep_size)".into(),
            "rows_removed" => "rows_removed: catalog rows the slot needed were vacuumed away (on a standby: enable hot_standby_feedback with a physical slot between it and the primary)".into(),
            "wal_level_insufficient" => "wal_level_insufficient: wal_level on the primary was set below logical".into(),
            "idle_timeout" => "idle_timeout: nobody read the slot for longer than idle_replication_slot_timeout".into(),
            "conflict" => "conflict: the slot conflicted with recovery on this standby (catalog rows vacuumed away on the primary: enable hot_standby_feedback with a physical slot between it and the primary; or the primary's wal_level lowered below logical)".into(),
            other => format!("invalidation_reason {other}"),
        }
    }
}

impl fmt::Display for Invalidation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.explanation())
    }
}

/// The error of a slot that PostgreSQL invalidated: its cause, then what to do.
pub fn invalidated_error(slot: &str, invalidation: &Invalidation) -> String {
    format!(
        "replication slot {slot:?} is invalidated (wal_status = 'lost', {invalidation}), so outbox events committed since its confirmed LSN may never be published; reconcile those events from the outbox table, then drop the slot (SELECT pg_drop_replication_slot('{slot}')) and create a new one with `outbox-relay setup --accept-slot-loss`"
    )
}

/// What is wrong with a name in `synchronized_standby_slots`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandbySlotProblem {
    Missing,
    /// A logical slot: only physical slots can be named there.
    NotPhysical,
    /// No walsender streams from it: it confirms nothing.
    Inactive,
    /// `wal_status = 'lost'`.
    Invalidated,
}

/// A name of `synchronized_standby_slots` and its slot's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbySlot {
    pub name: String,
    /// `None`: the slot confirms changes as they come.
    pub problem: Option<StandbySlotProblem>,
}

impl fmt::Display for StandbySlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = &self.name;
        match self.problem {
            None => write!(f, "physical slot {name:?} is active"),
            Some(StandbySlotProblem::Missing) => write!(f, "slot {name:?} does not exist"),
            Some(StandbySlotProblem::NotPhysical) => {
                write!(f, "slot {name:?} is not a physical slot")
            }
            Some(StandbySlotProblem::Inactive) => {
                write!(
                    f,
                    "physical slot {name:?} is inactive (no standby streams from it)"
                )
            }
            Some(StandbySlotProblem::Invalidated) => {
                write!(f, "physical slot {name:?} is invalidated")
            }
        }
    }
}

/// The slot names of a `synchronized_standby_slots` value (comma-separated, each possibly
/// double-quoted); empty for an empty setting.
pub fn parse_standby_slot_names(setting: &str) -> Vec<String> {
    setting
        .split(',')
        .map(|name| name.trim())
        .filter(|name| !name.is_empty())
        .map(|name| {
            name.strip_prefix('"')
                .and_then(|n| n.strip_suffix('"'))
                .map_or_else(|| name.to_owned(), |n| n.replace("\"\"", "\""))
        })
        .collect()
}

/// A slot as `pg_replication_slots` shows it, for [`judge_standby_slots`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRow {
    pub name: String,
    pub physical: bool,
    pub active: bool,
    pub lost: bool,
}

/// Judges each of `names` by the slot of that name among `slots`.
pub fn judge_standby_slots(names: &[String], slots: &[SlotRow]) -> Vec<StandbySlot> {
    names
        .iter()
        .map(|name| {
            let problem = match slots.iter().find(|s| &s.name == name) {
                None => Some(StandbySlotProblem::Missing),
                Some(s) if !s.physical => Some(StandbySlotProblem::NotPhysical),
                Some(s) if s.lost => Some(StandbySlotProblem::Invalidated),
                Some(s) if !s.active => Some(StandbySlotProblem::Inactive),
                Some(_) => None,
            };
            StandbySlot {
                name: name.clone(),
                problem,
            }
        })
        .collect()
}

/// `synchronized_standby_slots` on the server `client` is connected to, each name judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbySlots {
    /// The setting's text; `None` before PostgreSQL 17 (no such setting).
    pub setting: Option<String>,
    pub slots: Vec<StandbySlot>,
}

impl StandbySlots {
    /// The names whose slot holds back every failover slot's walsender.
    pub fn stalling(&self) -> Vec<&StandbySlot> {
        self.slots.iter().filter(|s| s.problem.is_some()).collect()
    }

    /// The warning for a failover slot held back by [`StandbySlots::stalling`], naming the
    /// setting, each slot and what to change; `None` when nothing stalls.
    pub fn stall_message(&self) -> Option<String> {
        let stalling = self.stalling();
        if stalling.is_empty() {
            return None;
        }
        let slots: Vec<String> = stalling.iter().map(ToString::to_string).collect();
        Some(format!(
            "synchronized_standby_slots = '{}' holds back every failover slot's walsender until those physical slots confirm each change, and {}: no change reaches the relay; start the standby streaming from it (or create it: SELECT pg_create_physical_replication_slot(...)), or remove it (ALTER SYSTEM SET synchronized_standby_slots = '...'; SELECT pg_reload_conf())",
            self.setting.as_deref().unwrap_or_default(),
            slots.join(", ")
        ))
    }
}

/// The slots among `names` that exist on the server of `client`.
///
/// Returns an error if the query fails.
pub async fn slot_rows(client: &Client, names: &[String]) -> Result<Vec<SlotRow>, SourceError> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let rows = client
        .query(
            "SELECT slot_name::text, slot_type = 'physical', active, wal_status IS NOT DISTINCT FROM 'lost'
             FROM pg_catalog.pg_replication_slots WHERE slot_name = ANY($1)",
            &[&names],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| SlotRow {
            name: row.get(0),
            physical: row.get(1),
            active: row.get(2),
            lost: row.get(3),
        })
        .collect())
}

/// Reads `synchronized_standby_slots` and the slots it names.
///
/// Returns an error if the queries fail.
pub async fn standby_slots(client: &Client) -> Result<StandbySlots, SourceError> {
    let setting: Option<String> = client
        .query_one(
            "SELECT current_setting('synchronized_standby_slots', true)",
            &[],
        )
        .await?
        .get(0);
    let names = parse_standby_slot_names(setting.as_deref().unwrap_or_default());
    let rows = slot_rows(client, &names).await?;
    Ok(StandbySlots {
        slots: judge_standby_slots(&names, &rows),
        setting,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(version_num: i32, version: &str) -> Server {
        Server {
            version_num,
            version: version.into(),
            host: "127.0.0.1:5432".into(),
        }
    }

    #[test]
    fn creation_sql_asks_for_failover_only_where_it_exists() {
        let pg16 = server(160_002, "16.2");
        let pg17 = server(170_010, "17.10");
        assert_eq!(
            create_slot_sql(&pg16, false).unwrap(),
            "SELECT lsn::text FROM pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')"
        );
        assert!(create_slot_sql(&pg17, true)
            .unwrap()
            .ends_with("pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"));
        let error = create_slot_sql(&pg16, true).unwrap_err();
        for part in [
            "failover",
            "PostgreSQL 17",
            "PostgreSQL 16.2",
            "127.0.0.1:5432",
        ] {
            assert!(error.contains(part), "{part:?} missing in {error}");
        }
        assert_eq!(
            alter_failover_command("outbox_relay"),
            "ALTER_REPLICATION_SLOT \"outbox_relay\" (FAILOVER true)"
        );
    }

    #[test]
    fn setup_sql_creates_a_failover_slot_when_asked() {
        let mut config = crate::config::PipelineConfig::test_pipeline();
        let plain = crate::source::slot::setup_sql(&config);
        assert!(
            plain.contains("pg_create_logical_replication_slot('outbox_relay', 'pgoutput')\n"),
            "{plain}"
        );
        assert!(!plain.contains("FAILOVER"), "{plain}");
        config.failover = true;
        let failover = crate::source::slot::setup_sql(&config);
        for part in [
            "pg_create_logical_replication_slot('outbox_relay', 'pgoutput', false, false, true)\n",
            "-- ALTER_REPLICATION_SLOT \"outbox_relay\" (FAILOVER true);",
        ] {
            assert!(failover.contains(part), "{part:?} missing in {failover}");
        }
    }

    #[test]
    fn invalidation_names_its_reason_by_version() {
        assert_eq!(Invalidation::of_lost(None, None).reason, "wal_removed");
        assert_eq!(
            Invalidation::of_lost(None, Some(false)).reason,
            "wal_removed"
        );
        assert_eq!(Invalidation::of_lost(None, Some(true)).reason, "conflict");
        assert_eq!(
            Invalidation::of_lost(Some("idle_timeout"), Some(true)).reason,
            "idle_timeout"
        );
        let rows = invalidated_error(
            "s",
            &Invalidation::of_lost(Some("rows_removed"), Some(true)),
        );
        assert!(
            rows.contains("rows_removed") && rows.contains("hot_standby_feedback"),
            "{rows}"
        );
        assert!(!rows.contains("max_slot_wal_keep_size"), "{rows}");
        let conflict = invalidated_error("s", &Invalidation::of_lost(None, Some(true)));
        assert!(
            conflict.contains("conflict: the slot conflicted")
                && !conflict.contains("conflicting:")
                && conflict.contains("hot_standby_feedback"),
            "{conflict}"
        );
        assert!(!conflict.contains("max_slot_wal_keep_size"), "{conflict}");
        let wal = invalidated_error("s", &Invalidation::of_lost(Some("wal_removed"), None));
        assert!(wal.contains("max_slot_wal_keep_size"), "{wal}");
        assert!(Invalidation::of_lost(Some("idle_timeout"), None)
            .explanation()
            .contains("idle_replication_slot_timeout"));
        assert!(Invalidation::of_lost(Some("wal_level_insufficient"), None)
            .explanation()
            .contains("wal_level"));
    }

    #[test]
    fn parses_standby_slot_names() {
        assert!(parse_standby_slot_names("").is_empty());
        assert_eq!(
            parse_standby_slot_names("a, \"b\" ,c,"),
            vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]
        );
    }

    #[test]
    fn judges_each_standby_slot() {
        let row = |name: &str, physical, active, lost| SlotRow {
            name: name.into(),
            physical,
            active,
            lost,
        };
        let names: Vec<String> = ["ok", "gone", "logical", "idle", "lost"]
            .map(String::from)
            .to_vec();
        let judged = judge_standby_slots(
            &names,
            &[
                row("ok", true, true, false),
                row("logical", false, true, false),
                row("idle", true, false, false),
                row("lost", true, false, true),
            ],
        );
        let problems: Vec<_> = judged.iter().map(|s| s.problem).collect();
        use StandbySlotProblem::*;
        assert_eq!(
            problems,
            vec![
                None,
                Some(Missing),
                Some(NotPhysical),
                Some(Inactive),
                Some(Invalidated)
            ]
        );
        let slots = StandbySlots {
            setting: Some("ok, gone".into()),
            slots: judged[..2].to_vec(),
        };
        let message = slots.stall_message().unwrap();
        for part in [
            "synchronized_standby_slots = 'ok, gone'",
            "\"gone\" does not exist",
        ] {
            assert!(message.contains(part), "{part:?} missing in {message}");
        }
        assert!(!message.contains("\"ok\""), "{message}");
        let fine = StandbySlots {
            setting: Some("ok".into()),
            slots: judged[..1].to_vec(),
        };
        assert_eq!(fine.stall_message(), None);
    }
}
