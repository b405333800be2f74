//! The broker's ingest ceiling for `bench/run.py`: a bare rdkafka producer loop with the
//! relay's producer settings and records shaped like the relay's, without PostgreSQL.
//!
//! ```sh
//! cargo run --release --example producer_ceiling -- BOOTSTRAP TOPIC count N [k=v ...]
//! cargo run --release --example producer_ceiling -- BOOTSTRAP TOPIC rate EVENTS_PER_SEC SECS [k=v ...]
//! ```
//!
//! `count N` produces N records as fast as the producer takes them, keeping at most
//! `MAX_IN_FLIGHT` unacknowledged (the relay's default `max_in_flight_events`), and exits once
//! the broker acknowledged all of them. `rate R S` produces R records a second, evenly spaced,
//! for S seconds, each value carrying the send time as `{"t": <Unix seconds>}` for the bench's
//! latency consumer. Both print one JSON line: events, seconds (first send to last ack),
//! mean produce -> ack milliseconds. `k=v` arguments are librdkafka properties, applied like
//! the relay's `--kafka-property` (before the properties the relay forces).
//!
//! Settings as `outbox_relay::sink::kafka::KafkaSink::new` makes them: `partitioner =
//! murmur2_random`, `enable.idempotence = true`, `acks = all`, `message.timeout.ms = 0`,
//! `queue.buffering.max.messages = 100000`; librdkafka's defaults otherwise (`linger.ms = 5`).
//! Records: key `key-<i mod 1000>`, a ~230-byte JSON value, headers `id` (36 bytes) and
//! `event_type`, the send time as timestamp.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

/// The relay's default `max_in_flight_events`.
const MAX_IN_FLIGHT: u64 = 10_000;

#[derive(Default)]
struct Counts {
    acked: AtomicU64,
    failed: AtomicU64,
    /// Sum of produce -> ack times, microseconds.
    latency_us: AtomicU64,
}

struct Context(Arc<Counts>);

impl ClientContext for Context {}

impl ProducerContext for Context {
    type DeliveryOpaque = Box<Instant>;

    fn delivery(&self, result: &DeliveryResult<'_>, sent: Box<Instant>) {
        let counts = &self.0;
        match result {
            Ok(_) => {
                counts.acked.fetch_add(1, Ordering::Relaxed);
                let us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                counts.latency_us.fetch_add(us, Ordering::Relaxed);
            }
            Err((e, _)) => {
                if counts.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("producer_ceiling: delivery failed: {e}");
                }
            }
        }
    }
}

enum Mode {
    Count(u64),
    Rate { per_sec: u64, secs: u64 },
}

fn usage() -> ! {
    eprintln!(
        "usage: producer_ceiling BOOTSTRAP TOPIC (count N | rate EVENTS_PER_SEC SECS) [k=v ...]"
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        usage()
    }
    let number = |s: &str| s.parse::<u64>().unwrap_or_else(|_| usage());
    let (mode, rest) = match args[2].as_str() {
        "count" => (Mode::Count(number(&args[3])), &args[4..]),
        "rate" if args.len() >= 5 => (
            Mode::Rate {
                per_sec: number(&args[3]),
                secs: number(&args[4]),
            },
            &args[5..],
        ),
        _ => usage(),
    };
    let (bootstrap, topic) = (&args[0], &args[1]);

    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("client.id", "producer-ceiling")
        .set("partitioner", "murmur2_random");
    for property in rest {
        let (key, value) = property.split_once('=').unwrap_or_else(|| usage());
        config.set(key, value);
    }
    if config.get("message.timeout.ms").is_none() && config.get("delivery.timeout.ms").is_none() {
        config.set("message.timeout.ms", "0");
    }
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("queue.buffering.max.messages", "100000");
    let counts = Arc::new(Counts::default());
    let producer: ThreadedProducer<Context> = config
        .create_with_context(Context(counts.clone()))
        .expect("producer config");

    let total = match mode {
        Mode::Count(n) => n,
        Mode::Rate { per_sec, secs } => per_sec * secs,
    };
    let interval = match mode {
        Mode::Count(_) => None,
        Mode::Rate { per_sec, .. } => Some(Duration::from_secs_f64(1.0 / per_sec as f64)),
    };
    if interval.is_some() {
        // Connected, with the idempotent producer id, before the clock starts: the relay under
        // the same load has been running for a while. The consumer skips this record.
        producer
            .send(
                BaseRecord::<[u8], str, _>::with_opaque_to(topic, Box::new(Instant::now()))
                    .payload("{}"),
            )
            .map_err(|(e, _)| e)
            .expect("warm-up record queued");
        producer
            .flush(Duration::from_secs(30))
            .expect("warm-up record delivered");
        counts.acked.store(0, Ordering::Relaxed);
        counts.latency_us.store(0, Ordering::Relaxed);
    }
    let pad = "x".repeat(200);
    let start = Instant::now();
    for i in 0..total {
        if let Some(interval) = interval {
            let due = start + interval.mul_f64(i as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        while i - counts.acked.load(Ordering::Relaxed) - counts.failed.load(Ordering::Relaxed)
            >= MAX_IN_FLIGHT
        {
            std::thread::sleep(Duration::from_micros(200));
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970");
        let value = match mode {
            Mode::Count(_) => format!(r#"{{"pad": "{pad}", "seq": {i}}}"#),
            Mode::Rate { .. } => format!(r#"{{"t": {:.6}, "pad": "{pad}"}}"#, now.as_secs_f64()),
        };
        let key = format!("key-{}", i % 1000);
        let id = format!("00000000-0000-4000-8000-{i:012}");
        let headers = OwnedHeaders::new_with_capacity(2)
            .insert(Header {
                key: "id",
                value: Some(id.as_bytes()),
            })
            .insert(Header {
                key: "event_type",
                value: Some("Created".as_bytes()),
            });
        let timestamp_ms = i64::try_from(now.as_millis()).expect("milliseconds fit");
        let mut record = BaseRecord::with_opaque_to(topic, Box::new(Instant::now()))
            .key(key.as_bytes())
            .payload(value.as_bytes())
            .headers(headers)
            .timestamp(timestamp_ms);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => panic!("produce failed: {e}"),
            }
        }
    }
    producer
        .flush(Duration::from_secs(300))
        .expect("all records delivered within 300 s");
    let seconds = start.elapsed().as_secs_f64();
    let acked = counts.acked.load(Ordering::Relaxed);
    let failed = counts.failed.load(Ordering::Relaxed);
    let mean_ms = counts.latency_us.load(Ordering::Relaxed) as f64 / acked.max(1) as f64 / 1000.0;
    println!(
        r#"{{"events": {total}, "acked": {acked}, "failed": {failed}, "seconds": {seconds:.3}, "mean_produce_to_ack_ms": {mean_ms:.3}}}"#
    );
    if acked != total {
        std::process::exit(1);
    }
}
