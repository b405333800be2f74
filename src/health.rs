//! The HTTP endpoint: Prometheus `/metrics`, `/healthz` (the process is alive) and `/readyz`
//! (every pipeline is in a ready state: streaming, catching up or standing by, with no record
//! waiting longer than `max_event_wait_secs`; JSON detail per pipeline, 503 otherwise).
//!
//! Whoever can reach the port is a client: the server serves at most [`MAX_CONNECTIONS`]
//! connections at once (more wait in the kernel's listen queue, holding none of the relay's
//! file descriptors), gives a client [`HEADER_READ_TIMEOUT`] to send a request's headers of at
//! most [`MAX_HEADER_BYTES`], and closes any connection after [`MAX_CONNECTION_TIME`], so that
//! slow or idle clients can neither exhaust the relay's file descriptors (which its PostgreSQL
//! and broker connections need) nor keep others out for long.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Connections served at once: a few scrapers and probes need a handful.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a client has to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The most a request's headers may take, bytes (hyper's smallest read buffer).
pub const MAX_HEADER_BYTES: usize = 8192;
/// How long a connection is served, requests and keep-alive included: a scraper connects again.
pub const MAX_CONNECTION_TIME: Duration = Duration::from_secs(60);

/// Binds the endpoint's address.
///
/// Returns an error if the address cannot be bound (in use, not local, no permission).
pub async fn bind(listen: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen).await
}

/// Serves the endpoint on `listener` until `shutdown` is cancelled (see the module docs for
/// its limits); the connections still open then are closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listen = listener.local_addr()?;
    tracing::info!(%listen, "serving /metrics, /healthz and /readyz");
    let app = Router::new()
        .route("/metrics", get(prometheus_text))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readiness))
        .with_state(metrics);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        // A slot first: without one, no connection is accepted (it waits in the listen queue).
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot.expect("the semaphore is never closed"),
            () = shutdown.cancelled() => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: wait rather than spin.
                    tracing::debug!(error = %e, "accepting a metrics connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .max_buf_size(MAX_HEADER_BYTES)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        connections.spawn(async move {
            let _slot = slot;
            let _ = tokio::time::timeout(MAX_CONNECTION_TIME, connection).await;
        });
        while connections.try_join_next().is_some() {}
    }
    // A request being answered gets a moment to finish; idle connections are closed.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.shutdown().await;
    Ok(())
}

async fn prometheus_text(State(metrics): State<Metrics>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics.render(),
    )
}

async fn readiness(State(metrics): State<Metrics>) -> impl IntoResponse {
    let pipelines = metrics.health();
    let ready = !pipelines.is_empty() && pipelines.values().all(|p| p.ready);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(serde_json::json!({ "ready": ready, "pipelines": pipelines })),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::PipelineState;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Whether the server closed `stream`, reading what it sent before without waiting.
    fn is_closed(stream: &tokio::net::TcpStream) -> bool {
        let mut buf = [0u8; 1024];
        loop {
            match stream.try_read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
            }
        }
    }

    /// Reads `stream` until the server closes it; panics after `deadline`.
    async fn closed_within(stream: &mut tokio::net::TcpStream, deadline: Duration) {
        let mut buf = [0u8; 1024];
        let closed = tokio::time::timeout(deadline, async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(
            closed.is_ok(),
            "the server kept the connection past {deadline:?}"
        );
    }

    /// Many clients that never finish their headers: each is closed after the header timeout,
    /// no more are served at once than the limit, and a real request gets its answer. (Without
    /// these bounds, such clients hold file descriptors the relay needs to reach PostgreSQL.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_clients_are_cut_off_and_limited_and_a_scrape_still_gets_through() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, Metrics::new(), shutdown.clone()));
        let start = tokio::time::Instant::now();
        let mut slow = Vec::new();
        for _ in 0..3 * MAX_CONNECTIONS {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
            slow.push(stream);
        }
        // Between the first round's timeout and the second's: only the first round, at most
        // the limit, can have been served and cut off by then.
        tokio::time::sleep_until(start + HEADER_READ_TIMEOUT + HEADER_READ_TIMEOUT / 2).await;
        let closed = slow.iter().filter(|s| is_closed(s)).count();
        assert!(
            (1..=MAX_CONNECTIONS).contains(&closed),
            "{closed} of {} slow clients closed after one header timeout: at most {MAX_CONNECTIONS} are served at once, each cut off after {HEADER_READ_TIMEOUT:?}",
            slow.len()
        );
        // Every slow client is served (and cut off) in turn: three rounds of the limit.
        for stream in &mut slow {
            closed_within(stream, 3 * HEADER_READ_TIMEOUT + Duration::from_secs(10)).await;
        }
        let mut scrape = tokio::net::TcpStream::connect(addr).await.unwrap();
        scrape
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), scrape.read_to_string(&mut answer))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the server ends within 10 s of the shutdown")
            .unwrap()
            .unwrap();
    }

    /// Headers over the limit are refused, not buffered.
    #[tokio::test]
    async fn oversized_headers_are_refused() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, Metrics::new(), shutdown.clone()));
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let filler = "a".repeat(4 * MAX_HEADER_BYTES);
        let request = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Filler: {filler}\r\n\r\n");
        let _ = stream.write_all(request.as_bytes()).await;
        let mut answer = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
        shutdown.cancel();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn readyz_shows_an_error_that_recurs_after_every_session_start() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("orders");
        p.set_state(PipelineState::Streaming, None);
        p.set_failed_sessions(3);
        p.set_state(
            PipelineState::Degraded,
            Some("invalid pgoutput message at LSN 0/16B3748".into()),
        );
        let response = readiness(State(metrics.clone())).await.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let orders = &json["pipelines"]["orders"];
        assert_eq!(orders["state"], "degraded", "{json}");
        assert_eq!(orders["consecutive_failed_sessions"], 3, "{json}");
        assert_eq!(
            orders["last_error"], "invalid pgoutput message at LSN 0/16B3748",
            "{json}"
        );
        // Streaming again: ready, and the count stays until a session makes progress.
        p.set_state(PipelineState::Streaming, None);
        let response = readiness(State(metrics.clone())).await.into_response();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(metrics.health()["orders"].consecutive_failed_sessions, 3);
        assert!(metrics.health()["orders"].last_error.is_some());
        // Progress: the error is over.
        p.set_failed_sessions(0);
        assert_eq!(metrics.health()["orders"].last_error, None);
    }

    async fn ready(metrics: &Metrics) -> (StatusCode, serde_json::Value) {
        let response = readiness(State(metrics.clone())).await.into_response();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn a_streaming_pipeline_whose_records_wait_too_long_is_degraded_and_not_ready() {
        let metrics = Metrics::new();
        let p = metrics
            .pipeline("orders")
            .with_max_event_wait(Duration::from_secs(5));
        p.set_state(PipelineState::Streaming, None);
        p.oldest_unacked_age.set(4.0);
        assert_eq!(ready(&metrics).await.0, StatusCode::OK);
        p.oldest_unacked_age.set(20.0);
        let (status, json) = ready(&metrics).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{json}");
        assert_eq!(json["pipelines"]["orders"]["state"], "degraded", "{json}");
        assert!(
            json["pipelines"]["orders"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("max_event_wait_secs = 5")),
            "{json}"
        );
        let text = metrics.render();
        assert!(
            text.contains("outbox_relay_pipeline_state{pipeline=\"orders\",state=\"degraded\"} 1")
                && text.contains(
                    "outbox_relay_pipeline_state{pipeline=\"orders\",state=\"streaming\"} 0"
                ),
            "{text}"
        );
        // Acknowledged: streaming and ready again.
        p.oldest_unacked_age.set(0.0);
        assert_eq!(ready(&metrics).await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn a_standby_is_ready_and_a_failed_pipeline_beside_a_healthy_one_is_not() {
        let metrics = Metrics::new();
        let orders = metrics.pipeline("orders");
        let billing = metrics.pipeline("billing");
        orders.set_state(PipelineState::Streaming, None);
        billing.set_state(
            PipelineState::StandingBy,
            Some("replication slot \"billing\" is active for PID 42".into()),
        );
        let (status, json) = ready(&metrics).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        assert_eq!(json["pipelines"]["billing"]["state"], "standing_by");
        billing.set_state(
            PipelineState::Failed,
            Some("password authentication failed".into()),
        );
        let (status, json) = ready(&metrics).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{json}");
        assert_eq!(json["pipelines"]["billing"]["ready"], false, "{json}");
        assert_eq!(json["pipelines"]["orders"]["ready"], true, "{json}");
    }

    #[tokio::test]
    async fn taking_over_from_a_standby_clears_the_last_error() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("orders");
        p.set_state(PipelineState::Degraded, Some("connection refused".into()));
        p.set_state(
            PipelineState::StandingBy,
            Some("replication slot \"orders\" is active for PID 42".into()),
        );
        p.set_failed_sessions(0);
        p.set_state(PipelineState::Streaming, None);
        let health = &metrics.health()["orders"];
        assert_eq!(
            (health.state, health.last_error.as_deref()),
            (PipelineState::Streaming, None)
        );
    }

    #[test]
    fn build_info_names_the_version_and_commit() {
        let text = Metrics::new().render();
        assert!(
            text.contains(&format!(
                "outbox_relay_build_info{{commit=\"{}\",version=\"{}\"}} 1",
                crate::COMMIT,
                crate::VERSION
            )),
            "{text}"
        );
    }
}
