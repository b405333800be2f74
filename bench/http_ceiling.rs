//! The HTTP sink's ceiling for bench/sinks.py: a bare reqwest client posting `events` bodies of
//! `bytes` bytes to `url` with `concurrency` requests in flight (the relay's default
//! `max_concurrency`), each waiting for its 2xx. Prints `{"seconds": ..., "events_per_second":
//! ...}`.
//!
//! `http_ceiling <url> <events> <concurrency> <bytes>`

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, events, concurrency, bytes] = &args[..] else {
        panic!("usage: http_ceiling <url> <events> <concurrency> <bytes>");
    };
    let (events, concurrency, bytes): (usize, usize, usize) = (
        events.parse().unwrap(),
        concurrency.parse().unwrap(),
        bytes.parse().unwrap(),
    );
    // Plain http: the TLS configuration is never used, but reqwest wants one.
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .build()
        .unwrap();
    let body = bytes::Bytes::from(format!(
        "{{\"pad\":\"{}\"}}",
        "x".repeat(bytes.saturating_sub(10))
    ));
    let start = Instant::now();
    let mut requests = futures::stream::iter(0..events)
        .map(|n| {
            let request = client
                .post(url)
                .header("content-type", "application/json")
                .header("webhook-id", n.to_string())
                .body(body.clone());
            async move {
                let response = request.send().await.expect("POST");
                assert!(response.status().is_success(), "HTTP {}", response.status());
                response.bytes().await.unwrap();
            }
        })
        .buffer_unordered(concurrency);
    while requests.next().await.is_some() {}
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{{\"seconds\": {seconds}, \"events_per_second\": {}}}",
        events as f64 / seconds
    );
}
