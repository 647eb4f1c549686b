//! Counters and their snapshots.
//!
//! Each component owns its counters under a distinct prefix (`index_`, `ram_`, `snapshot_`,
//! later `ssd_`, `writer_`, `remote_`), so merging them can never overwrite one with another
//! (seed 002, "Stats ownership"). Counters bumped on the lock-free read path are
//! [`StripedCounter`]s, so two threads loading blocks do not fight over one cache line.

use std::sync::atomic::{AtomicU64, Ordering};

/// Number of stripes; a power of two at least the core count of the machines we target.
const STRIPES: usize = 16;

#[derive(Debug, Default)]
#[repr(align(128))]
struct PaddedCounter(AtomicU64);

/// A counter split over cache-line-padded stripes chosen by thread.
#[derive(Debug, Default)]
pub struct StripedCounter {
    stripes: [PaddedCounter; STRIPES],
}

fn stripe_of_this_thread() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = Cell::new(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
    }
    STRIPE.with(Cell::get)
}

impl StripedCounter {
    /// Adds one.
    pub fn incr(&self) {
        self.add(1);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.stripes[stripe_of_this_thread()]
            .0
            .fetch_add(n, Ordering::Relaxed);
    }

    /// The sum over all stripes.
    pub fn get(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }
}

/// `(name, value)` pairs as `(prefix_name, value)`: every component's counter list.
pub(crate) fn prefixed(prefix: &str, pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    pairs
        .iter()
        .map(|(k, v)| (format!("{prefix}_{k}"), *v))
        .collect()
}

/// Evictions of one tier, by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evictions {
    /// Evicted to stay within the byte budget.
    pub budget: u64,
    /// Expired.
    pub ttl: u64,
    /// Removed on request.
    pub explicit: u64,
    /// Dropped because they failed verification.
    pub corrupt: u64,
}

/// A snapshot of one tier's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Loads that found the block.
    pub hits: u64,
    /// Loads that did not.
    pub misses: u64,
    /// Blocks admitted.
    pub stores: u64,
    /// Puts of a block already held (refreshed, not rewritten).
    pub dedup_skips: u64,
    /// Puts refused for lack of room.
    pub rejected_no_space: u64,
    /// Puts refused because the parent block was absent.
    pub rejected_parent_missing: u64,
    /// Puts refused because another block holds the same hash (the hash is quarantined).
    pub rejected_collision: u64,
    /// Puts refused because the hash is quarantined.
    pub rejected_quarantined: u64,
    /// Reads or writes that failed with an I/O error (disk full included).
    pub io_errors: u64,
    /// Blocks removed, by cause.
    pub evictions: Evictions,
    /// Blocks held now.
    pub resident_blocks: u64,
    /// Payload bytes held now.
    pub resident_bytes: u64,
    /// The tier's byte capacity.
    pub capacity_bytes: u64,
}

impl TierStats {
    /// The counters as `(name, value)` pairs, each name starting with `prefix_`.
    pub fn counters(&self, prefix: &str) -> Vec<(String, u64)> {
        prefixed(
            prefix,
            &[
                ("hits", self.hits),
                ("misses", self.misses),
                ("stores", self.stores),
                ("dedup_skips", self.dedup_skips),
                ("rejected_no_space", self.rejected_no_space),
                ("rejected_parent_missing", self.rejected_parent_missing),
                ("rejected_collision", self.rejected_collision),
                ("rejected_quarantined", self.rejected_quarantined),
                ("io_errors", self.io_errors),
                ("evictions_budget", self.evictions.budget),
                ("evictions_ttl", self.evictions.ttl),
                ("evictions_explicit", self.evictions.explicit),
                ("evictions_corrupt", self.evictions.corrupt),
                ("resident_blocks", self.resident_blocks),
                ("resident_bytes", self.resident_bytes),
                ("capacity_bytes", self.capacity_bytes),
            ],
        )
    }
}

/// A snapshot of the prefix index's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Lookups served.
    pub lookups: u64,
    /// Lookups that matched at least one block.
    pub lookup_hits: u64,
    /// Lookups that matched nothing.
    pub lookup_misses: u64,
    /// Blocks matched over all lookups.
    pub matched_blocks: u64,
    /// Entries whose hash matched but whose parent, tokens, extra keys or layout did not:
    /// treated as a miss. Non-zero means a hash collision or a bug, never served.
    pub verify_mismatches: u64,
    /// Blocks the index knows of now.
    pub entries: u64,
}

impl IndexStats {
    /// The counters as `(name, value)` pairs prefixed `index_`.
    pub fn counters(&self) -> Vec<(String, u64)> {
        prefixed(
            "index",
            &[
                ("lookups", self.lookups),
                ("lookup_hits", self.lookup_hits),
                ("lookup_misses", self.lookup_misses),
                ("matched_blocks", self.matched_blocks),
                ("verify_mismatches", self.verify_mismatches),
                ("entries", self.entries),
            ],
        )
    }
}

/// A snapshot of the snapshot bucket's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotStats {
    /// Gets that found a live snapshot.
    pub hits: u64,
    /// Gets that did not (absent or expired).
    pub misses: u64,
    /// Snapshots stored (new or replacing one under the same key).
    pub stores: u64,
    /// Puts refused (larger than the byte cap, or no memory could be freed).
    pub rejected: u64,
    /// Snapshots dropped to respect the entry cap.
    pub evictions_entries: u64,
    /// Snapshots dropped to respect the byte cap or the shared memory budget.
    pub evictions_bytes: u64,
    /// Snapshots dropped because their TTL passed.
    pub evictions_ttl: u64,
    /// Snapshots held now.
    pub resident_entries: u64,
    /// Snapshot bytes held now.
    pub resident_bytes: u64,
}

impl SnapshotStats {
    /// The counters as `(name, value)` pairs prefixed `snapshot_`.
    pub fn counters(&self) -> Vec<(String, u64)> {
        prefixed(
            "snapshot",
            &[
                ("hits", self.hits),
                ("misses", self.misses),
                ("stores", self.stores),
                ("rejected", self.rejected),
                ("evictions_entries", self.evictions_entries),
                ("evictions_bytes", self.evictions_bytes),
                ("evictions_ttl", self.evictions_ttl),
                ("resident_entries", self.resident_entries),
                ("resident_bytes", self.resident_bytes),
            ],
        )
    }
}

/// Everything the engine counts, taken in one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// The prefix index.
    pub index: IndexStats,
    /// The RAM tier.
    pub ram: TierStats,
    /// The persistent tier, when one is attached.
    pub ssd: Option<TierStats>,
    /// The persistent tier's write-behind queue, when one is attached.
    pub writer: Option<crate::tier::writer::WriterStats>,
    /// The remote tier's counters, if one is attached.
    pub remote: Option<TierStats>,
    /// Its write-behind queue's counters.
    pub remote_writer: Option<crate::tier::writer::WriterStats>,
    /// Blocks read from the persistent tier and promoted into RAM.
    pub promotions: u64,
    /// Blocks read ahead from the persistent tier after a lookup and promoted into RAM.
    pub prefetched: u64,
    /// Prefetched blocks that a load then found in RAM.
    pub prefetch_used: u64,
    /// Lookups whose prefetch was skipped (queue full).
    pub prefetch_skipped: u64,
    /// Blocks RAM evicted and queued for the persistent tier (evict-only mode).
    pub demotions_queued: u64,
    /// Blocks RAM evicted that could not be queued (queue full or closing).
    pub demotions_dropped: u64,
    /// Evict-only mode: RAM-only blocks written to the persistent tier at shutdown.
    pub shutdown_saved: u64,
    /// Evict-only mode: RAM-only blocks a shutdown could not write (deadline, refusal).
    pub shutdown_unsaved: u64,
    /// The snapshot bucket.
    pub snapshot: SnapshotStats,
    /// Bytes of the shared memory budget in use (RAM blocks plus snapshots).
    pub memory_used_bytes: u64,
    /// The shared memory budget.
    pub memory_capacity_bytes: u64,
}

impl EngineStats {
    /// Every counter as `(name, value)`, names unique thanks to their prefixes.
    pub fn counters(&self) -> Vec<(String, u64)> {
        let mut out = self.index.counters();
        out.extend(self.ram.counters("ram"));
        if let Some(ssd) = &self.ssd {
            out.extend(ssd.counters("ssd"));
        }
        if let Some(writer) = &self.writer {
            out.extend(writer.counters());
        }
        if let Some(remote) = &self.remote {
            out.extend(remote.counters("remote"));
        }
        if let Some(writer) = &self.remote_writer {
            out.extend(
                writer
                    .counters()
                    .into_iter()
                    .map(|(n, v)| (format!("remote_{n}"), v)),
            );
        }
        out.push(("engine_promotions_ssd_to_ram".into(), self.promotions));
        out.push(("engine_prefetched_blocks".into(), self.prefetched));
        out.push(("engine_prefetch_used_blocks".into(), self.prefetch_used));
        out.push(("engine_prefetch_skipped".into(), self.prefetch_skipped));
        out.push((
            "engine_demotions_ram_to_ssd_queued".into(),
            self.demotions_queued,
        ));
        out.push((
            "engine_demotions_ram_to_ssd_dropped".into(),
            self.demotions_dropped,
        ));
        out.push(("engine_shutdown_saved_blocks".into(), self.shutdown_saved));
        out.push((
            "engine_shutdown_unsaved_blocks".into(),
            self.shutdown_unsaved,
        ));
        out.extend(self.snapshot.counters());
        out.push(("engine_memory_used_bytes".into(), self.memory_used_bytes));
        out.push((
            "engine_memory_capacity_bytes".into(),
            self.memory_capacity_bytes,
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_names_are_unique() {
        let names: Vec<String> = EngineStats::default()
            .counters()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let unique: std::collections::HashSet<&String> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
    }

    #[test]
    fn striped_counter_sums_over_threads() {
        let c = std::sync::Arc::new(StripedCounter::default());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || (0..1000).for_each(|_| c.incr()))
            })
            .collect();
        for h in handles {
            assert!(h.join().is_ok());
        }
        assert_eq!(c.get(), 4000);
    }
}
