//! `check` and `status` on failover slots (PostgreSQL 17+): whether the slot is one, whether
//! the standby of `standby_url` keeps it in sync so that a promotion keeps it, whether
//! `synchronized_standby_slots` holds its walsender back, and PostgreSQL 18's
//! `idle_replication_slot_timeout`.
//!
//! The findings are pure functions of what the queries read ([`SlotOnPrimary`],
//! [`StandbyState`]), so each rule is unit-tested without a server.

use std::time::Duration;

use tokio_postgres::Client;

use super::{finding, Finding, Verdict};
use crate::config::PipelineConfig;
use crate::error::chain;
use crate::source::slot::failover::{self, Invalidation, Server, SlotRow, StandbySlots};
use crate::source::slot::{self, SqlConnection};
use crate::source::SourceError;
use crate::supervisor::LONGEST_WAIT;

/// The pipeline's slot on the primary, as the failover findings need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotOnPrimary {
    pub server: Server,
    /// `None`: the slot does not exist.
    pub failover: Option<bool>,
    /// `synchronized_standby_slots` and the slots it names.
    pub standby_slots: StandbySlots,
    /// `idle_replication_slot_timeout` (PostgreSQL 18); `None` before 18, zero when off.
    pub idle_timeout: Option<Duration>,
    /// The server is a standby (the pipeline decodes there).
    pub in_recovery: bool,
}

/// Reads [`SlotOnPrimary`] for `slot`.
///
/// Returns an error if a query fails.
pub async fn slot_on_primary(client: &Client, slot: &str) -> Result<SlotOnPrimary, SourceError> {
    let idle_timeout = client
        .query_opt(
            "SELECT setting, unit FROM pg_catalog.pg_settings WHERE name = 'idle_replication_slot_timeout'",
            &[],
        )
        .await?
        .and_then(|row| setting_duration(row.get(0), row.get(1)));
    Ok(SlotOnPrimary {
        server: failover::server(client).await?,
        failover: failover::is_failover_slot(client, slot).await?,
        standby_slots: failover::standby_slots(client).await?,
        idle_timeout,
        in_recovery: client
            .query_one("SELECT pg_catalog.pg_is_in_recovery()", &[])
            .await?
            .get(0),
    })
}

/// A time setting of `pg_settings` (`setting` in `unit`: `ms`, `s`, `min`, `h`, `d`).
fn setting_duration(setting: &str, unit: Option<&str>) -> Option<Duration> {
    let value: u64 = setting.parse().ok()?;
    let secs = match unit.unwrap_or("s") {
        "ms" => return Some(Duration::from_millis(value)),
        "s" => 1,
        "min" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(value * secs))
}

/// The slot's failover flag, `synchronized_standby_slots` and the idle timeout, as findings.
pub fn primary_findings(config: &PipelineConfig, primary: &SlotOnPrimary) -> Vec<Finding> {
    let mut out = Vec::new();
    let slot = &config.slot;
    let host = &primary.server.host;
    // What the start stops on, with the same sentence.
    let refusal = failover::failover_refusal(
        slot,
        &primary.server,
        primary.in_recovery,
        primary.failover,
        config.failover,
        config.create_slot,
    );
    let has_failover_slots = primary.server.has_failover_slots();
    out.push(match (refusal, primary.failover) {
        (Some(refusal), _) => finding("failover slot", Verdict::Fail, refusal),
        (None, _) if !has_failover_slots => finding(
            "failover slot",
            Verdict::Ok,
            format!("PostgreSQL {} has no failover slots: a database failover loses slot {slot} (with create_slot = false the relay then stops instead of starting after the events it missed)", primary.server.version),
        ),
        (None, Some(true)) => finding("failover slot", Verdict::Ok, format!("{slot} is a failover slot on {host}")),
        (None, None) if config.failover => finding("failover slot", Verdict::Ok, format!("{slot} will be created with FAILOVER")),
        (None, None) => finding("failover slot", Verdict::Ok, format!("{slot} will be created without FAILOVER (failover = false): a database failover loses it")),
        (None, Some(false)) if config.failover => finding(
            "failover slot",
            Verdict::Warn,
            format!("{slot} on {host} is not a failover slot yet, so a database failover loses it: the relay's start turns FAILOVER on (ALTER_REPLICATION_SLOT) once no walsender holds the slot, as outbox-relay setup does"),
        ),
        (None, Some(false)) => finding(
            "failover slot",
            Verdict::Ok,
            format!("{slot} is not a failover slot (failover = false): a database failover loses it"),
        ),
    });
    if has_failover_slots {
        let failover_slot = primary.failover.unwrap_or(config.failover);
        out.push(standby_slots_finding(
            host,
            &primary.standby_slots,
            failover_slot,
        ));
    }
    if let Some(finding) = idle_timeout_finding(host, primary) {
        out.push(finding);
    }
    out
}

/// `synchronized_standby_slots` on `host`: a name whose slot cannot confirm stalls every
/// failover slot; an empty setting lets the relay read changes a standby may not have yet
/// when it is promoted. Warnings, never failures: the start does not stop on a stall (a
/// standby that restarts, or whose slot is being created, mends it without anyone), the
/// running relay waits and says so with the same sentence
/// (`outbox_relay_standby_slots_stalled`).
fn standby_slots_finding(host: &str, slots: &StandbySlots, failover_slot: bool) -> Finding {
    const CHECK: &str = "standby_slots";
    let setting = slots.setting.as_deref().unwrap_or_default();
    match slots.stall_message() {
        Some(message) if failover_slot => finding(CHECK, Verdict::Warn, format!("on {host}: {message}")),
        Some(message) => finding(CHECK, Verdict::Warn, format!("on {host}, for failover slots (this one is not): {message}")),
        None if setting.is_empty() && failover_slot => finding(
            CHECK,
            Verdict::Warn,
            format!("synchronized_standby_slots is empty on {host}: the relay may receive changes the standby has not, and after a promotion the synced slot may be behind what Kafka has; list the standby's physical slot there"),
        ),
        None if setting.is_empty() => finding(CHECK, Verdict::Ok, "synchronized_standby_slots is empty"),
        None => finding(CHECK, Verdict::Ok, format!("synchronized_standby_slots = '{setting}' on {host}: each named physical slot is active")),
    }
}

/// PostgreSQL 18's `idle_replication_slot_timeout`: warns when it is set and shorter than the
/// supervisor's [`LONGEST_WAIT`] between two sessions. `None` before 18.
///
/// A slot is idle only while no walsender holds it (its `inactive_since` is null while one
/// does, PostgreSQL docs, "idle_replication_slot_timeout"): a hung relay's walsender keeps it
/// active until `wal_sender_timeout` or a standby relay ends that walsender, so neither counts.
/// What counts is the wait before the next session: at most
/// [`STAND_BY_RETRY`](crate::supervisor::STAND_BY_RETRY) for a relay standing by, up to
/// [`LONGEST_WAIT`] for one reconnecting after errors (a failover, an outage of the database).
fn idle_timeout_finding(host: &str, primary: &SlotOnPrimary) -> Option<Finding> {
    const CHECK: &str = "idle slot timeout";
    let timeout = primary.idle_timeout?;
    Some(if timeout.is_zero() {
        finding(CHECK, Verdict::Ok, "idle_replication_slot_timeout is off")
    } else if timeout < LONGEST_WAIT {
        finding(
            CHECK,
            Verdict::Warn,
            format!(
                "idle_replication_slot_timeout = {} s on {host} invalidates the slot when no relay streams from it that long, shorter than the {} s a relay may wait between two sessions while it reconnects (its longest backoff, with jitter): raise it or set it to 0",
                timeout.as_secs(),
                LONGEST_WAIT.as_secs()
            ),
        )
    } else {
        finding(
            CHECK,
            Verdict::Ok,
            format!("idle_replication_slot_timeout = {} s: an outage of the relay longer than that invalidates the slot", timeout.as_secs()),
        )
    })
}

/// What `check` reads on the standby of `standby_url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbyState {
    pub server: Server,
    pub in_recovery: bool,
    /// Settings by name; `None`: not set, or this role may not read it (`primary_conninfo`
    /// needs `pg_read_all_settings`).
    pub sync_replication_slots: Option<String>,
    pub hot_standby_feedback: Option<String>,
    pub primary_slot_name: Option<String>,
    pub primary_conninfo: Option<String>,
    /// The pipeline's slot there; `None`: not there.
    pub slot: Option<SlotCopy>,
    /// The standby's own `synchronized_standby_slots`, which holds back failover slots once it
    /// is promoted.
    pub standby_slots: StandbySlots,
}

/// The standby's copy of a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotCopy {
    pub synced: bool,
    pub temporary: bool,
    pub invalidation: Option<Invalidation>,
}

impl SlotCopy {
    /// One word for `status`: `synced`, `temporary` (a promotion now drops it), `local` (not
    /// synced from the primary) or `invalidated`.
    pub fn state(&self) -> &'static str {
        match self {
            SlotCopy {
                invalidation: Some(_),
                ..
            } => "invalidated",
            SlotCopy { synced: false, .. } => "local",
            SlotCopy {
                temporary: true, ..
            } => "temporary",
            SlotCopy { .. } => "synced",
        }
    }
}

/// Reads [`StandbyState`] over `client`, connected to the standby, for `slot`.
///
/// Returns an error if a query fails.
pub async fn standby_state(client: &Client, slot: &str) -> Result<StandbyState, SourceError> {
    let settings = client
        .query(
            "SELECT name, setting FROM pg_catalog.pg_settings
             WHERE name IN ('sync_replication_slots', 'hot_standby_feedback', 'primary_slot_name', 'primary_conninfo')",
            &[],
        )
        .await?;
    let setting = |name: &str| {
        settings
            .iter()
            .find(|row| row.get::<_, &str>(0) == name)
            .and_then(|row| row.get::<_, Option<String>>(1))
            .filter(|value| !value.is_empty())
    };
    let in_recovery: bool = client
        .query_one("SELECT pg_catalog.pg_is_in_recovery()", &[])
        .await?
        .get(0);
    let copy = client
        .query_opt(
            "SELECT COALESCE((to_jsonb(s) ->> 'synced')::bool, false), temporary,
                    wal_status IS NOT DISTINCT FROM 'lost', to_jsonb(s) ->> 'invalidation_reason',
                    (to_jsonb(s) ->> 'conflicting')::bool
             FROM pg_catalog.pg_replication_slots s WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(StandbyState {
        server: failover::server(client).await?,
        in_recovery,
        sync_replication_slots: setting("sync_replication_slots"),
        hot_standby_feedback: setting("hot_standby_feedback"),
        primary_slot_name: setting("primary_slot_name"),
        primary_conninfo: setting("primary_conninfo"),
        slot: copy.map(|row| SlotCopy {
            synced: row.get(0),
            temporary: row.get(1),
            invalidation: row
                .get::<_, bool>(2)
                .then(|| Invalidation::of_lost(row.get(3), row.get(4))),
        }),
        standby_slots: failover::standby_slots(client).await?,
    })
}

/// The `dbname` of a libpq connection string (`key=value` pairs, or a URL's path or
/// `dbname` parameter); `None` if it names none.
pub fn conninfo_dbname(conninfo: &str) -> Option<String> {
    let conninfo = conninfo.trim();
    if let Some(rest) = conninfo
        .strip_prefix("postgresql://")
        .or_else(|| conninfo.strip_prefix("postgres://"))
    {
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let from_query = query
            .split('&')
            .find_map(|pair| pair.strip_prefix("dbname="))
            .filter(|db| !db.is_empty());
        let from_path = before_query
            .split_once('/')
            .map(|(_, db)| db)
            .filter(|db| !db.is_empty());
        return from_query.or(from_path).map(str::to_owned);
    }
    let mut rest = conninfo;
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let after = after.trim_start();
        let (value, next) = match after.strip_prefix('\'') {
            Some(quoted) => {
                let mut value = String::new();
                let mut chars = quoted.char_indices();
                let mut end = quoted.len();
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => value.extend(chars.next().map(|(_, c)| c)),
                        '\'' => {
                            end = i + 1;
                            break;
                        }
                        c => value.push(c),
                    }
                }
                (value, &quoted[end..])
            }
            None => {
                let end = after.find(char::is_whitespace).unwrap_or(after.len());
                (after[..end].to_owned(), &after[end..])
            }
        };
        if key.trim() == "dbname" && !value.is_empty() {
            return Some(value);
        }
        rest = next.trim_start();
    }
    None
}

/// Whether the standby keeps `config`'s slot in sync, one finding per setting, each naming
/// the standby's host, the setting and what to change. `primary_physical` is the slot that
/// `primary_slot_name` names, as the primary shows it (`None`: not there, or not set).
pub fn standby_findings(
    config: &PipelineConfig,
    standby: &StandbyState,
    primary_physical: Option<&SlotRow>,
) -> Vec<Finding> {
    let host = &standby.server.host;
    let slot = &config.slot;
    let on = |value: &Option<String>| value.as_deref() == Some("on");
    let mut out = Vec::new();
    if !standby.in_recovery {
        out.push(finding("standby", Verdict::Fail, format!("standby_url reaches {host}, which is not in recovery: point standby_url at the physical standby")));
        return out;
    }
    if !standby.server.has_failover_slots() {
        out.push(finding(
            "standby",
            Verdict::Fail,
            format!(
                "{host} runs PostgreSQL {}: synced slots need 17 or later",
                standby.server.version
            ),
        ));
        return out;
    }
    out.push(finding(
        "standby",
        Verdict::Ok,
        format!("{host}, PostgreSQL {}, in recovery", standby.server.version),
    ));
    out.push(if on(&standby.sync_replication_slots) {
        finding("standby sync", Verdict::Ok, format!("sync_replication_slots = on on {host}"))
    } else {
        finding("standby sync", Verdict::Fail, format!("sync_replication_slots is off on {host}: ALTER SYSTEM SET sync_replication_slots = on there, then SELECT pg_reload_conf()"))
    });
    out.push(if on(&standby.hot_standby_feedback) {
        finding("standby feedback", Verdict::Ok, format!("hot_standby_feedback = on on {host}"))
    } else {
        finding("standby feedback", Verdict::Fail, format!("hot_standby_feedback is off on {host}: ALTER SYSTEM SET hot_standby_feedback = on there, then SELECT pg_reload_conf()"))
    });
    out.push(match (&standby.primary_slot_name, primary_physical) {
        (None, _) => finding("standby primary slot", Verdict::Fail, format!("primary_slot_name is not set on {host}: create a physical slot on the primary (SELECT pg_create_physical_replication_slot('standby1')) and set primary_slot_name = 'standby1' on {host}")),
        (Some(name), None) => finding("standby primary slot", Verdict::Fail, format!("primary_slot_name = '{name}' on {host}, but the primary has no slot {name:?}: SELECT pg_create_physical_replication_slot('{name}') on the primary")),
        (Some(name), Some(row)) if !row.physical => finding("standby primary slot", Verdict::Fail, format!("primary_slot_name = '{name}' on {host} names a logical slot on the primary: name a physical slot")),
        (Some(name), Some(row)) if !row.active => finding("standby primary slot", Verdict::Fail, format!("physical slot {name:?} (primary_slot_name on {host}) is inactive on the primary: the standby does not stream from it; check primary_conninfo on {host} and its log")),
        (Some(name), Some(_)) => finding("standby primary slot", Verdict::Ok, format!("{host} streams from physical slot {name:?} on the primary")),
    });
    out.push(match &standby.primary_conninfo {
        None => finding("standby conninfo", Verdict::Warn, format!("cannot read primary_conninfo on {host} (unset, or the role lacks pg_read_all_settings): it must name a dbname for slot synchronization")),
        Some(conninfo) => match conninfo_dbname(conninfo) {
            Some(db) => finding("standby conninfo", Verdict::Ok, format!("primary_conninfo on {host} names dbname {db}")),
            None => finding("standby conninfo", Verdict::Fail, format!("primary_conninfo on {host} names no dbname, so it cannot synchronize slots: add dbname=<a database> to it (ALTER SYSTEM SET primary_conninfo = '... dbname=postgres'), then SELECT pg_reload_conf()")),
        },
    });
    out.push(match &standby.slot {
        None => finding("standby slot copy", Verdict::Fail, format!("{host} has no copy of slot {slot}: a promotion now loses it (the slot must be a failover slot, and the settings above right; the standby syncs every few seconds)")),
        Some(copy) => match copy.state() {
            "synced" => finding("standby slot copy", Verdict::Ok, format!("{slot} is synced on {host} and persistent: a promotion keeps it")),
            "temporary" => finding("standby slot copy", Verdict::Warn, format!("{slot} is synced on {host} but still temporary: a promotion now drops it; it becomes persistent once the standby has replayed up to the slot's position on the primary (the relay must confirm past it)")),
            "local" => finding("standby slot copy", Verdict::Fail, format!("{host} has a slot {slot} that is not synced from the primary (synced = false): drop it there so that the primary's can be synced")),
            _ => finding("standby slot copy", Verdict::Fail, format!("{slot} on {host} is invalidated ({}): a promotion cannot use it", copy.invalidation.as_ref().map(ToString::to_string).unwrap_or_default())),
        },
    });
    if let Some(message) = standby.standby_slots.stall_message() {
        out.push(finding(
            "standby after promote",
            Verdict::Warn,
            format!("on {host}, once promoted: {message}"),
        ));
    }
    out
}

/// Runs the failover checks of `config` over `client` (the primary): the slot's failover
/// flag, `synchronized_standby_slots`, the idle timeout, and with `standby_url` the standby.
/// Never fails: problems are findings.
pub async fn check(config: &PipelineConfig, client: &Client, out: &mut Vec<Finding>) {
    let primary = match slot_on_primary(client, &config.slot).await {
        Ok(primary) => primary,
        Err(e) => {
            out.push(finding(
                "failover slot",
                Verdict::Fail,
                format!("query failed: {}", chain(&e)),
            ));
            return;
        }
    };
    out.extend(primary_findings(config, &primary));
    if config.standby_url.is_none() {
        return;
    }
    let standby = match connect_standby(config).await {
        Ok((client, _connection)) => standby_state(&client, &config.slot).await,
        Err(e) => {
            out.push(finding(
                "standby",
                Verdict::Fail,
                format!("cannot connect to standby_url: {e}"),
            ));
            return;
        }
    };
    let standby = match standby {
        Ok(standby) => standby,
        Err(e) => {
            out.push(finding(
                "standby",
                Verdict::Fail,
                format!("query on the standby failed: {}", chain(&e)),
            ));
            return;
        }
    };
    let physical = match &standby.primary_slot_name {
        Some(name) => match failover::slot_rows(client, std::slice::from_ref(name)).await {
            Ok(rows) => rows.into_iter().next(),
            Err(e) => {
                out.push(finding(
                    "standby primary slot",
                    Verdict::Fail,
                    format!("query failed: {}", chain(&e)),
                ));
                return;
            }
        },
        None => None,
    };
    out.extend(standby_findings(config, &standby, physical.as_ref()));
}

/// The pipeline with `standby_url` as its source URL, to connect to the standby as to the
/// primary (the same libpq environment and TLS rules), except that `PGTARGETSESSIONATTRS`
/// does not apply: set for the source URL (`primary`), it made the standby unfit. `None`
/// without `standby_url`.
pub fn standby_pipeline(config: &PipelineConfig) -> Option<PipelineConfig> {
    let mut url = config.standby_url.clone()?.0;
    if !url.contains("target_session_attrs") {
        match url.starts_with("postgres://") || url.starts_with("postgresql://") {
            true if url.contains('?') => url.push_str("&target_session_attrs=any"),
            true => url.push_str("?target_session_attrs=any"),
            false => url.push_str(" target_session_attrs=any"),
        }
    }
    Some(PipelineConfig {
        source_url: crate::config::SourceUrl(url),
        source_url_file: None,
        ..config.clone()
    })
}

/// An SQL connection to the standby of `standby_url`.
///
/// Returns an error (the chain as text, naming `standby_url`) if it cannot be made.
pub async fn connect_standby(config: &PipelineConfig) -> Result<(Client, SqlConnection), String> {
    let standby = standby_pipeline(config).ok_or("standby_url is not set")?;
    slot::connect(&standby).await.map_err(|e| {
        chain(&e)
            .replace("source_url", "standby_url")
            .replace("source url", "standby_url")
    })
}

/// The standby's copy of the slot for `status`: `synced`, `temporary`, `local`,
/// `invalidated`, `missing`, or `error: ...`; `None` without `standby_url`.
pub async fn standby_slot_state(config: &PipelineConfig) -> Option<String> {
    config.standby_url.as_ref()?;
    let (client, _connection) = match connect_standby(config).await {
        Ok(connected) => connected,
        Err(e) => return Some(format!("error: {e}")),
    };
    let state = standby_state(&client, &config.slot).await;
    Some(match state {
        Ok(StandbyState {
            slot: Some(copy), ..
        }) => copy.state().to_owned(),
        Ok(StandbyState { slot: None, .. }) => "missing".to_owned(),
        Err(e) => format!("error: {}", chain(&e)),
    })
}

#[cfg(test)]
mod tests;
