//! Stopping on a signal: both front ends stop cleanly on SIGTERM or SIGINT.

use std::future::Future;

use tokio::signal::unix::{Signal, SignalKind, signal};

/// Registers for SIGTERM and SIGINT now and returns a future that resolves on the first of
/// them. The registration is what replaces the default action (exit at once), so a front
/// end calls this before it can be signalled — before it opens its store and prints that
/// it listens — and a SIGTERM at any moment after is a clean stop, not a kill. Needs a
/// tokio runtime's context (call it inside one, or under `Runtime::enter`). A signal that
/// cannot be watched (no signal driver) is logged and never resolves.
pub fn stop_signals() -> impl Future<Output = ()> + Send + 'static {
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        tokio::select! {
            () = wait(term, "SIGTERM") => {}
            () = wait(int, "SIGINT") => {}
        }
    }
}

async fn wait(watched: std::io::Result<Signal>, name: &str) {
    match watched {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(e) => {
            tracing::warn!(signal = name, error = %e, "cannot watch a stop signal");
            std::future::pending::<()>().await;
        }
    }
}
