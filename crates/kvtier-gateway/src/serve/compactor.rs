//! The gateway's compaction thread: a pass every `compact_interval`
//! (`GatewayStore::compact`), each moving at most one segment's worth of bytes, counted
//! in [`super::Counters`]. Stopped (and joined) with the gateway: a pass in progress ends
//! first, so the store's files are closed when the gateway's stop returns.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use crate::store::GatewayStore;

use super::Counters;

/// How compaction runs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Schedule {
    pub interval: Duration,
    pub below: f64,
    pub budget: u64,
}

/// Runs passes until `stop`'s sender is dropped.
pub(super) fn run(
    store: Arc<GatewayStore>,
    schedule: Schedule,
    counters: Arc<Counters>,
    stop: Receiver<()>,
) {
    loop {
        match stop.recv_timeout(schedule.interval) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        match store.compact(schedule.below, schedule.budget) {
            Ok(done) => {
                counters
                    .segments_removed
                    .fetch_add(done.segments_removed, Ordering::Relaxed);
                counters
                    .bytes_reclaimed
                    .fetch_add(done.bytes_reclaimed, Ordering::Relaxed);
                counters
                    .records_moved
                    .fetch_add(done.records_moved, Ordering::Relaxed);
                if done.segments_removed + done.records_moved > 0 {
                    tracing::info!(
                        removed = done.segments_removed,
                        reclaimed = done.bytes_reclaimed,
                        moved = done.records_moved,
                        moved_bytes = done.bytes_moved,
                        "gateway compaction pass"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "gateway compaction pass failed; trying again next pass")
            }
        }
    }
}
