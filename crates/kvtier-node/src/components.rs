//! [`Components`]: what the assembly hands every part of a node instead of letting each
//! start its own — one clock and one runtime for network I/O.
//!
//! With one clock, every TTL, LRU order and record stamp in a node reads the same time,
//! and a test that passes a `MockClock` moves all of them at once (nothing sleeps). With
//! one runtime, a node has one set of I/O threads however many network tiers it has, and
//! their lifetime is the node's business, not each tier's.

use std::sync::Arc;

use kvtier_core::clock::{Clock, SystemClock};
use kvtier_remote::IoRuntime;

/// Threads of the I/O runtime a node starts for itself.
const IO_WORKERS: usize = 2;

/// The components a node is assembled from; see the module docs.
#[derive(Debug, Clone)]
pub struct Components {
    /// Time for the engine and every tier (default: the system's clocks).
    pub clock: Arc<dyn Clock>,
    /// The runtime network tiers run their requests on (default: none given; the node
    /// starts one of two threads, `kvtier-io`, if and when a tier needs it).
    pub runtime: Option<IoRuntime>,
}

impl Default for Components {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock::new()),
            runtime: None,
        }
    }
}

impl Components {
    /// The runtime given, or one started now (then kept, so it is started once).
    pub(crate) fn runtime(&mut self) -> kvtier_core::Result<IoRuntime> {
        if let Some(rt) = &self.runtime {
            return Ok(rt.clone());
        }
        let rt = IoRuntime::new("kvtier-io", IO_WORKERS)?;
        self.runtime = Some(rt.clone());
        Ok(rt)
    }
}
