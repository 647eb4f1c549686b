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
//! - Buffers of evicted blocks are recycled for the next store of the same size, together
//!   with their budget reservation, so steady-state stores neither fault in fresh pages nor
//!   step outside the budget (see [`RamTier::buffer_for`]).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
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

/// Recycled payload buffers; each one's bytes stay reserved in the budget while pooled.
#[derive(Debug, Default)]
struct Pool {
    bufs: Vec<BytesMut>,
    bytes: u64,
}

/// Most buffers kept for reuse.
const POOL_MAX_BUFFERS: usize = 8;

/// A payload copied into memory reserved from the RAM tier's budget, ready for
/// [`RamTier::put_buffer`]. Dropping it unused returns its reservation.
#[derive(Debug)]
pub struct BlockBuffer {
    buf: BytesMut,
    reserved: u64,
    budget: Arc<MemoryBudget>,
}

impl BlockBuffer {
    /// The copied bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// Takes the bytes and the reservation out, leaving nothing to release on drop.
    fn into_parts(mut self) -> (Bytes, u64) {
        let reserved = std::mem::take(&mut self.reserved);
        (std::mem::take(&mut self.buf).freeze(), reserved)
    }
}

impl Drop for BlockBuffer {
    fn drop(&mut self) {
        if self.reserved > 0 {
            self.budget.release(self.reserved);
        }
    }
}

/// Blocks in host memory. See the module docs.
pub struct RamTier {
    map: ShardedMap<Arc<Slot>>,
    ledger: Mutex<Ledger>,
    pool: Mutex<Pool>,
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
            pool: Mutex::new(Pool::default()),
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
        let mut freed = self.drain_pool();
        while freed < bytes {
            let Some(victim) = ledger.book.lru_leaf() else {
                break;
            };
            freed += self.drop_locked(&mut ledger, &victim, RemovalCause::Budget, false);
        }
        freed
    }

    /// Copies `src` into a buffer for [`RamTier::put_buffer`], reusing a recycled buffer of
    /// the same size (and its budget reservation) when one is pooled. The copy uses
    /// non-temporal stores for large payloads. No lock is held during the copy.
    pub fn buffer_for(&self, src: &[u8]) -> BlockBuffer {
        let size = src.len();
        let recycled = {
            let mut pool = self.pool.lock();
            let at = pool.bufs.iter().position(|b| b.capacity() == size);
            at.map(|i| {
                let b = pool.bufs.swap_remove(i);
                pool.bytes -= size as u64;
                b
            })
        };
        let (mut buf, reserved) = match recycled {
            Some(b) => (b, size as u64),
            None => (BytesMut::with_capacity(size), 0),
        };
        crate::copy::copy_into(&mut buf, src);
        BlockBuffer {
            buf,
            reserved,
            budget: self.budget.clone(),
        }
    }

    /// Admits a block whose payload was prepared by [`RamTier::buffer_for`]; like
    /// [`Tier::put`] otherwise.
    pub fn put_buffer(&self, meta: &BlockMeta, buffer: BlockBuffer) -> Result<PutOutcome> {
        let (payload, reserved) = buffer.into_parts();
        self.admit(meta, payload, reserved)
    }

    /// Returns every pooled buffer's reservation; returns the bytes released.
    fn drain_pool(&self) -> u64 {
        let mut pool = self.pool.lock();
        let freed = pool.bytes;
        pool.bufs.clear();
        pool.bytes = 0;
        self.budget.release(freed);
        freed
    }

    /// Keeps an evicted block's buffer, with its reservation, for the next store of that
    /// size. Returns false (the caller releases) when the buffer is shared or the pool full.
    fn recycle(&self, payload: Bytes) -> bool {
        let size = payload.len() as u64;
        let mut pool = self.pool.lock();
        if pool.bufs.len() >= POOL_MAX_BUFFERS || pool.bytes + size > self.budget.capacity() / 16 {
            return false;
        }
        match payload.try_into_mut() {
            Ok(buf) => {
                pool.bufs.push(buf);
                pool.bytes += size;
                true
            }
            Err(_) => false,
        }
    }

    /// The put path. `reserved` bytes of the budget are already held for this payload
    /// (a recycled buffer's); they are kept on admission and released otherwise.
    fn admit(&self, meta: &BlockMeta, payload: Bytes, mut reserved: u64) -> Result<PutOutcome> {
        let now = self.clock.now_nanos();
        let size = payload.len() as u64;
        if reserved > size {
            self.budget.release(reserved - size);
            reserved = size;
        }
        let refuse = |ledger: &mut Ledger, outcome: PutOutcome| {
            if reserved > 0 {
                self.budget.release(reserved);
            }
            match outcome {
                PutOutcome::Duplicate => ledger.dedup_skips += 1,
                PutOutcome::Rejected(RejectReason::NoSpace) => ledger.rejected_no_space += 1,
                PutOutcome::Rejected(RejectReason::ParentMissing) => {
                    ledger.rejected_parent_missing += 1;
                }
                PutOutcome::Stored => {}
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
        // Top the reservation up to the payload size: pooled buffers first (they hold
        // reservations but no blocks), then least recently used leaves.
        let missing = size - reserved;
        while missing > 0 && !self.budget.try_reserve(missing) {
            if self.drain_pool() > 0 {
                continue;
            }
            match ledger.book.lru_leaf() {
                Some(victim) => {
                    self.drop_locked(&mut ledger, &victim, RemovalCause::Budget, true);
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
        let pooled = self.pool.lock().bytes;
        if ledger.resident_bytes + pooled > self.budget.used() {
            return Err(format!(
                "resident {} + pooled {pooled} bytes exceed the {} reserved",
                ledger.resident_bytes,
                self.budget.used()
            ));
        }
        Ok(())
    }

    /// Removes one leaf `hash` (already chosen) and returns its size.
    fn drop_locked(
        &self,
        ledger: &mut Ledger,
        hash: &BlockHash,
        cause: RemovalCause,
        recycle: bool,
    ) -> u64 {
        match ledger.book.remove_leaf(hash) {
            Some(node) => self.forget(ledger, node, cause, recycle),
            None => 0,
        }
    }

    fn forget(&self, ledger: &mut Ledger, node: Node, cause: RemovalCause, recycle: bool) -> u64 {
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
        // The read map's reference is gone; readers hold clones of the bytes, not the slot.
        let recycled =
            recycle && Arc::try_unwrap(node.slot).is_ok_and(|slot| self.recycle(slot.payload));
        if !recycled {
            self.budget.release(size);
        }
        size
    }
}

impl Tier for RamTier {
    fn kind(&self) -> TierKind {
        TierKind::Ram
    }

    fn put(&self, meta: &BlockMeta, payload: Bytes) -> Result<PutOutcome> {
        self.admit(meta, payload, 0)
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
            self.forget(&mut ledger, node, RemovalCause::Explicit, false);
        }
        Ok(held)
    }

    fn stats(&self) -> TierStats {
        let ledger = self.ledger.lock();
        TierStats {
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
        }
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
