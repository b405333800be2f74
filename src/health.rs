//! The HTTP endpoint: Prometheus `/metrics`, `/healthz` (the process is alive) and `/readyz`
//! (every pipeline is streaming; JSON detail per pipeline, 503 otherwise).

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, PipelineState};

/// Binds the endpoint's address.
///
/// Returns an error if the address cannot be bound (in use, not local, no permission).
pub async fn bind(listen: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen).await
}

/// Serves the endpoint on `listener` until `shutdown` is cancelled.
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
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

async fn prometheus_text(State(metrics): State<Metrics>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics.render(),
    )
}

async fn readiness(State(metrics): State<Metrics>) -> impl IntoResponse {
    let pipelines = metrics.health();
    let ready = !pipelines.is_empty()
        && pipelines
            .values()
            .all(|p| p.state == PipelineState::Streaming);
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
