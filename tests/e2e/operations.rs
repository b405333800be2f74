use std::path::Path;
use std::time::Duration;

use crate::support::{
    self, consume, http_get, kafka, metric_value, pg, run_within, unique_name, wait_for, Auth,
    Relay,
};
use crate::{assert_delivered, run_with_config, write_events, Setup, Written};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_config_file_three_databases_and_a_failing_one_degrades_only_itself() {
    let setups = [
        Setup::new("multi_a", &["Order"], 1).await,
        Setup::new("multi_b", &["Order"], 1).await,
        Setup::new("multi_c", &["Order"], 1).await,
    ];
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut toml = format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[metrics]\nlisten = \"{metrics}\"\n",
        kafka().bootstrap()
    );
    let mut env = Vec::new();
    for (i, s) in setups.iter().enumerate() {
        toml.push_str(&format!(
            "[[pipelines]]\nname = \"db{i}\"\nsource_url = \"${{DB{i}_URL}}\"\nslot = \"{}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\n",
            s.slot
        ));
        env.push((format!("DB{i}_URL"), s.db.url(Auth::Scram)));
    }
    let (_dir, args) = run_with_config(&toml);
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let relay = Relay::spawn_with_env(&args, &env_refs);

    wait_for(
        "/readyz to report all three pipelines streaming",
        Duration::from_secs(60),
        || async {
            http_get(&metrics, "/readyz")
                .await
                .filter(|(status, _)| *status == 200)
        },
    )
    .await;
    // The three pipelines have the same Kafka settings: one producer (one librdkafka main
    // thread) serves them all.
    let producers = std::fs::read_dir(format!("/proc/{}/task", relay.pid()))
        .expect("the relay's threads")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "rdk:main")
        .count();
    assert_eq!(producers, 1, "librdkafka producers in the relay process");
    let mut written = Vec::new();
    for s in &setups {
        written.push(
            write_events(&s.db.client, 3, 2, &s.types, 2, 0, Duration::ZERO)
                .await
                .0,
        );
    }
    for (s, w) in setups.iter().zip(&written) {
        let topics = s.topics();
        let consumed = consume(
            &kafka().bootstrap(),
            &[topics[0].as_str()],
            w.len(),
            Duration::ZERO,
            Duration::from_secs(60),
        )
        .await;
        assert_delivered(w, &consumed, false);
    }

    // Database b goes away: its pipeline reconnects while a and c keep flowing.
    let b = &setups[1];
    let admin = pg().connect("postgres", Auth::Trust).await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS false",
            b.db.name
        ))
        .await
        .unwrap();
    assert!(b.db.terminate_slot_backend(&b.slot).await);
    let (status, body) = wait_for(
        "/readyz to report db1 degraded",
        Duration::from_secs(30),
        || async {
            http_get(&metrics, "/readyz")
                .await
                .filter(|(_, body)| body.contains("degraded"))
        },
    )
    .await;
    assert_eq!(status, 503, "{body}");
    let readiness: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        readiness["pipelines"]["db0"]["state"], "streaming",
        "{body}"
    );
    assert_eq!(readiness["pipelines"]["db1"]["state"], "degraded", "{body}");
    assert_eq!(
        readiness["pipelines"]["db2"]["state"], "streaming",
        "{body}"
    );
    for i in [0, 2] {
        let s = &setups[i];
        let more = write_events(&s.db.client, 3, 2, &s.types, 2, 100, Duration::ZERO)
            .await
            .0;
        written[i].extend(more);
        s.assert_first_topic(&written[i], false).await;
    }
    let (_, text) = http_get(&metrics, "/metrics").await.unwrap();
    assert!(
        text.contains("outbox_relay_pipeline_streaming{pipeline=\"db1\"} 0"),
        "{text}"
    );
    let published_db0: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with(
                "outbox_relay_events_published_total{pipeline=\"db0\",sink=\"kafka\",topic=",
            )
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(published_db0, 12.0, "{text}");
    assert!(
        text.contains("outbox_relay_events_decoded_total{pipeline=\"db0\"} 12"),
        "{text}"
    );
    assert!(
        text.contains(
            "outbox_relay_delivery_latency_seconds_count{pipeline=\"db0\",sink=\"kafka\"} 12"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "outbox_relay_commit_to_ack_latency_seconds_count{pipeline=\"db2\",sink=\"kafka\"} 12"
        ),
        "{text}"
    );
    assert!(
        text.contains("outbox_relay_replication_lag_bytes{pipeline=\"db0\"}"),
        "{text}"
    );
    // Everything was acknowledged, and the slots (read every 10 s) keep their WAL within
    // max_wal_size. The status update after the last ack may not be out yet: wait for it.
    let limited: String = admin
        .query_one("SHOW max_slot_wal_keep_size", &[])
        .await
        .unwrap()
        .get(0);
    for db in ["db0", "db2"] {
        let text = wait_for(
            "the slot metrics of the streaming pipelines",
            Duration::from_secs(15),
            || async {
                let (_, text) = http_get(&metrics, "/metrics").await?;
                let age = format!(
                    "outbox_relay_oldest_unacked_event_age_seconds{{pipeline=\"{db}\",sink=\"kafka\"}} 0\n"
                );
                let reserved = format!(
                    "outbox_relay_slot_wal_status{{pipeline=\"{db}\",status=\"reserved\"}} 1\n"
                );
                (text.contains(&age) && text.contains(&reserved)).then_some(text)
            },
        )
        .await;
        for status in ["extended", "unreserved", "lost"] {
            let line = format!(
                "outbox_relay_slot_wal_status{{pipeline=\"{db}\",status=\"{status}\"}} 0\n"
            );
            assert!(text.contains(&line), "{line} missing in\n{text}");
        }
        let safe = format!("outbox_relay_slot_safe_wal_size_bytes{{pipeline=\"{db}\"}}");
        if limited == "-1" {
            assert!(!text.contains(&safe), "no WAL limit, yet {safe} in\n{text}");
        } else {
            assert!(metric_value(&text, &safe) > 0.0, "{text}");
        }
    }

    // b comes back and catches up.
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS true",
            b.db.name
        ))
        .await
        .unwrap();
    let more = write_events(&b.db.client, 3, 2, &b.types, 2, 100, Duration::ZERO)
        .await
        .0;
    written[1].extend(more);
    let topics = b.topics();
    let consumed = consume(
        &kafka().bootstrap(),
        &[topics[0].as_str()],
        written[1].len(),
        Duration::ZERO,
        Duration::from_secs(90),
    )
    .await;
    assert_delivered(&written[1], &consumed, false);
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_creates_publication_and_slot_and_a_dropped_slot_stops_the_relay() {
    let setup = Setup::new("setupcmd", &["Order"], 1).await;
    setup
        .db
        .client
        .batch_execute("DROP PUBLICATION outbox_pub")
        .await
        .unwrap();
    let mut run_args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let mut setup_args = run_args.clone();
    setup_args = crate::as_command(&setup_args, "setup");

    let mut print = setup_args.clone();
    print.push("--print-sql".into());
    let mut printer = Relay::spawn(&print);
    assert!(
        printer.wait(Duration::from_secs(30)).success(),
        "{}",
        printer.log()
    );
    assert!(
        printer
            .log()
            .contains("CREATE PUBLICATION \"outbox_pub\" FOR TABLE \"public\".\"outbox\""),
        "{}",
        printer.log()
    );
    assert!(
        setup.db.confirmed_flush_lsn(&setup.slot).await.is_none(),
        "--print-sql created the slot"
    );

    let mut creator = Relay::spawn(&setup_args);
    assert!(
        creator.wait(Duration::from_secs(60)).success(),
        "{}",
        creator.log()
    );
    assert!(
        setup.db.confirmed_flush_lsn(&setup.slot).await.is_some(),
        "setup did not create the slot"
    );

    // Events committed between setup and the first start are published: the slot holds them.
    let (written, _) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 0, Duration::ZERO).await;
    run_args.push("--no-create-slot".into());
    let mut relay = Relay::spawn(&run_args);
    setup.assert_first_topic(&written, true).await;
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());

    setup.db.drop_slot(&setup.slot).await;
    let mut relay = Relay::spawn(&run_args);
    let status = relay.wait(Duration::from_secs(30));
    assert!(!status.success(), "the relay ran without its slot");
    assert!(relay.log().contains("does not exist"), "{}", relay.log());
    assert!(
        setup.db.confirmed_flush_lsn(&setup.slot).await.is_none(),
        "the slot was re-created"
    );
}

/// What `setup --print-sql` prints for the `setup` command line `setup_args`; panics, with its
/// output, when it fails.
fn printed_setup_sql(setup_args: &[String]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(setup_args)
        .arg("--print-sql")
        .output()
        .unwrap();
    let sql = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{sql}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sql
}

/// What `setup --print-sql` prints is what a DBA runs instead of `setup`: run with `psql -f`
/// on a database that has the outbox and its publication (sql/outbox.sql), it creates the
/// relay's role with its grants, the slot record and the slot, and the relay then streams as
/// that role, with those privileges only, without creating anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_setup_prints_runs_as_it_is_and_the_relay_streams_after_it() {
    let setup = Setup::new("printsql", &["Order"], 1).await;
    let role = crate::support::unique_name("printsql_relay");
    let url = setup.db.url(Auth::Trust).replacen(
        "postgres://postgres@",
        &format!("postgres://{role}@"),
        1,
    );
    let run_args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let at = run_args.iter().position(|a| a == "--source-url").unwrap();
    let mut run_args = run_args;
    run_args[at + 1] = url;
    let printed = printed_setup_sql(&crate::as_command(&run_args, "setup"));
    let sql = printed.as_str();
    assert!(sql.contains("\\set ON_ERROR_STOP on\n"), "{sql}");
    assert!(sql.contains(&format!("CREATE ROLE \"{role}\"")), "{sql}");
    // As a DBA runs it, twice (every part may run again): psql -f, each statement on its
    // own, stopping at the first error.
    for _ in 0..2 {
        if let Err(e) = pg().psql_file(&setup.db.name, sql) {
            panic!("the printed SQL fails: {e}\n{sql}");
        }
    }
    assert!(
        setup.db.confirmed_flush_lsn(&setup.slot).await.is_some(),
        "the printed SQL created no slot:\n{sql}"
    );

    let (written, _) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 0, Duration::ZERO).await;
    run_args.push("--no-create-slot".into());
    let mut relay = Relay::spawn(&run_args);
    setup.assert_first_topic(&written, true).await;
    relay.sigterm();
    assert!(
        relay.wait(Duration::from_secs(40)).success(),
        "{}",
        relay.log()
    );
}

/// An existing publication that leaves the outbox table out is not passed over: `setup` and
/// the script `setup --print-sql` prints stop at it with the sentence `check` prints, fix
/// included, before they create the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_and_its_printed_sql_stop_at_an_existing_publication_without_the_outbox() {
    let setup = Setup::new("printsql_pub", &["Order"], 1).await;
    let publication = format!("{}_other", setup.db.name);
    setup
        .db
        .client
        .batch_execute(&format!(
            "CREATE TABLE elsewhere (id int); CREATE PUBLICATION {publication} FOR TABLE elsewhere"
        ))
        .await
        .unwrap();
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let at = args.iter().position(|a| a == "--publication").unwrap() + 1;
    args[at] = publication.clone();
    let args = crate::as_command(&args, "setup");
    let sentence = format!(
        "table public.outbox is not in publication \"{publication}\": ALTER PUBLICATION \"{publication}\" ADD TABLE \"public\".\"outbox\""
    );

    let mut command = Relay::spawn(&args);
    let status = command.wait(Duration::from_secs(60));
    let log = command.log();
    assert_eq!(status.code(), Some(3), "setup exited with {status}:\n{log}");
    assert!(
        log.contains(&sentence),
        "setup does not say {sentence:?}:\n{log}"
    );
    assert!(
        setup.db.confirmed_flush_lsn(&setup.slot).await.is_none(),
        "setup created the slot"
    );

    let sql = printed_setup_sql(&args);
    // The harness's psql stops at the first error by itself; a DBA's stops because of this.
    assert!(sql.contains("\\set ON_ERROR_STOP on\n"), "{sql}");
    let stopped = match pg().psql_file(&setup.db.name, &sql) {
        Ok(_) => panic!("the printed SQL ran past a publication without the outbox:\n{sql}"),
        Err(e) => e,
    };
    assert!(stopped.contains(&sentence), "psql said:\n{stopped}");
    assert!(
        setup.db.confirmed_flush_lsn(&setup.slot).await.is_none(),
        "the printed SQL went on to create the slot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_status_tell_the_operator_what_is_wrong_and_where_the_slot_is() {
    let setup = Setup::new("check", &["Order"], 1).await;
    let args = |command: &str| {
        let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Scram);
        args = crate::as_command(&args, command);
        args
    };
    let mut check = Relay::spawn(&args("check"));
    assert!(
        check.wait(Duration::from_secs(60)).success(),
        "{}",
        check.log()
    );
    for needle in [
        "ok    wal_level",
        "ok    role",
        "ok    publication",
        "WARN  slot",
        "ok    kafka",
    ] {
        assert!(
            check.log().contains(needle),
            "{needle:?} missing:\n{}",
            check.log()
        );
    }

    setup
        .db
        .client
        .batch_execute("ALTER PUBLICATION outbox_pub DROP TABLE outbox")
        .await
        .unwrap();
    let mut check = Relay::spawn(&args("check"));
    assert!(
        !check.wait(Duration::from_secs(60)).success(),
        "check passed without the table in the publication"
    );
    assert!(check.log().contains("FAIL  publication"), "{}", check.log());
    setup
        .db
        .client
        .batch_execute("ALTER PUBLICATION outbox_pub ADD TABLE outbox")
        .await
        .unwrap();

    let mut status = Relay::spawn(&args("status"));
    assert!(
        !status.wait(Duration::from_secs(30)).success(),
        "status succeeded without a slot"
    );
    assert!(
        status.log().contains("slot does not exist"),
        "{}",
        status.log()
    );
    let relay = Relay::spawn(&args("run"));
    setup.wait_streaming().await;
    let mut status = Relay::spawn(&args("status"));
    assert!(
        status.wait(Duration::from_secs(30)).success(),
        "{}",
        status.log()
    );
    let pid = setup.db.slot_active_pid(&setup.slot).await.unwrap();
    let line = status
        .log()
        .lines()
        .find(|l| l.contains(&setup.slot))
        .map(str::to_owned)
        .unwrap_or_default();
    assert!(
        line.contains(&pid.to_string()) && line.contains("reserved"),
        "status line {line:?}"
    );
    drop(relay);
}

/// With `message_prefix`, any role that can connect can publish events through
/// `pg_logical_emit_message`, which PUBLIC may execute by default: `check` warns until
/// `sql/logical_messages.sql` has revoked it, and a role without the grant can no longer call it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_warns_while_public_may_emit_logical_messages_until_the_sql_kit_revokes_it() {
    let setup = Setup::new("emit_grant", &["Order"], 1).await;
    let c = &setup.db.client;
    let writer = format!("{}_writer", setup.slot);
    let outsider = format!("{}_outsider", setup.slot);
    c.batch_execute(&format!("CREATE ROLE {writer}; CREATE ROLE {outsider}"))
        .await
        .unwrap();
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args = crate::as_command(&args, "check");
    args.extend(["--message-prefix".to_string(), "outbox".to_string()]);
    let mut check = Relay::spawn(&args);
    check.wait(Duration::from_secs(60));
    let line = check
        .log()
        .lines()
        .find(|l| l.contains("logical messages"))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no logical messages finding:\n{}", check.log()));
    assert!(
        line.trim_start().starts_with("WARN")
            && line.contains("PUBLIC")
            && line.contains("sql/logical_messages.sql"),
        "{line}"
    );

    let kit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/logical_messages.sql"),
    )
    .unwrap()
    .replace("ARRAY['orders_service']", &format!("ARRAY['{writer}']"));
    // Twice: the kit is idempotent.
    c.batch_execute(&kit).await.unwrap();
    c.batch_execute(&kit).await.unwrap();
    let mut check = Relay::spawn(&args);
    check.wait(Duration::from_secs(60));
    assert!(
        check
            .log()
            .lines()
            .any(|l| l.trim_start().starts_with("ok") && l.contains("logical messages")),
        "{}",
        check.log()
    );
    let emit = "SELECT pg_logical_emit_message(true, 'outbox', '{}')";
    let denied = c
        .batch_execute(&format!("SET ROLE {outsider}; {emit}"))
        .await
        .expect_err("a role without the grant emitted a message");
    assert!(
        denied.to_string().contains("permission denied")
            || format!("{denied:?}").contains("permission denied"),
        "{denied:?}"
    );
    c.batch_execute("RESET ROLE").await.unwrap();
    c.batch_execute(&format!("SET ROLE {writer}; {emit}; RESET ROLE"))
        .await
        .expect("the writer role may emit");
}

/// Runs `outbox-relay probe --url URL` and returns its exit code and output.
fn probe(url: &str) -> (Option<i32>, String) {
    let mut probe = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    probe.args(["probe", "--url", url]);
    let out = run_within(probe, Duration::from_secs(30));
    (out.status.code(), format!("{}{}", out.stdout, out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_command_exits_0_when_ready_and_1_otherwise() {
    let setup = Setup::new("probe", &["Order"], 1).await;
    let metrics = format!("127.0.0.1:{}", support::free_port());
    // Nothing listens yet.
    let (code, text) = probe(&format!("http://{metrics}/readyz"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("cannot reach"), "{text}");

    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.extend(["--metrics-listen".to_string(), metrics.clone()]);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    wait_for("/readyz to answer 200", Duration::from_secs(30), || async {
        http_get(&metrics, "/readyz")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    let (code, text) = probe(&format!("http://{metrics}/readyz"));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("200"), "{text}");
    let (code, text) = probe(&format!("http://{metrics}/healthz"));
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = probe(&format!("http://{metrics}/no-such-page"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("404"), "{text}");
    drop(relay);
}

/// The JSON objects of a log, one per non-empty line; panics naming a line that is not one.
fn json_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .filter(|v| v.is_object())
                .unwrap_or_else(|| panic!("not a JSON object: {line}\n--- log:\n{log}"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_format_json_writes_every_line_as_one_json_object() {
    let setup = Setup::new("jsonlog", &["Order"], 1).await;
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.extend(["--log-format".to_owned(), "json".to_owned()]);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (written, _) =
        write_events(&setup.db.client, 1, 2, &setup.types, 1, 0, Duration::ZERO).await;
    let consumed = setup
        .consume_all(written.len(), Duration::ZERO, Duration::from_secs(60))
        .await;
    assert_delivered(&written, &consumed, true);
    relay.sigterm();
    assert!(
        relay.wait(Duration::from_secs(40)).success(),
        "{}",
        relay.log()
    );
    let lines = json_lines(&relay.log());
    let stopped = lines
        .iter()
        .find(|l| l["fields"]["message"] == "stopped")
        .unwrap_or_else(|| panic!("no \"stopped\" line in {lines:#?}"));
    assert_eq!(stopped["level"], "INFO");
    assert_eq!(stopped["fields"]["pipeline"], setup.slot.as_str());
    assert!(
        stopped["fields"]["confirmed_flush_lsn"].is_string() && stopped["timestamp"].is_string(),
        "{stopped}"
    );

    // From OUTBOX_RELAY_LOG_FORMAT, and for the error that ends a command.
    let mut bad = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    bad.extend(["--max-in-flight-events".to_owned(), "0".to_owned()]);
    let mut refused = Relay::spawn_with_env(&bad, &[("OUTBOX_RELAY_LOG_FORMAT", "json")]);
    assert!(
        !refused.wait(Duration::from_secs(30)).success(),
        "{}",
        refused.log()
    );
    let lines = json_lines(&refused.log());
    let failed = lines
        .iter()
        .find(|l| l["level"] == "ERROR")
        .unwrap_or_else(|| panic!("no ERROR line in {lines:#?}"));
    assert_eq!(failed["fields"]["message"], "outbox-relay failed");
    assert!(
        failed["fields"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("max_in_flight_events")),
        "{failed}"
    );
}

/// `target/<profile>/examples/inbox_consumer`, built first if `cargo test --test e2e` did not.
fn inbox_consumer_example() -> std::path::PathBuf {
    let relay = Path::new(env!("CARGO_BIN_EXE_outbox-relay"));
    let path = relay.parent().unwrap().join("examples/inbox_consumer");
    if !path.exists() {
        let mut build = std::process::Command::new(env!("CARGO"));
        build
            .args(["build", "--example", "inbox_consumer"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        // Compiling on a busy 2-core machine: minutes, not hours.
        let out = run_within(build, Duration::from_secs(900));
        assert!(
            out.status.success(),
            "cargo build --example inbox_consumer: {}\n{}",
            out.status,
            out.stderr
        );
    }
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_consumer_example_applies_a_redelivered_event_once() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::FutureRecord;

    let setup = Setup::new("inbox", &["Order"], 1).await;
    let relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    setup.wait_streaming().await;
    let first = setup
        .db
        .insert_event(&setup.types[0], "o-1", "OrderPlaced", Some("{}"), None)
        .await;
    let second = setup
        .db
        .insert_event(&setup.types[0], "o-2", "OrderPlaced", Some("{}"), None)
        .await;
    let consumed = setup
        .consume_all(2, Duration::ZERO, Duration::from_secs(60))
        .await;
    drop(relay);
    // The first event again, as after a relay crash before its LSN was confirmed.
    let original = consumed
        .iter()
        .find(|r| r.header_str("id").as_deref() == Some(first.as_str()))
        .unwrap();
    let mut headers = OwnedHeaders::new();
    for (key, value) in &original.headers {
        headers = headers.insert(Header {
            key,
            value: value.as_deref(),
        });
    }
    let topic = &setup.topics()[0];
    support::kafka::producer(&kafka().bootstrap())
        .send(
            FutureRecord::to(topic)
                .key(original.key.as_deref().unwrap())
                .payload(original.value.as_deref().unwrap())
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .unwrap();

    let consumer_db = pg().create_database(&unique_name("inbox_consumer")).await;
    let example = inbox_consumer_example();
    let args: Vec<String> = [
        "--bootstrap-servers",
        &kafka().bootstrap(),
        "--topics",
        topic,
        "--group-id",
        &unique_name("inbox_group"),
        "--database-url",
        &consumer_db.url(Auth::Trust),
        "--max-records",
        "3",
        "--idle-timeout-secs",
        "60",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let run = tokio::task::spawn_blocking(move || {
        let mut consumer = std::process::Command::new(example);
        consumer.args(args);
        run_within(consumer, Duration::from_secs(90))
    });
    let out = support::within("the inbox consumer", Duration::from_secs(120), run)
        .await
        .unwrap();
    let stdout = out.stdout.clone();
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        out.stderr
    );
    // One partition: the relay's two records, then the copy.
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].starts_with("applied ") && lines[0].ends_with(&first),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("applied ") && lines[1].ends_with(&second),
        "{stdout}"
    );
    assert!(
        lines[2].starts_with("duplicate ") && lines[2].ends_with(&first),
        "{stdout}"
    );

    let mut inbox: Vec<String> = consumer_db
        .client
        .query("SELECT event_id FROM inbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    inbox.sort();
    let mut expected = vec![first.clone(), second.clone()];
    expected.sort();
    assert_eq!(inbox, expected, "one inbox row per event");
    let counts: Vec<(String, i64)> = consumer_db
        .client
        .query(
            "SELECT aggregate_id, events FROM aggregate_event_counts ORDER BY aggregate_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        counts,
        [("o-1".to_string(), 1), ("o-2".to_string(), 1)],
        "the handler ran once per event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_debezium_connector_takes_over_its_slot_and_keeps_its_topics() {
    let setup = Setup::new("dbzimport", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let c = &setup.db.client;
    let sql = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("sql")
            .join("outbox_debezium.sql"),
    )
    .unwrap();
    c.batch_execute(&sql).await.unwrap();
    // The slot Debezium left behind (pgoutput), with an event it had not confirmed.
    setup.db.create_slot(&setup.slot).await;
    let insert = |event_type: &'static str| {
        let t = t.clone();
        async move {
            let row = c
                .query_one(
                    "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
                     VALUES (gen_random_uuid(), $1, 'k', $2, '{\"n\": 1.50}') RETURNING id::text, payload::text",
                    &[&t, &event_type],
                )
                .await
                .unwrap();
            Written {
                id: row.get(0),
                aggregate_type: t,
                aggregate_id: "k".into(),
                event_type: event_type.into(),
                payload: row.get(1),
            }
        }
    };
    let mut written = vec![insert("BeforeTakeover").await];

    let dir = tempfile::tempdir().unwrap();
    let connector = dir.path().join("orders-connector.json");
    std::fs::write(
        &connector,
        serde_json::json!({
            "name": "orders-connector",
            "config": {
                "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                "tasks.max": "1",
                "database.hostname": "127.0.0.1",
                "database.port": setup.db.port(),
                "database.user": "postgres",
                "database.password": "not-printed",
                "database.dbname": setup.db.name,
                "topic.prefix": "orders",
                "plugin.name": "pgoutput",
                "slot.name": setup.slot,
                "publication.name": "outboxevent_pub",
                "table.include.list": "public.outboxevent",
                "transforms": "outbox",
                "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
                "transforms.outbox.route.topic.replacement": "${routedByValue}.events"
            }
        })
        .to_string(),
    )
    .unwrap();
    let mut import = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    // Kafka Connect's default converters wrote other bytes: accepted, the test reads the relay's.
    import.args([
        "import-debezium".as_ref(),
        "--accept-differences".as_ref(),
        connector.as_os_str(),
    ]);
    let output = run_within(import, Duration::from_secs(60));
    let (stdout, stderr) = (output.stdout, output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        !stdout.contains("not-printed") && !stderr.contains("not-printed"),
        "the password was printed"
    );
    for line in [
        "database.password: not copied: set ORDERS_CONNECTOR_DB_PASSWORD",
        "topic.prefix: not needed",
        "tasks.max: ",
    ] {
        assert!(
            stderr.contains(line),
            "{line:?} missing in stderr:\n{stderr}"
        );
    }
    let config = dir.path().join("relay.toml");
    std::fs::write(&config, &stdout).unwrap();
    let bootstrap = kafka().bootstrap();
    let relay = Relay::spawn_with_env(
        &[
            "run".into(),
            "--config".into(),
            config.display().to_string(),
        ],
        &[
            ("KAFKA_BOOTSTRAP_SERVERS", bootstrap.as_str()),
            ("ORDERS_CONNECTOR_DB_PASSWORD", "unused-with-trust"),
        ],
    );
    setup.wait_streaming().await;
    written.push(insert("AfterTakeover").await);
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
        .await;
    assert_delivered(&written, &consumed, true);
    drop(relay);
}

/// `outbox_relay_replication_lag_bytes` is the slot's lag on the server: with the broker
/// away and the relay's reads held by its in-flight limit, it grows with the WAL written
/// (it showed what the relay had read past its confirmed LSN: a couple of records).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_lag_is_the_slots_lag_while_reads_are_held() {
    let setup = Setup::new("lag_gauge", &["Order"], 1).await;
    let unreachable = format!("127.0.0.1:{}", support::free_port());
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&unreachable, Auth::Trust);
    args.extend([
        "--max-in-flight-events".into(),
        "2".into(),
        "--metrics-listen".into(),
        metrics.clone(),
    ]);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let start = setup.db.current_wal_insert_lsn().await;
    for n in 0..100 {
        crate::insert(
            &setup.db.client,
            &setup.types[0],
            &format!("k{n}"),
            &format!(r#"{{"n": {n}, "pad": "{}"}}"#, "p".repeat(2_000)),
        )
        .await;
    }
    let written = setup.db.current_wal_insert_lsn().await - start;
    let series = format!(
        "outbox_relay_replication_lag_bytes{{pipeline=\"{}\"}}",
        setup.slot
    );
    wait_for(
        "the lag gauge to count the WAL written behind the held reads",
        Duration::from_secs(60),
        || async {
            let text = support::scrape_metrics(&metrics).await;
            (metric_value(&text, &series) >= written as f64).then_some(())
        },
    )
    .await;
    assert!(relay.is_running(), "{}", relay.log());
}

/// Found by review: the "catching up" line measured its lag from the stream, whose XLogData
/// headers carry the record's own LSN as the end of WAL, so however far behind the slot was,
/// the line never came. It now uses the slot's lag read from the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catching_up_is_logged_while_the_slot_is_far_behind() {
    let setup = Setup::new("catching_up", &["Order"], 1).await;
    let unreachable = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&unreachable, Auth::Trust);
    args.extend(["--max-in-flight-events".into(), "2".into()]);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    for n in 0..3 {
        crate::insert(&setup.db.client, &setup.types[0], &format!("k{n}"), "{}").await;
    }
    // 24 MiB of WAL behind the held reads (rows under the TOAST threshold, so uncompressed).
    setup
        .db
        .client
        .batch_execute(
            "CREATE TABLE padding (v text);
             INSERT INTO padding SELECT repeat(md5(n::text), 32) FROM generate_series(1, 24000) n;",
        )
        .await
        .expect("write padding WAL");
    relay
        .wait_for_log("catching up", Duration::from_secs(60))
        .await;
    let log = relay.log();
    let line = log
        .lines()
        .find(|l| l.contains("catching up"))
        .expect("the line was found above");
    assert!(line.contains("lag_bytes="), "{line}");
    assert!(relay.is_running(), "{log}");
}

/// Found by review: the metrics endpoint shared the pipelines' shutdown token, so it closed as
/// a shutdown's drain began: no `/metrics`, `/healthz` or `/readyz` for the drain's length (up
/// to `shutdown_timeout_secs`), just while an operator watches the in-flight records go out.
/// Kept up, `/readyz` then answered 200 "streaming" for a stopping process: it says "draining".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_are_served_until_a_shutdowns_drain_ends() {
    let setup = Setup::new("drain_metrics", &["Order"], 1).await;
    let unreachable = format!("127.0.0.1:{}", support::free_port());
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&unreachable, Auth::Trust);
    args.extend([
        "--metrics-listen".into(),
        metrics.clone(),
        "--shutdown-timeout-secs".into(),
        "30".into(),
    ]);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    crate::insert(&setup.db.client, &setup.types[0], "k1", "{}").await;
    let series = format!(
        "outbox_relay_in_flight_events{{pipeline=\"{}\",sink=\"kafka\"}}",
        setup.slot
    );
    wait_for(
        "the event to wait in flight for the unreachable broker",
        Duration::from_secs(60),
        || async {
            let text = support::scrape_metrics(&metrics).await;
            (metric_value(&text, &series) >= 1.0).then_some(())
        },
    )
    .await;

    relay.sigterm();
    wait_for(
        "the relay to start draining",
        Duration::from_secs(30),
        || async {
            relay
                .log()
                .contains("draining before shutdown")
                .then_some(())
        },
    )
    .await;
    for path in ["/metrics", "/healthz"] {
        let answer = http_get(&metrics, path).await;
        assert!(
            matches!(answer, Some((200, _))),
            "GET {path} during the drain: {answer:?}\n{}",
            relay.log()
        );
    }
    // A stopping process is not ready: the pipeline says it is draining.
    let answer = http_get(&metrics, "/readyz").await;
    assert!(
        matches!(&answer, Some((503, body)) if body.contains(r#""state":"draining""#)),
        "GET /readyz during the drain: {answer:?}\n{}",
        relay.log()
    );
    let text = support::scrape_metrics(&metrics).await;
    assert_eq!(metric_value(&text, &series), 1.0, "the drain's record");
    assert!(
        relay.is_running(),
        "the drain ended before the endpoint was read: {}",
        relay.log()
    );
    relay.wait(Duration::from_secs(60));
    assert!(
        http_get(&metrics, "/healthz").await.is_none(),
        "the endpoint outlived the relay"
    );
}

/// The SQL kit runs in the order its page gives, twice (each file creates only what is
/// missing; the Debezium-shaped table's file too), and the role `sql/roles.sql` makes streams with the slot record but may not
/// delete from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_kit_runs_twice_and_its_role_streams_without_delete() {
    let setup = Setup::new("sql_kit", &["Order"], 1).await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql");
    for _ in 0..2 {
        for file in [
            "outbox.sql",
            "slot_record.sql",
            "roles.sql",
            "outbox_debezium.sql",
        ] {
            let sql = std::fs::read_to_string(root.join(file)).unwrap();
            pg().psql(&setup.db.name, &sql);
        }
    }
    let may_delete = pg().psql(
        &setup.db.name,
        "SELECT has_table_privilege('outbox_relay', 'outbox_relay.streamed_slots', 'DELETE')",
    );
    assert_eq!(may_delete.trim(), "f");
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let at = args.iter().position(|a| a == "--source-url").unwrap() + 1;
    args[at] = format!(
        "postgres://outbox_relay@127.0.0.1:{}/{}",
        setup.db.port(),
        setup.db.name
    );
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    setup.one_event_flows().await;
    wait_for("the slot record row", Duration::from_secs(30), || async {
        let rows = pg().psql(
            &setup.db.name,
            &format!(
                "SELECT count(*) FROM outbox_relay.streamed_slots WHERE slot_name = '{}'",
                setup.slot
            ),
        );
        (rows.trim() == "1").then_some(())
    })
    .await;
    drop(relay);
}
