use std::collections::HashMap;
use std::time::Duration;

use crate::support::{self, parse_lsn, pg, wait_for, within, Auth, Relay};
use crate::{assert_delivered, header, write_events, Setup};

const CHECKPOINT_TOPIC: &str = "outbox-relay.checkpoints";

/// A mock Kafka cluster with the checkpoint topic (3 partitions) and `<type>.events` topics.
fn mock_cluster(
    types: &[String],
    partitions: i32,
) -> rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext> {
    let mock = rdkafka::mocking::MockCluster::new(1).expect("creating a librdkafka mock cluster");
    mock.create_topic(CHECKPOINT_TOPIC, 3, 1).unwrap();
    for t in types {
        mock.create_topic(&format!("{t}.events"), partitions, 1)
            .unwrap();
    }
    mock
}

/// The checkpoint LSNs of `pipeline` in the order the relay committed them (one key lives in
/// one partition, and consumed records are in offset order per partition).
async fn checkpoints(bootstrap: &str, pipeline: &str, expected: usize) -> Vec<u64> {
    checkpoint_values(bootstrap, pipeline, expected)
        .await
        .iter()
        .map(|v| checkpoint_lsn(v))
        .collect()
}

/// Writes `value` as the checkpoint of `pipeline`, with the relay's partitioner (so that the
/// key stays in one partition) and its mark (format 2, the default transactional id).
async fn write_checkpoint(bootstrap: &str, pipeline: &str, value: &str) {
    use rdkafka::message::{Header, OwnedHeaders};
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("partitioner", "murmur2_random")
        .create()
        .unwrap();
    producer
        .send(
            rdkafka::producer::FutureRecord::to(CHECKPOINT_TOPIC)
                .key(pipeline)
                .payload(value)
                .headers(
                    OwnedHeaders::new()
                        .insert(Header {
                            key: "outbox_relay_checkpoint_format",
                            value: Some("2"),
                        })
                        .insert(Header {
                            key: "outbox_relay_transactional_id",
                            value: Some(&format!("outbox-relay-{pipeline}")),
                        }),
                ),
            Duration::from_secs(10),
        )
        .await
        .expect("writing the checkpoint");
}

/// Reads `topics` as [`support::consume`] does, with `isolation.level=read_committed`.
async fn read_committed(
    bootstrap: &str,
    topics: &[&str],
    expected: usize,
    settle: Duration,
    deadline: Duration,
) -> Vec<support::Consumed> {
    support::consume_with(
        bootstrap,
        topics,
        expected,
        settle,
        deadline,
        &[("isolation.level", "read_committed")],
    )
    .await
}

/// The checkpoint values of `pipeline` as written, in the order the relay committed them.
async fn checkpoint_values(bootstrap: &str, pipeline: &str, expected: usize) -> Vec<String> {
    let records = read_committed(
        bootstrap,
        &[CHECKPOINT_TOPIC],
        expected,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    records
        .iter()
        .filter(|r| r.key.as_deref() == Some(pipeline.as_bytes()))
        .map(|r| r.value_str().expect("checkpoint value"))
        .collect()
}

/// The LSN of a checkpoint record's value: JSON with `"lsn"` (format version 2).
fn checkpoint_lsn(value: &str) -> u64 {
    let json: serde_json::Value = serde_json::from_str(value).expect("checkpoint JSON");
    assert_eq!(json["version"], 2, "{value}");
    parse_lsn(json["lsn"].as_str().expect("checkpoint lsn"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_checkpoint_ahead_of_the_slot_passes_over_what_kafka_has() {
    let setup = Setup::new("eos_skip", &[], 1).await;
    let types = vec![format!("Order_{}", setup.db.name)];
    let mock = mock_cluster(&types, 2);
    let bootstrap = mock.bootstrap_servers();
    let mut args = setup.relay_args(&bootstrap, Auth::Trust);
    args.push("--exactly-once".into());
    let c = &setup.db.client;

    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (mut expected, before) = write_events(c, 2, 3, &types, 2, 0, Duration::ZERO).await;
    setup
        .wait_confirmed_past(
            before[1],
            "the first two transactions",
            Duration::from_secs(60),
        )
        .await;
    assert!(
        relay.log().contains("checkpoint_lsn=none"),
        "a first start finds no checkpoint"
    );
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());

    // While the relay is down: transactions A and B, a checkpoint at B's end (as if their
    // Kafka transactions committed and the relay died before confirming the slot), then C.
    let (skipped, _) = write_events(c, 2, 3, &types, 2, 6, Duration::ZERO).await;
    let checkpoint = setup.db.current_wal_insert_lsn().await;
    let (last, before_last) = write_events(c, 1, 3, &types, 2, 12, Duration::ZERO).await;
    expected.extend(last);
    let system_id: i64 = setup
        .db
        .query_one_value("SELECT system_identifier FROM pg_control_system()")
        .await;
    write_checkpoint(
        &bootstrap,
        &setup.slot,
        &format!(
            r#"{{"version":2,"lsn":"{}","system_id":"{system_id}","timeline":1,"slot":"{}"}}"#,
            support::pg::format_lsn(checkpoint),
            setup.slot
        ),
    )
    .await;

    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut with_metrics = args.clone();
    with_metrics.extend(["--metrics-listen".to_owned(), metrics.clone()]);
    let relay = Relay::spawn(&with_metrics);
    setup
        .wait_confirmed_past(
            before_last[0],
            "confirmed_flush_lsn past transaction C",
            Duration::from_secs(60),
        )
        .await;
    let consumed = support::consume_with(
        &bootstrap,
        &[&format!("{}.events", types[0])],
        expected.len(),
        Duration::from_secs(2),
        Duration::from_secs(60),
        &[("isolation.level", "read_committed")],
    )
    .await;
    for s in &skipped {
        assert!(
            !consumed
                .iter()
                .any(|r| header(r, "id") == Some(s.id.as_bytes())),
            "event {} of a transaction at or below the checkpoint was published again",
            s.id
        );
    }
    assert_delivered(&expected, &consumed, true);
    // The events passed over are counted as such; C's Kafka transaction as committed.
    let text = support::scrape_metrics(&metrics).await;
    let series = |name: &str, label: &str| {
        support::metric_value(
            &text,
            &format!("{name}{{{label},pipeline=\"{}\"}}", setup.slot),
        )
    };
    assert_eq!(
        series(
            "outbox_relay_messages_skipped_total",
            "kind=\"checkpointed\""
        ),
        skipped.len() as f64,
        "{text}"
    );
    assert_eq!(
        series(
            "outbox_relay_kafka_transactions_total",
            "outcome=\"committed\""
        ),
        1.0,
        "C's Kafka transaction, the second relay's only one:\n{text}"
    );
    assert!(
        !text.contains("outcome=\"aborted\""),
        "a Kafka transaction aborted:\n{text}"
    );
    assert!(
        relay.log().contains(&format!(
            "checkpoint_lsn={}",
            support::pg::format_lsn(checkpoint)
        )),
        "the start line names the checkpoint found:\n{}",
        relay.log()
    );
    // The first relay's checkpoints (its two transactions in one Kafka transaction or two),
    // the test's, then C's.
    let values = checkpoint_values(&bootstrap, &setup.slot, 3).await;
    let lsns: Vec<u64> = values.iter().map(|v| checkpoint_lsn(v)).collect();
    assert!(lsns.len() == 3 || lsns.len() == 4, "{lsns:?}");
    let n = lsns.len();
    assert!(
        lsns[n - 3] > before[1],
        "the first relay's last checkpoint: {lsns:?}"
    );
    assert_eq!(lsns[n - 2], checkpoint);
    assert!(
        lsns[n - 1] > before_last[0] && lsns[n - 1] > checkpoint,
        "{lsns:?}"
    );
    // C's commit wrote the relay's format with this source's origin.
    assert_eq!(
        values[n - 1],
        format!(
            r#"{{"version":2,"lsn":"{}","system_id":"{system_id}","timeline":1,"slot":"{}"}}"#,
            support::pg::format_lsn(lsns[n - 1]),
            setup.slot
        )
    );

    // `check` reads the checkpoint as the relay does, and names a missing checkpoint topic.
    let mut check_args = args.clone();
    check_args = crate::as_command(&check_args, "check");
    let mut check = Relay::spawn(&check_args);
    let status = check.wait(Duration::from_secs(60));
    let out = check.log();
    assert!(status.success(), "check exited with {status}:\n{out}");
    assert!(
        out.lines().any(|l| l.starts_with("  ok    checkpoint")
            && l.ends_with(&format!(
                "{CHECKPOINT_TOPIC}: last checkpoint {} (the topic must have cleanup.policy=compact)",
                support::pg::format_lsn(lsns[n - 1])
            ))),
        "{out}"
    );
    check_args.extend(["--checkpoint-topic".into(), "no.such.topic".into()]);
    let mut check = Relay::spawn(&check_args);
    assert!(!check.wait(Duration::from_secs(60)).success());
    let out = check.log();
    assert!(
        out.contains("checkpoint topic \"no.such.topic\" does not exist: create it with cleanup.policy=compact"),
        "{out}"
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_kill_9_at_random_moments_commits_each_transaction_once() {
    let setup = Setup::new("eos_kill9", &[], 1).await;
    let types: Vec<String> = ["Order", "Payment"]
        .iter()
        .map(|t| format!("{t}_{}", setup.db.name))
        .collect();
    let mock = mock_cluster(&types, 3);
    let bootstrap = mock.bootstrap_servers();
    let mut args = setup.relay_args(&bootstrap, Auth::Trust);
    args.push("--exactly-once".into());
    let mut rng = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("exactly-once kill -9 test seed {rng}");
    let mut random = move |below: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % below
    };

    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    // 200 transactions of 10 events (5 keys per type), written while the relay is killed.
    let writer_db = pg().connect(&setup.db.name, Auth::Trust).await;
    let writer_types = types.clone();
    let writer = tokio::spawn(async move {
        write_events(
            &writer_db,
            200,
            10,
            &writer_types,
            5,
            0,
            Duration::from_millis(10),
        )
        .await
    });
    let mut logs = Vec::new();
    let kills = 4;
    for round in 0..kills {
        tokio::time::sleep(Duration::from_millis(200 + random(600))).await;
        relay.kill();
        logs.push(relay.log());
        setup
            .wait_released(&format!("kill -9 number {round}"))
            .await;
        relay = Relay::spawn(&args);
        relay
            .wait_for_log("exactly-once mode", Duration::from_secs(60))
            .await;
    }
    let (written, before_commit) = within(
        "the writer's 2,000 events",
        Duration::from_secs(120),
        writer,
    )
    .await
    .unwrap();
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "confirmed_flush_lsn past the last commit",
            Duration::from_secs(120),
        )
        .await;
    logs.push(relay.log());

    // Each PostgreSQL transaction was committed to Kafka once, in a batch of consecutive
    // ones: the checkpoints (one per Kafka transaction, its last PostgreSQL transaction's
    // end) in commit order, each between a COMMIT's start and the next transaction's, the
    // last one past the last transaction.
    let lsns = checkpoints(&bootstrap, &setup.slot, 1).await;
    assert!(
        lsns.windows(2).all(|w| w[0] < w[1]),
        "checkpoints not strictly increasing (a transaction committed twice): {lsns:X?}"
    );
    assert!(
        !lsns.is_empty() && lsns.len() <= before_commit.len(),
        "{} checkpoints for {} transactions",
        lsns.len(),
        before_commit.len()
    );
    for lsn in &lsns {
        let i = before_commit
            .iter()
            .rposition(|before| before < lsn)
            .unwrap_or_else(|| panic!("checkpoint {lsn:X} is before the first transaction"));
        let next = before_commit.get(i + 1).copied().unwrap_or(u64::MAX);
        assert!(
            *lsn <= next,
            "checkpoint {lsn:X} is not transaction {i}'s end ({:X}..{next:X})",
            before_commit[i]
        );
    }
    assert!(
        lsns.last().unwrap() > before_commit.last().unwrap(),
        "the last checkpoint is not past the last transaction: {lsns:X?}"
    );

    let topics: Vec<String> = types.iter().map(|t| format!("{t}.events")).collect();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let consumed = support::consume_with(
        &bootstrap,
        &topics,
        written.len(),
        Duration::from_secs(2),
        Duration::from_secs(60),
        &[("isolation.level", "read_committed")],
    )
    .await;
    assert_delivered(&written, &consumed, false);
    // Duplicates only from the one Kafka transaction each kill left open (aborted; on a broker
    // with transactions invisible to this consumer): a batch of consecutive transactions, so
    // at most one run of consecutive transactions per kill.
    let txn_of: HashMap<&str, usize> = written
        .iter()
        .enumerate()
        .map(|(i, w)| (w.id.as_str(), i / 10))
        .collect();
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for r in &consumed {
        *copies
            .entry(std::str::from_utf8(header(r, "id").unwrap()).unwrap())
            .or_default() += 1;
    }
    let mut duplicated_txns: Vec<usize> = copies
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| txn_of[id])
        .collect();
    duplicated_txns.sort_unstable();
    duplicated_txns.dedup();
    let runs = 1 + duplicated_txns
        .windows(2)
        .filter(|w| w[1] != w[0] + 1)
        .count();
    assert!(
        duplicated_txns.is_empty() || runs <= kills,
        "events of {runs} runs of transactions published twice after {kills} kills: {duplicated_txns:?}"
    );
    let uncommitted = support::consume_with(
        &bootstrap,
        &topics,
        written.len(),
        Duration::from_secs(2),
        Duration::from_secs(60),
        &[("isolation.level", "read_uncommitted")],
    )
    .await;
    let passed_over = logs
        .iter()
        .filter(|l| l.contains("checkpoint_lsn=") && !l.contains("checkpoint_lsn=none"))
        .count();
    eprintln!(
        "{} events; read_committed saw {} records, read_uncommitted {}; transactions with \
         duplicates (aborted on a real broker): {duplicated_txns:?}; restarts that found a \
         checkpoint: {passed_over} of {}",
        written.len(),
        consumed.len(),
        uncommitted.len(),
        logs.len()
    );
    assert!(
        logs.last().unwrap().contains("checkpoint_lsn=")
            && !logs.last().unwrap().contains("checkpoint_lsn=none"),
        "the last restart found a checkpoint"
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_slot_waits_for_the_kafka_commit_and_a_failed_commit_is_aborted() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let setup = Setup::new("eos_commit", &[], 1).await;
    let types = vec![format!("Order_{}", setup.db.name)];
    let topic = format!("{}.events", types[0]);
    let mock = mock_cluster(&types, 1);
    let bootstrap = mock.bootstrap_servers();
    let mut args = setup.relay_args(&bootstrap, Auth::Trust);
    args.push("--exactly-once".into());
    let c = &setup.db.client;
    let mut relay = streaming_exactly_once(&setup, &args).await;
    let (mut written, before) = write_events(c, 1, 3, &types, 1, 0, Duration::ZERO).await;
    setup
        .wait_confirmed_past(before[0], "the first transaction", Duration::from_secs(60))
        .await;

    // The coordinator answers the next commits "loading" for a while (librdkafka retries
    // twice per commit call, the relay calls again): the records are in the log, the slot
    // must stay before the transaction until the commit went through.
    mock.request_errors(
        RDKafkaApiKey::EndTxn,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS; 12],
    );
    let witness = setup.witness().await;
    let (more, _) = write_events(c, 1, 3, &types, 1, 3, Duration::ZERO).await;
    let pending_commit = setup.commit_end_of(&witness, &more[0].id).await;
    written.extend(more);
    support::consume_with(
        &bootstrap,
        &[&topic],
        6,
        Duration::ZERO,
        Duration::from_secs(30),
        &[("isolation.level", "read_uncommitted")],
    )
    .await;
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed < pending_commit,
        "slot confirmed at {confirmed:X}, the end of a transaction whose Kafka commit is pending ({pending_commit:X})"
    );
    setup
        .wait_confirmed_past(
            before[0],
            "the slot to pass the transaction once its commit went through",
            Duration::from_secs(60),
        )
        .await;
    let lsns = checkpoints(&bootstrap, &setup.slot, 2).await;
    assert_eq!(
        lsns.len(),
        2,
        "one checkpoint per transaction, also when the commit was retried: {lsns:?}"
    );

    // A commit that fails for good (unknown producer id: abortable): the relay aborts the
    // Kafka transaction and starts a new session from the slot.
    mock.request_errors(
        RDKafkaApiKey::EndTxn,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID],
    );
    let (more, before) = write_events(c, 1, 3, &types, 1, 6, Duration::ZERO).await;
    written.extend(more);
    relay
        .wait_for_log("open kafka transaction aborted", Duration::from_secs(60))
        .await;
    setup
        .wait_confirmed_past(
            before[0],
            "the slot to pass the transaction after the abort and a new session",
            Duration::from_secs(60),
        )
        .await;
    let consumed = read_committed(
        &bootstrap,
        &[&topic],
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
    .await;
    assert_delivered(&written, &consumed, false);
    drop(relay);
}

/// The relay started with `args`, once its exactly-once session streams.
async fn streaming_exactly_once(setup: &Setup, args: &[String]) -> Relay {
    let mut relay = Relay::spawn(args);
    setup.wait_streaming().await;
    relay
        .wait_for_log("exactly-once mode", Duration::from_secs(60))
        .await;
    relay
}

/// `run --exactly-once` arguments for the relay of `setup` with `bootstrap`.
fn eos_args(setup: &Setup, bootstrap: &str) -> Vec<String> {
    let mut args = setup.relay_args(bootstrap, Auth::Trust);
    args.push("--exactly-once".into());
    args
}

/// A checkpoint is only good for the WAL history it was written in. The
/// pipeline's checkpoint comes from the shared cluster; then the same pipeline name is pointed
/// at a fresh cluster, whose events have LSNs below that checkpoint. The relay must refuse
/// (naming what to do) and confirm nothing, instead of passing the events over as committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_refuses_a_checkpoint_of_another_cluster_and_confirms_nothing() {
    let fresh = support::PgCluster::start_private(&support::unique_name("eosorigin"));
    let fresh_name = support::unique_name("eos_fresh");
    let fresh_db = fresh.create_database(&fresh_name).await;
    let fresh_lsn = fresh_db.current_wal_insert_lsn().await;

    let setup = Setup::new("eos_origin", &[], 1).await;
    let types = vec![format!("Order_{}", setup.db.name)];
    let mock = mock_cluster(&types, 1);
    let bootstrap = mock.bootstrap_servers();
    let c = &setup.db.client;
    // The shared cluster's WAL well past the fresh one's (16 MB per segment switch).
    while setup.db.current_wal_insert_lsn().await < fresh_lsn + (32 << 20) {
        within(
            "a WAL segment switch",
            support::QUERY_DEADLINE,
            c.batch_execute(
                "SELECT pg_logical_emit_message(false, 'eos_origin', 'x'); SELECT pg_switch_wal()",
            ),
        )
        .await
        .unwrap();
    }
    let args = eos_args(&setup, &bootstrap);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (_, before) = write_events(c, 1, 2, &types, 1, 0, Duration::ZERO).await;
    setup
        .wait_confirmed_past(
            before[0],
            "the checkpointed transaction",
            Duration::from_secs(60),
        )
        .await;
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());
    let checkpoint = checkpoints(&bootstrap, &setup.slot, 1).await[0];

    // The fresh cluster: its slot, then events below the checkpoint, then the relay under the
    // same pipeline name.
    let fresh_slot = format!("{fresh_name}_slot");
    let slot_lsn = parse_lsn(&fresh_db.create_slot(&fresh_slot).await);
    let fresh_types = vec![format!("Order_{fresh_name}")];
    mock.create_topic(&format!("{}.events", fresh_types[0]), 1, 1)
        .unwrap();
    let (_, fresh_commits) =
        write_events(&fresh_db.client, 3, 2, &fresh_types, 1, 0, Duration::ZERO).await;
    let last_fresh = *fresh_commits.last().unwrap();
    assert!(
        last_fresh < checkpoint,
        "the fresh cluster's events ({last_fresh:X}) must be below the checkpoint ({checkpoint:X})"
    );
    // The same pipeline name, the fresh database and slot.
    let mut fresh_args = args.clone();
    assert_eq!(
        (&*fresh_args[1], &*fresh_args[3]),
        ("--source-url", "--slot")
    );
    fresh_args[2] = fresh_db.url(Auth::Trust);
    fresh_args[4] = fresh_slot.clone();
    let mut relay = Relay::spawn(&fresh_args);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        let confirmed = fresh_db
            .confirmed_flush_lsn_u64(&fresh_slot)
            .await
            .unwrap_or(0);
        assert!(
            confirmed <= last_fresh,
            "the relay confirmed the fresh cluster's slot at {confirmed:X}, past its events \
             (last commit after {last_fresh:X}), which it passed over by another cluster's \
             checkpoint {checkpoint:X}:\n{}",
            relay.log()
        );
        if let Some(status) = relay.try_status() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after 60 s waiting for the relay to refuse the other cluster's checkpoint and exit:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let log = relay.log();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "checkpoint of pipeline \"{}\" in topic \"{CHECKPOINT_TOPIC}\" does not belong to this source",
            setup.slot
        )) && log.contains("(another cluster)")
            && log.contains("delete its checkpoint"),
        "{log}"
    );
    assert_eq!(
        fresh_db.confirmed_flush_lsn_u64(&fresh_slot).await,
        Some(slot_lsn),
        "the refused relay confirmed something"
    );
}

/// With `on_bad_event = "dead_letter"`, a record the broker refuses for
/// good leaves the Kafka transaction abortable only. The relay aborts it and redoes the
/// PostgreSQL transaction with that event in the dead-letter topic: the copy arrives, the
/// other events arrive once in the read_committed view, and the slot moves past.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_dead_letters_a_refused_record_in_the_redone_transaction() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let setup = Setup::new("eos_dlq", &[], 1).await;
    let types = vec![format!("Order_{}", setup.db.name)];
    let topic = format!("{}.events", types[0]);
    let dlq = format!("{}.dead-letter", setup.slot);
    let mock = mock_cluster(&types, 1);
    mock.create_topic(&dlq, 1, 1).unwrap();
    let bootstrap = mock.bootstrap_servers();
    let toml = format!(
        r#"
[kafka]
bootstrap_servers = "{bootstrap}"

[[pipelines]]
name = "{slot}"
source_url = "{url}"
slot = "{slot}"
publication = "outbox_pub"
table = "public.outbox"
exactly_once = true
on_bad_event = "dead_letter"
dead_letter_topic = "{dlq}"
"#,
        url = setup.db.url(Auth::Trust),
        slot = setup.slot,
    );
    let (_dir, args) = crate::run_with_config(&toml);
    let mut relay = streaming_exactly_once(&setup, &args).await;
    let c = &setup.db.client;
    let (mut expected, before) = write_events(c, 1, 2, &types, 1, 0, Duration::ZERO).await;
    setup
        .wait_confirmed_past(before[0], "the first transaction", Duration::from_secs(60))
        .await;

    // The broker refuses the next produce request for good: the one with the next
    // transaction's only record.
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    let (refused, _) = write_events(c, 1, 1, &types, 1, 2, Duration::ZERO).await;
    let (more, before_last) = write_events(c, 1, 2, &types, 1, 3, Duration::ZERO).await;
    expected.extend(more);

    let dead = read_committed(
        &bootstrap,
        &[&dlq],
        1,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(dead.len(), 1, "one dead-letter copy");
    assert_eq!(
        dead[0].header_str("id").as_deref(),
        Some(refused[0].id.as_str())
    );
    assert_eq!(
        dead[0].header_str("outbox_relay_topic").as_deref(),
        Some(topic.as_str())
    );
    assert!(
        dead[0]
            .header_str("outbox_relay_error")
            .is_some_and(|e| e.contains("too large")),
        "{:?}",
        dead[0].header_str("outbox_relay_error")
    );
    setup
        .wait_confirmed_past(
            before_last[0],
            "the slot to pass the redone transaction and the next",
            Duration::from_secs(60),
        )
        .await;
    let consumed = read_committed(
        &bootstrap,
        &[&topic],
        expected.len(),
        Duration::from_secs(2),
        Duration::from_secs(30),
    )
    .await;
    assert_delivered(&expected, &consumed, true);
    let log = relay.log();
    assert!(
        log.contains("its transaction was aborted and is redone") && log.contains(&refused[0].id),
        "{log}"
    );
    assert!(relay.is_running(), "{log}");
}

/// A stop while the exactly-once start waits for a
/// transaction coordinator that never answers (librdkafka's init call: up to 60 s) ends the
/// relay within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_the_exactly_once_start_ends_the_relay_within_seconds() {
    let setup = Setup::new("eos_stop", &[], 1).await;
    // Nothing listens there: the coordinator is never found.
    let closed = format!("127.0.0.1:{}", support::free_port());
    let args = eos_args(&setup, &closed);
    let mut relay = Relay::spawn(&args);
    // START_REPLICATION is done: the exactly-once start comes next.
    setup.wait_streaming().await;
    relay
        .wait_for_log("Connection refused", Duration::from_secs(30))
        .await;
    let stop = std::time::Instant::now();
    relay.sigterm();
    let status = relay.wait(Duration::from_secs(10));
    assert!(status.success(), "exited with {status}:\n{}", relay.log());
    assert!(
        relay.log().contains("stopped during session set-up"),
        "{}",
        relay.log()
    );
    eprintln!("stopped {:?} after SIGTERM", stop.elapsed());
}

/// A streaming standby of a private cluster (`pg_basebackup -R`) on a port of its own,
/// stopped (`-m immediate`) when dropped.
struct Standby<'a> {
    cluster: &'a support::PgCluster,
    data: std::path::PathBuf,
    port: u16,
}

impl<'a> Standby<'a> {
    fn start(cluster: &'a support::PgCluster) -> Standby<'a> {
        let dir = cluster
            .data_dir()
            .parent()
            .expect("the cluster's directory");
        let standby = Standby {
            cluster,
            data: dir.join("standby"),
            port: support::free_port(),
        };
        standby.run(
            "pg_basebackup",
            &[
                "-D",
                &standby.data.display().to_string(),
                "-R",
                "--checkpoint=fast",
                "-X",
                "stream",
                "-h",
                "127.0.0.1",
                "-p",
                &cluster.port().to_string(),
                "-U",
                "postgres",
            ],
        );
        let log = dir.join("standby.log").display().to_string();
        let port = format!("-p {}", standby.port);
        standby.pg_ctl(&["start", "-w", "-t", "60", "-l", &log, "-o", &port]);
        standby
    }

    fn run(&self, prog: &str, args: &[&str]) {
        let mut cmd = self.cluster.command(prog);
        cmd.args(args);
        let out = support::run_within(cmd, Duration::from_secs(90));
        assert!(
            out.status.success(),
            "{prog} {args:?}: {}\n{}",
            out.stdout,
            out.stderr
        );
    }

    fn pg_ctl(&self, args: &[&str]) {
        let data = self.data.display().to_string();
        let mut all = args.to_vec();
        all.extend(["-D", &data]);
        self.run("pg_ctl", &all);
    }

    fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    async fn connect(&self, db: &str) -> tokio_postgres::Client {
        let (client, connection) = within(
            "connecting to the standby",
            support::QUERY_DEADLINE,
            tokio_postgres::connect(&self.url(db), tokio_postgres::NoTls),
        )
        .await
        .unwrap();
        tokio::spawn(connection);
        client
    }
}

impl Drop for Standby<'_> {
    fn drop(&mut self) {
        let mut cmd = self.cluster.command("pg_ctl");
        cmd.args(["stop", "-m", "immediate", "-D"]).arg(&self.data);
        let _ = support::run_within(cmd, Duration::from_secs(60));
    }
}

/// A legitimate failover: a promoted standby of the same cluster has the
/// same system identifier and timeline 2. The checkpoint written on timeline 1 before the
/// switch point is accepted (and the next one written with timeline 2); one on timeline 1
/// past the switch point is refused, read from the server's real `TIMELINE_HISTORY`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_after_a_failover_takes_a_checkpoint_before_the_switch_point_and_refuses_one_past_it(
) {
    let cluster = support::PgCluster::start_private(&support::unique_name("eosfailover"));
    let name = support::unique_name("eos_failover");
    let setup = Setup {
        db: cluster.create_database(&name).await,
        slot: format!("{name}_slot"),
        types: vec![format!("Order_{name}")],
    };
    let types = setup.types.clone();
    let topic = format!("{}.events", types[0]);
    let mock = mock_cluster(&types, 1);
    let bootstrap = mock.bootstrap_servers();
    let args = eos_args(&setup, &bootstrap);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (mut written, before) =
        write_events(&setup.db.client, 1, 2, &types, 1, 0, Duration::ZERO).await;
    setup
        .wait_confirmed_past(before[0], "the first transaction", Duration::from_secs(60))
        .await;
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());
    let first = checkpoints(&bootstrap, &setup.slot, 1).await[0];

    // A standby that has replayed it, promoted: timeline 2, its own slot of the same name.
    let standby = Standby::start(&cluster);
    let primary_lsn = setup.db.current_wal_lsn().await;
    let client = standby.connect(&name).await;
    wait_for(
        "the standby to replay the primary's WAL",
        Duration::from_secs(60),
        || async {
            let replayed: String = client
                .query_one("SELECT pg_last_wal_replay_lsn()::text", &[])
                .await
                .unwrap()
                .get(0);
            (parse_lsn(&replayed) >= primary_lsn).then_some(())
        },
    )
    .await;
    standby.pg_ctl(&["promote", "-w", "-t", "60"]);
    let history: String = client
        .query_one("SELECT pg_read_file('pg_wal/00000002.history')", &[])
        .await
        .unwrap()
        .get(0);
    let switch = parse_lsn(history.split_whitespace().nth(1).expect("the switch point"));
    assert!(
        first <= switch,
        "checkpoint {first:X} after the switch point {switch:X}"
    );
    client
        .query_one(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&setup.slot],
        )
        .await
        .unwrap();
    let (more, before) = write_events(&client, 1, 2, &types, 1, 2, Duration::ZERO).await;
    written.extend(more);

    let mut standby_args = args.clone();
    assert_eq!(standby_args[1], "--source-url");
    standby_args[2] = standby.url(&name);
    let mut relay = Relay::spawn(&standby_args);
    let confirmed = || async {
        let lsn: Option<String> = client
            .query_one(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&setup.slot],
            )
            .await
            .unwrap()
            .get(0);
        lsn.map_or(0, |l| parse_lsn(&l))
    };
    wait_for(
        "the slot on the promoted standby to pass its transaction",
        Duration::from_secs(60),
        || async { (confirmed().await > before[0]).then_some(()) },
    )
    .await;
    let log = relay.log();
    assert!(
        log.contains(&format!(
            "checkpoint_lsn={}",
            support::pg::format_lsn(first)
        )),
        "{log}"
    );
    let consumed = read_committed(
        &bootstrap,
        &[&topic],
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
    .await;
    assert_delivered(&written, &consumed, true);
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());
    let values = checkpoint_values(&bootstrap, &setup.slot, 2).await;
    let latest: serde_json::Value = serde_json::from_str(&values[1]).unwrap();
    assert_eq!(latest["timeline"], 2, "{values:?}");

    // A checkpoint of timeline 1 past the switch point: those transactions are not in this
    // server's history.
    let mut forged = latest.clone();
    forged["timeline"] = 1.into();
    forged["lsn"] = support::pg::format_lsn(switch + 0x1000).into();
    write_checkpoint(&bootstrap, &setup.slot, &forged.to_string()).await;
    let before_refusal = confirmed().await;
    let mut relay = Relay::spawn(&standby_args);
    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "past the point {} where this server's history left timeline 1",
            support::pg::format_lsn(switch)
        )),
        "{log}"
    );
    assert_eq!(
        confirmed().await,
        before_refusal,
        "the refused relay confirmed something"
    );
}

/// Batches: a backlog of 40 transactions written while the relay is down is committed in a
/// few Kafka transactions, each with the last PostgreSQL transaction's end as its
/// checkpoint. Then a crash between those Kafka commits and the slot's confirmation (the
/// slot put back where it stood before the backlog, as if the relay died before its status
/// update reached PostgreSQL): the next relay must pass over every transaction of every
/// batch by the checkpoint, so that a `read_committed` consumer sees each event once and none
/// is lost. A checkpoint at a batch's first transaction would publish the rest again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_commits_a_backlog_in_batches_and_a_crash_before_the_confirmation_publishes_nothing_again(
) {
    let setup = Setup::new("eos_batch", &[], 1).await;
    let types = vec![format!("Order_{}", setup.db.name)];
    let topic = format!("{}.events", types[0]);
    let mock = mock_cluster(&types, 2);
    let bootstrap = mock.bootstrap_servers();
    let args = eos_args(&setup, &bootstrap);
    let c = &setup.db.client;

    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (mut written, before) = write_events(c, 1, 3, &types, 4, 0, Duration::ZERO).await;
    setup
        .wait_confirmed_past(before[0], "the first transaction", Duration::from_secs(60))
        .await;
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());
    setup.wait_released("the SIGTERM").await;
    // Where the slot stands before the backlog, kept in a copy.
    let before_backlog = format!("{}_before_backlog", setup.slot);
    let copy = |from: &str, to: &str| {
        format!("SELECT slot_name::text FROM pg_copy_logical_replication_slot('{from}', '{to}')")
    };
    let _: String = setup
        .db
        .query_one_value(&copy(&setup.slot, &before_backlog))
        .await;

    let txns = 40;
    let (backlog, backlog_before_commit) =
        write_events(c, txns, 3, &types, 4, 3, Duration::ZERO).await;
    written.extend(backlog);
    let mut relay = Relay::spawn(&args);
    setup
        .wait_confirmed_past(
            *backlog_before_commit.last().unwrap(),
            "confirmed_flush_lsn past the backlog",
            Duration::from_secs(60),
        )
        .await;
    relay.sigterm();
    assert!(relay.wait(Duration::from_secs(40)).success());
    let first_log = relay.log();

    // The first transaction's checkpoint, then the backlog's batches: fewer Kafka
    // transactions than PostgreSQL transactions, each checkpoint a transaction's end, the
    // last one the backlog's end.
    let lsns = checkpoints(&bootstrap, &setup.slot, 2).await;
    assert!(
        lsns.windows(2).all(|w| w[0] < w[1]),
        "checkpoints not strictly increasing: {lsns:X?}"
    );
    let batches = &lsns[1..];
    assert!(
        !batches.is_empty() && batches.len() <= txns / 2,
        "{} Kafka transactions for {txns} PostgreSQL transactions written at once: {lsns:X?}",
        batches.len()
    );
    for lsn in batches {
        let i = backlog_before_commit
            .iter()
            .rposition(|before| before < lsn)
            .unwrap_or_else(|| panic!("checkpoint {lsn:X} is before the backlog"));
        let next = backlog_before_commit
            .get(i + 1)
            .copied()
            .unwrap_or(u64::MAX);
        assert!(
            *lsn <= next,
            "checkpoint {lsn:X} is not a transaction's end ({:X}..{next:X})",
            backlog_before_commit[i]
        );
    }
    assert!(
        *batches.last().unwrap() > *backlog_before_commit.last().unwrap(),
        "the last checkpoint is the last transaction's end: {lsns:X?}"
    );

    // The crash before the confirmation: the slot back before the backlog.
    setup.db.drop_slot(&setup.slot).await;
    let _: String = setup
        .db
        .query_one_value(&copy(&before_backlog, &setup.slot))
        .await;
    setup.db.drop_slot(&before_backlog).await;
    assert!(setup.confirmed_flush().await < backlog_before_commit[0]);
    let (last, last_before_commit) =
        write_events(c, 1, 3, &types, 4, 3 + 3 * txns, Duration::ZERO).await;
    written.extend(last);
    let relay = Relay::spawn(&args);
    setup
        .wait_confirmed_past(
            last_before_commit[0],
            "confirmed_flush_lsn past the transaction after the backlog",
            Duration::from_secs(60),
        )
        .await;
    assert!(
        relay.log().contains(&format!(
            "checkpoint_lsn={}",
            support::pg::format_lsn(*batches.last().unwrap())
        )),
        "the restart names the last batch's checkpoint:\n{}",
        relay.log()
    );
    let consumed = read_committed(
        &bootstrap,
        &[&topic],
        written.len(),
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &consumed, true);
    eprintln!(
        "{txns} transactions in {} Kafka transactions; first relay's log:\n{first_log}",
        batches.len()
    );
    drop(relay);
}

/// An exactly-once start that outlasts `wal_sender_timeout` (every request to the broker
/// slowed down: fencing, the checkpoint topic's watermarks and read take seconds) keeps its
/// walsender: status updates go out while the sink is set up. Without them the walsender
/// ended the stream after its timeout and the session's first read failed (a start that
/// always took that long never streamed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_start_longer_than_wal_sender_timeout_keeps_its_walsender() {
    let setup = Setup::new("eos_slow_start", &[], 1).await;
    setup
        .db
        .client
        .batch_execute(&format!(
            "ALTER DATABASE {} SET wal_sender_timeout = '2s'",
            setup.db.name
        ))
        .await
        .unwrap();
    let types = vec![format!("Order_{}", setup.db.name)];
    let mock = mock_cluster(&types, 1);
    mock.broker_round_trip_time(1, Duration::from_millis(700))
        .unwrap();
    let bootstrap = mock.bootstrap_servers();
    let mut args = setup.relay_args(&bootstrap, Auth::Trust);
    args.push("--exactly-once".into());
    let spawned = std::time::Instant::now();
    let relay = Relay::spawn(&args);

    wait_for(
        "the relay to finish its exactly-once start",
        Duration::from_secs(120),
        || async {
            let log = relay.log();
            log.lines()
                .any(|l| l.contains(" streaming pipeline="))
                .then_some(())
        },
    )
    .await;
    let start = spawned.elapsed();
    assert!(
        start > Duration::from_secs(4),
        "the start took {start:?}, within twice wal_sender_timeout: this test would show nothing"
    );
    mock.broker_round_trip_time(1, Duration::ZERO).unwrap();
    let c = &setup.db.client;
    let (expected, before) = write_events(c, 2, 3, &types, 2, 0, Duration::ZERO).await;
    setup
        .wait_confirmed_past(
            before[1],
            "the transactions written after the start",
            Duration::from_secs(60),
        )
        .await;
    let consumed = read_committed(
        &bootstrap,
        &[&format!("{}.events", types[0])],
        expected.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&expected, &consumed, true);
    let log = relay.log();
    assert!(
        !log.contains("reconnecting"),
        "a session ended (the start took {start:?}):\n{log}"
    );
}

/// A record for a topic the cluster does not have, behind records already sent in the open
/// Kafka transaction: the relay aborts that transaction at once (it would hold the partitions'
/// last stable offset until the broker's transaction timeout, then fail as if fenced) and
/// reads the PostgreSQL transaction again in a new session. Once the topic exists, every
/// event arrives, in order per key, and the slot moves past.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_aborts_a_transaction_held_by_a_missing_topic_and_redoes_it() {
    let setup = Setup::new("eos_missing", &[], 1).await;
    let present = format!("Order_{}", setup.db.name);
    let absent = format!("Invoice_{}", setup.db.name);
    // Only the first type's topic; the broker creates none by itself.
    let mock = mock_cluster(std::slice::from_ref(&present), 1);
    let bootstrap = mock.bootstrap_servers();
    let mut args = eos_args(&setup, &bootstrap);
    args.extend([
        "--kafka-property".into(),
        "allow.auto.create.topics=false".into(),
    ]);
    let mut relay = streaming_exactly_once(&setup, &args).await;
    let c = &setup.db.client;
    let (mut written, before) = write_events(
        c,
        1,
        1,
        std::slice::from_ref(&present),
        1,
        0,
        Duration::ZERO,
    )
    .await;
    setup
        .wait_confirmed_past(before[0], "the first transaction", Duration::from_secs(60))
        .await;

    // One transaction: an event for the topic that exists, then one for the missing topic.
    let types = [present.clone(), absent.clone()];
    let witness = setup.witness().await;
    let (held, _) = write_events(c, 1, 2, &types, 1, 2, Duration::ZERO).await;
    let held_end = setup.commit_end_of(&witness, &held[1].id).await;
    written.extend(held);
    relay
        .wait_for_log("open kafka transaction aborted", Duration::from_secs(30))
        .await;
    let log = relay.log();
    assert!(
        log.contains(&format!("topic {absent}.events does not exist"))
            && log.contains("read again from the slot"),
        "{log}"
    );
    assert!(
        setup.confirmed_flush().await < held_end,
        "the slot passed a transaction whose Kafka transaction was aborted"
    );

    mock.create_topic(&format!("{absent}.events"), 1, 1)
        .unwrap();
    setup
        .wait_confirmed_past(
            held_end - 1,
            "the slot to pass the redone transaction once the topic exists",
            Duration::from_secs(120),
        )
        .await;
    let consumed = read_committed(
        &bootstrap,
        &[&format!("{present}.events"), &format!("{absent}.events")],
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
    .await;
    // librdkafka's mock cluster does not leave aborted records out of a read_committed fetch:
    // the aborted transaction's copy of the held transaction's first event may show here too,
    // and nothing else twice.
    assert_delivered(&written, &consumed, false);
    let aborted_copy = &written[1].id;
    let ids: Vec<&[u8]> = consumed.iter().map(|r| header(r, "id").unwrap()).collect();
    for w in &written {
        let copies = ids.iter().filter(|id| **id == w.id.as_bytes()).count();
        assert!(
            copies == 1 || (copies == 2 && &w.id == aborted_copy),
            "event {} arrived {copies} times",
            w.id
        );
    }
    assert!(relay.is_running(), "{}", relay.log());
}
