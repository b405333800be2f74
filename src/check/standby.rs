//! `check` of a pipeline whose server is a physical standby (logical decoding there needs
//! PostgreSQL 16+): `hot_standby_feedback`, without which a VACUUM on the primary invalidates
//! the slot, and the primary's `wal_level`.
//!
//! The primary's `wal_level` shows in no setting or function of the standby. The standby
//! checks it from the WAL it replayed whenever a slot is created (before the creation's wait
//! for a running-transactions record), and invalidates its slots when the primary lowers it.
//! So: a valid slot of the pipeline on the standby proves it `logical`; without one, `check`
//! creates a temporary slot with a short `statement_timeout` and reads the refusal, if any
//! (a cancelled wait means the requirement was met).
//!
//! The findings are a pure function of [`DecodingStandby`], unit-tested without a server.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::{finding, Finding, Verdict};
use crate::source::slot::failover::{self, Server};
use crate::source::slot::standby::{
    decoding_refusal, is_primary_wal_level_error, primary_wal_level_fix, DECODING_MIN_VERSION_NUM,
};
use crate::source::SourceError;

/// How long `check`'s probe slot may wait for a running-transactions record: it only needs
/// the creation to get past the `wal_level` check, which comes first.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What `check` knows of the primary's `wal_level` on a standby.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrimaryWalLevel {
    /// The pipeline's slot is valid on the standby, which it would not be had the primary
    /// lowered `wal_level`.
    SlotValid,
    /// A probe slot creation got past the `wal_level` check.
    Logical,
    /// A probe slot creation was refused for the primary's `wal_level`.
    BelowLogical,
    /// The probe failed otherwise (the server's message).
    Unknown(String),
}

/// The standby as `check` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodingStandby {
    pub server: Server,
    pub hot_standby_feedback: bool,
    /// `None`: not set.
    pub primary_slot_name: Option<String>,
    pub primary_wal_level: PrimaryWalLevel,
}

/// Reads [`DecodingStandby`] for `slot` over `client`, connected to a standby; probes the
/// primary's `wal_level` with a temporary slot unless `slot` is valid there.
///
/// Returns an error if a query fails.
pub async fn decoding_standby(client: &Client, slot: &str) -> Result<DecodingStandby, SourceError> {
    let row = client
        .query_one(
            "SELECT current_setting('hot_standby_feedback') = 'on',
                    NULLIF(current_setting('primary_slot_name'), ''),
                    EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots
                            WHERE slot_name = $1 AND wal_status IS DISTINCT FROM 'lost')",
            &[&slot],
        )
        .await?;
    let slot_valid: bool = row.get(2);
    let primary_wal_level = match slot_valid {
        true => PrimaryWalLevel::SlotValid,
        false => probe_primary_wal_level(client).await?,
    };
    Ok(DecodingStandby {
        server: failover::server(client).await?,
        hot_standby_feedback: row.get(0),
        primary_slot_name: row.get(1),
        primary_wal_level,
    })
}

/// Creates a temporary pgoutput slot, waiting at most [`PROBE_TIMEOUT`], and drops it again:
/// a refusal naming the primary's `wal_level` is [`PrimaryWalLevel::BelowLogical`].
async fn probe_primary_wal_level(client: &Client) -> Result<PrimaryWalLevel, SourceError> {
    client
        .batch_execute(&format!(
            "SET statement_timeout = {}",
            PROBE_TIMEOUT.as_millis()
        ))
        .await?;
    let probe = client
        .query_one(
            "SELECT slot_name::text FROM pg_catalog.pg_create_logical_replication_slot('outbox_relay_check_' || pg_catalog.pg_backend_pid(), 'pgoutput', true)",
            &[],
        )
        .await;
    client.batch_execute("SET statement_timeout = 0").await?;
    Ok(match probe {
        Ok(row) => {
            let name: String = row.get(0);
            client
                .execute("SELECT pg_catalog.pg_drop_replication_slot($1)", &[&name])
                .await?;
            PrimaryWalLevel::Logical
        }
        Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => PrimaryWalLevel::Logical,
        Err(e) => match e.as_db_error().map(|db| db.message()) {
            Some(message) if is_primary_wal_level_error(message) => PrimaryWalLevel::BelowLogical,
            Some(message) => PrimaryWalLevel::Unknown(message.to_owned()),
            None => return Err(e.into()),
        },
    })
}

/// The findings of a pipeline on the standby `standby`. Where the start stops
/// ([`decoding_refusal`]), the finding fails with the start's sentence.
pub fn findings(standby: &DecodingStandby) -> Vec<Finding> {
    let host = &standby.server.host;
    let refusal = decoding_refusal(&standby.server, standby.hot_standby_feedback);
    if standby.server.version_num < DECODING_MIN_VERSION_NUM {
        return vec![finding(
            "standby decoding",
            Verdict::Fail,
            refusal.unwrap_or_default(),
        )];
    }
    let mut out = vec![finding(
        "standby decoding",
        Verdict::Ok,
        format!(
            "{host} is a standby (PostgreSQL {}): the slot lives there, and a failover of the primary does not touch it",
            standby.server.version
        ),
    )];
    out.push(match (refusal, &standby.primary_slot_name) {
        (Some(refusal), _) => finding("standby feedback", Verdict::Fail, refusal),
        (None, None) => finding(
            "standby feedback",
            Verdict::Warn,
            format!("hot_standby_feedback = on on {host}, but primary_slot_name is not set: the primary forgets the feedback whenever the standby disconnects, and a VACUUM then may invalidate the slot; stream the standby from a physical slot"),
        ),
        (None, Some(name)) => finding(
            "standby feedback",
            Verdict::Ok,
            format!("hot_standby_feedback = on on {host}, held on the primary by physical slot {name:?}"),
        ),
    });
    out.push(match &standby.primary_wal_level {
        PrimaryWalLevel::SlotValid => finding(
            "primary wal_level",
            Verdict::Ok,
            format!("the slot is valid on {host}, so its primary has wal_level = logical"),
        ),
        PrimaryWalLevel::Logical => finding(
            "primary wal_level",
            Verdict::Ok,
            format!("{host} accepts a slot, so its primary has wal_level = logical"),
        ),
        PrimaryWalLevel::BelowLogical => {
            finding("primary wal_level", Verdict::Fail, primary_wal_level_fix(host))
        }
        PrimaryWalLevel::Unknown(message) => finding(
            "primary wal_level",
            Verdict::Warn,
            format!("cannot tell whether the primary of {host} has wal_level = logical: a probe slot creation failed: {message}"),
        ),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standby(
        version_num: i32,
        feedback: bool,
        slot: Option<&str>,
        wal: PrimaryWalLevel,
    ) -> DecodingStandby {
        DecodingStandby {
            server: Server {
                version_num,
                version: format!("{}.2", version_num / 10_000),
                host: "10.0.0.2:5432".into(),
            },
            hot_standby_feedback: feedback,
            primary_slot_name: slot.map(str::to_owned),
            primary_wal_level: wal,
        }
    }

    fn line<'a>(findings: &'a [Finding], check: &str) -> &'a Finding {
        findings
            .iter()
            .find(|f| f.check == check)
            .unwrap_or_else(|| panic!("no {check} finding in {findings:?}"))
    }

    #[test]
    fn a_standby_before_16_cannot_decode() {
        let findings = findings(&standby(150_008, true, Some("p"), PrimaryWalLevel::Logical));
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].verdict, Verdict::Fail);
        assert!(
            findings[0].detail.contains("PostgreSQL 16"),
            "{}",
            findings[0]
        );
        assert!(
            findings[0].detail.contains("10.0.0.2:5432"),
            "{}",
            findings[0]
        );
    }

    #[test]
    fn hot_standby_feedback_is_needed_and_best_held_by_a_physical_slot() {
        let off = findings(&standby(
            160_002,
            false,
            Some("p"),
            PrimaryWalLevel::Logical,
        ));
        let f = line(&off, "standby feedback");
        assert_eq!(f.verdict, Verdict::Fail);
        for part in [
            "hot_standby_feedback is off on 10.0.0.2:5432",
            "rows_removed",
            "pg_reload_conf",
        ] {
            assert!(f.detail.contains(part), "{part:?} missing in {f}");
        }
        let no_slot = findings(&standby(170_002, true, None, PrimaryWalLevel::Logical));
        let f = line(&no_slot, "standby feedback");
        assert_eq!(f.verdict, Verdict::Warn);
        assert!(f.detail.contains("primary_slot_name"), "{f}");
        let fine = findings(&standby(180_001, true, Some("p"), PrimaryWalLevel::Logical));
        assert!(fine.iter().all(|f| f.verdict == Verdict::Ok), "{fine:?}");
    }

    #[test]
    fn the_primary_wal_level_is_judged_by_the_slot_or_the_probe() {
        let cases = [
            (
                PrimaryWalLevel::SlotValid,
                Verdict::Ok,
                "wal_level = logical",
            ),
            (PrimaryWalLevel::Logical, Verdict::Ok, "wal_level = logical"),
            (
                PrimaryWalLevel::BelowLogical,
                Verdict::Fail,
                "wal_level = logical on the primary",
            ),
            (
                PrimaryWalLevel::Unknown("all replication slots are in use".into()),
                Verdict::Warn,
                "all replication slots are in use",
            ),
        ];
        for (wal, verdict, part) in cases {
            let findings = findings(&standby(160_002, true, Some("p"), wal));
            let f = line(&findings, "primary wal_level");
            assert_eq!(f.verdict, verdict, "{f}");
            assert!(
                f.detail.contains(part) && f.detail.contains("10.0.0.2:5432"),
                "{f}"
            );
        }
    }

    /// The start stops with `check`'s sentence where `check` fails a standby: a slot creation
    /// refused for the primary's `wal_level` names what `primary wal_level` prints, and a
    /// standby before 16 or without `hot_standby_feedback` is refused before any slot.
    #[test]
    fn the_start_stops_with_the_sentence_check_fails_a_standby_with() {
        let start = crate::source::slot::standby::primary_wal_level_error("s", "10.0.0.2:5432");
        let below = findings(&standby(
            160_002,
            true,
            Some("p"),
            PrimaryWalLevel::BelowLogical,
        ));
        let f = line(&below, "primary wal_level");
        assert!(
            start.contains(&f.detail),
            "the start's {start}\nvs check's {f}"
        );

        for (version_num, feedback, check) in [
            (150_008, true, "standby decoding"),
            (160_002, false, "standby feedback"),
            (180_001, false, "standby feedback"),
        ] {
            let state = standby(version_num, feedback, Some("p"), PrimaryWalLevel::Logical);
            let refusal = decoding_refusal(&state.server, feedback)
                .unwrap_or_else(|| panic!("the start accepts {state:?}"));
            let all = findings(&state);
            let f = line(&all, check);
            assert_eq!(f.verdict, Verdict::Fail, "{f}");
            assert_eq!(f.detail, refusal);
        }
        for version_num in [160_002, 170_010] {
            let state = standby(version_num, true, None, PrimaryWalLevel::Logical);
            assert_eq!(decoding_refusal(&state.server, true), None);
            assert!(findings(&state).iter().all(|f| f.verdict != Verdict::Fail));
        }
    }
}
