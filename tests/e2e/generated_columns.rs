//! An outbox whose aggregate type (the routing) and aggregate id (the key) are stored
//! generated columns: published on PostgreSQL 18 with `publish_generated_columns = stored`,
//! never before 18. Where the publication leaves them out, `check` names the column and the
//! publication and the relay refuses to stream, instead of meeting the first event without
//! them.

use std::time::Duration;

use crate::as_command;
use crate::failover_slots::run_command;
use crate::standby::assert_relay_stops_naming;
use crate::support::{kafka, pg::pg_major, within, Auth, Relay, QUERY_DEADLINE};
use crate::{assert_delivered, Setup, Written};

/// The outbox table `gen_outbox`, whose `aggregate_type` and `aggregate_id` are generated
/// from `ref` (`<type>/<id>`), in publication `gen_pub` without `publish_generated_columns`.
const TABLE: &str = "CREATE TABLE gen_outbox (
    id             uuid  PRIMARY KEY DEFAULT gen_random_uuid(),
    ref            text  NOT NULL,
    aggregate_type text  GENERATED ALWAYS AS (split_part(ref, '/', 1)) STORED,
    aggregate_id   text  GENERATED ALWAYS AS (split_part(ref, '/', 2)) STORED,
    event_type     text  NOT NULL,
    payload        jsonb,
    headers        jsonb NOT NULL DEFAULT '{}'
);
CREATE PUBLICATION gen_pub FOR TABLE gen_outbox WITH (publish = 'insert')";

/// `run` arguments for the relay on `gen_outbox` and `gen_pub`.
fn relay_args(setup: &Setup) -> Vec<String> {
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    for (flag, value) in [
        ("--publication", "gen_pub"),
        ("--table", "public.gen_outbox"),
    ] {
        let at = args.iter().position(|a| a == flag).unwrap() + 1;
        args[at] = value.into();
    }
    args
}

/// Inserts event `n` of aggregate `<type>/key-<n % 2>`; returns it as generated.
async fn insert(setup: &Setup, n: usize) -> Written {
    let reference = format!("{}/key-{}", setup.types[0], n % 2);
    let payload = format!(r#"{{"n": {n}}}"#);
    let row = within(
        "INSERT into gen_outbox",
        QUERY_DEADLINE,
        setup.db.client.query_one(
            "INSERT INTO gen_outbox (ref, event_type, payload) VALUES ($1, 'Generated', $2::text::jsonb)
             RETURNING id::text, aggregate_type, aggregate_id, payload::text",
            &[&reference, &payload],
        ),
    )
    .await
    .unwrap();
    Written {
        id: row.get(0),
        aggregate_type: row.get(1),
        aggregate_id: row.get(2),
        event_type: "Generated".into(),
        payload: row.get(3),
    }
}

/// `check` fails naming `parts`, and a relay on a slot with an event waiting stops with an
/// error naming them too.
async fn refused(setup: &Setup, parts: &[&str]) {
    let args = relay_args(setup);
    let (ok, log) = run_command(&as_command(&args, "check"));
    assert!(!ok, "check passed unpublished generated columns:\n{log}");
    let line = log
        .lines()
        .find(|l| l.contains("published columns"))
        .unwrap_or_else(|| panic!("check has no published columns line:\n{log}"));
    assert!(line.starts_with("  FAIL"), "{line}");
    for part in parts {
        assert!(line.contains(part), "{part:?} missing in check's {line}");
    }

    setup.db.create_slot(&setup.slot).await;
    insert(setup, 0).await;
    assert_relay_stops_naming(&args, parts);
    setup.db.drop_slot(&setup.slot).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_routing_and_key_columns_work_on_18_once_published() {
    let setup = Setup::new_on(pg_major(18), "gencols", &["Gen"], 1).await;
    setup.db.client.batch_execute(TABLE).await.unwrap();
    refused(
        &setup,
        &[
            "\"aggregate_type\" (columns.aggregate_type)",
            "\"aggregate_id\" (columns.aggregate_id)",
            "generated column",
            "\"gen_pub\"",
            "publish_generated_columns = stored",
        ],
    )
    .await;

    setup
        .db
        .client
        .batch_execute("ALTER PUBLICATION gen_pub SET (publish_generated_columns = stored)")
        .await
        .unwrap();
    let args = relay_args(&setup);
    let (ok, log) = run_command(&as_command(&args, "check"));
    let line = log
        .lines()
        .find(|l| l.contains("published columns"))
        .unwrap_or_default();
    assert!(
        line.starts_with("  ok"),
        "check's published columns: {line}\n{log}"
    );
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let mut written = Vec::new();
    for n in 1..=6 {
        written.push(insert(&setup, n).await);
    }
    let consumed = setup
        .consume_all(written.len(), Duration::ZERO, Duration::from_secs(60))
        .await;
    assert_delivered(&written, &consumed, false);
    assert!(ok, "check failed once the columns are published:\n{log}");
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_routing_columns_are_refused_before_18() {
    let setup = Setup::new_on(pg_major(16), "gencols16", &["Gen"], 1).await;
    setup.db.client.batch_execute(TABLE).await.unwrap();
    refused(
        &setup,
        &[
            "\"aggregate_type\" (columns.aggregate_type)",
            "PostgreSQL 16.2 never publishes generated columns",
        ],
    )
    .await;
}
