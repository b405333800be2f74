//! A webhook receiver for bench/sinks.py's HTTP sink: answers every `POST` with 200 and counts
//! them by path; a `GET` of a path answers how many `POST`s that path took (0 for none), so
//! the relay's posts (`/hooks/Order.events`) and the bare client's (bench/http_ceiling.rs,
//! `/hooks/ceiling`) are counted apart. As little work per request as axum allows (one
//! uncontended lock and a map look-up), so that the relay and the bare client are what is
//! measured.
//!
//! `http_receiver <port>`; serves until killed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::{Method, Uri};

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("usage: http_receiver <port>");
    let counts = Arc::new(Mutex::new(HashMap::<String, u64>::new()));
    let app = axum::Router::new().fallback(move |method: Method, uri: Uri| {
        let counts = Arc::clone(&counts);
        async move {
            let mut counts = counts.lock().expect("the count map");
            let path = uri.path();
            match method {
                Method::POST => {
                    match counts.get_mut(path) {
                        Some(n) => *n += 1,
                        None => {
                            counts.insert(path.to_owned(), 1);
                        }
                    }
                    String::new()
                }
                _ => counts.get(path).copied().unwrap_or(0).to_string(),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("binding the receiver's port");
    axum::serve(listener, app).await.expect("serving");
}
