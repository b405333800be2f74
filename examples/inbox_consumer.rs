//! A consumer of outbox-relay's topics that processes each event once: the inbox pattern.
//!
//! outbox-relay delivers at least once: after a crash or a broker failure, events after the
//! slot's last confirmed LSN are published again, and a consumer that crashes between its
//! database commit and its offset commit reads records again too. Effectively-once processing
//! comes from the consumer's own database: for each record, in ONE PostgreSQL transaction,
//!
//! 1. insert the event id (the record's `id` header) into `inbox` (`sql/inbox.sql`) with
//!    `ON CONFLICT DO NOTHING`;
//! 2. only if a row was inserted, apply the event (here a toy handler counting events per
//!    aggregate);
//! 3. commit;
//!
//! and only then commit the record's Kafka offset. A crash before 3 rolls both back and the
//! record is read again; a crash between 3 and the offset commit reads it again, finds its id
//! in `inbox`, and skips it. Either way the handler's effect happens once.
//!
//! cargo run --example inbox_consumer -- --bootstrap-servers 127.0.0.1:9092 \
//!   --topics Order.events --database-url postgres://app@localhost/consumer

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use tokio_postgres::{Client, NoTls, Transaction};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap_servers: String,
    /// Comma-separated topics, e.g. Order.events,Customer.events.
    #[arg(long, value_delimiter = ',', required = true)]
    topics: Vec<String>,
    /// Consumer group: offsets are committed for it.
    #[arg(long, default_value = "inbox-consumer")]
    group_id: String,
    /// The consumer's own database (inbox and handler tables are created if missing).
    /// This example connects without TLS; use tokio-postgres-rustls in production.
    #[arg(long)]
    database_url: String,
    /// Stop after this many records (duplicates included); default: run until killed.
    #[arg(long)]
    max_records: Option<u64>,
    /// Fail when no record arrives for this long, seconds.
    #[arg(long, default_value_t = 3600)]
    idle_timeout_secs: u64,
}

/// What the toy handler writes: events applied per aggregate. A real consumer changes its own
/// business tables here.
const HANDLER_DDL: &str = "CREATE TABLE IF NOT EXISTS aggregate_event_counts (
    topic        text   NOT NULL,
    aggregate_id text   NOT NULL,
    events       bigint NOT NULL,
    PRIMARY KEY (topic, aggregate_id)
)";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (mut client, connection) = tokio_postgres::connect(&args.database_url, NoTls)
        .await
        .context("connecting to the consumer's database")?;
    let connection = tokio::spawn(connection);
    client
        .batch_execute(include_str!("../sql/inbox.sql"))
        .await
        .context("creating the inbox table")?;
    client.batch_execute(HANDLER_DDL).await?;

    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap_servers)
        .set("group.id", &args.group_id)
        // Offsets are committed by hand, after the database commit: never before.
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    let topics: Vec<&str> = args.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;

    let idle = Duration::from_secs(args.idle_timeout_secs);
    let mut seen = 0u64;
    while args.max_records.is_none_or(|max| seen < max) {
        let message = tokio::time::timeout(idle, consumer.recv())
            .await
            .with_context(|| format!("no record for {idle:?}"))??;
        let applied = process(&mut client, &message).await?;
        // The database commit is done: now the offset may move past the record. A synchronous
        // commit per record keeps the example obvious (and blocks this thread briefly); a busy
        // consumer commits asynchronously or every N records: the inbox absorbs the re-reads.
        consumer.commit_message(&message, CommitMode::Sync)?;
        println!(
            "{} {}[{}]@{} id={}",
            if applied { "applied" } else { "duplicate" },
            message.topic(),
            message.partition(),
            message.offset(),
            event_id(&message)?,
        );
        seen += 1;
    }
    drop(client);
    connection.await??;
    Ok(())
}

/// Records `message`'s event id in `inbox` and, if it was not there yet, applies the event,
/// all in one transaction. Returns whether the event was applied (false: a duplicate).
///
/// Returns an error, leaving nothing changed, if the record has no `id` header or the
/// database fails.
async fn process(client: &mut Client, message: &BorrowedMessage<'_>) -> anyhow::Result<bool> {
    let id = event_id(message)?;
    let tx = client.transaction().await?;
    let inserted = tx
        .execute(
            "INSERT INTO inbox (event_id, topic) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&id, &message.topic()],
        )
        .await?;
    if inserted == 1 {
        handle(&tx, message).await?;
    }
    tx.commit().await?;
    Ok(inserted == 1)
}

/// The toy handler: counts the event for its aggregate (the record key).
async fn handle(tx: &Transaction<'_>, message: &BorrowedMessage<'_>) -> anyhow::Result<()> {
    let aggregate_id = message
        .key()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .unwrap_or_default();
    tx.execute(
        "INSERT INTO aggregate_event_counts (topic, aggregate_id, events) VALUES ($1, $2, 1)
         ON CONFLICT (topic, aggregate_id) DO UPDATE SET events = aggregate_event_counts.events + 1",
        &[&message.topic(), &aggregate_id],
    )
    .await?;
    Ok(())
}

/// The record's `id` header (outbox-relay sets it to the event id).
///
/// Returns an error naming the record if there is none: skipping it would lose the event.
fn event_id(message: &BorrowedMessage<'_>) -> anyhow::Result<String> {
    message
        .headers()
        .and_then(|h| h.iter().find(|h| h.key == "id"))
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .with_context(|| {
            format!(
                "record {}[{}]@{} has no id header",
                message.topic(),
                message.partition(),
                message.offset()
            )
        })
}
