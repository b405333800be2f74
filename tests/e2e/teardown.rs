//! `outbox-relay teardown`: a pipeline's slot, slot record row and publication removed once
//! it is out of service, never while a relay streams from its slot, and never unconfirmed.

use std::time::Duration;

use crate::as_command;
use crate::failover_slots::run_command;
use crate::support::{kafka, Auth, Relay};
use crate::Setup;

/// The slot, its record rows and the publication `setup` left, counted.
async fn left(setup: &Setup) -> (i64, i64, i64) {
    let row = setup
        .db
        .client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1),
                    (SELECT count(*) FROM outbox_relay.streamed_slots WHERE slot_name = $1),
                    (SELECT count(*) FROM pg_publication WHERE pubname = 'outbox_pub')",
            &[&setup.slot],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// A streamed pipeline's slot, record row and publication, its relay stopped; returns the
/// relay's arguments.
async fn retired_pipeline(name: &str) -> (Setup, Vec<String>) {
    let setup = Setup::new(name, &["Order"], 1).await;
    let args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    setup.one_event_flows().await;
    // The slot record is written once a first position is confirmed.
    crate::support::wait_for("the slot record", Duration::from_secs(30), || async {
        (left(&setup).await == (1, 1, 1)).then_some(())
    })
    .await;
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());
    (setup, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_removes_the_slot_its_record_and_the_publication_once_no_relay_streams() {
    let setup = Setup::new("teardown", &["Order"], 1).await;
    let args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    // The slot record is written once a first position is confirmed.
    setup.one_event_flows().await;
    let records = || async {
        setup
            .db
            .client
            .query_one(
                "SELECT count(*) FROM outbox_relay.streamed_slots WHERE slot_name = $1",
                &[&setup.slot],
            )
            .await
            .map(|row| row.get::<_, i64>(0))
            .unwrap_or(-1)
    };
    crate::support::wait_for("the slot record", Duration::from_secs(30), || async {
        (records().await == 1).then_some(())
    })
    .await;

    let teardown = as_command(&args, "teardown");
    let mut with_yes = teardown.clone();
    with_yes.push("--yes".into());
    let (ok, out) = run_command(&with_yes);
    assert!(
        !ok && out.contains("in use by the walsender with PID"),
        "teardown while the relay streams:\n{out}"
    );
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());

    let mut print = teardown.clone();
    print.push("--print-sql".into());
    let (ok, out) = run_command(&print);
    assert!(
        ok && out.contains(&format!("pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots WHERE slot_name = '{}' AND database = current_database()", setup.slot))
            && out.contains("DELETE FROM \"outbox_relay\".\"streamed_slots\"")
            && out.contains("-- DROP PUBLICATION IF EXISTS \"outbox_pub\""),
        "{out}"
    );
    // Not a terminal and no --yes: nothing is removed.
    let (ok, out) = run_command(&teardown);
    assert!(!ok && out.contains("not confirmed"), "{out}");
    assert!(setup.db.slot_active_pid(&setup.slot).await.is_none());
    assert_eq!(records().await, 1, "removed without confirmation");

    // Another logical slot of the database (another relay, another consumer) may stream
    // with the publication: it is kept.
    let other = format!("{}_other", setup.slot);
    setup.db.create_slot(&other).await;
    let (ok, out) = run_command(&with_yes);
    assert!(
        ok && out.contains("keeps publication \"outbox_pub\": other logical slots")
            && out.contains(&format!("removed replication slot {:?}", setup.slot)),
        "{out}"
    );
    setup.db.drop_slot(&other).await;
    let (ok, out) = run_command(&with_yes);
    assert!(ok, "{out}");
    assert!(
        out.contains("removed publication \"outbox_pub\""),
        "once no other slot may use it:\n{out}"
    );
    let left: i64 = setup
        .db
        .client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1)
                  + (SELECT count(*) FROM pg_publication WHERE pubname = 'outbox_pub')",
            &[&setup.slot],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    assert_eq!(records().await, 0);
    let (ok, out) = run_command(&with_yes);
    assert!(ok && out.contains("nothing to remove"), "{out}");
}

/// A role without REPLICATION, then one with REPLICATION that owns neither the publication
/// nor the slot record table, may not do every step: teardown refuses before removing
/// anything (exit code 4), naming the role, what it may not do and who may; the owner of
/// both then removes it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_by_a_role_that_may_not_do_every_step_removes_nothing() {
    let (setup, args) = retired_pipeline("teardown_rights").await;
    let teardown_as = |role: &str| {
        let mut as_role = args.clone();
        as_role[2] = format!(
            "postgres://{role}@127.0.0.1:{}/{}",
            setup.db.port(),
            setup.db.name
        );
        let mut teardown = as_command(&as_role, "teardown");
        teardown.push("--yes".into());
        teardown
    };
    let refused = |teardown: &[String], says: &[String]| {
        let mut command = Relay::spawn(teardown);
        let status = command.wait(Duration::from_secs(60));
        let log = command.log();
        assert_eq!(
            status.code(),
            Some(4),
            "teardown exited with {status}:\n{log}"
        );
        for says in says {
            assert!(log.contains(says), "teardown does not say {says:?}:\n{log}");
        }
        assert!(!log.contains("connection error"), "{log}");
        log
    };
    // Without REPLICATION, not even the slot.
    let no_replication = format!("{}_norepl", setup.db.name);
    setup
        .db
        .client
        .batch_execute(&format!("CREATE ROLE {no_replication} LOGIN"))
        .await
        .unwrap();
    let log = refused(
        &teardown_as(&no_replication),
        &[format!(
            "role \"{no_replication}\" may not drop replication slot {:?} (a role with REPLICATION or a superuser may: ALTER ROLE \"{no_replication}\" REPLICATION), nor delete the slot record",
            setup.slot
        )],
    );
    assert_eq!(left(&setup).await, (1, 1, 1), "removed in part:\n{log}");

    let role = format!("{}_tear", setup.db.name);
    setup
        .db
        .client
        .batch_execute(&format!("CREATE ROLE {role} LOGIN REPLICATION"))
        .await
        .unwrap();
    let teardown = teardown_as(&role);
    let log = refused(
        &teardown,
        &[
            format!("role \"{role}\" may not delete the slot record"),
            format!("GRANT USAGE ON SCHEMA \"outbox_relay\" TO \"{role}\""),
            format!("GRANT SELECT, DELETE ON \"outbox_relay\".\"streamed_slots\" TO \"{role}\""),
            "nor drop publication \"outbox_pub\" (only its owner".to_string(),
            "or a superuser may)".to_string(),
            "nothing was removed".to_string(),
        ],
    );
    assert!(!log.contains("may not drop replication slot"), "{log}");
    assert_eq!(left(&setup).await, (1, 1, 1), "removed in part:\n{log}");

    // Allowed the record table: the record row is listed, the publication still refused.
    setup
        .db
        .client
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA outbox_relay TO {role}; GRANT SELECT, DELETE ON outbox_relay.streamed_slots TO {role}"
        ))
        .await
        .unwrap();
    let log = refused(
        &teardown,
        &[
            format!("will remove the slot record of {:?}", setup.slot),
            format!("role \"{role}\" may not drop publication \"outbox_pub\" (only its owner"),
        ],
    );
    assert!(!log.contains("GRANT"), "{log}");
    assert_eq!(left(&setup).await, (1, 1, 1), "removed in part:\n{log}");

    let mut as_owner = as_command(&args, "teardown");
    as_owner.push("--yes".into());
    let (ok, out) = run_command(&as_owner);
    assert!(
        ok && out.contains("removed publication \"outbox_pub\""),
        "{out}"
    );
    assert_eq!(left(&setup).await, (0, 0, 0), "{out}");
}

/// A statement that fails after the plan found every step allowed (here an event trigger
/// refuses DROP PUBLICATION): the error says what was already removed and what was not, and
/// a second run removes the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_stopped_midway_says_what_it_already_removed() {
    let (setup, args) = retired_pipeline("teardown_midway").await;
    setup
        .db
        .client
        .batch_execute(
            "CREATE FUNCTION keep_publications() RETURNS event_trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'publications are kept in this database'; END $$;
             CREATE EVENT TRIGGER keep_publications ON ddl_command_start
               WHEN TAG IN ('DROP PUBLICATION') EXECUTE FUNCTION keep_publications();",
        )
        .await
        .unwrap();
    let mut teardown = as_command(&args, "teardown");
    teardown.push("--yes".into());
    let (ok, out) = run_command(&teardown);
    let says = format!(
        "removed replication slot {:?} (and the WAL it keeps) and the slot record of {:?}, then could not remove publication \"outbox_pub\" (running teardown again removes the rest)",
        setup.slot, setup.slot
    );
    assert!(
        !ok && out.contains(&says),
        "teardown does not say {says:?}:\n{out}"
    );
    assert!(
        out.contains("publications are kept in this database"),
        "{out}"
    );
    assert!(!out.contains("connection error"), "{out}");
    assert_eq!(left(&setup).await, (0, 0, 1), "{out}");

    setup
        .db
        .client
        .batch_execute("DROP EVENT TRIGGER keep_publications")
        .await
        .unwrap();
    let (ok, out) = run_command(&teardown);
    assert!(
        ok && out.contains("removed publication \"outbox_pub\""),
        "{out}"
    );
    assert_eq!(left(&setup).await, (0, 0, 0), "{out}");
}
