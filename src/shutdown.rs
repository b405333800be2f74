//! Shutdown signals.

/// Completes on the first SIGINT or SIGTERM.
///
/// # Panics
/// If the signal handlers cannot be installed (no tokio runtime with signals enabled).
pub async fn signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = terminate.recv() => tracing::info!("received SIGTERM, draining"),
        _ = tokio::signal::ctrl_c() => tracing::info!("received SIGINT, draining"),
    }
}
