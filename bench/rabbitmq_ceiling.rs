//! The RabbitMQ ceiling for bench/sinks.py: a bare lapin publisher with the relay's message
//! settings, without PostgreSQL and without per-key order.
//!
//! ```sh
//! cargo run --release --example rabbitmq_ceiling -- URL EXCHANGE ROUTING_KEY declare
//! cargo run --release --example rabbitmq_ceiling -- URL EXCHANGE ROUTING_KEY publish N [IN_FLIGHT]
//! cargo run --release --example rabbitmq_ceiling -- URL EXCHANGE ROUTING_KEY count
//! cargo run --release --example rabbitmq_ceiling -- URL EXCHANGE ROUTING_KEY purge
//! ```
//!
//! `declare` makes a durable topic exchange and a durable queue named ROUTING_KEY bound to it
//! with that key. `publish N` publishes N persistent messages with `mandatory` on one channel in
//! confirm mode, at most IN_FLIGHT (default 256, the relay's `max_concurrency`) awaiting their
//! confirm, each like the relay's (a ~230-byte JSON body, `message_id`, headers `id`,
//! `event_type`, `key`), and prints one JSON line: events, seconds (first publish to last
//! confirm). It exits non-zero if a message is nacked or returned. `count` prints the number of
//! messages in the queue (a passive declare; it exits non-zero if there is no such queue).
//! `purge` empties the queue.

use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, exchange, key, command, rest @ ..] = &args[..] else {
        panic!("usage: URL EXCHANGE ROUTING_KEY declare|publish N [IN_FLIGHT]|count|purge");
    };
    let properties = ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio);
    let connection = Connection::connect(url, properties)
        .await
        .expect("connecting");
    let channel = connection
        .create_channel()
        .await
        .expect("opening a channel");
    match command.as_str() {
        "declare" => {
            let durable = ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            };
            channel
                .exchange_declare(
                    exchange,
                    ExchangeKind::Topic,
                    durable,
                    FieldTable::default(),
                )
                .await
                .expect("declaring the exchange");
            let durable = QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            };
            channel
                .queue_declare(key, durable, FieldTable::default())
                .await
                .expect("declaring the queue");
            channel
                .queue_bind(
                    key,
                    exchange,
                    key,
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("binding the queue");
        }
        "purge" => {
            channel
                .queue_purge(key, QueuePurgeOptions::default())
                .await
                .expect("purging the queue");
        }
        "count" => {
            let passive = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            let queue = channel
                .queue_declare(key, passive, FieldTable::default())
                .await
                .expect("declaring the queue passively");
            println!("{}", queue.message_count());
        }
        "publish" => {
            let n: u64 = rest
                .first()
                .and_then(|v| v.parse().ok())
                .expect("publish N");
            let in_flight: usize = rest.get(1).map_or(256, |v| v.parse().expect("IN_FLIGHT"));
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .expect("confirm mode");
            let start = Instant::now();
            let mut pending = FuturesUnordered::new();
            let mut confirmed = 0u64;
            for i in 0..n {
                while pending.len() >= in_flight {
                    check(pending.next().await.expect("a pending confirm"));
                    confirmed += 1;
                }
                let id = format!("00000000-0000-0000-0000-{i:012}");
                let body = format!(r#"{{"seq": {i}, "pad": "{}"}}"#, "x".repeat(200));
                let mut headers = FieldTable::default();
                headers.insert("id".into(), AMQPValue::LongString(id.clone().into()));
                headers.insert("event_type".into(), AMQPValue::LongString("Created".into()));
                headers.insert(
                    "key".into(),
                    AMQPValue::LongString(format!("key-{}", i % 1000).into()),
                );
                let properties = BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_message_id(id.into())
                    .with_content_type("application/json".into())
                    .with_headers(headers);
                let options = BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                };
                let channel = channel.clone();
                let (exchange, key) = (exchange.clone(), key.clone());
                pending.push(async move {
                    channel
                        .basic_publish(&exchange, &key, options, body.as_bytes(), properties)
                        .await?
                        .await
                });
            }
            while let Some(result) = pending.next().await {
                check(result);
                confirmed += 1;
            }
            println!(
                "{{\"events\": {confirmed}, \"seconds\": {:.3}}}",
                start.elapsed().as_secs_f64()
            );
        }
        other => panic!("unknown command {other:?}"),
    }
    let _ = connection.close(200, "done").await;
}

/// Panics unless the message was confirmed and not returned.
fn check(result: lapin::Result<Confirmation>) {
    match result.expect("publishing") {
        Confirmation::Ack(None) => {}
        other => panic!("not confirmed: {other:?}"),
    }
}
