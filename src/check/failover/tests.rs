use super::*;
use crate::source::slot::failover::{StandbySlot, StandbySlotProblem};

fn server(version_num: i32, version: &str, host: &str) -> Server {
    Server {
        version_num,
        version: version.into(),
        host: host.into(),
    }
}

fn primary(version_num: i32, failover: Option<bool>) -> SlotOnPrimary {
    SlotOnPrimary {
        server: server(version_num, "17.10", "10.0.0.1:5432"),
        failover,
        standby_slots: StandbySlots {
            setting: Some("standby1".into()),
            slots: vec![StandbySlot {
                name: "standby1".into(),
                problem: None,
            }],
        },
        idle_timeout: None,
        in_recovery: false,
    }
}

fn config(failover: bool) -> PipelineConfig {
    PipelineConfig {
        failover,
        ..PipelineConfig::test_pipeline()
    }
}

fn verdict_of(findings: &[Finding], check: &str) -> (Verdict, String) {
    let f = findings
        .iter()
        .find(|f| f.check == check)
        .unwrap_or_else(|| panic!("no {check:?} finding in {findings:#?}"));
    (f.verdict, f.detail.clone())
}

#[test]
fn failover_slot_finding_by_version_and_flag() {
    let old = SlotOnPrimary {
        server: server(160_002, "16.2", "10.0.0.1:5432"),
        ..primary(160_002, Some(false))
    };
    let findings = primary_findings(&config(true), &old);
    let (verdict, detail) = verdict_of(&findings, "failover slot");
    assert_eq!(verdict, Verdict::Fail);
    assert!(
        detail.contains("16.2") && detail.contains("failover"),
        "{detail}"
    );
    assert!(
        !findings.iter().any(|f| f.check == "standby_slots"),
        "no synchronized_standby_slots before 17: {findings:#?}"
    );
    assert_eq!(
        verdict_of(&primary_findings(&config(false), &old), "failover slot").0,
        Verdict::Ok
    );

    // A slot without FAILOVER: the start turns it on (a warning), unless create_slot = false
    // leaves the slot to the operator (a failure).
    for (create_slot, expected) in [(true, Verdict::Warn), (false, Verdict::Fail)] {
        let config = PipelineConfig {
            create_slot,
            ..config(true)
        };
        let (verdict, detail) = verdict_of(
            &primary_findings(&config, &primary(170_010, Some(false))),
            "failover slot",
        );
        assert_eq!(verdict, expected, "create_slot = {create_slot}: {detail}");
        assert!(
            detail.contains("ALTER_REPLICATION_SLOT") && detail.contains("10.0.0.1:5432"),
            "{detail}"
        );
    }
    for (slot, flag) in [
        (Some(true), true),
        (Some(true), false),
        (None, true),
        (Some(false), false),
    ] {
        assert_eq!(
            verdict_of(
                &primary_findings(&config(flag), &primary(170_010, slot)),
                "failover slot"
            )
            .0,
            Verdict::Ok,
            "slot {slot:?}, failover = {flag}"
        );
    }
}

/// A stall is waited for, not stopped on: the start accepts it (a standby restarting mends
/// it by itself) and the running relay warns with the same sentence, so `check` warns too.
#[test]
fn a_stalled_synchronized_standby_slot_warns_as_the_running_relay_does() {
    let mut stalled = primary(170_010, Some(true));
    stalled.standby_slots.slots[0].problem = Some(StandbySlotProblem::Missing);
    let (verdict, detail) = verdict_of(&primary_findings(&config(true), &stalled), "standby_slots");
    assert_eq!(verdict, Verdict::Warn);
    let running = stalled.standby_slots.stall_message().unwrap();
    assert!(
        detail.ends_with(&running),
        "{detail}\nvs the relay's {running}"
    );
    assert!(
        detail.contains("synchronized_standby_slots = 'standby1'")
            && detail.contains("does not exist")
            && detail.contains("10.0.0.1:5432"),
        "{detail}"
    );
    stalled.failover = Some(false);
    assert_eq!(
        verdict_of(&primary_findings(&config(false), &stalled), "standby_slots").0,
        Verdict::Warn
    );
    let mut empty = primary(170_010, Some(true));
    empty.standby_slots = StandbySlots {
        setting: Some(String::new()),
        slots: vec![],
    };
    assert_eq!(
        verdict_of(&primary_findings(&config(true), &empty), "standby_slots").0,
        Verdict::Warn
    );
    assert_eq!(
        verdict_of(
            &primary_findings(&config(true), &primary(170_010, Some(true))),
            "standby_slots"
        )
        .0,
        Verdict::Ok
    );
}

#[test]
fn idle_timeout_warns_below_the_longest_wait_between_sessions() {
    let mut p = primary(180_006, Some(true));
    assert!(!primary_findings(&config(true), &p)
        .iter()
        .any(|f| f.check == "idle slot timeout"));
    p.idle_timeout = Some(Duration::from_secs(59));
    let (verdict, detail) = verdict_of(&primary_findings(&config(true), &p), "idle slot timeout");
    assert_eq!(verdict, Verdict::Warn);
    assert!(
        detail.contains("idle_replication_slot_timeout = 59 s") && detail.contains("60 s"),
        "{detail}"
    );
    p.idle_timeout = Some(Duration::from_secs(60));
    assert_eq!(
        verdict_of(&primary_findings(&config(true), &p), "idle slot timeout").0,
        Verdict::Ok
    );
    p.idle_timeout = Some(Duration::ZERO);
    assert_eq!(
        verdict_of(&primary_findings(&config(true), &p), "idle slot timeout").0,
        Verdict::Ok
    );
    // A grace period does not shorten the wait: one up to wal_sender_timeout is not used, and
    // while a walsender holds the slot (however long) the slot is not idle.
    let quick = PipelineConfig {
        terminate_stale_walsender_after_secs: Some(10),
        ..config(true)
    };
    p.idle_timeout = Some(Duration::from_secs(50));
    assert_eq!(
        verdict_of(&primary_findings(&quick, &p), "idle slot timeout").0,
        Verdict::Warn
    );
    assert_eq!(
        setting_duration("2", Some("min")),
        Some(Duration::from_secs(120))
    );
    assert_eq!(
        setting_duration("1500", Some("ms")),
        Some(Duration::from_millis(1500))
    );
}

#[test]
fn finds_dbname_in_conninfo() {
    assert_eq!(
        conninfo_dbname("user=postgres host=p port=5432 sslmode=prefer"),
        None
    );
    assert_eq!(
        conninfo_dbname("user=postgres passfile='/root/.pgpass' dbname=postgres host=p"),
        Some("postgres".into())
    );
    assert_eq!(
        conninfo_dbname("host=p dbname = 'my db'"),
        Some("my db".into())
    );
    assert_eq!(
        conninfo_dbname("application_name='a b' dbname='it\\'s'"),
        Some("it's".into())
    );
    assert_eq!(
        conninfo_dbname("postgresql://u@p:5432/app?sslmode=require"),
        Some("app".into())
    );
    assert_eq!(
        conninfo_dbname("postgres://u@p:5432?dbname=x"),
        Some("x".into())
    );
    assert_eq!(conninfo_dbname("postgres://u@p:5432"), None);
}

fn standby() -> StandbyState {
    StandbyState {
        server: server(170_010, "17.10", "10.0.0.2:5432"),
        in_recovery: true,
        sync_replication_slots: Some("on".into()),
        hot_standby_feedback: Some("on".into()),
        primary_slot_name: Some("standby1".into()),
        primary_conninfo: Some("host=10.0.0.1 user=replicator dbname=postgres".into()),
        slot: Some(SlotCopy {
            synced: true,
            temporary: false,
            invalidation: None,
        }),
        standby_slots: StandbySlots {
            setting: Some(String::new()),
            slots: vec![],
        },
    }
}

fn physical(active: bool) -> SlotRow {
    SlotRow {
        name: "standby1".into(),
        physical: true,
        active,
        lost: false,
    }
}

#[test]
fn a_standby_that_keeps_the_slot_passes_every_check() {
    let findings = standby_findings(&config(true), &standby(), Some(&physical(true)));
    assert!(
        findings.iter().all(|f| f.verdict == Verdict::Ok),
        "{findings:#?}"
    );
    assert_eq!(findings.len(), 6, "{findings:#?}");
}

#[test]
fn each_standby_problem_names_the_host_and_setting() {
    type Case = (&'static str, &'static str, Verdict, fn(&mut StandbyState));
    let cases: [Case; 9] = [
        (
            "standby sync",
            "sync_replication_slots",
            Verdict::Fail,
            |s| s.sync_replication_slots = Some("off".into()),
        ),
        (
            "standby feedback",
            "hot_standby_feedback",
            Verdict::Fail,
            |s| s.hot_standby_feedback = None,
        ),
        (
            "standby primary slot",
            "primary_slot_name",
            Verdict::Fail,
            |s| s.primary_slot_name = None,
        ),
        ("standby conninfo", "dbname", Verdict::Fail, |s| {
            s.primary_conninfo = Some("host=p user=r".into())
        }),
        (
            "standby conninfo",
            "pg_read_all_settings",
            Verdict::Warn,
            |s| s.primary_conninfo = None,
        ),
        ("standby slot copy", "no copy", Verdict::Fail, |s| {
            s.slot = None
        }),
        ("standby slot copy", "temporary", Verdict::Warn, |s| {
            s.slot.as_mut().unwrap().temporary = true
        }),
        ("standby slot copy", "synced = false", Verdict::Fail, |s| {
            s.slot.as_mut().unwrap().synced = false
        }),
        (
            "standby after promote",
            "synchronized_standby_slots",
            Verdict::Warn,
            |s| {
                s.standby_slots = StandbySlots {
                    setting: Some("standby1".into()),
                    slots: vec![StandbySlot {
                        name: "standby1".into(),
                        problem: Some(StandbySlotProblem::Missing),
                    }],
                }
            },
        ),
    ];
    for (check, setting, expected, change) in cases {
        let mut state = standby();
        change(&mut state);
        let findings = standby_findings(&config(true), &state, Some(&physical(true)));
        let (verdict, detail) = verdict_of(&findings, check);
        assert_eq!(verdict, expected, "{check}: {detail}");
        assert!(
            detail.contains(setting) && detail.contains("10.0.0.2:5432"),
            "{check}: {detail}"
        );
        let others = findings
            .iter()
            .filter(|f| f.verdict != Verdict::Ok && f.check != check)
            .count();
        assert_eq!(
            others, 0,
            "{check}: only this finding is not ok: {findings:#?}"
        );
    }
    let (verdict, detail) = verdict_of(
        &standby_findings(&config(true), &standby(), None),
        "standby primary slot",
    );
    assert_eq!(verdict, Verdict::Fail);
    assert!(
        detail.contains("pg_create_physical_replication_slot('standby1')"),
        "{detail}"
    );
    let (verdict, detail) = verdict_of(
        &standby_findings(&config(true), &standby(), Some(&physical(false))),
        "standby primary slot",
    );
    assert_eq!(verdict, Verdict::Fail);
    assert!(detail.contains("inactive"), "{detail}");
    let primary_itself = StandbyState {
        in_recovery: false,
        ..standby()
    };
    let findings = standby_findings(&config(true), &primary_itself, Some(&physical(true)));
    assert_eq!(verdict_of(&findings, "standby").0, Verdict::Fail);
    assert_eq!(findings.len(), 1);
}

/// `PGTARGETSESSIONATTRS` is for the source URL: the standby URL gets `any` of its own,
/// unless it says otherwise.
#[test]
fn the_standby_url_is_not_held_to_the_source_urls_target_session_attrs() {
    let standby = |url: &str| {
        let mut config = PipelineConfig::new("p", "outbox".parse().unwrap());
        config.standby_url = Some(crate::config::SourceUrl(url.into()));
        let pipeline = standby_pipeline(&config).unwrap();
        let target = pipeline.source_config().unwrap().target;
        (pipeline.source_url.0, target)
    };
    use crate::source::target::TargetSessionAttrs::{Any, Standby};
    assert_eq!(
        standby("postgres://u@s/db"),
        ("postgres://u@s/db?target_session_attrs=any".into(), Any)
    );
    assert_eq!(
        standby("postgres://u@s/db?sslmode=require").0,
        "postgres://u@s/db?sslmode=require&target_session_attrs=any"
    );
    assert_eq!(
        standby("host=s dbname=db user=u").0,
        "host=s dbname=db user=u target_session_attrs=any"
    );
    assert_eq!(
        standby("postgres://u@s/db?target_session_attrs=standby").1,
        Standby
    );
}

/// A pipeline decoding on a standby cannot have its slot created with FAILOVER (PostgreSQL
/// refuses it there): check fails instead of promising it.
#[test]
fn a_failover_slot_to_be_created_on_a_standby_fails() {
    let on_standby = SlotOnPrimary {
        in_recovery: true,
        ..primary(170010, None)
    };
    let findings = primary_findings(&config(true), &on_standby);
    let slot = findings
        .iter()
        .find(|f| f.check == "failover slot")
        .expect("a failover slot finding");
    assert_eq!(slot.verdict, Verdict::Fail, "{slot:?}");
    assert!(slot.detail.contains("a standby"), "{slot:?}");
    let on_primary = primary_findings(&config(true), &primary(170010, None));
    assert!(on_primary
        .iter()
        .any(|f| f.check == "failover slot" && f.verdict == Verdict::Ok));
}

/// Found by review: an existing slot without FAILOVER on a standby, with failover = true, was
/// sent to `setup` (ALTER_REPLICATION_SLOT), which PostgreSQL refuses on a standby.
#[test]
fn a_slot_on_a_standby_without_failover_is_not_sent_to_setup() {
    let on_standby = SlotOnPrimary {
        in_recovery: true,
        ..primary(170010, Some(false))
    };
    let findings = primary_findings(&config(true), &on_standby);
    let slot = findings
        .iter()
        .find(|f| f.check == "failover slot")
        .expect("a failover slot finding");
    assert_eq!(slot.verdict, Verdict::Fail, "{slot:?}");
    assert!(
        slot.detail.contains("a standby") && !slot.detail.contains("outbox-relay setup"),
        "{slot:?}"
    );
    let on_primary = primary_findings(&config(true), &primary(170010, Some(false)));
    let slot = on_primary
        .iter()
        .find(|f| f.check == "failover slot")
        .expect("a failover slot finding");
    assert!(slot.detail.contains("outbox-relay setup"), "{slot:?}");
}

/// The start stops exactly where `check` fails its `failover slot` finding, with the same
/// sentence ([`failover::failover_refusal`] is what the start stops with); where the start
/// turns FAILOVER on itself (a primary's slot without it, `create_slot`), `check` warns.
#[test]
fn check_fails_the_failover_slot_exactly_where_the_start_stops_with_the_same_sentence() {
    for version_num in [160_002, 170_010] {
        for in_recovery in [false, true] {
            for slot in [None, Some(false), Some(true)] {
                for flag in [false, true] {
                    for create_slot in [false, true] {
                        let state = SlotOnPrimary {
                            server: server(version_num, "x", "10.0.0.1:5432"),
                            in_recovery,
                            ..primary(version_num, slot)
                        };
                        let config = PipelineConfig {
                            create_slot,
                            ..config(flag)
                        };
                        let (verdict, detail) =
                            verdict_of(&primary_findings(&config, &state), "failover slot");
                        let start = failover::failover_refusal(
                            "outbox_relay",
                            &state.server,
                            in_recovery,
                            slot,
                            flag,
                            create_slot,
                        );
                        let case = format!(
                            "{version_num} recovery={in_recovery} slot={slot:?} failover={flag} create_slot={create_slot}"
                        );
                        let mended = version_num >= 170_000
                            && !in_recovery
                            && slot == Some(false)
                            && flag
                            && create_slot;
                        match start {
                            Some(refusal) => {
                                assert_eq!(verdict, Verdict::Fail, "{case}");
                                assert_eq!(detail, refusal, "{case}");
                            }
                            None if mended => {
                                assert_eq!(verdict, Verdict::Warn, "{case}: {detail}");
                                assert!(
                                    detail.contains("the relay's start turns FAILOVER on"),
                                    "{case}: {detail}"
                                );
                            }
                            None => assert_eq!(verdict, Verdict::Ok, "{case}: {detail}"),
                        }
                    }
                }
            }
        }
    }
    // The one a running primary can mend when the relay may not: setup, with every relay
    // stopped.
    let refusal = failover::failover_refusal(
        "outbox_relay",
        &server(170_010, "17.10", "10.0.0.1:5432"),
        false,
        Some(false),
        true,
        false,
    )
    .unwrap();
    for part in [
        "10.0.0.1:5432",
        "create_slot = false",
        "stop every relay streaming from it",
        "outbox-relay setup",
        "ALTER_REPLICATION_SLOT \"outbox_relay\" (FAILOVER true)",
    ] {
        assert!(refusal.contains(part), "{part:?} missing in {refusal}");
    }
}
