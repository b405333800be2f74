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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readyz_shows_an_error_that_recurs_after_every_session_start() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("orders");
        p.set_state(PipelineState::Streaming, None);
        p.set_failed_sessions(3);
        p.set_state(
            PipelineState::Reconnecting,
            Some("invalid pgoutput message at LSN 0/16B3748".into()),
        );
        let response = readiness(State(metrics.clone())).await.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let orders = &json["pipelines"]["orders"];
        assert_eq!(orders["state"], "reconnecting", "{json}");
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
    }
}
