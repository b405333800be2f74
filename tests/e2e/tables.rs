use std::path::Path;
use std::time::Duration;

use crate::support::{consume, kafka, wait_for, Auth, Relay};
use crate::{assert_delivered, insert, insert_lsn, run_with_config, Setup, Written};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_event_function_and_debezium_named_columns() {
    let setup = Setup::new("sqlkit", &["Order", "Payment"], 1).await;
    let sql = |file: &str| {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("sql").join(file))
            .unwrap()
    };
    setup
        .db
        .client
        .batch_execute(&sql("publish_event.sql"))
        .await
        .unwrap();
    setup
        .db
        .client
        .batch_execute(&sql("outbox_debezium.sql"))
        .await
        .unwrap();
    let (t, t2) = (setup.types[0].clone(), setup.types[1].clone());

    let relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    // Debezium's column names, through a config file.
    let (_dir, args) = run_with_config(&format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[[pipelines]]\nname = \"debezium\"\nsource_url = \"{}\"\nslot = \"{}_dbz\"\npublication = \"outboxevent_pub\"\ntable = \"public.outboxevent\"\n[pipelines.columns]\naggregate_type = \"aggregatetype\"\naggregate_id = \"aggregateid\"\nevent_type = \"type\"\n",
        kafka().bootstrap(),
        setup.db.url(Auth::Trust),
        setup.slot
    ));
    let debezium = Relay::spawn(&args);
    setup.wait_streaming().await;
    wait_for(
        "the Debezium-named pipeline to stream",
        Duration::from_secs(60),
        || async {
            setup
                .db
                .slot_active_pid(&format!("{}_dbz", setup.slot))
                .await
        },
    )
    .await;

    let c = &setup.db.client;
    c.batch_execute("BEGIN").await.unwrap();
    let kept: String = c
        .query_one(
            "SELECT publish_event($1, 'k', 'Kept', '{\"n\": 1}')::text",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    let dropped: String = c
        .query_one(
            "SELECT publish_event($1, 'k', 'Dropped', '{\"n\": 2}', keep => false)::text",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    c.batch_execute("COMMIT").await.unwrap();
    let dbz_id: String = c
        .query_one(
            "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), $1, 'k', 'FromDebeziumTable', '{\"n\": 3}') RETURNING id::text",
            &[&t2],
        )
        .await
        .unwrap()
        .get(0);
    let remaining: i64 = c
        .query_one("SELECT count(*) FROM outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(remaining, 1, "keep => false deletes the row");

    let written = [
        Written {
            id: kept,
            aggregate_type: t.clone(),
            aggregate_id: "k".into(),
            event_type: "Kept".into(),
            payload: r#"{"n": 1}"#.into(),
        },
        Written {
            id: dropped,
            aggregate_type: t.clone(),
            aggregate_id: "k".into(),
            event_type: "Dropped".into(),
            payload: r#"{"n": 2}"#.into(),
        },
    ];
    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        2,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &consumed, true);
    let from_debezium_table = Written {
        id: dbz_id,
        aggregate_type: t2.clone(),
        aggregate_id: "k".into(),
        event_type: "FromDebeziumTable".into(),
        payload: r#"{"n": 3}"#.into(),
    };
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[1].as_str()],
        1,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&[from_debezium_table], &consumed, true);
    drop((relay, debezium));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_and_deletes_of_outbox_rows_are_passed_over_or_halt_as_configured() {
    let setup = Setup::new("invalidop", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let c = &setup.db.client;
    c.batch_execute("ALTER PUBLICATION outbox_pub SET (publish = 'insert, update, delete'); ALTER TABLE outbox REPLICA IDENTITY FULL")
        .await
        .unwrap();
    let mut relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    setup.wait_streaming().await;

    c.batch_execute("BEGIN").await.unwrap();
    let a = insert(c, &t, "k", r#"{"e": "a"}"#).await;
    c.execute("DELETE FROM outbox WHERE id = $1::text::uuid", &[&a.id])
        .await
        .unwrap();
    let b = insert(c, &t, "k", r#"{"e": "b"}"#).await;
    c.execute(
        "UPDATE outbox SET event_type = 'Changed' WHERE id = $1::text::uuid",
        &[&b.id],
    )
    .await
    .unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    let topics = setup.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        2,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&[a, b], &consumed, true);
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());

    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.extend(["--op-invalid-behavior", "error"].map(String::from));
    let mut strict = Relay::spawn(&args);
    setup.wait_streaming().await;
    let witness = setup.witness().await;
    c.batch_execute("BEGIN").await.unwrap();
    let d = insert(c, &t, "k", r#"{"e": "d"}"#).await;
    c.execute(
        "UPDATE outbox SET event_type = 'Changed' WHERE id = $1::text::uuid",
        &[&d.id],
    )
    .await
    .unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    let commit_end = setup.commit_end_of(&witness, &d.id).await;
    assert!(
        !strict.wait(Duration::from_secs(30)).success(),
        "op_invalid_behavior = error must stop the relay"
    );
    assert!(
        strict.log().contains("update of an outbox row"),
        "{}",
        strict.log()
    );
    assert!(
        setup.confirmed_flush().await < commit_end,
        "confirmed the transaction with the update"
    );
}

/// `args` with the value after `flag` replaced by `value`.
fn with_arg(mut args: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} not in {args:?}"));
    args[at + 1] = value.to_owned();
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoted_mixed_case_names_and_look_alike_tables_in_one_publication() {
    let setup = Setup::new("quoted", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let c = &setup.db.client;
    // The configured table and four look-alikes with the same columns.
    let look_alikes = [
        r#""Billing-Prod".outbox"#,
        r#""billing-prod"."Outbox""#,
        r#""billing-prod".outbox"#,
        "public.outbox",
    ];
    c.batch_execute(
        r#"CREATE SCHEMA "Billing-Prod";
           CREATE SCHEMA "billing-prod";
           CREATE TABLE "Billing-Prod"."Outbox" (LIKE public.outbox INCLUDING ALL);
           CREATE TABLE "Billing-Prod".outbox (LIKE public.outbox INCLUDING ALL);
           CREATE TABLE "billing-prod"."Outbox" (LIKE public.outbox INCLUDING ALL);
           CREATE TABLE "billing-prod".outbox (LIKE public.outbox INCLUDING ALL);"#,
    )
    .await
    .unwrap();
    let table = r#""Billing-Prod"."Outbox""#;
    let flags = |command: &str| {
        let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
        args = crate::as_command(&args, command);
        let args = with_arg(args, "--publication", "Outbox-Pub");
        with_arg(args, "--table", table)
    };

    let mut print = flags("setup");
    print.push("--print-sql".into());
    let mut printer = Relay::spawn(&print);
    assert!(
        printer.wait(Duration::from_secs(30)).success(),
        "{}",
        printer.log()
    );
    assert!(
        printer.log().contains(
            r#"CREATE PUBLICATION "Outbox-Pub" FOR TABLE "Billing-Prod"."Outbox" WITH (publish = 'insert');"#
        ),
        "{}",
        printer.log()
    );
    let mut creator = Relay::spawn(&flags("setup"));
    assert!(
        creator.wait(Duration::from_secs(60)).success(),
        "{}",
        creator.log()
    );
    c.batch_execute(&format!(
        r#"ALTER PUBLICATION "Outbox-Pub" ADD TABLE {}"#,
        look_alikes.join(", ")
    ))
    .await
    .unwrap();
    let tables: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'Outbox-Pub'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 5, "setup published the configured table");
    let mut check = Relay::spawn(&flags("check"));
    assert!(
        check.wait(Duration::from_secs(60)).success(),
        "{}",
        check.log()
    );
    for needle in [
        "ok    outbox table            \"Billing-Prod\".\"Outbox\" readable",
        "ok    publication             Outbox-Pub publishes inserts of \"Billing-Prod\".\"Outbox\"",
        "ok    outbox columns          every mapped column exists",
    ] {
        assert!(
            check.log().contains(needle),
            "{needle:?} missing:\n{}",
            check.log()
        );
    }

    // The file form of the same names.
    let (_dir, args) = run_with_config(&format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[[pipelines]]\nname = \"quoted\"\nsource_url = \"{}\"\nslot = \"{}\"\npublication = \"Outbox-Pub\"\ntable = '{table}'\ncreate_slot = false\n",
        kafka().bootstrap(),
        setup.db.url(Auth::Trust),
        setup.slot
    ));
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    let mut written = Vec::new();
    let mut before_commit = 0;
    for round in 0..2 {
        c.batch_execute("BEGIN").await.unwrap();
        for target in std::iter::once(table).chain(look_alikes) {
            let row = c
                .query_one(
                    &format!(
                        "INSERT INTO {target} (aggregate_type, aggregate_id, event_type, payload)
                         VALUES ($1, 'k', $2, '{{\"round\": {round}}}') RETURNING id::text, payload::text"
                    ),
                    &[&t, &target],
                )
                .await
                .unwrap();
            if target == table {
                written.push(Written {
                    id: row.get(0),
                    aggregate_type: t.clone(),
                    aggregate_id: "k".into(),
                    event_type: target.to_owned(),
                    payload: row.get(1),
                });
            }
        }
        before_commit = insert_lsn(c).await;
        c.batch_execute("COMMIT").await.unwrap();
    }
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(3),
            Duration::from_secs(60),
        )
        .await;
    // Any record of a look-alike table would have an id not in `written`.
    assert_delivered(&written, &consumed, true);
    setup
        .wait_confirmed_past(
            before_commit,
            "the look-alikes' rows to be confirmed",
            Duration::from_secs(30),
        )
        .await;
    drop(relay);
}

/// Inserts one outbox row naming the event type column `event_type_column` and giving
/// `payload_sql` (an SQL expression) as the payload; returns what was written.
async fn insert_with(
    client: &tokio_postgres::Client,
    event_type_column: &str,
    aggregate_type: &str,
    event_type: &str,
    payload_sql: &str,
) -> Written {
    let row = client
        .query_one(
            &format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, {event_type_column}, payload)
                 VALUES ($1, 'k-1', $2, {payload_sql}) RETURNING id::text, payload::text"
            ),
            &[&aggregate_type, &event_type],
        )
        .await
        .unwrap_or_else(|e| panic!("inserting {event_type}: {e}"));
    Written {
        id: row.get(0),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: "k-1".to_owned(),
        event_type: event_type.to_owned(),
        payload: row.get(1),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alter_table_mid_stream_and_a_renamed_column_halts_until_it_is_mapped() {
    let setup = Setup::new("altertable", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let c = &setup.db.client;
    // A column before the mapped ones, so that dropping it moves all of them.
    c.batch_execute(
        "DROP TABLE outbox;
         CREATE TABLE outbox (
           id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
           legacy text,
           aggregate_type text NOT NULL,
           aggregate_id text NOT NULL,
           event_type text NOT NULL,
           payload jsonb,
           headers jsonb NOT NULL DEFAULT '{}');
         ALTER PUBLICATION outbox_pub ADD TABLE outbox;",
    )
    .await
    .unwrap();
    let mut relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    setup.wait_streaming().await;

    let mut written = vec![insert_with(c, "event_type", &t, "Before", r#"'{"n": 1}'"#).await];
    c.batch_execute("ALTER TABLE outbox ADD COLUMN tenant text DEFAULT 'x'")
        .await
        .unwrap();
    written.push(insert_with(c, "event_type", &t, "AfterAdd", r#"'{"n": 2}'"#).await);
    // A schema change inside a transaction, between two of its inserts.
    c.batch_execute("BEGIN").await.unwrap();
    written.push(insert_with(c, "event_type", &t, "InTxnBefore", r#"'{"n": 3}'"#).await);
    c.batch_execute("ALTER TABLE outbox ADD COLUMN note text NOT NULL DEFAULT 'n'")
        .await
        .unwrap();
    written.push(insert_with(c, "event_type", &t, "InTxnAfter", r#"'{"n": 4}'"#).await);
    c.batch_execute("COMMIT").await.unwrap();
    c.batch_execute("ALTER TABLE outbox DROP COLUMN tenant; ALTER TABLE outbox DROP COLUMN legacy")
        .await
        .unwrap();
    written.push(insert_with(c, "event_type", &t, "AfterDrop", r#"'{"n": 5}'"#).await);
    c.batch_execute("ALTER TABLE outbox ALTER COLUMN aggregate_id TYPE varchar(64)")
        .await
        .unwrap();
    written.push(insert_with(c, "event_type", &t, "Varchar", r#"'{"n": 6}'"#).await);
    c.batch_execute("ALTER TABLE outbox ALTER COLUMN payload TYPE json USING payload::json")
        .await
        .unwrap();
    // json keeps the text as inserted: spacing, key order and duplicate keys.
    let exact = r#"{ "b":1,  "a":2, "a":3 ,"n": 7.50 }"#;
    let json = insert_with(c, "event_type", &t, "Json", &format!("'{exact}'")).await;
    assert_eq!(json.payload, exact);
    written.push(json);
    c.batch_execute("BEGIN").await.unwrap();
    written.push(insert_with(c, "event_type", &t, "JsonArray", r#"'[1, 2.50 ,"x"]'"#).await);
    let before_last_commit = insert_lsn(c).await;
    c.batch_execute("COMMIT").await.unwrap();
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
        .await;
    assert_delivered(&written, &consumed, true);
    setup
        .wait_confirmed_past(
            before_last_commit,
            "the events before the rename to be confirmed",
            Duration::from_secs(30),
        )
        .await;

    // Renamed away: the relay stops naming the column, without confirming the row.
    c.batch_execute("ALTER TABLE outbox RENAME COLUMN event_type TO kind")
        .await
        .unwrap();
    let witness = setup.witness().await;
    c.batch_execute("BEGIN").await.unwrap();
    let renamed = insert_with(c, "kind", &t, "Renamed", r#"'{"n": 9}'"#).await;
    c.batch_execute("COMMIT").await.unwrap();
    let renamed_commit_end = setup.commit_end_of(&witness, &renamed.id).await;
    let status = relay.wait(Duration::from_secs(30));
    assert!(!status.success(), "the relay went on without event_type");
    let log = relay.log();
    for needle in [
        r#"has no column "event_type" (columns.event_type)"#,
        "aggregate_id, kind, payload",
        &format!("(event id {})", renamed.id),
    ] {
        assert!(
            log.contains(needle),
            "the error names the column, the table's columns and the row ({needle:?}):\n{log}"
        );
    }
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed < renamed_commit_end,
        "confirmed_flush_lsn {confirmed:X} reached the commit of the row the relay could not map (ends at {renamed_commit_end:X})"
    );
    let mut check_args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    check_args = crate::as_command(&check_args, "check");
    let mut check = Relay::spawn(&check_args);
    assert!(
        !check.wait(Duration::from_secs(60)).success(),
        "check passed without event_type:\n{}",
        check.log()
    );
    assert!(
        check
            .log()
            .contains(r#"FAIL  outbox columns          missing "event_type" (columns.event_type)"#),
        "{}",
        check.log()
    );

    // Mapped to the new name, a restarted relay publishes it.
    let (_dir, args) = run_with_config(&format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[[pipelines]]\nname = \"renamed\"\nsource_url = \"{}\"\nslot = \"{}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\ncreate_slot = false\n[pipelines.columns]\nevent_type = \"kind\"\n",
        kafka().bootstrap(),
        setup.db.url(Auth::Trust),
        setup.slot
    ));
    let mut relay = Relay::spawn(&args);
    written.push(renamed);
    written.push(insert_with(c, "kind", &t, "AfterRestart", r#"'{"n": 10}'"#).await);
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
        .await;
    assert_delivered(&written, &consumed, true);

    // The outbox renamed under the running relay: its inserts stop it, they are not passed
    // over; a restart refuses the missing table.
    c.batch_execute("ALTER TABLE outbox RENAME TO outbox_moved")
        .await
        .unwrap();
    let witness = setup.witness().await;
    c.batch_execute("BEGIN").await.unwrap();
    let moved: String = c
        .query_one(
            "INSERT INTO outbox_moved (aggregate_type, aggregate_id, kind, payload) VALUES ($1, 'k-1', 'Moved', '{}') RETURNING id::text",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    c.batch_execute("COMMIT").await.unwrap();
    let moved_commit_end = setup.commit_end_of(&witness, &moved).await;
    assert!(
        !relay.wait(Duration::from_secs(30)).success(),
        "the relay passed over an insert into the renamed outbox ({moved})"
    );
    assert!(
        relay.log().contains(&format!(
            "(event id {moved}) into public.outbox_moved, which was the outbox table public.outbox"
        )),
        "{}",
        relay.log()
    );
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed < moved_commit_end,
        "confirmed_flush_lsn {confirmed:X} reached the commit of the insert into the renamed outbox (ends at {moved_commit_end:X})"
    );
    let mut restarted = Relay::spawn(&args);
    assert!(!restarted.wait(Duration::from_secs(30)).success());
    assert!(
        restarted
            .log()
            .contains("table public.outbox does not exist in this database"),
        "{}",
        restarted.log()
    );
}

/// The outbox table dropped from the publication, or `insert` left out of `publish`, while
/// the relay streams: PostgreSQL decodes none of the table's inserts from then on and says
/// nothing, so the relay's publication checks find it and stop the pipeline, naming the change,
/// before the slot is confirmed past the first insert left out. (Idle progress confirmed past
/// it within 20 s, nothing was published and the relay went on "streaming".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_change_that_leaves_out_the_outbox_stops_the_relay_before_it_confirms_past_it(
) {
    for (name, change) in [
        (
            "drift_drop",
            "ALTER PUBLICATION outbox_pub DROP TABLE outbox",
        ),
        (
            "drift_publish",
            "ALTER PUBLICATION outbox_pub SET (publish = 'update, delete')",
        ),
    ] {
        let setup = Setup::new(name, &["Order"], 1).await;
        let t = setup.types[0].clone();
        let c = &setup.db.client;
        let mut relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
        setup.wait_streaming().await;
        let before = insert(c, &t, "k", r#"{"n": 1}"#).await;
        let topics = setup.topics();
        let consumed = consume(
            &kafka().bootstrap(),
            &[topics[0].as_str()],
            1,
            Duration::ZERO,
            Duration::from_secs(60),
        )
        .await;
        assert_delivered(&[before], &consumed, true);

        c.batch_execute(change).await.unwrap();
        let witness = setup.witness().await;
        // With `publish = 'update, delete'`, the documented pattern of a row deleted in its own
        // transaction: the walsender sends that transaction, with the delete only, and its
        // commit must not be confirmed either.
        let delete_too = name == "drift_publish";
        if delete_too {
            c.batch_execute("BEGIN").await.unwrap();
        }
        let left_out = insert(c, &t, "k", r#"{"n": 2}"#).await;
        if delete_too {
            c.execute(
                "DELETE FROM outbox WHERE id = $1::text::uuid",
                &[&left_out.id],
            )
            .await
            .unwrap();
            c.batch_execute("COMMIT").await.unwrap();
        }
        let left_out_commit = setup.commit_end_of(&witness, &left_out.id).await;
        // More WAL, of another table, for keepalives to carry idle progress past the insert.
        c.batch_execute(
            "CREATE TABLE other_wal (n int); INSERT INTO other_wal SELECT generate_series(1, 1000)",
        )
        .await
        .unwrap();
        let status = relay.wait(Duration::from_secs(60));
        assert!(
            !status.success(),
            "{change}: the relay exited with {status}"
        );
        let log = relay.log();
        assert!(
            log.contains("the publication changed while streaming"),
            "{change}:\n{}",
            crate::support::tail_lines(&log, 20)
        );
        // Whether PostgreSQL left the insert out (a table dropped from the publication always
        // does): what was not published is not confirmed.
        let consumed = consume(
            &kafka().bootstrap(),
            &[topics[0].as_str()],
            1,
            Duration::from_secs(3),
            Duration::from_secs(30),
        )
        .await;
        let published = consumed
            .iter()
            .any(|r| r.header_str("id").as_deref() == Some(left_out.id.as_str()));
        assert!(
            !published || name == "drift_publish",
            "{change}: the insert was published: {consumed:?}\n{}",
            crate::support::tail_lines(&log, 30)
        );
        let confirmed = setup.confirmed_flush().await;
        assert!(
            published || confirmed < left_out_commit,
            "{change}: confirmed_flush_lsn {confirmed:X} passed the insert left out ({left_out_commit:X})\n{}",
            crate::support::tail_lines(&log, 30)
        );
    }
}
