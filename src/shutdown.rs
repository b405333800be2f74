//! Shutdown signals, and tasks that end with their owner.

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

/// A spawned task that ends with its owner: aborted when this guard is dropped (a dropped
/// `JoinHandle` would detach it instead). Holds connection drivers and watchers whose owner
/// (a session, a pipeline) may be dropped at any await.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
