//! A slot is never silently replaced, across restarts of the relay: the slot record
//! (`outbox_relay.streamed_slots`, sql/slot_record.sql) remembers that the relay streamed from
//! its slot, so a relay started after the slot was dropped refuses to create it again, even
//! with the default `create_slot = true`, until `setup --accept-slot-loss`.

use std::time::Duration;

use crate::support::pg::format_lsn;
use crate::support::{kafka, parse_lsn, wait_for, Auth, Relay};
use crate::{assert_delivered, write_events, Setup, Written};

/// How long a relay may take to stop on an error at start.
const START_FAILURE_DEADLINE: Duration = Duration::from_secs(60);

/// The record of `slot`: (confirmed_lsn, confirmed_at, pipeline, system_identifier, timeline,
/// first_streamed_at); `None` without a row.
async fn record(setup: &Setup) -> Option<(u64, String, String, String, i64, String)> {
    setup
        .db
        .client
        .query_opt(
            "SELECT confirmed_lsn::text, confirmed_at::text, pipeline, system_identifier, timeline, first_streamed_at::text
             FROM outbox_relay.streamed_slots WHERE slot_name = $1",
            &[&setup.slot],
        )
        .await
        .unwrap()
        .map(|r| {
            (
                parse_lsn(r.get(0)),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
            )
        })
}

/// Asserts that the record's confirmed LSN is not past the slot's `confirmed_flush_lsn`
/// (both read in one statement); returns the record's LSN.
async fn assert_record_within_slot(setup: &Setup, when: &str) -> u64 {
    let row = setup
        .db
        .client
        .query_one(
            "SELECT r.confirmed_lsn::text, s.confirmed_flush_lsn::text
             FROM outbox_relay.streamed_slots r JOIN pg_replication_slots s USING (slot_name)
             WHERE slot_name = $1",
            &[&setup.slot],
        )
        .await
        .unwrap_or_else(|e| panic!("{when}: no record or no slot of {}: {e}", setup.slot));
    let (recorded, slot) = (parse_lsn(row.get(0)), parse_lsn(row.get(1)));
    assert!(
        recorded <= slot,
        "{when}: the record's confirmed LSN {} is past the slot's confirmed_flush_lsn {}",
        row.get::<_, String>(0),
        row.get::<_, String>(1)
    );
    recorded
}

/// `setup.relay_args` for `command` (run, setup) with `extra` flags.
fn args(setup: &Setup, auth: Auth, command: &str, extra: &[&str]) -> Vec<String> {
    let mut args = setup.relay_args(&kafka().bootstrap(), auth);
    args = crate::as_command(&args, command);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Waits until every event of `written` arrived, and nothing else, as [`assert_delivered`]
/// checks (`written`: every event written to the test's topics).
async fn assert_arrived(setup: &Setup, written: &[Written]) {
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(1),
            Duration::from_secs(60),
        )
        .await;
    assert_delivered(written, &consumed, false);
}

/// Stops `relay` with SIGTERM and asserts that it exits cleanly.
fn stop(mut relay: Relay) {
    relay.sigterm();
    assert!(
        relay.wait(Duration::from_secs(40)).success(),
        "{}",
        relay.log()
    );
}

/// Runs the relay with `args` and asserts that it stops with an error; returns its log.
fn refused(args: &[String]) -> String {
    let mut relay = Relay::spawn(args);
    let status = relay.wait(START_FAILURE_DEADLINE);
    let log = relay.log();
    assert!(!status.success(), "{args:?} did not stop: {log}");
    log
}

async fn slot_exists(setup: &Setup) -> bool {
    setup.db.confirmed_flush_lsn(&setup.slot).await.is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_restarted_after_its_slot_was_dropped_refuses_to_create_it_until_the_loss_is_accepted(
) {
    let setup = Setup::new("slotloss", &["Order"], 1).await;
    // The least-privileged role, with the default create_slot = true.
    let run = args(&setup, Auth::Scram, "run", &[]);
    let relay = Relay::spawn(&run);
    setup.wait_streaming().await;
    // The relay writes the record just after its walsender took the slot (what wait_streaming
    // sees) and before its session starts: a test run once read it in between.
    wait_for(
        "the slot record once streaming",
        Duration::from_secs(30),
        || async { record(&setup).await.map(|_| ()) },
    )
    .await;

    // Several transactions over a few record intervals; the record never passes the slot.
    let mut written = Vec::new();
    let mut last_before_commit = 0;
    for round in 0..6 {
        let (w, before_commit) = write_events(
            &setup.db.client,
            2,
            2,
            &setup.types,
            3,
            round * 4,
            Duration::from_millis(200),
        )
        .await;
        written.extend(w);
        last_before_commit = *before_commit.last().unwrap();
        assert_record_within_slot(&setup, &format!("while streaming, round {round}")).await;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    }
    assert_arrived(&setup, &written).await;
    wait_for(
        "the slot record to pass the last delivered transaction",
        Duration::from_secs(60),
        || async {
            let lsn = assert_record_within_slot(&setup, "after delivery").await;
            (lsn > last_before_commit).then_some(())
        },
    )
    .await;
    stop(relay);
    let recorded = assert_record_within_slot(&setup, "after the relay stopped").await;
    let (_, confirmed_at, pipeline, system_identifier, timeline, _) = record(&setup).await.unwrap();
    assert_eq!(pipeline, setup.slot, "the record names the pipeline");
    assert!(
        !system_identifier.is_empty() && timeline >= 1,
        "{system_identifier} {timeline}"
    );

    setup.db.drop_slot(&setup.slot).await;
    // Committed while there is no slot: what a re-created slot would never publish.
    write_events(&setup.db.client, 1, 1, &setup.types, 1, 100, Duration::ZERO).await;

    // A lost slot is a permanent source error: exit code 4, which alerts can tell apart.
    let mut relay = Relay::spawn(&run);
    let status = relay.wait(START_FAILURE_DEADLINE);
    assert_eq!(status.code(), Some(4), "{}", relay.log());
    let log = refused(&run);
    for needle in [
        format!(
            "replication slot \"{}\" does not exist, but pipeline",
            setup.slot
        ),
        format!(
            "last confirmed LSN {} at {confirmed_at}",
            format_lsn(recorded)
        ),
        "outbox-relay setup --accept-slot-loss".to_owned(),
    ] {
        assert!(log.contains(&needle), "{needle:?} not in {log}");
    }
    assert!(!slot_exists(&setup).await, "the relay re-created the slot");
    // `status` says so too.
    let log = refused(&args(&setup, Auth::Scram, "status", &[]));
    assert!(
        log.contains(&format!(
            "slot does not exist but the relay streamed from it (last confirmed LSN {}",
            format_lsn(recorded)
        )),
        "{log}"
    );

    // `check` fails on it too, as the start does (it passed: "the relay will create it").
    let log = refused(&args(&setup, Auth::Scram, "check", &[]));
    assert!(
        log.contains("FAIL")
            && log.contains(&format!(
                "but the relay streamed from it (last confirmed LSN {}",
                format_lsn(recorded)
            )),
        "{log}"
    );

    // A record the start cannot read fails `check` too (it passed: read errors were taken
    // for no record, "the relay will create it").
    let corrupt = |timeline: &str| {
        format!(
            "UPDATE outbox_relay.streamed_slots SET timeline = {timeline} WHERE slot_name = '{}'",
            setup.slot
        )
    };
    setup.db.client.batch_execute(&corrupt("-1")).await.unwrap();
    let log = refused(&args(&setup, Auth::Scram, "check", &[]));
    assert!(
        log.contains("FAIL")
            && log.contains("slot record cannot be read")
            && log.contains("invalid timeline"),
        "{log}"
    );
    setup
        .db
        .client
        .batch_execute(&corrupt(&timeline.to_string()))
        .await
        .unwrap();

    // `setup` without the acknowledgement refuses too.
    let log = refused(&args(&setup, Auth::Scram, "setup", &[]));
    assert!(log.contains("--accept-slot-loss"), "{log}");
    assert!(!slot_exists(&setup).await, "setup re-created the slot");

    let mut accept = Relay::spawn(&args(&setup, Auth::Scram, "setup", &["--accept-slot-loss"]));
    assert!(
        accept.wait(START_FAILURE_DEADLINE).success(),
        "{}",
        accept.log()
    );
    assert!(
        slot_exists(&setup).await,
        "setup --accept-slot-loss created no slot"
    );
    assert!(record(&setup).await.is_none(), "the record was not cleared");

    let relay = Relay::spawn(&run);
    setup.wait_streaming().await;
    let (after, _) =
        write_events(&setup.db.client, 1, 2, &setup.types, 1, 200, Duration::ZERO).await;
    // The topic holds the first events too; the one committed without a slot is not there.
    written.extend(after);
    assert_arrived(&setup, &written).await;
    assert!(
        record(&setup).await.is_some(),
        "the new slot is not recorded"
    );
    stop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_creates_the_record_table_and_the_slot_and_a_record_of_another_system_still_refuses(
) {
    let setup = Setup::new("slotfirst", &["Order"], 1).await;
    setup
        .db
        .client
        .batch_execute("DROP SCHEMA outbox_relay CASCADE")
        .await
        .unwrap();

    // A role without CREATE on the database: a clear error, no slot.
    let log = refused(&args(&setup, Auth::Scram, "run", &[]));
    for needle in [
        "cannot create the slot record \"outbox_relay\".\"streamed_slots\"",
        "GRANT CREATE ON DATABASE",
        "sql/slot_record.sql",
        "slot_record = false",
    ] {
        assert!(log.contains(needle), "{needle:?} not in {log}");
    }
    assert!(!slot_exists(&setup).await, "a slot without its record");

    // A role that may create it: the relay creates the table and, on a first start, the slot.
    let run = args(&setup, Auth::Trust, "run", &[]);
    let relay = Relay::spawn(&run);
    setup.wait_streaming().await;
    assert!(slot_exists(&setup).await);
    let (written, _) =
        write_events(&setup.db.client, 1, 2, &setup.types, 1, 0, Duration::ZERO).await;
    assert_arrived(&setup, &written).await;
    stop(relay);
    let (_, _, _, system_identifier, _, _) = record(&setup).await.expect("no record");

    // The record says another system (a database restored elsewhere): reported, not trusted.
    setup
        .db
        .client
        .execute(
            "UPDATE outbox_relay.streamed_slots SET system_identifier = '12345' WHERE slot_name = $1",
            &[&setup.slot],
        )
        .await
        .unwrap();
    setup.db.drop_slot(&setup.slot).await;
    let log = refused(&run);
    assert!(
        log.contains(&format!(
            "another database system (this server's system identifier is {system_identifier})"
        )),
        "{log}"
    );
    assert!(!slot_exists(&setup).await, "the relay re-created the slot");

    // Turned off, the record does not stop it (the operator chose so).
    let unrecorded = Relay::spawn(&args(&setup, Auth::Trust, "run", &["--no-slot-record"]));
    setup.wait_streaming().await;
    stop(unrecorded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_in_another_schema_is_written_there_and_still_refuses_a_dropped_slot() {
    let setup = Setup::new("slotschema", &["Order"], 1).await;
    let run = args(
        &setup,
        Auth::Trust,
        "run",
        &["--slot-record-schema", "relay_meta"],
    );
    let relay = Relay::spawn(&run);
    setup.wait_streaming().await;
    let (written, _) =
        write_events(&setup.db.client, 1, 2, &setup.types, 1, 0, Duration::ZERO).await;
    assert_arrived(&setup, &written).await;
    let in_schema = |schema: &'static str| {
        let (client, slot) = (&setup.db.client, setup.slot.clone());
        async move {
            client
                .query_opt(
                    &format!("SELECT pipeline FROM {schema}.streamed_slots WHERE slot_name = $1"),
                    &[&slot],
                )
                .await
                .unwrap_or_else(|e| panic!("reading {schema}.streamed_slots: {e}"))
                .map(|row| row.get::<_, String>(0))
        }
    };
    let pipeline = wait_for(
        "the slot record in relay_meta.streamed_slots",
        Duration::from_secs(30),
        || in_schema("relay_meta"),
    )
    .await;
    assert_eq!(pipeline, setup.slot);
    // Setup::new made the default schema's table (sql/slot_record.sql); the relay left it alone.
    assert_eq!(in_schema("outbox_relay").await, None);
    stop(relay);

    setup.db.drop_slot(&setup.slot).await;
    let log = refused(&run);
    assert!(
        log.contains(&format!(
            "replication slot \"{}\" does not exist, but pipeline",
            setup.slot
        )),
        "{log}"
    );
    assert!(!slot_exists(&setup).await, "the relay re-created the slot");
}

/// `check` fails on a slot record the start cannot write or create, with the grants it needs:
/// it said nothing (the slot existed) or "the relay will create it", and the start stopped.
/// Found by review.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_fails_on_a_slot_record_the_relay_cannot_write_or_create() {
    let setup = Setup::new("grants", &["Order"], 1).await;
    setup.db.create_slot(&setup.slot).await;
    let check = args(&setup, Auth::Scram, "check", &[]);
    let record_line = |log: &str| {
        log.lines()
            .find(|l| l.contains("slot record"))
            .unwrap_or_else(|| panic!("no slot record line:\n{log}"))
            .to_owned()
    };
    let mut relay = Relay::spawn(&check);
    relay.wait(START_FAILURE_DEADLINE);
    let line = record_line(&relay.log());
    assert!(line.contains("ok") && line.contains("writable"), "{line}");

    let sql = |statements: &'static str| setup.db.client.batch_execute(statements);
    // Column grants, as the start needs them, are enough (the writes are EXPLAINed).
    sql("REVOKE INSERT, UPDATE ON outbox_relay.streamed_slots FROM relay_scram;
         GRANT INSERT (slot_name, pipeline, system_identifier, timeline, confirmed_lsn, confirmed_at, first_streamed_at),
               UPDATE (pipeline, system_identifier, timeline, confirmed_lsn, confirmed_at)
           ON outbox_relay.streamed_slots TO relay_scram")
    .await
    .unwrap();
    let mut relay = Relay::spawn(&check);
    relay.wait(START_FAILURE_DEADLINE);
    let line = record_line(&relay.log());
    assert!(line.contains("ok") && line.contains("writable"), "{line}");

    sql("REVOKE INSERT ON outbox_relay.streamed_slots FROM relay_scram")
        .await
        .unwrap();
    let line = record_line(&refused(&check));
    assert!(
        line.contains("FAIL") && line.contains("cannot write") && line.contains("sql/roles.sql"),
        "{line}"
    );
    // The start stops on it too.
    let log = refused(&args(&setup, Auth::Scram, "run", &[]));
    assert!(log.contains("cannot write the slot record"), "{log}");

    // A role without USAGE on the schema (the query finding the table failed, naming no
    // grant); the test roles have it through pg_read_all_data.
    let role = format!("{}_nousage", setup.db.name);
    setup
        .db
        .client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN REPLICATION; GRANT SELECT ON public.outbox TO {role}"
        ))
        .await
        .unwrap();
    let mut without_usage = check.clone();
    let at = without_usage
        .iter()
        .position(|a| a == "--source-url")
        .unwrap()
        + 1;
    without_usage[at] = format!(
        "postgres://{role}@127.0.0.1:{}/{}",
        setup.db.port(),
        setup.db.name
    );
    let line = record_line(&refused(&without_usage));
    assert!(
        line.contains("FAIL")
            && line.contains("may not use schema")
            && line.contains("USAGE ON SCHEMA"),
        "{line}"
    );
    setup
        .db
        .client
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await
        .unwrap();

    // No table, in a schema the role may not create in: CREATE on that schema is the grant.
    sql("DROP TABLE outbox_relay.streamed_slots").await.unwrap();
    let line = record_line(&refused(&check));
    assert!(
        line.contains("FAIL") && line.contains("GRANT CREATE ON SCHEMA \"outbox_relay\""),
        "{line}"
    );
}
