//! How the supervisor restarts and stops sessions, seen from outside: a stop while a session
//! is still being set up ends the process at once, and a session that fails right after
//! every start is retried after growing delays, with the recurring error in `/readyz`; a
//! pipeline that fails for good beside a healthy one ends the process with its exit code, or
//! with `on_pipeline_failure = "retry"` stays `failed` while the other delivers.

use std::path::Path;
use std::time::Duration;

use crate::support::{self, http_get, kafka, metric_value, pg, unique_name, wait_for, Auth, Relay};
use crate::{run_with_config, write_events, Setup};

/// A config file with a healthy pipeline `good` on `setup`'s database and a pipeline `bad` on
/// the same database whose slot does not exist and may not be created: it fails for good at
/// its first start. Returns the file's directory, the `run` arguments and the metrics address.
fn good_and_bad(setup: &Setup, policy: &str) -> (tempfile::TempDir, Vec<String>, String) {
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let url = setup.db.url(Auth::Trust);
    let toml = format!(
        "{policy}[kafka]\nbootstrap_servers = \"{}\"\n[metrics]\nlisten = \"{metrics}\"\n\
         [[pipelines]]\nname = \"good\"\nsource_url = \"{url}\"\nslot = \"{slot}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\n\
         [[pipelines]]\nname = \"bad\"\nsource_url = \"{url}\"\nslot = \"{slot}_missing\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\ncreate_slot = false\n",
        kafka().bootstrap(),
        slot = setup.slot,
    );
    let (dir, args) = run_with_config(&toml);
    (dir, args, metrics)
}

/// With the default `on_pipeline_failure = "exit"`, a pipeline stopped by an error retrying
/// cannot fix (its slot is missing) drains the healthy one and ends the process with the
/// configuration exit code, 3, instead of leaving a process that looks healthy with one
/// pipeline dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_failing_for_good_beside_a_healthy_one_ends_the_process_with_exit_code_3() {
    let setup = Setup::new("fail_exit", &["Order"], 1).await;
    let (_dir, args, _metrics) = good_and_bad(&setup, "");
    let mut relay = Relay::spawn(&args);
    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert_eq!(status.code(), Some(3), "relay exited with {status}:\n{log}");
    assert!(
        log.contains("does not exist") && log.contains("draining the other pipelines"),
        "{log}"
    );
}

/// With `on_pipeline_failure = "retry"`, the failed pipeline reads `failed` (so `/readyz`
/// fails, `/healthz` does not), the healthy one delivers, and the process stays up until a
/// SIGTERM, which it answers with exit code 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_retry_a_failed_pipeline_is_shown_failed_while_the_healthy_one_delivers() {
    let setup = Setup::new("fail_retry", &["Order"], 1).await;
    let (_dir, args, metrics) = good_and_bad(&setup, "on_pipeline_failure = \"retry\"\n");
    let mut relay = Relay::spawn(&args);
    let body = wait_for(
        "/readyz to show the bad pipeline failed",
        Duration::from_secs(60),
        || async {
            http_get(&metrics, "/readyz")
                .await
                .filter(|(_, body)| body.contains("\"failed\""))
                .map(|(status, body)| {
                    assert_eq!(status, 503, "{body}");
                    body
                })
        },
    )
    .await;
    let readiness: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        readiness["pipelines"]["bad"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("does not exist")),
        "{body}"
    );
    setup.wait_streaming().await;
    let written = write_events(&setup.db.client, 2, 2, &setup.types, 1, 0, Duration::ZERO)
        .await
        .0;
    setup.assert_first_topic(&written, false).await;
    let (status, _) = http_get(&metrics, "/healthz").await.expect("GET /healthz");
    assert_eq!(status, 200);
    let (_, text) = http_get(&metrics, "/metrics").await.unwrap();
    assert_eq!(
        metric_value(
            &text,
            "outbox_relay_pipeline_state{pipeline=\"bad\",state=\"failed\"}"
        ),
        1.0,
        "{text}"
    );
    assert!(relay.is_running(), "{}", relay.log());
    relay.sigterm();
    let status = relay.wait(Duration::from_secs(40));
    assert_eq!(status.code(), Some(0), "{}", relay.log());
}

/// A SIGTERM while the relay sets up its session, here creating its slot, which
/// waits for a transaction that stays open (the relay's SQL connection runs with
/// `statement_timeout = 0`), ends the process within seconds, well under the 30 s shutdown
/// timeout, with success and without ever streaming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_the_slot_creation_waits_for_an_open_transaction_ends_the_relay_within_seconds(
) {
    let name = unique_name("stop_in_setup");
    let db = pg().create_database(&name).await;
    let slot = format!("{name}_slot");
    // A transaction with an xid, left open: a logical slot's creation waits for it to end.
    let holder = pg().connect(&name, Auth::Trust).await;
    support::within(
        "opening the transaction that holds up the slot creation",
        Duration::from_secs(30),
        holder.batch_execute("BEGIN; SELECT txid_current();"),
    )
    .await
    .unwrap();
    // No broker: the session never gets as far as creating its producer.
    let bootstrap = format!("127.0.0.1:{}", support::free_port());
    // A Setup without topics (Setup::new would start the broker): its relay arguments.
    let setup = Setup {
        db,
        slot,
        types: Vec::new(),
    };
    let args = setup.relay_args(&bootstrap, Auth::Trust);
    let mut relay = Relay::spawn(&args);
    wait_for(
        "the relay's slot creation to wait for the open transaction",
        Duration::from_secs(30),
        || async {
            let waiting: i64 = setup
                .db
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()
                       AND query LIKE '%pg_create_logical_replication_slot%'
                       AND state = 'active' AND wait_event = 'transactionid'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            (waiting > 0).then_some(())
        },
    )
    .await;
    let signalled = std::time::Instant::now();
    relay.sigterm();
    // Panics (with the deadline) if the relay is still there after 10 s.
    let status = relay.wait(Duration::from_secs(10));
    let took = signalled.elapsed();
    let log = relay.log();
    assert!(
        status.success(),
        "relay exited with {status} after SIGTERM during set-up:\n{log}"
    );
    assert_eq!(status.code(), Some(0), "exit code:\n{log}");
    eprintln!("stopped {took:?} after SIGTERM during the slot creation");
    assert!(
        !log.contains(": streaming "),
        "the relay streamed although its slot creation never finished:\n{log}"
    );
    assert!(
        log.contains("stopped during session set-up"),
        "no log line saying the set-up was cancelled:\n{log}"
    );
    support::within(
        "committing the transaction that held up the slot creation",
        Duration::from_secs(30),
        holder.batch_execute("COMMIT"),
    )
    .await
    .unwrap();
}

/// The `delay_ms` of every "pipeline session ended; reconnecting" line of `log`, in order.
fn reconnect_delays_ms(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|line| line.contains("pipeline session ended; reconnecting"))
        .filter_map(|line| {
            let (_, rest) = line.split_once("delay_ms=")?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// A session that fails right after every start (here: the broker is unreachable
/// and each record times out after 1 s, before anything is confirmed) is retried after a
/// growing delay, not about every second, and `/readyz` and
/// `outbox_relay_consecutive_failed_sessions` show the recurring error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_failing_after_every_start_backs_off_further_and_readyz_shows_it() {
    let name = unique_name("recurring");
    let setup = Setup {
        db: pg().create_database(&name).await,
        slot: format!("{name}_slot"),
        types: vec![format!("Order_{name}")],
    };
    let bootstrap = format!("127.0.0.1:{}", support::free_port());
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&bootstrap, Auth::Trust);
    args.extend(
        [
            "--metrics-listen",
            &metrics,
            "--kafka-property",
            "message.timeout.ms=1000",
        ]
        .map(String::from),
    );
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    write_events(&setup.db.client, 1, 1, &setup.types, 1, 0, Duration::ZERO).await;
    let delays = wait_for(
        "four restarts of the session that fails after every start",
        Duration::from_secs(90),
        || {
            let delays = reconnect_delays_ms(&relay.log());
            async move { (delays.len() >= 4).then_some(delays) }
        },
    )
    .await;
    // 1, 2, 4, 8 s plus up to as much again of jitter; reset at every start it was 1 to 2 s.
    for (i, least) in [1_000, 2_000, 4_000, 8_000].into_iter().enumerate() {
        assert!(
            delays[i] >= least,
            "restart {i} after {} ms, expected at least {least} ms (delays {delays:?}):\n{}",
            delays[i],
            relay.log()
        );
    }
    let series = format!(
        "outbox_relay_consecutive_failed_sessions{{pipeline=\"{}\"}}",
        setup.slot
    );
    let text = support::scrape_metrics(&metrics).await;
    assert!(
        metric_value(&text, &series) >= 4.0,
        "{series} after four failed sessions:\n{text}"
    );
    let (status, body) = support::within(
        "GET /readyz",
        Duration::from_secs(10),
        http_get(&metrics, "/readyz"),
    )
    .await
    .expect("GET /readyz");
    let json: serde_json::Value = serde_json::from_str(&body).expect("/readyz JSON");
    let pipeline = &json["pipelines"][&setup.slot];
    assert!(
        pipeline["consecutive_failed_sessions"].as_u64() >= Some(4),
        "/readyz ({status}) after four failed sessions: {body}"
    );
    assert!(
        pipeline["last_error"]
            .as_str()
            .is_some_and(|e| e.contains(&format!("{}.events", setup.types[0]))),
        "/readyz names the failing delivery: {body}"
    );
    relay.sigterm();
    let status = relay.wait(Duration::from_secs(40));
    assert!(
        status.success(),
        "relay exited with {status}:\n{}",
        relay.log()
    );
}

/// `run` against a server with `wal_level = replica` stops at once with the sentence `check`
/// prints and the configuration exit code, instead of retrying the slot creation forever
/// under a connection error; so does `setup`, before it creates anything (the slot
/// creation's own refusal, SQLSTATE 55000, would count as transient: exit 1, retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_stops_on_wal_level_replica_with_checks_advice_and_exit_code_3() {
    let cluster = support::PgCluster::start_private(&unique_name("replica_wal"));
    cluster.psql("postgres", "ALTER SYSTEM SET wal_level = replica");
    cluster.restart("fast");
    let args: Vec<String> = [
        "run",
        "--source-url",
        &cluster.url("postgres", Auth::Trust),
        "--slot",
        "replica_wal_slot",
        "--bootstrap-servers",
        &kafka().bootstrap(),
    ]
    .map(String::from)
    .to_vec();
    let mut relay = Relay::spawn(&args);
    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert_eq!(status.code(), Some(3), "relay exited with {status}:\n{log}");
    assert!(
        log.contains("wal_level is replica: set wal_level = logical")
            && log.contains("restart PostgreSQL"),
        "{log}"
    );

    let kit = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/outbox.sql");
    cluster.psql("postgres", &std::fs::read_to_string(kit).unwrap());
    let mut setup_args = args.clone();
    setup_args = crate::as_command(&setup_args, "setup");
    let mut setup = Relay::spawn(&setup_args);
    let status = setup.wait(Duration::from_secs(60));
    let log = setup.log();
    assert_eq!(status.code(), Some(3), "setup exited with {status}:\n{log}");
    assert!(
        log.contains("wal_level is replica: set wal_level = logical"),
        "{log}"
    );
}

/// A missing outbox table is named as missing, with what creates it, not as a table to add
/// to the publication.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_names_a_missing_outbox_table_as_missing() {
    let setup = Setup::new("no_table", &["Order"], 1).await;
    setup
        .db
        .client
        .batch_execute("DROP TABLE public.outbox")
        .await
        .unwrap();
    let mut relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert_eq!(status.code(), Some(3), "relay exited with {status}:\n{log}");
    assert!(
        log.contains(
            "table public.outbox does not exist in this database: create it (sql/outbox.sql)"
        ),
        "{log}"
    );
}

/// Records the pipeline `pipeline` had acknowledged, over every topic, from a `/metrics` text.
fn published_by(text: &str, pipeline: &str) -> f64 {
    let prefix = format!("outbox_relay_events_published_total{{pipeline=\"{pipeline}\",");
    text.lines()
        .filter(|line| line.starts_with(&prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// With `on_pipeline_failure = "retry"`, a pipeline whose publication leaves out the outbox
/// table stops at its start; once the table is added to the publication, its next start
/// streams and delivers, as a new process would: the publication checks that saw the table
/// missing while it was failed do not stop it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_retry_a_pipeline_failed_on_its_publication_streams_once_the_table_is_added() {
    let setup = Setup::new("fail_pub", &["Order"], 1).await;
    let c = &setup.db.client;
    c.batch_execute("CREATE PUBLICATION billing_pub")
        .await
        .unwrap();
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let url = setup.db.url(Auth::Trust);
    let toml = format!(
        "on_pipeline_failure = \"retry\"\n[kafka]\nbootstrap_servers = \"{}\"\n[metrics]\nlisten = \"{metrics}\"\n\
         [[pipelines]]\nname = \"good\"\nsource_url = \"{url}\"\nslot = \"{slot}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\n\
         [[pipelines]]\nname = \"billing\"\nsource_url = \"{url}\"\nslot = \"{slot}_billing\"\npublication = \"billing_pub\"\ntable = \"public.outbox\"\n",
        kafka().bootstrap(),
        slot = setup.slot,
    );
    let (_dir, args) = run_with_config(&toml);
    let mut relay = Relay::spawn(&args);
    wait_for(
        "/readyz to show billing failed on its publication",
        Duration::from_secs(60),
        || async {
            let (_, body) = http_get(&metrics, "/readyz").await?;
            let readiness: serde_json::Value = serde_json::from_str(&body).ok()?;
            let billing = &readiness["pipelines"]["billing"];
            (billing["state"] == "failed"
                && billing["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("billing_pub")))
            .then_some(())
        },
    )
    .await;
    // Not a wait for an outcome, and nothing is asserted on its length: it lets the
    // publication checks (every 2 s while the pipeline waits to start again) see the
    // publication without the table, the case under test, before the table is added.
    tokio::time::sleep(Duration::from_secs(5)).await;
    c.batch_execute("ALTER PUBLICATION billing_pub ADD TABLE outbox")
        .await
        .unwrap();
    // The failed pipeline starts again after a minute.
    let billing_slot = format!("{}_billing", setup.slot);
    wait_for(
        "the billing pipeline to stream from its slot after its failed start",
        Duration::from_secs(120),
        || async {
            c.query_opt(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active",
                &[&billing_slot],
            )
            .await
            .ok()?
            .map(|_| ())
        },
    )
    .await;
    write_events(c, 2, 2, &setup.types, 1, 0, Duration::ZERO).await;
    wait_for(
        "the billing pipeline to deliver the 4 events written after its new start",
        Duration::from_secs(60),
        || async {
            let (_, text) = http_get(&metrics, "/metrics").await?;
            (published_by(&text, "billing") >= 4.0).then_some(())
        },
    )
    .await;
    let (_, text) = http_get(&metrics, "/metrics").await.unwrap();
    assert_eq!(
        metric_value(
            &text,
            "outbox_relay_pipeline_state{pipeline=\"billing\",state=\"streaming\"}"
        ),
        1.0,
        "{text}"
    );
    let log = relay.log();
    assert!(
        !log.contains("the publication changed while streaming"),
        "{}",
        support::tail_lines(&log, 30)
    );
    relay.sigterm();
    let status = relay.wait(Duration::from_secs(40));
    assert_eq!(status.code(), Some(0), "{}", relay.log());
}
