//! `outbox-relay teardown`: a pipeline's slot, slot record row and publication removed once
//! it is out of service, never while a relay streams from its slot, and never unconfirmed.

use std::time::Duration;

use crate::as_command;
use crate::failover_slots::run_command;
use crate::support::{kafka, Auth, Relay};
use crate::Setup;

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
