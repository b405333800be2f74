use std::time::Duration;

use super::{assert_delivered, payload, write_events, Setup};
use crate::support::{self, http_get, kafka, metric_sum, pg, wait_for, within, Auth, Relay};
use crate::{insert, Written};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_two_pollers_publish_ten_thousand_events_once_in_key_order() {
    let setup = Setup::new("poll_two", &["Order", "customer", "PAYMENT"], 3).await;
    let listen = [
        format!("127.0.0.1:{}", support::free_port()),
        format!("127.0.0.1:{}", support::free_port()),
    ];
    let polling = "batch_size = 200\nnotify_channel = \"outbox_relay\"";
    let relays: Vec<Relay> = ["poller_a", "poller_b"]
        .iter()
        .zip(&listen)
        .map(|(name, addr)| {
            Relay::spawn(&setup.relay_args(name, &kafka().bootstrap(), polling, "", Some(addr)))
        })
        .collect();
    let started = std::time::Instant::now();
    let written = write_events(&setup.db.client, 1_000, 10, &setup.types, 25).await;
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(3),
            Duration::from_secs(180),
        )
        .await;
    eprintln!(
        "10,000 events written and consumed through two pollers in {:?}",
        started.elapsed()
    );
    assert_eq!(assert_delivered(&written, &consumed, 1), 0, "no duplicates");
    assert_eq!(consumed.len(), written.len());
    wait_for(
        "every row to be marked PUBLISHED",
        Duration::from_secs(30),
        || async {
            let statuses = setup.statuses().await;
            (statuses.get("PUBLISHED") == Some(&10_000) && statuses.len() == 1).then_some(())
        },
    )
    .await;
    let unset: i64 = setup
        .db
        .query_one_value("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        .await;
    assert_eq!(unset, 0, "published_at is set on every published row");
    // Both pollers took part: the order check did not serialise everything onto one.
    let mut per_poller = Vec::new();
    for addr in &listen {
        let text = http_get(addr, "/metrics")
            .await
            .map(|(_, body)| body)
            .expect("metrics endpoint answers");
        let published = metric_sum(&text, "outbox_relay_events_published_total").unwrap_or(0.0);
        assert!(
            metric_sum(&text, "outbox_relay_pending_rows").is_some(),
            "{text}"
        );
        per_poller.push(published);
    }
    eprintln!("published per poller: {per_poller:?}");
    assert!(
        per_poller.iter().all(|n| *n > 0.0),
        "both pollers published: {per_poller:?}"
    );
    assert_eq!(per_poller.iter().sum::<f64>(), 10_000.0);
    drop(relays);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_flag_and_delete_modes_mark_rows_and_check_reports_what_is_missing() {
    let setup = Setup::new("poll_modes", &["Order"], 2).await;
    let t = setup.types[0].clone();
    let client = &setup.db.client;
    client
        .batch_execute(
            "CREATE TABLE outbox_flag (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
               aggregate_id text, event_type text, payload jsonb, created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
               published boolean NOT NULL DEFAULT false);
             CREATE TABLE outbox_delete (LIKE outbox_flag INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
             ALTER TABLE outbox_delete DROP COLUMN published, ADD PRIMARY KEY (id);",
        )
        .await
        .unwrap();
    let mut written = Vec::new();
    for (table, n) in [("outbox_flag", 0), ("outbox_delete", 1)] {
        for i in 0..5 {
            let row = client
                .query_one(
                    &format!("INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, 'E', $3::text::jsonb) RETURNING id::text, payload::text"),
                    &[&t, &format!("k{n}"), &payload(i)],
                )
                .await
                .unwrap();
            written.push(Written {
                id: row.get(0),
                aggregate_type: t.clone(),
                aggregate_id: format!("k{n}"),
                event_type: "E".into(),
                payload: row.get(1),
            });
        }
    }
    let bootstrap = kafka().bootstrap();
    let flag = Relay::spawn(&setup.relay_args_for(
        "public.outbox_flag",
        "flag",
        &bootstrap,
        "mark = \"flag\"",
        "",
        None,
    ));
    let delete = Relay::spawn(&setup.relay_args_for(
        "public.outbox_delete",
        "delete",
        &bootstrap,
        "mark = \"delete\"",
        "",
        None,
    ));
    let consumed = setup
        .consume_all(10, Duration::from_secs(2), Duration::from_secs(60))
        .await;
    assert_eq!(assert_delivered(&written, &consumed, 1), 0);
    wait_for("rows to be marked", Duration::from_secs(30), || async {
        let flagged: i64 = setup
            .db
            .query_one_value("SELECT count(*) FROM outbox_flag WHERE published")
            .await;
        let left: i64 = setup
            .db
            .query_one_value("SELECT count(*) FROM outbox_delete")
            .await;
        (flagged == 5 && left == 0).then_some(())
    })
    .await;
    drop((flag, delete));

    // check: a table without the status columns, and a role that may not mark rows.
    let check = |args: Vec<String>| async move {
        let mut args = args;
        args = crate::as_command(&args, "check");
        let mut relay = Relay::spawn(&args);
        let status = relay.wait(Duration::from_secs(60));
        (status.success(), relay.log())
    };
    let (ok, out) = check(setup.relay_args(
        "good",
        &bootstrap,
        "notify_channel = \"outbox_relay\"",
        "",
        None,
    ))
    .await;
    assert!(ok, "{out}");
    assert!(
        out.contains("polling: needs no REPLICATION")
            && out.contains("0 pending")
            && !out.contains("wal senders"),
        "{out}"
    );
    let (ok, out) =
        check(setup.relay_args_for("public.outbox_flag", "missing", &bootstrap, "", "", None))
            .await;
    assert!(!ok, "{out}");
    assert!(
        out.contains("FAIL") && out.contains("no column \"status\""),
        "{out}"
    );
    // A columns.headers other than the default must exist: a misspelling fails, not passes
    // with every row's headers left out.
    let (ok, out) = check(setup.relay_args(
        "misspelt",
        &bootstrap,
        "[pipelines.columns]\nheaders = \"hdrs\"",
        "",
        None,
    ))
    .await;
    assert!(!ok, "{out}");
    assert!(
        out.contains("FAIL") && out.contains("\"hdrs\"") && out.contains("columns.headers"),
        "{out}"
    );
    client
        .batch_execute(&format!(
            "CREATE ROLE reader_{0} LOGIN; GRANT SELECT ON outbox TO reader_{0};",
            setup.name
        ))
        .await
        .unwrap();
    let mut args = setup.relay_args("reader", &bootstrap, "", "", None);
    let path = args[2].clone();
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "postgres://postgres@",
        &format!("postgres://reader_{}@", setup.name),
    );
    std::fs::write(&path, text).unwrap();
    args = crate::as_command(&args, "check");
    let mut relay = Relay::spawn(&args);
    assert!(!relay.wait(Duration::from_secs(60)).success());
    let out = relay.log();
    assert!(
        out.contains(&format!(
            "GRANT UPDATE ON \"public\".\"outbox\" TO \"reader_{}\"",
            setup.name
        )),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_hostile_database_defaults_do_not_break_the_poller() {
    let setup = Setup::new("poll_defaults", &["Order"], 1).await;
    for setting in [
        "statement_timeout = '1ms'",
        "lock_timeout = '1ms'",
        "idle_in_transaction_session_timeout = '1s'",
        "idle_session_timeout = '1s'",
        "search_path = nowhere",
        "default_transaction_isolation = 'repeatable read'",
        "default_transaction_read_only = on",
        "TimeZone = 'America/Bogota'",
    ] {
        setup
            .db
            .client
            .batch_execute(&format!("ALTER DATABASE {} SET {setting}", setup.name))
            .await
            .unwrap();
    }
    // linger.ms keeps each batch's transaction open past idle_in_transaction_session_timeout.
    let relay = Relay::spawn(&setup.relay_args(
        "poller",
        &kafka().bootstrap(),
        "max_interval_ms = 100\nstats_interval_ms = 100",
        "\"linger.ms\" = \"1500\"",
        None,
    ));
    let mut written = write_events(&setup.db.client, 2, 5, &setup.types, 3).await;
    // Idle past idle_session_timeout, then more.
    tokio::time::sleep(Duration::from_secs(3)).await;
    written.extend(write_events(&setup.db.client, 2, 5, &setup.types, 3).await);
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(assert_delivered(&written, &consumed, 1), 0);
    wait_for(
        "every row to be marked PUBLISHED",
        Duration::from_secs(30),
        || async { (setup.statuses().await.get("PUBLISHED") == Some(&20)).then_some(()) },
    )
    .await;
    assert!(
        !relay.log().contains("reconnecting"),
        "no session ended:\n{}",
        relay.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_sigterm_mid_stream_then_restart_publishes_each_event_once() {
    let setup = Setup::new("poll_term", &["Order", "Shipment"], 2).await;
    let args = setup.relay_args("poller", &kafka().bootstrap(), "batch_size = 20", "", None);
    let mut relay = Relay::spawn(&args);
    let writer_db = pg().connect(&setup.db.name, Auth::Trust).await;
    let types = setup.types.clone();
    let writer = tokio::spawn(async move {
        let mut written = Vec::new();
        for n in 0..400 {
            let t = &types[n % types.len()];
            written.push(insert(&writer_db, t, &format!("k{}", n % 7), &payload(n)).await);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        written
    });
    wait_for(
        "some events to be published",
        Duration::from_secs(30),
        || async {
            setup
                .statuses()
                .await
                .contains_key("PUBLISHED")
                .then_some(())
        },
    )
    .await;
    relay.sigterm();
    let status = relay.wait(Duration::from_secs(30));
    assert!(
        status.success(),
        "exit after SIGTERM: {status}\n{}",
        relay.log()
    );
    assert!(!writer.is_finished(), "stopped mid-stream");
    let relay = Relay::spawn(&args);
    let written = within("the writer's 400 events", Duration::from_secs(120), writer)
        .await
        .unwrap();
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(3),
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(
        assert_delivered(&written, &consumed, 1),
        0,
        "a graceful stop publishes nothing twice"
    );
    drop(relay);
}

/// Two polling pipelines and a log-tailing one in one process, all with the file's Kafka
/// settings: the polling two share one producer, the log-tailing one keeps its own (two
/// librdkafka main threads, not three or one), and every pipeline delivers all its events
/// in key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_pipelines_of_one_process_share_a_producer_but_not_with_log_tailing() {
    let polling = [
        Setup::new("poll_share_a", &["Order"], 2).await,
        Setup::new("poll_share_b", &["Order"], 2).await,
    ];
    let tailing = crate::Setup::new("poll_share_c", &["Order"], 1).await;
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut toml = format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[metrics]\nlisten = \"{metrics}\"\n",
        kafka().bootstrap()
    );
    for s in &polling {
        toml.push_str(&format!(
            "[[pipelines]]\nname = \"{0}\"\nsource_url = \"{1}\"\nsource_kind = \"polling\"\ntable = \"public.outbox\"\nshutdown_timeout_secs = 5\n[pipelines.polling]\nbatch_size = 50\n",
            s.name,
            s.db.url(Auth::Trust)
        ));
    }
    toml.push_str(&format!(
        "[[pipelines]]\nname = \"tailing\"\nsource_url = \"{}\"\nslot = \"{}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\n",
        tailing.db.url(Auth::Trust),
        tailing.slot
    ));
    let (_dir, args) = crate::run_with_config(&toml);
    let relay = Relay::spawn(&args);
    // The log-tailing pipeline creates its slot: events written before it would not be in it.
    wait_for(
        "/readyz to report every pipeline streaming",
        Duration::from_secs(60),
        || async {
            http_get(&metrics, "/readyz")
                .await
                .filter(|(status, _)| *status == 200)
        },
    )
    .await;
    let mut written = Vec::new();
    for s in &polling {
        written.push(write_events(&s.db.client, 20, 5, &s.types, 4).await);
    }
    let tailed = crate::write_events(
        &tailing.db.client,
        10,
        2,
        &tailing.types,
        2,
        0,
        Duration::ZERO,
    )
    .await
    .0;
    for (s, w) in polling.iter().zip(&written) {
        let consumed = s
            .consume_all(w.len(), Duration::from_secs(1), Duration::from_secs(60))
            .await;
        assert_eq!(
            assert_delivered(w, &consumed, 1),
            0,
            "pipeline {}: no duplicates\n{}",
            s.name,
            relay.log()
        );
    }
    tailing.assert_first_topic(&tailed, false).await;
    // Every pipeline delivered, so each has its session's producer now.
    let producers = std::fs::read_dir(format!("/proc/{}/task", relay.pid()))
        .expect("the relay's threads")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "rdk:main")
        .count();
    assert_eq!(
        producers,
        2,
        "librdkafka producers in the relay process (one for both polling pipelines, one for the log-tailing one)\n{}",
        relay.log()
    );
    assert!(
        !relay.log().contains("reconnecting"),
        "no session ended:\n{}",
        relay.log()
    );
    drop(relay);
}

/// A cycle's marks that never end (here an UPDATE trigger that sleeps, as a COMMIT waits for a
/// synchronous standby that is down): SIGTERM still ends the relay within its shutdown timeout,
/// and the row stays pending to be published again. (The UPDATEs and COMMIT had no deadline
/// and the stop waited on them for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_sigterm_while_the_cycle_s_marks_hang_ends_within_the_shutdown_timeout() {
    let setup = Setup::new("poll_hang", &["Order"], 1).await;
    setup
        .db
        .client
        .batch_execute(
            "CREATE FUNCTION hang() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN PERFORM pg_sleep(600); RETURN NEW; END $$;
             CREATE TRIGGER hang BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION hang();",
        )
        .await
        .unwrap();
    // shutdown_timeout_secs = 5 (the fixture's).
    let args = setup.relay_args("poller", &kafka().bootstrap(), "", "", None);
    let mut relay = Relay::spawn(&args);
    let written = insert(&setup.db.client, &setup.types[0], "k1", &payload(1)).await;
    let consumed = setup
        .consume_all(1, Duration::ZERO, Duration::from_secs(60))
        .await;
    assert_delivered(std::slice::from_ref(&written), &consumed, 1);
    wait_for(
        "the cycle's mark to hang in the trigger",
        Duration::from_secs(30),
        || async {
            let row = setup
                .db
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()",
                    &[],
                )
                .await
                .unwrap();
            (row.get::<_, i64>(0) > 0).then_some(())
        },
    )
    .await;
    relay.sigterm();
    // The timeout, plus room for a loaded machine; the mark would hang for 600 s.
    relay.wait(Duration::from_secs(30));
    assert_eq!(
        setup.statuses().await.get("PENDING").copied(),
        Some(1),
        "the row stays pending"
    );
    // The server goes on sleeping for the relay that left.
    setup
        .db
        .client
        .batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()",
        )
        .await
        .unwrap();
}

/// Any role may `NOTIFY` the wake-up channel: a flood of notifications with nothing to publish
/// adds at most one poll per timed one, and the idle backoff goes on. (Each notification was a
/// poll: 158 a second instead of one.) A notification with a row behind it is still taken at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_wake_ups_by_notify_are_rate_limited() {
    let setup = Setup::new("poll_notify", &["Order"], 1).await;
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let args = setup.relay_args(
        "poller",
        &kafka().bootstrap(),
        "notify_channel = \"outbox_relay\"\nmax_interval_ms = 1000",
        "",
        Some(&metrics),
    );
    let relay = Relay::spawn(&args);
    let polls = || async {
        let text = http_get(&metrics, "/metrics").await.map(|(_, body)| body)?;
        metric_sum(&text, "outbox_relay_polls_total")
    };
    wait_for("the first polls", Duration::from_secs(30), || async {
        polls().await.filter(|n| *n > 0.0)
    })
    .await;
    // Into the idle backoff: polls a second apart.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = polls().await.unwrap();
    let spammer = pg().connect(&setup.db.name, Auth::Trust).await;
    let started = std::time::Instant::now();
    for _ in 0..500 {
        spammer.batch_execute("NOTIFY outbox_relay").await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let during = polls().await.unwrap() - before;
    let secs = started.elapsed().as_secs_f64();
    // A timed poll a second and at most one woken poll after each (one more of each at the
    // edges); each notification was a poll: hundreds.
    assert!(
        during <= 2.0 * (secs.ceil() + 2.0),
        "{during} polls during 500 notifications over {secs:.1} s"
    );
    let written = insert(&setup.db.client, &setup.types[0], "k1", &payload(1)).await;
    let consumed = setup
        .consume_all(1, Duration::ZERO, Duration::from_secs(30))
        .await;
    assert_delivered(std::slice::from_ref(&written), &consumed, 1);
    drop(relay);
}
