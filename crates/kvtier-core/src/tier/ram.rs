//! The RAM tier: the hot working set in host memory.
//!
//! - A byte budget ([`MemoryBudget`], shared with the snapshot bucket) that is reserved
//!   before a block is kept, so it is never exceeded, not even for a moment.
//! - Loads return the stored [`Bytes`] itself (a refcount increment): zero copy, and the
//!   cost does not grow with the block size. A layer's page is a slice of it.
//! - The read path takes only a shard's reader lock and bumps striped counters; stores and
//!   evictions serialise on one bookkeeping mutex, held for bookkeeping only (payload bytes
//!   are copied by the engine before it is taken).
//! - Chain-aware LRU eviction (see `ram_book`): leaves only, least recently used first. The
//!   tier holds a block only if it holds the block's parent, so every held chain is whole.
//! - Payloads are copied in once, by the caller of `put` and outside every lock, into a
//!   slot of the engine's arena ([`crate::arena`]) with streaming stores (see
//!   `docs/adr/0004-ram-tier.md` and `docs/adr/0018-arena.md`).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::ram_book::{Book, Node, Slot};
use super::{BlockMeta, PutOutcome, RejectReason, RemovalCause, ResidencySink, Tier, TierKind};
use crate::budget::MemoryBudget;
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::hash::BlockHash;
use crate::shard::ShardedMap;
use crate::stats::{Evictions, StripedCounter, TierStats};
use crate::tier::NoSink;

/// Settings of the RAM tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamConfig {
    /// Host memory for blocks and snapshots together, in bytes (default 1 GiB).
    pub capacity_bytes: u64,
}

impl Default for RamConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: 1 << 30,
        }
    }
}

#[derive(Debug, Default)]
struct Ledger {
    book: Book,
    stores: u64,
    dedup_skips: u64,
    rejected_no_space: u64,
    rejected_parent_missing: u64,
    evictions: Evictions,
    resident_bytes: u64,
}

/// Blocks in host memory. See the module docs.
pub struct RamTier {
    map: ShardedMap<Arc<Slot>>,
    ledger: Mutex<Ledger>,
    budget: Arc<MemoryBudget>,
    clock: Arc<dyn Clock>,
    sink: Arc<dyn ResidencySink>,
    hits: StripedCounter,
    misses: StripedCounter,
}

impl fmt::Debug for RamTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RamTier")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl RamTier {
    /// A RAM tier reserving from `budget`, reading time from `clock` and reporting residency
    /// to `sink`.
    pub fn new(
        budget: Arc<MemoryBudget>,
        clock: Arc<dyn Clock>,
        sink: Arc<dyn ResidencySink>,
    ) -> Self {
        Self {
            map: ShardedMap::default(),
            ledger: Mutex::new(Ledger::default()),
            budget,
            clock,
            sink,
            hits: StripedCounter::default(),
            misses: StripedCounter::default(),
        }
    }

    /// A stand-alone RAM tier of `config.capacity_bytes` with the system clock and no sink.
    pub fn standalone(config: RamConfig) -> Self {
        Self::new(
            Arc::new(MemoryBudget::new(config.capacity_bytes)),
            Arc::new(SystemClock::new()),
            Arc::new(NoSink),
        )
    }

    /// Evicts least recently used leaves until at least `bytes` are freed or nothing is
    /// left to evict. Returns the bytes freed. The snapshot bucket calls this when the
    /// shared budget is full.
    pub fn evict_bytes(&self, bytes: u64) -> u64 {
        let mut ledger = self.ledger.lock();
        let mut freed = 0;
        while freed < bytes {
            let Some(victim) = ledger.book.lru_leaf() else {
                break;
            };
            freed += self.drop_locked(&mut ledger, &victim, RemovalCause::Budget);
        }
        freed
    }

    /// Every block held now with its payload (shared, not copied), parents before
    /// children (by chain position), so a tier that wants a block's parent first gets it.
    pub fn held_blocks(&self) -> Vec<(BlockMeta, Bytes)> {
        let ledger = self.ledger.lock();
        let mut out: Vec<(BlockMeta, Bytes)> = ledger
            .book
            .nodes()
            .map(|n| (n.meta.clone(), n.slot.payload.clone()))
            .collect();
        drop(ledger);
        out.sort_by_key(|(m, _)| m.position);
        out
    }

    /// The put path.
    fn admit(&self, meta: &BlockMeta, payload: Bytes) -> Result<PutOutcome> {
        let now = self.clock.now_nanos();
        let size = payload.len() as u64;
        let refuse = |ledger: &mut Ledger, outcome: PutOutcome| {
            match outcome {
                PutOutcome::Duplicate => ledger.dedup_skips += 1,
                PutOutcome::Rejected(RejectReason::NoSpace) => ledger.rejected_no_space += 1,
                PutOutcome::Rejected(RejectReason::ParentMissing) => {
                    ledger.rejected_parent_missing += 1;
                }
                PutOutcome::Rejected(RejectReason::Collision | RejectReason::Quarantined)
                | PutOutcome::Stored => {}
            }
            Ok(outcome)
        };
        let mut ledger = self.ledger.lock();
        if let Some(node) = ledger.book.get(&meta.hash) {
            node.slot.touch(now);
            return refuse(&mut ledger, PutOutcome::Duplicate);
        }
        if !ledger.book.parent_held(meta) {
            return refuse(
                &mut ledger,
                PutOutcome::Rejected(RejectReason::ParentMissing),
            );
        }
        if size > self.budget.capacity() {
            return refuse(&mut ledger, PutOutcome::Rejected(RejectReason::NoSpace));
        }
        ledger.book.pin_parent(meta);
        // Make room by evicting least recently used leaves (never this block's ancestors,
        // pinned above) until the payload's bytes can be reserved.
        while !self.budget.try_reserve(size) {
            match ledger.book.lru_leaf() {
                Some(victim) => {
                    self.drop_locked(&mut ledger, &victim, RemovalCause::Budget);
                }
                None => {
                    ledger.book.unpin(meta);
                    return refuse(&mut ledger, PutOutcome::Rejected(RejectReason::NoSpace));
                }
            }
        }
        let slot = Arc::new(Slot {
            payload,
            last_access: now.into(),
        });
        self.map.write(&meta.hash).insert(meta.hash, slot.clone());
        ledger.book.insert(meta.clone(), slot);
        ledger.stores += 1;
        ledger.resident_bytes += size;
        self.sink.inserted(TierKind::Ram, meta);
        Ok(PutOutcome::Stored)
    }

    /// Checks the chain and leaf invariants and that the budget covers exactly the held
    /// bytes; for tests. Returns a description of the first broken invariant.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let ledger = self.ledger.lock();
        ledger.book.check()?;
        if ledger.book.len() != self.map.len() {
            return Err(format!(
                "book holds {} blocks, read map {}",
                ledger.book.len(),
                self.map.len()
            ));
        }
        if ledger.resident_bytes > self.budget.capacity() {
            return Err("resident bytes exceed the capacity".into());
        }
        if ledger.resident_bytes > self.budget.used() {
            return Err(format!(
                "resident {} bytes exceed the {} reserved",
                ledger.resident_bytes,
                self.budget.used()
            ));
        }
        Ok(())
    }

    /// Removes one leaf `hash` (already chosen) and returns its size.
    fn drop_locked(&self, ledger: &mut Ledger, hash: &BlockHash, cause: RemovalCause) -> u64 {
        match ledger.book.remove_leaf(hash) {
            Some(node) => self.forget(ledger, node, cause),
            None => 0,
        }
    }

    fn forget(&self, ledger: &mut Ledger, node: Node, cause: RemovalCause) -> u64 {
        let hash = node.meta.hash;
        self.map.write(&hash).remove(&hash);
        let size = node.size();
        ledger.resident_bytes -= size;
        match cause {
            RemovalCause::Budget => ledger.evictions.budget += 1,
            RemovalCause::Ttl => ledger.evictions.ttl += 1,
            RemovalCause::Explicit => ledger.evictions.explicit += 1,
            RemovalCause::Corrupt => ledger.evictions.corrupt += 1,
        }
        self.sink
            .removed(TierKind::Ram, &node.meta, cause, Some(&node.slot.payload));
        self.budget.release(size);
        size
    }
}

impl Tier for RamTier {
    fn kind(&self) -> TierKind {
        TierKind::Ram
    }

    fn put(&self, meta: &BlockMeta, payload: Bytes) -> Result<PutOutcome> {
        self.admit(meta, payload)
    }

    fn get(&self, hash: &BlockHash) -> Result<Option<Bytes>> {
        let now = self.clock.now_nanos();
        let found = self.map.read(hash).get(hash).map(|slot| {
            slot.touch(now);
            slot.payload.clone()
        });
        match &found {
            Some(_) => self.hits.incr(),
            None => self.misses.incr(),
        }
        Ok(found)
    }

    fn get_range(&self, hash: &BlockHash, range: Range<u64>) -> Result<Option<Bytes>> {
        let Some(payload) = self.get(hash)? else {
            return Ok(None);
        };
        let len = payload.len() as u64;
        if range.start >= range.end || range.end > len {
            return Err(Error::invalid(format!(
                "byte range {}..{} is empty or past the end of block `{hash}` ({len} bytes)",
                range.start, range.end
            )));
        }
        // Both ends are within `len`, which came from a `usize`.
        Ok(Some(
            payload.slice(range.start as usize..range.end as usize),
        ))
    }

    fn contains(&self, hash: &BlockHash) -> bool {
        self.map.read(hash).contains_key(hash)
    }

    fn remove(&self, hash: &BlockHash) -> Result<bool> {
        let mut ledger = self.ledger.lock();
        let removed = ledger.book.remove_subtree(hash);
        let held = !removed.is_empty();
        for node in removed {
            self.forget(&mut ledger, node, RemovalCause::Explicit);
        }
        Ok(held)
    }

    fn stats(&self) -> TierStats {
        self.stats_and(|| ()).0
    }
}

impl RamTier {
    /// The tier's counters together with whatever `also` reads, both under the tier's
    /// bookkeeping lock: residency changes reported to the sink happen under that lock too,
    /// so e.g. the index's entry count read in `also` agrees with the tier's residency.
    /// `also` must not call into this tier or into the snapshot bucket.
    pub fn stats_and<T>(&self, also: impl FnOnce() -> T) -> (TierStats, T) {
        let ledger = self.ledger.lock();
        let other = also();
        let stats = TierStats {
            hits: self.hits.get(),
            misses: self.misses.get(),
            stores: ledger.stores,
            dedup_skips: ledger.dedup_skips,
            rejected_no_space: ledger.rejected_no_space,
            rejected_parent_missing: ledger.rejected_parent_missing,
            evictions: ledger.evictions,
            resident_blocks: ledger.book.len() as u64,
            resident_bytes: ledger.resident_bytes,
            capacity_bytes: self.budget.capacity(),
            ..TierStats::default()
        };
        (stats, other)
    }
}

impl RamTier {
    /// Refreshes `hash`'s recency and counts a dedup skip if it is held; returns whether it
    /// was. Lets a caller skip copying a payload the tier already has.
    pub fn touch(&self, hash: &BlockHash) -> bool {
        let now = self.clock.now_nanos();
        let held = self
            .map
            .read(hash)
            .get(hash)
            .map(|s| s.touch(now))
            .is_some();
        if held {
            self.ledger.lock().dedup_skips += 1;
        }
        held
    }
}
