//! Group commit: concurrent callers that each need their writes durable share syncs.
//!
//! Writes are counted as they are made. One caller at a time leads: it notes the count,
//! syncs, and records that count as covered. Callers arriving meanwhile wait on a condition
//! variable, not in a mutex queue, so when the sync ends they all wake at once: those whose
//! writes it covered return straight away, and one of the rest leads the next sync, which
//! covers everything written during the previous one. With sixteen concurrent durable
//! stores that is about one `fdatasync` per batch, and nobody waits more than two syncs
//! (a mutex held across the sync let late arrivals barge ahead of early ones).

use kvtier_core::Result;
use parking_lot::{Condvar, Mutex};

#[derive(Debug, Default)]
struct State {
    /// Writes (by count) that a finished sync covered.
    synced: u64,
    /// A leader is syncing now.
    running: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct SyncGate {
    state: Mutex<State>,
    done: Condvar,
}

impl SyncGate {
    /// Returns once the writes up to count `wanted` are durable: at once if a finished
    /// sync covered them, else after a sync led by this caller or another. `sync` is what
    /// a leader runs; it returns the count of writes it covered. With `wanted` `None`,
    /// this caller always leads a sync of its own (after any running one).
    pub(super) fn sync(
        &self,
        wanted: Option<u64>,
        sync: impl FnOnce() -> Result<u64>,
    ) -> Result<()> {
        let mut state = self.state.lock();
        loop {
            if wanted.is_some_and(|w| state.synced >= w) {
                return Ok(());
            }
            if !state.running {
                break;
            }
            self.done.wait(&mut state);
        }
        state.running = true;
        drop(state);
        let result = sync();
        let mut state = self.state.lock();
        state.running = false;
        if let Ok(covered) = result {
            state.synced = state.synced.max(covered);
        }
        drop(state);
        self.done.notify_all();
        result.map(|_| ())
    }
}
