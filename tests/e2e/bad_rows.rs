//! Rows the relay refuses before routing them: a row over `max_event_bytes` (refused before
//! its values are copied) and, from a `SQL_ASCII` database, text that is not UTF-8. With
//! `on_bad_event = "dead_letter"` each is dead-lettered and the rows after it flow; without,
//! the pipeline halts naming the row, and the slot stays before it.

use std::time::Duration;

use crate::support::{consume, kafka, Auth, Relay, QUERY_DEADLINE};
use crate::{assert_delivered, insert, insert_lsn, run_with_config, writer_statement, Setup};

/// The smallest `max_event_bytes` the tests set: an ordinary row is under it.
const MAX_EVENT_BYTES: usize = 2_000;

/// The relay's configuration for `setup`, with `extra` lines in the pipeline's table.
fn config(setup: &Setup, extra: &str) -> String {
    format!(
        r#"
[kafka]
bootstrap_servers = "{bootstrap}"

[[pipelines]]
name = "{slot}"
source_url = "{url}"
slot = "{slot}"
publication = "outbox_pub"
table = "public.outbox"
{extra}
"#,
        bootstrap = kafka().bootstrap(),
        url = setup.db.url(Auth::Trust),
        slot = setup.slot,
    )
}

/// A jsonb payload of more than `MAX_EVENT_BYTES`.
fn big_payload() -> String {
    format!(r#"{{"blob": "{}"}}"#, "x".repeat(5_000))
}

/// The bytes of row `id`'s mapped columns as PostgreSQL prints them: its event size.
async fn event_bytes(setup: &Setup, id: &str) -> usize {
    let bytes: i32 = crate::support::within(
        "the row's size",
        QUERY_DEADLINE,
        setup.db.client.query_one(
            "SELECT octet_length(id::text) + octet_length(aggregate_type) + octet_length(aggregate_id)
                    + octet_length(event_type) + octet_length(payload::text) + octet_length(headers::text)
             FROM outbox WHERE id = $1::text::uuid",
            &[&id],
        ),
    )
    .await
    .unwrap()
    .get(0);
    bytes as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_over_max_event_bytes_is_dead_lettered_as_a_reference_and_the_next_row_flows() {
    let setup = Setup::new("bigrow_dlq", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let dlq = format!("{}.dead-letter", setup.slot);
    kafka().create_topic(&dlq, 1);
    let toml = config(
        &setup,
        &format!(
            "max_event_bytes = {MAX_EVENT_BYTES}\non_bad_event = \"dead_letter\"\ndead_letter_topic = \"{dlq}\""
        ),
    );
    let (_dir, args) = run_with_config(&toml);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let witness = setup.witness().await;

    let client = &setup.db.client;
    let big = insert(client, &t, "k1", &big_payload()).await;
    let after = insert(client, &t, "k1", r#"{"n": 2}"#).await;
    let big_lsn = setup.db.change_lsn(&witness, &big.id).await;
    let last_commit = setup.commit_end_of(&witness, &after.id).await;

    setup.assert_first_topic(&[after], false).await;
    let dead = consume(
        &kafka().bootstrap(),
        &[dlq.as_str()],
        1,
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(dead.len(), 1, "one reference in the dead-letter topic");
    let document: serde_json::Value =
        serde_json::from_slice(dead[0].value.as_deref().expect("the reference's document"))
            .unwrap();
    let bytes = event_bytes(&setup, &big.id).await;
    assert!(bytes > MAX_EVENT_BYTES);
    assert_eq!(document["id"].as_str(), Some(big.id.as_str()), "{document}");
    assert_eq!(document["key"].as_str(), Some("k1"), "{document}");
    assert_eq!(document["aggregate_type"].as_str(), Some(t.as_str()));
    assert_eq!(document["bytes"].as_u64(), Some(bytes as u64), "{document}");
    assert_eq!(
        document["lsn"].as_str(),
        Some(big_lsn.as_str()),
        "{document}"
    );
    assert!(
        document.get("value").is_none() && document.get("headers").is_none(),
        "a reference holds no payload: {document}"
    );
    let error = document["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!(
            "{bytes} bytes, more than max_event_bytes = {MAX_EVENT_BYTES}"
        )),
        "{error}"
    );
    assert_eq!(
        dead[0].header_str("id").as_deref(),
        Some(big.id.as_str()),
        "the reference carries the event id"
    );
    setup
        .wait_confirmed_past(
            last_commit - 1,
            "confirmed_flush_lsn to pass the last commit",
            Duration::from_secs(30),
        )
        .await;
    assert!(relay.log().contains(&big.id), "{}", relay.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_dead_lettering_a_row_over_max_event_bytes_halts_naming_its_id_lsn_and_size() {
    let setup = Setup::new("bigrow_halt", &["Order"], 1).await;
    let t = setup.types[0].clone();
    let toml = config(&setup, &format!("max_event_bytes = {MAX_EVENT_BYTES}"));
    let (_dir, args) = run_with_config(&toml);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let witness = setup.witness().await;

    let client = &setup.db.client;
    let before = insert(client, &t, "k1", r#"{"n": 1}"#).await;
    let big = insert(client, &t, "k1", &big_payload()).await;
    let after = insert(client, &t, "k1", r#"{"n": 3}"#).await;
    let big_lsn = setup.db.change_lsn(&witness, &big.id).await;
    let big_commit = setup.commit_end_of(&witness, &big.id).await;

    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert_eq!(status.code(), Some(4), "a bad row exits 4:\n{log}");
    let bytes = event_bytes(&setup, &big.id).await;
    assert!(
        log.contains(&format!(
            "at LSN {big_lsn}, event {} (aggregate {t}/k1): {bytes} bytes, more than max_event_bytes = {MAX_EVENT_BYTES} (max_event_bytes)",
            big.id
        )) && log.contains("on_bad_event = \"dead_letter\""),
        "the error names the row, its LSN and size, and the settings:\n{log}"
    );
    // The row before it is delivered; the slot stays before the refused row's transaction.
    let consumed = setup
        .consume_all(1, Duration::from_secs(2), Duration::from_secs(30))
        .await;
    assert_delivered(&[before], &consumed, false);
    assert!(
        !consumed
            .iter()
            .any(|r| r.header_str("id").as_deref() == Some(after.id.as_str())),
        "nothing after the refused row is published"
    );
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed < big_commit,
        "confirmed {confirmed:x} must stay before the refused row's commit end {big_commit:x}"
    );
}

/// `SQL_ASCII` stores text as any bytes: the walsender would end the stream at such a value
/// on every reconnect; the relay reads it and refuses it like any bad row.
const SQL_ASCII: &str = "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0";

/// Inserts a row whose event type is `Caf` and the byte 0xe9 (Latin-1's é, not UTF-8) in a
/// transaction of its own; returns its id and the WAL insert LSN before its COMMIT.
async fn insert_latin1(setup: &Setup, aggregate_type: &str) -> (String, u64) {
    let client = &setup.db.client;
    writer_statement(client, "BEGIN").await;
    let id: String = crate::support::within(
        "INSERT of a row that is not UTF-8",
        QUERY_DEADLINE,
        client.query_one(
            r"INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
              VALUES ($1, 'k1', E'Caf\xe9', '{}') RETURNING id::text",
            &[&aggregate_type],
        ),
    )
    .await
    .unwrap()
    .get(0);
    let before_commit = insert_lsn(client).await;
    writer_statement(client, "COMMIT").await;
    (id, before_commit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_a_sql_ascii_database_text_that_is_not_utf8_is_dead_lettered_and_the_next_row_flows() {
    let setup = Setup::new_with("ascii_dlq", &["Order"], 1, SQL_ASCII).await;
    let t = setup.types[0].clone();
    let dlq = format!("{}.dead-letter", setup.slot);
    kafka().create_topic(&dlq, 1);
    let toml = config(
        &setup,
        &format!("on_bad_event = \"dead_letter\"\ndead_letter_topic = \"{dlq}\""),
    );
    let (_dir, args) = run_with_config(&toml);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    let (bad, _) = insert_latin1(&setup, &t).await;
    let after = insert(&setup.db.client, &t, "k1", r#"{"n": 2}"#).await;
    let last_commit = setup.db.current_wal_insert_lsn().await;

    setup.assert_first_topic(&[after], false).await;
    let dead = consume(
        &kafka().bootstrap(),
        &[dlq.as_str()],
        1,
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(dead.len(), 1, "one copy in the dead-letter topic");
    assert_eq!(dead[0].header_str("id").as_deref(), Some(bad.as_str()));
    let document: serde_json::Value =
        serde_json::from_slice(dead[0].value.as_deref().expect("the copy's document")).unwrap();
    let error = document["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!(
            "event {bad}: column \"event_type\" of public.outbox is not valid UTF-8"
        )),
        "{document}"
    );
    // The value that is not UTF-8 is in the copy, as base64 ("Caf\xe9").
    assert_eq!(
        document["headers"][1],
        serde_json::json!({"name": "event_type", "value": {"base64": "Q2Fm6Q=="}}),
        "{document}"
    );
    setup
        .wait_confirmed_past(
            last_commit,
            "confirmed_flush_lsn to pass the last commit",
            Duration::from_secs(30),
        )
        .await;
    assert!(relay.log().contains(&bad), "{}", relay.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_dead_lettering_text_that_is_not_utf8_halts_naming_the_row_and_the_fix() {
    let setup = Setup::new_with("ascii_halt", &["Order"], 1, SQL_ASCII).await;
    let t = setup.types[0].clone();
    let (_dir, args) = run_with_config(&config(&setup, ""));
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    let (bad, before_commit) = insert_latin1(&setup, &t).await;
    let after = insert(&setup.db.client, &t, "k1", r#"{"n": 2}"#).await;

    let status = relay.wait(Duration::from_secs(60));
    let log = relay.log();
    assert_eq!(
        status.code(),
        Some(4),
        "a bad row exits 4, never retried:\n{log}"
    );
    let error = log
        .lines()
        .find(|line| {
            line.contains(&format!(
                "event {bad}: column \"event_type\" of public.outbox is not valid UTF-8"
            ))
        })
        .unwrap_or_else(|| panic!("no error naming the row and its column:\n{log}"));
    assert!(
        error.contains("at LSN ") && error.contains("ENCODING 'UTF8'") && error.contains("bytea"),
        "the error names the LSN and the fix: {error}"
    );
    let consumed = setup
        .consume_all(0, Duration::from_secs(2), Duration::from_secs(10))
        .await;
    assert!(
        !consumed
            .iter()
            .any(|r| r.header_str("id").as_deref() == Some(after.id.as_str())),
        "nothing after the refused row is published"
    );
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed <= before_commit,
        "confirmed {confirmed:x} must stay before the refused row's commit (after {before_commit:x})"
    );
}
