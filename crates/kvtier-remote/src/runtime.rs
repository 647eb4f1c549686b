//! [`IoRuntime`]: the tokio runtime a node lends to the tiers that talk to the network.
//!
//! The [`kvtier_core::Tier`] trait is synchronous, and its callers include threads of other
//! runtimes (the server's request handlers, on blocking threads of the server's runtime).
//! A tier must therefore never `block_on` a runtime that might be its caller's: it spawns
//! each request on a runtime of its own kind — dedicated threads that only ever run tier
//! I/O — and waits for the answer on a channel, with a deadline.
//!
//! That runtime is a component like the clock: the assembly (`kvtier-node`) creates one
//! per node and hands a clone to every tier that needs it, instead of each tier starting
//! a private one. Clones share one runtime, and every holder keeps it alive, so it
//! outlives each tier by construction: the tier's in-flight requests never find it gone.
//! The last clone to be dropped shuts it down in the background, without waiting for its
//! tasks, because that drop may happen on a thread of another runtime, where waiting
//! would panic.

use std::sync::Arc;

use kvtier_core::{Error, ErrorKind, Result};
use tokio::runtime::{Builder, Handle, Runtime};

/// A shared multi-threaded tokio runtime for tier I/O. Cloning shares it; see the module
/// docs.
#[derive(Clone)]
pub struct IoRuntime {
    inner: Arc<Owned>,
}

struct Owned {
    /// Taken on drop, to be shut down without waiting.
    runtime: Option<Runtime>,
    handle: Handle,
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for IoRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoRuntime")
            .field("workers", &self.inner.handle.metrics().num_workers())
            .finish()
    }
}

impl IoRuntime {
    /// Starts a runtime of `workers` threads (at least one) named `name`, with timers
    /// and I/O enabled.
    pub fn new(name: &str, workers: usize) -> Result<Self> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .thread_name(name)
            .enable_all()
            .build()
            .map_err(|e| {
                Error::new(
                    ErrorKind::Unavailable,
                    format!("cannot start the I/O runtime `{name}`"),
                )
                .with_source(e)
            })?;
        let handle = runtime.handle().clone();
        Ok(Self {
            inner: Arc::new(Owned {
                runtime: Some(runtime),
                handle,
            }),
        })
    }

    /// The handle to spawn tasks on.
    pub fn handle(&self) -> &Handle {
        &self.inner.handle
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    #[test]
    fn a_clone_keeps_the_runtime_running_after_the_original_is_dropped() {
        let rt = IoRuntime::new("kvtier-test-io", 1).unwrap();
        let lent = rt.clone();
        drop(rt);
        let (tx, rx) = std::sync::mpsc::channel();
        lent.handle().spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            let _ = tx.send(7);
        });
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap(),
            7
        );
    }

    #[test]
    fn the_last_clone_may_be_dropped_inside_another_runtime() {
        let rt = IoRuntime::new("kvtier-test-io", 1).unwrap();
        let outer = Builder::new_current_thread().build().unwrap();
        // Dropping a runtime that waits for its tasks here would panic.
        outer.block_on(async move { drop(rt) });
    }
}
