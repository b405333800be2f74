//! The polling source (`source_kind = "polling"`): the relay binary configured from a file,
//! each test with its own database (with `sql/outbox_polling.sql`) and topics.
//! - `delivery`: what arrives (two pollers, marking modes, hostile defaults, a restart, a
//!   producer shared by two polling pipelines);
//! - `failures`: broker outages and backoff, poison and retryable events, `kill -9`, bad input.
//!
//! This file holds the polling tests' fixtures.

mod delivery;
mod failures;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::{consume, kafka, pg, unique_name, Auth, Consumed, TestDb};
use crate::{insert, writer_statement, Written};

/// A database `name` with the polling schema (`sql/outbox_polling.sql`) instead of the
/// log-tailing one.
pub(crate) async fn polling_database(name: &str) -> TestDb {
    polling_database_with(name, "").await
}

/// [`polling_database`] created with `options` (`ENCODING ...`).
pub(crate) async fn polling_database_with(name: &str, options: &str) -> TestDb {
    let db = pg().create_database_with(name, options).await;
    // create_database applies the log-tailing sql/outbox.sql; replace its table.
    let kit = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sql/outbox_polling.sql"),
    )
    .unwrap();
    db.client
        .batch_execute("DROP PUBLICATION outbox_pub; DROP TABLE outbox;")
        .await
        .unwrap();
    db.client.batch_execute(&kit).await.unwrap();
    db
}

/// A test's database (polling schema), topics, and config files for its relays.
struct Setup {
    db: TestDb,
    name: String,
    types: Vec<String>,
    dir: tempfile::TempDir,
    /// TOML lines of the `[[pipelines]]` entry that [`Setup::relay_args`] writes.
    pipeline_keys: String,
}

impl Setup {
    async fn new(prefix: &str, types: &[&str], partitions: i32) -> Setup {
        Setup::new_with(prefix, types, partitions, "").await
    }

    /// Like [`Setup::new`], the database created with `options` (`ENCODING ...`).
    async fn new_with(prefix: &str, types: &[&str], partitions: i32, options: &str) -> Setup {
        let name = unique_name(prefix);
        let db = polling_database_with(&name, options).await;
        let types: Vec<String> = types.iter().map(|t| format!("{t}_{name}")).collect();
        for t in &types {
            kafka().create_topic(&format!("{t}.events"), partitions);
        }
        Setup {
            db,
            name,
            types,
            dir: tempfile::tempdir().unwrap(),
            pipeline_keys: String::new(),
        }
    }

    fn topics(&self) -> Vec<String> {
        self.types.iter().map(|t| format!("{t}.events")).collect()
    }

    /// Writes a config file for one polling relay and returns the `run` arguments, with
    /// metrics on `metrics` when given. `polling` and `kafka_properties` are TOML lines.
    fn relay_args(
        &self,
        relay: &str,
        bootstrap: &str,
        polling: &str,
        kafka_properties: &str,
        metrics: Option<&str>,
    ) -> Vec<String> {
        self.relay_args_for(
            "public.outbox",
            relay,
            bootstrap,
            polling,
            kafka_properties,
            metrics,
        )
    }

    /// [`Setup::relay_args`] for another outbox table.
    fn relay_args_for(
        &self,
        table: &str,
        relay: &str,
        bootstrap: &str,
        polling: &str,
        kafka_properties: &str,
        metrics: Option<&str>,
    ) -> Vec<String> {
        let url = format!("{}?application_name={relay}", self.db.url(Auth::Trust));
        let path = self.dir.path().join(format!("{relay}.toml"));
        std::fs::write(
            &path,
            format!(
                r#"
[kafka]
bootstrap_servers = "{bootstrap}"
[kafka.properties]
{kafka_properties}

[[pipelines]]
name = "{name}"
source_url = "{url}"
source_kind = "polling"
table = "{table}"
shutdown_timeout_secs = 5
{pipeline_keys}
[pipelines.polling]
{polling}
"#,
                name = self.name,
                pipeline_keys = self.pipeline_keys,
            ),
        )
        .unwrap();
        let mut args = vec![
            "run".to_string(),
            "--config".to_string(),
            path.display().to_string(),
        ];
        if let Some(listen) = metrics {
            args.extend(["--metrics-listen".to_string(), listen.to_string()]);
        }
        args
    }

    async fn consume_all(
        &self,
        expected: usize,
        settle: Duration,
        deadline: Duration,
    ) -> Vec<Consumed> {
        let topics = self.topics();
        let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
        consume(&kafka().bootstrap(), &topics, expected, settle, deadline).await
    }

    /// Rows by status.
    async fn statuses(&self) -> HashMap<String, i64> {
        self.db
            .client
            .query("SELECT status, count(*) FROM outbox GROUP BY status", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    async fn status_of(&self, id: &str) -> (String, i32) {
        let row = self
            .db
            .client
            .query_one(
                "SELECT status, retry_count FROM outbox WHERE id = $1::text::uuid",
                &[&id],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }
}

/// A payload with many digits, unicode and escapes (plainer than the log-tailing suite's).
fn payload(n: usize) -> String {
    format!(r#"{{"n": {n}, "amount": 1234567890.12345678901234567890, "s": "é😀 \"q\" {n}"}}"#)
}

/// `txns` transactions of `per_txn` events, cycling through `types` and `keys` ids per type.
async fn write_events(
    client: &tokio_postgres::Client,
    txns: usize,
    per_txn: usize,
    types: &[String],
    keys: usize,
) -> Vec<Written> {
    let mut written = Vec::with_capacity(txns * per_txn);
    for t in 0..txns {
        writer_statement(client, "BEGIN").await;
        for e in 0..per_txn {
            let n = t * per_txn + e;
            let aggregate_type = &types[n % types.len()];
            let aggregate_id = format!("k{}", (n / types.len()) % keys);
            written.push(insert(client, aggregate_type, &aggregate_id, &payload(n)).await);
        }
        writer_statement(client, "COMMIT").await;
    }
    written
}

fn id_of(record: &Consumed) -> String {
    record.header_str("id").expect("id header")
}

/// Every written event arrived (at most `max_copies` times each), in its topic with its key
/// and value byte for byte, and per key the first arrivals are in write order. Returns the
/// number of records beyond the first copy of each event.
fn assert_delivered(written: &[Written], consumed: &[Consumed], max_copies: usize) -> usize {
    let by_id: HashMap<&str, &Written> = written.iter().map(|w| (w.id.as_str(), w)).collect();
    let mut copies: HashMap<String, usize> = HashMap::new();
    let mut first_order: HashMap<(String, String), Vec<String>> = HashMap::new();
    for record in consumed {
        let id = id_of(record);
        let w = by_id
            .get(id.as_str())
            .unwrap_or_else(|| panic!("record with unknown id {id} in {}", record.topic));
        assert_eq!(
            record.topic,
            format!("{}.events", w.aggregate_type),
            "topic of {id}"
        );
        assert_eq!(
            record.key_str().as_deref(),
            Some(w.aggregate_id.as_str()),
            "key of {id}"
        );
        assert_eq!(
            record.value_str().as_deref(),
            Some(w.payload.as_str()),
            "value of {id}"
        );
        let n = copies.entry(id.clone()).or_default();
        *n += 1;
        if *n == 1 {
            first_order
                .entry((w.aggregate_type.clone(), w.aggregate_id.clone()))
                .or_default()
                .push(id);
        }
    }
    let missing: Vec<&str> = written
        .iter()
        .filter(|w| !copies.contains_key(&w.id))
        .map(|w| w.id.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} events never arrived, e.g. {:?}",
        missing.len(),
        written.len(),
        &missing[..missing.len().min(3)]
    );
    let too_many: Vec<_> = copies.iter().filter(|(_, n)| **n > max_copies).collect();
    assert!(
        too_many.is_empty(),
        "{} events arrived more than {max_copies} time(s), e.g. {:?}",
        too_many.len(),
        too_many.first()
    );
    let mut expected: HashMap<(String, String), Vec<String>> = HashMap::new();
    for w in written {
        expected
            .entry((w.aggregate_type.clone(), w.aggregate_id.clone()))
            .or_default()
            .push(w.id.clone());
    }
    for (key, ids) in &expected {
        assert_eq!(
            first_order.get(key),
            Some(ids),
            "order of events for {key:?}"
        );
    }
    consumed.len() - copies.len()
}
