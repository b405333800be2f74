//! Prints the records of some Kafka topics from the beginning: the quickstart's window onto
//! what the relay published.
//!
//! cargo run --example tail -- --bootstrap-servers 127.0.0.1:19092 --topics Order.events,Customer.events --count 4

use std::time::{Duration, Instant};

use clap::Parser;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:19092")]
    bootstrap_servers: String,
    /// Comma-separated topics.
    #[arg(long, value_delimiter = ',')]
    topics: Vec<String>,
    /// Stop after this many records.
    #[arg(long, default_value_t = usize::MAX)]
    count: usize,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap_servers)
        .set("group.id", "outbox-relay-tail")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    for topic in &args.topics {
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        for t in metadata.topics() {
            for p in t.partitions() {
                assignment.add_partition_offset(topic, p.id(), Offset::Beginning)?;
            }
        }
    }
    consumer.assign(&assignment)?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let mut seen = 0;
    while seen < args.count && Instant::now() < deadline {
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message?;
        let text = |b: Option<&[u8]>| {
            b.map_or_else(
                || "null".to_owned(),
                |b| String::from_utf8_lossy(b).into_owned(),
            )
        };
        let headers: Vec<String> = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| format!("{}={}", h.key, text(h.value)))
                    .collect()
            })
            .unwrap_or_default();
        println!(
            "{}[{}]@{} key={} headers=[{}] value={}",
            message.topic(),
            message.partition(),
            message.offset(),
            text(message.key()),
            headers.join(", "),
            text(message.payload()),
        );
        seen += 1;
    }
    if seen < args.count && args.count != usize::MAX {
        anyhow::bail!(
            "only {seen} of {} records arrived within {} s",
            args.count,
            args.timeout_secs
        );
    }
    Ok(())
}
