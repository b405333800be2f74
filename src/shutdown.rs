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

/// Exits the process with [`crate::error::EXIT_SECOND_SIGNAL`] on the next SIGINT or SIGTERM:
/// for after [`signal`], when an operator will not wait for the drain. The events after the
/// confirmed LSN are published again on the next start.
///
/// # Panics
/// If the signal handlers cannot be installed (no tokio runtime with signals enabled).
pub async fn exit_on_second_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::warn!("second signal: exiting before the drain finished; the events after the confirmed LSN are published again on the next start");
    std::process::exit(i32::from(crate::error::EXIT_SECOND_SIGNAL));
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
