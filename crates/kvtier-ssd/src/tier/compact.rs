//! Compaction: space is reclaimed by whole segments. A sealed segment whose live records
//! fill less than a given fraction of it has them rewritten at the tail of the active
//! segment, then is deleted. A crash half-way leaves two copies of some records; recovery
//! keeps the newer, so nothing is lost and nothing is served twice.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kvtier_core::Result;
use kvtier_core::tier::RemovalCause;

use super::{Coding, Held, SsdTier, key_of};
use crate::format::SEGMENT_HEADER_LEN;
use crate::store::ReadFault;

/// What one compaction pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compacted {
    /// Segments deleted.
    pub segments: u64,
    /// Live records moved out of them.
    pub relocated: u64,
    /// Records found corrupt while moving (dropped, quarantined).
    pub corrupt: u64,
}

impl SsdTier {
    /// Rewrites the live records of every sealed segment whose live bytes are below
    /// `max_live_fraction` of its size, and deletes those segments.
    pub fn compact(&self, max_live_fraction: f64) -> Result<Compacted> {
        let mut done = Compacted::default();
        let active = self.store.active_segment();
        for id in self.store.segment_ids() {
            if Some(id) == active {
                continue;
            }
            let Some(len) = self.store.segment_len(id) else {
                continue;
            };
            let live = self
                .counters
                .lock()
                .segment_live
                .get(&id)
                .copied()
                .unwrap_or(0);
            let capacity = len.saturating_sub(SEGMENT_HEADER_LEN).max(1);
            if live as f64 >= max_live_fraction * capacity as f64 {
                continue;
            }
            let movers: Vec<Arc<Held>> = self
                .blocks
                .read()
                .values()
                .filter(|h| h.loc.segment == id)
                .cloned()
                .collect();
            for old in movers {
                let hash = old.meta.hash;
                // While this copy is written no store of the key runs (see `claims.rs`):
                // a copy found dropped below was deleted, not stored again meanwhile, so
                // its tombstone on the new copy deletes nothing a store wrote.
                let _claim = self.claims.claim(key_of(&hash));
                let current = self.blocks.read().get(&hash).cloned();
                if !current.is_some_and(|now| Arc::ptr_eq(&now, &old)) {
                    continue;
                }
                let payload = match self.store.read(&old.loc, &key_of(&hash), None) {
                    Ok(p) => p,
                    Err(ReadFault::Corrupt(why)) => {
                        tracing::warn!(block = %hash, %why, "corrupt record found by compaction");
                        self.quarantine(hash);
                        if self.drop_if(&hash, Some(&old), RemovalCause::Corrupt)? {
                            done.corrupt += 1;
                        }
                        continue;
                    }
                    Err(ReadFault::Io(e)) => return Err(e),
                };
                // On the maintenance thread: a record written raw by an acknowledged
                // store is encoded now, if its namespace has a codec.
                let loc = self.write_record(&old.meta, &payload, false, Coding::Encode)?;
                let moved = Arc::new(Held {
                    loc,
                    meta: old.meta.clone(),
                    last_access: old.last_access.load(Ordering::Relaxed).into(),
                });
                let mut blocks = self.blocks.write();
                let still_same = blocks.get(&hash).is_some_and(|now| Arc::ptr_eq(now, &old));
                if still_same {
                    blocks.insert(hash, moved);
                }
                drop(blocks);
                let mut c = self.counters.lock();
                if still_same {
                    c.release(old.meta.layout, &old.loc);
                    c.hold(old.meta.layout, &loc);
                    c.records_relocated += 1;
                    done.relocated += 1;
                } else {
                    // Dropped while we copied it: the new copy, the newest, carries the
                    // delete.
                    drop(c);
                    let _ = self.store.tombstone(&loc, key_of(&hash));
                }
            }
            done.relocated += self.relocate_snapshots(id)?;
            let left = self.blocks.read().values().any(|h| h.loc.segment == id)
                || self.snapshots.read().values().any(|h| h.loc.segment == id);
            if !left {
                self.store.remove_segment(id)?;
                let mut c = self.counters.lock();
                c.segment_live.remove(&id);
                c.segments_reclaimed += 1;
                done.segments += 1;
            }
        }
        Ok(done)
    }

    /// Segments reclaimed and records relocated by compaction since open.
    pub fn compaction_totals(&self) -> (u64, u64) {
        let c = self.counters.lock();
        (c.segments_reclaimed, c.records_relocated)
    }
}
