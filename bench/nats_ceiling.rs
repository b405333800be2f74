//! The NATS JetStream ceiling for bench/sinks.py (`bench/run.py` scenario 7): a bare async-nats
//! publisher of records like the relay's, without PostgreSQL and without per-key order.
//!
//! ```sh
//! cargo run --release --example nats_ceiling -- URL create STREAM SUBJECT...
//! cargo run --release --example nats_ceiling -- URL publish SUBJECT N [IN_FLIGHT]
//! cargo run --release --example nats_ceiling -- URL count STREAM SUBJECT
//! ```
//!
//! `create` makes a file-storage stream taking SUBJECTs. `publish` sends N messages (a
//! ~230-byte body, headers `id`, `event_type`, `key` and `Nats-Msg-Id`) with at most IN_FLIGHT
//! (default 256, the relay's `max_concurrency`) awaiting their PubAck, and exits non-zero if
//! one is not acknowledged. `count` prints how many messages of SUBJECT the stream holds.

use futures::stream::{FuturesUnordered, StreamExt};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, command, rest @ ..] = &args[..] else {
        panic!("usage: URL create STREAM SUBJECT... | publish SUBJECT N [IN_FLIGHT] | count STREAM SUBJECT");
    };
    let client = async_nats::connect(url.as_str()).await.expect("connecting");
    let js = async_nats::jetstream::new(client);
    match (command.as_str(), rest) {
        ("create", [stream, subjects @ ..]) => {
            js.get_or_create_stream(async_nats::jetstream::stream::Config {
                name: stream.clone(),
                subjects: subjects.to_vec(),
                storage: async_nats::jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await
            .expect("creating the stream");
        }
        ("publish", [subject, n, more @ ..]) => {
            let n: usize = n.parse().expect("N");
            let in_flight: usize = more.first().map_or(256, |v| v.parse().expect("IN_FLIGHT"));
            let body = bytes::Bytes::from(format!(r#"{{"pad": "{}", "seq": 1}}"#, "x".repeat(200)));
            let mut pending = FuturesUnordered::new();
            for i in 0..n {
                let id = format!("00000000-0000-0000-0000-{i:012}");
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("id", id.as_str());
                headers.insert("event_type", "Created");
                headers.insert("key", format!("key-{}", i % 1000).as_str());
                headers.insert("Nats-Msg-Id", id.as_str());
                let ack = js
                    .publish_with_headers(subject.clone(), headers, body.clone())
                    .await
                    .expect("publishing");
                pending.push(std::future::IntoFuture::into_future(ack));
                while pending.len() >= in_flight {
                    pending.next().await.unwrap().expect("a PubAck");
                }
            }
            while let Some(ack) = pending.next().await {
                ack.expect("a PubAck");
            }
        }
        ("count", [stream, subject]) => {
            let mut stream = js.get_stream(stream).await.expect("the stream");
            let info = stream.info().await.expect("stream info");
            let _ = subject;
            println!("{}", info.state.messages);
        }
        _ => panic!("unknown command {command:?}"),
    }
}
