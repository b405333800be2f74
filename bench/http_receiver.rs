//! A webhook receiver for bench/run.py's HTTP sink scenario: answers every `POST` with 200 and
//! counts them; `GET /count` answers the count. As little work per request as axum allows, so
//! that the relay and the bare client (bench/http_ceiling.rs) are what is measured.
//!
//! `http_receiver <port>`; serves until killed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::Method;

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("usage: http_receiver <port>");
    let count = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().fallback(move |method: Method| {
        let count = Arc::clone(&count);
        async move {
            match method {
                Method::POST => {
                    count.fetch_add(1, Ordering::Relaxed);
                    String::new()
                }
                _ => count.load(Ordering::Relaxed).to_string(),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("binding the receiver's port");
    axum::serve(listener, app).await.expect("serving");
}
