//! The snapshot bucket: exact-prefix reuse for recurrent-state models (seed 003).
//!
//! Mamba-like layers carry a fixed-size state that cannot be cut at an arbitrary earlier
//! token, so their prompts cannot share blocks. Instead, the whole state at the end of a
//! turn is kept under a key made of the layout, a hash of the exact full prompt and an
//! optional session key, and is restored only on an exact match.
//!
//! The bucket has its own entry cap, byte cap and TTL, separate from the block tiers, but
//! its bytes come out of the same host-memory budget as RAM blocks.
//!
//! The engine keeps two buckets: end-of-turn snapshots (least recently read goes first)
//! and periodic checkpoints at block boundaries inside prompts (issue 16), which evict by
//! recency, hit count and length together ([`Eviction::Scored`]).

mod key;

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;

pub use key::SnapshotKey;

use crate::budget::MemoryBudget;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::layout::LayoutDigest;
use crate::stats::SnapshotStats;

/// Settings of the snapshot bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotConfig {
    /// Most snapshots held at once (default 4,096).
    pub max_entries: usize,
    /// Most snapshot bytes held at once (default 256 MiB); also the largest accepted blob.
    pub max_bytes: u64,
    /// How long a snapshot lives after it was stored (default 24 hours).
    pub ttl: Duration,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        Self {
            max_entries: 4096,
            max_bytes: 256 << 20,
            ttl: Duration::from_secs(24 * 3600),
        }
    }
}

impl SnapshotConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        if self.max_entries == 0 || self.max_bytes == 0 || self.ttl.is_zero() {
            return Err(Error::invalid(format!(
                "snapshot bucket settings must be positive: max_entries={}, max_bytes={}, ttl={:?}",
                self.max_entries, self.max_bytes, self.ttl
            )));
        }
        Ok(())
    }
}

/// Settings of the checkpoint bucket: recurrent state kept at block boundaries inside
/// prompts, so a prompt that diverges from a cached one restores the last checkpoint
/// before the divergence and replays only the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// The bucket's own caps and TTL (default 16,384 entries, 256 MiB or a quarter of the
    /// RAM capacity, 24 hours); it evicts by [`Eviction::Scored`].
    pub bucket: SnapshotConfig,
    /// Tokens between checkpoints of a prompt, unless a layout sets its own (default
    /// 256; rounded up to whole blocks of each layout).
    pub every_tokens: u32,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            bucket: SnapshotConfig {
                max_entries: 16_384,
                ..SnapshotConfig::default()
            },
            every_tokens: 256,
        }
    }
}

impl CheckpointConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        self.bucket.validate()?;
        if self.every_tokens == 0 {
            return Err(Error::invalid("checkpoint every_tokens must be at least 1"));
        }
        Ok(())
    }
}

/// How a [`SnapshotBucket::put`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotPut {
    /// Stored under a new key.
    Stored,
    /// Stored, replacing the snapshot held under the same key.
    Replaced,
    /// Not stored: larger than the byte cap, or no memory could be freed for it.
    Rejected,
}

/// How a full bucket picks the entry to drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// The least recently read entry.
    Lru,
    /// Among the [`SCORED_SAMPLE`] least recently read entries, the one read fewest times,
    /// then the one covering fewest tokens (cheapest to recompute), then the oldest.
    /// Recency still decides which entries are candidates at all, so an entry that is
    /// read keeps its place; a checkpoint deep into a shared document that serves many
    /// prompts outlives a shallow one nobody restored.
    Scored,
}

/// How many of the least recently read entries [`Eviction::Scored`] weighs.
pub const SCORED_SAMPLE: usize = 8;

#[derive(Debug)]
struct Entry {
    blob: Bytes,
    /// The layout the state was computed under (a layout's delete drops its states).
    layout: LayoutDigest,
    expires_at: u64,
    last_access: u64,
    /// Tokens of prompt the state covers.
    tokens: u64,
    /// Gets that returned it.
    hits: u64,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<SnapshotKey, Entry>,
    by_access: BTreeSet<(u64, SnapshotKey)>,
    by_expiry: BTreeSet<(u64, SnapshotKey)>,
    bytes: u64,
    stats: SnapshotStats,
}

#[derive(Clone, Copy)]
enum Why {
    Entries,
    Bytes,
    Ttl,
    Replaced,
}

impl Inner {
    fn drop_entry(&mut self, key: &SnapshotKey, budget: &MemoryBudget, why: Why) {
        let Some(e) = self.entries.remove(key) else {
            return;
        };
        self.by_access.remove(&(e.last_access, *key));
        self.by_expiry.remove(&(e.expires_at, *key));
        let len = e.blob.len() as u64;
        self.bytes -= len;
        budget.release(len);
        match why {
            Why::Entries => self.stats.evictions_entries += 1,
            Why::Bytes => self.stats.evictions_bytes += 1,
            Why::Ttl => self.stats.evictions_ttl += 1,
            Why::Replaced => {}
        }
    }

    fn victim(&self, eviction: Eviction) -> Option<SnapshotKey> {
        match eviction {
            Eviction::Lru => self.by_access.first().map(|&(_, k)| k),
            Eviction::Scored => self
                .by_access
                .iter()
                .take(SCORED_SAMPLE)
                .filter_map(|&(at, k)| self.entries.get(&k).map(|e| ((e.hits, e.tokens, at), k)))
                .min()
                .map(|(_, k)| k),
        }
    }

    fn drop_lru(&mut self, budget: &MemoryBudget, why: Why, eviction: Eviction) -> bool {
        match self.victim(eviction) {
            Some(k) => {
                self.drop_entry(&k, budget, why);
                true
            }
            None => false,
        }
    }

    fn purge_expired(&mut self, now: u64, budget: &MemoryBudget) {
        while let Some(&(at, k)) = self.by_expiry.first() {
            if at > now {
                break;
            }
            self.drop_entry(&k, budget, Why::Ttl);
        }
    }
}

/// See the module docs.
pub struct SnapshotBucket {
    inner: Mutex<Inner>,
    config: SnapshotConfig,
    eviction: Eviction,
    budget: Arc<MemoryBudget>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for SnapshotBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotBucket")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SnapshotBucket {
    /// A bucket reserving from `budget` and reading time from `clock`, dropping the least
    /// recently read entry first.
    pub fn new(
        config: SnapshotConfig,
        budget: Arc<MemoryBudget>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        Self::with_eviction(config, Eviction::Lru, budget, clock)
    }

    /// A bucket that evicts as `eviction` says.
    pub fn with_eviction(
        config: SnapshotConfig,
        eviction: Eviction,
        budget: Arc<MemoryBudget>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            inner: Mutex::new(Inner::default()),
            config,
            eviction,
            budget,
            clock,
        })
    }

    /// Stores `blob`, the state after `tokens` tokens, under `key`. When the shared memory
    /// budget is full, `reclaim(n)` is asked to free `n` bytes elsewhere (the engine evicts
    /// RAM blocks) before the bucket drops its own entries.
    pub fn put(
        &self,
        key: SnapshotKey,
        layout: LayoutDigest,
        blob: Bytes,
        tokens: u64,
        reclaim: &dyn Fn(u64) -> u64,
    ) -> SnapshotPut {
        let eviction = self.eviction;
        let now = self.clock.now_nanos();
        let len = blob.len() as u64;
        let mut inner = self.inner.lock();
        inner.purge_expired(now, &self.budget);
        if len > self.config.max_bytes || len > self.budget.capacity() {
            inner.stats.rejected += 1;
            return SnapshotPut::Rejected;
        }
        let replaced = inner.entries.contains_key(&key);
        if replaced {
            inner.drop_entry(&key, &self.budget, Why::Replaced);
        }
        while inner.entries.len() >= self.config.max_entries {
            inner.drop_lru(&self.budget, Why::Entries, eviction);
        }
        while inner.bytes + len > self.config.max_bytes {
            inner.drop_lru(&self.budget, Why::Bytes, eviction);
        }
        // Bounded: concurrent RAM stores may take freed bytes again, and a put must end.
        let mut reclaim_tries = 8;
        while !self.budget.try_reserve(len) {
            if reclaim_tries > 0 {
                reclaim_tries -= 1;
                if reclaim(len) > 0 {
                    continue;
                }
            }
            if !inner.drop_lru(&self.budget, Why::Bytes, eviction) {
                inner.stats.rejected += 1;
                return SnapshotPut::Rejected;
            }
        }
        let ttl = u64::try_from(self.config.ttl.as_nanos()).unwrap_or(u64::MAX);
        let expires_at = now.saturating_add(ttl);
        inner.by_access.insert((now, key));
        inner.by_expiry.insert((expires_at, key));
        inner.entries.insert(
            key,
            Entry {
                blob,
                layout,
                expires_at,
                last_access: now,
                tokens,
                hits: 0,
            },
        );
        inner.bytes += len;
        inner.stats.stores += 1;
        if replaced {
            SnapshotPut::Replaced
        } else {
            SnapshotPut::Stored
        }
    }

    /// The snapshot stored under exactly `key`, if it is live. Zero copy.
    pub fn get(&self, key: &SnapshotKey) -> Option<Bytes> {
        let now = self.clock.now_nanos();
        let mut inner = self.inner.lock();
        inner.purge_expired(now, &self.budget);
        let Some(e) = inner.entries.get_mut(key) else {
            inner.stats.misses += 1;
            return None;
        };
        let old = e.last_access;
        e.last_access = now;
        e.hits += 1;
        let blob = e.blob.clone();
        inner.by_access.remove(&(old, *key));
        inner.by_access.insert((now, *key));
        inner.stats.hits += 1;
        Some(blob)
    }

    /// Whether a live entry is held under `key`, without counting a get or touching its
    /// recency (lookups ask this; only a load reads).
    pub fn contains(&self, key: &SnapshotKey) -> bool {
        let now = self.clock.now_nanos();
        self.inner
            .lock()
            .entries
            .get(key)
            .is_some_and(|e| e.expires_at > now)
    }

    /// Drops the snapshot under `key`; returns whether one was held.
    pub fn remove(&self, key: &SnapshotKey) -> bool {
        let mut inner = self.inner.lock();
        let held = inner.entries.contains_key(key);
        inner.drop_entry(key, &self.budget, Why::Replaced);
        held
    }

    /// Drops every state computed under `layout` (the layout is being deleted); returns
    /// how many.
    pub fn remove_layout(&self, layout: LayoutDigest) -> u64 {
        let mut inner = self.inner.lock();
        let keys: Vec<SnapshotKey> = inner
            .entries
            .iter()
            .filter(|(_, e)| e.layout == layout)
            .map(|(k, _)| *k)
            .collect();
        for k in &keys {
            inner.drop_entry(k, &self.budget, Why::Replaced);
        }
        keys.len() as u64
    }

    /// Drops every expired snapshot now (gets and puts also do this as they go).
    pub fn purge_expired(&self) {
        let now = self.clock.now_nanos();
        self.inner.lock().purge_expired(now, &self.budget);
    }

    /// A consistent snapshot of the counters.
    pub fn stats(&self) -> SnapshotStats {
        let inner = self.inner.lock();
        SnapshotStats {
            resident_entries: inner.entries.len() as u64,
            resident_bytes: inner.bytes,
            ..inner.stats
        }
    }
}
