//! The engine: layouts, the prefix index, the tiers and the snapshot bucket behind one API.
//!
//! ```text
//! register_layout(key) ─► Layout            prompt(layout, tokens, extras) ─► Prompt (hashed once)
//! lookup(&Prompt) ─► Lookup (memory only)   load(&Lookup) ─► the matched blocks' bytes
//! store(&Prompt, payloads)                  snapshot_put / snapshot_get (exact prefix)
//! checkpoint_put(&Prompt, blocks, state)    restore(&Lookup) ─► KV and state, or nothing
//! flush / shutdown / reattach_persistent    stats
//! resolve(layout, hashes) ─► Lookup         delete_namespace(layout)
//! ```
//!
//! RAM is the engine's head; below it is the tier stack (`stack`): the attached tiers,
//! fastest first, each with its write-behind queue and its [`TierPolicy`] (write-through
//! or evict-only, durable acknowledgements, promotion, prefetch). Blocks reach each tier
//! through its queue, lookups start prefetching what only a prefetching tier holds, and
//! loads read each block from the fastest tier holding it and promote it as that tier's
//! policy says; see `store`, `load`, `prefetch` and `lifecycle`.

mod builder;
mod hits;
mod lifecycle;
mod load;
mod movement;
mod namespace;
mod policy;
mod prefetch;
mod resolve;
mod sink;
mod stack;
mod state;
mod store;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::RwLock;

pub use builder::{DEFAULT_MAX_TOKENS, EngineBuilder, EngineConfig};
pub use lifecycle::{Flushed, Reattached, TierFlushed};
pub use policy::{Ack, PersistConfig, PersistMode, RemoteAttach, TierOpener, TierPolicy};

pub use state::Restored;
pub use store::{StoreOptions, StoreReport};

use crate::arena::{Arena, BlockBuf};
use crate::budget::MemoryBudget;
use crate::error::{Error, Result};
use crate::hash::ExtraKeys;
use crate::index::{Lookup, PrefixIndex, Prompt};
use crate::layout::{Layout, LayoutDigest, LayoutKey};
use crate::registry::{EngineStats, LowerTierStats};
use crate::snapshot::{SnapshotBucket, SnapshotKey, SnapshotPut};
use crate::stats::EngineCounters;
use crate::tier::{RamTier, Tier, TierKind};

/// The blocks a load returned.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// Payloads (or the requested layers of them) of the leading blocks, in order.
    pub blocks: Vec<Bytes>,
    /// False when a block was lost between lookup and load: `blocks` then holds only the
    /// blocks before it, and the caller recomputes from there.
    pub complete: bool,
}

/// See the module docs.
pub struct Engine {
    config: EngineConfig,
    layouts: RwLock<HashMap<LayoutDigest, Arc<Layout>>>,
    index: Arc<PrefixIndex>,
    ram: Arc<RamTier>,
    snapshots: SnapshotBucket,
    /// Recurrent state at block boundaries inside prompts (see `state`).
    checkpoints: SnapshotBucket,
    /// Tokens between checkpoints, for layouts that set their own.
    checkpoint_every: RwLock<HashMap<LayoutDigest, usize>>,
    state_counters: state::StateCounters,
    budget: Arc<MemoryBudget>,
    /// The memory stored blocks and snapshots are copied into.
    arena: Arena,
    /// The tiers below RAM, fastest first; the persistent one is swapped by
    /// [`Engine::reattach_persistent`].
    stack: Arc<stack::Stack>,
    /// Stores and snapshot puts hold it shared; a reattach holds it exclusively, so an
    /// admission either lands before the swap (and is drained into the old tier) or
    /// waits for the new tier — none is acknowledged into the gap between them.
    admission: RwLock<()>,
    sink: Arc<sink::EngineSink>,
    prefetcher: prefetch::Prefetcher,
    movement: Arc<movement::Movement>,
    observers: Arc<crate::events::Observers>,
    /// Set when a background thread panics: every later call fails with `Closed`.
    poison: Arc<crate::poison::Poison>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Starts building an engine; see [`EngineBuilder`] for the settings and their defaults.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// The settings the engine runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The engine's poison flag: why it is closed, if a background thread panicked (see
    /// [`crate::poison`]). Components assembled beside the engine close it through this.
    pub fn poison(&self) -> &Arc<crate::poison::Poison> {
        &self.poison
    }

    /// Fault injection for tests: makes the write-behind worker of every tier below RAM
    /// panic once it reaches the injected job; the engine is then closed. Not for
    /// production use.
    #[doc(hidden)]
    pub fn inject_background_panic(&self) {
        for slot in self.stack.slots().iter() {
            slot.writer.inject_panic();
        }
    }

    /// Validates and registers `key`, returning the layout. Registering the same key again
    /// returns the same layout. Refuses a layout whose block is larger than the RAM budget.
    pub fn register_layout(&self, key: LayoutKey) -> Result<Arc<Layout>> {
        self.poison.check()?;
        let layout = Layout::new(key)?;
        let capacity = self.budget.capacity();
        if layout.block_bytes() > capacity {
            return Err(Error::no_space(format!(
                "one block of layout `{}` takes {} bytes, more than the whole RAM capacity of {capacity} bytes",
                layout.digest(),
                layout.block_bytes()
            )));
        }
        let layout = {
            let mut layouts = self.layouts.write();
            layouts
                .entry(layout.digest())
                .or_insert_with(|| Arc::new(layout))
                .clone()
        };
        // Every tier learns the layout (a tier attached meanwhile learns it from the
        // registry after joining the stack: one of the two sees it).
        for slot in self.stack.slots().iter() {
            slot.tier.layout_registered(&layout);
        }
        Ok(layout)
    }

    /// Every registered layout.
    pub(super) fn layouts(&self) -> Vec<Arc<Layout>> {
        self.layouts.read().values().cloned().collect()
    }

    /// The registered layout with this digest.
    pub fn layout(&self, digest: LayoutDigest) -> Result<Arc<Layout>> {
        self.layouts.read().get(&digest).cloned().ok_or_else(|| {
            Error::invalid(format!(
                "unknown layout `{digest}`: register it before using it"
            ))
        })
    }

    /// Hashes `tokens` under the registered layout `layout`. Refuses an unknown layout, an
    /// empty prompt and one longer than the configured maximum.
    pub fn prompt(
        &self,
        layout: LayoutDigest,
        tokens: &[u32],
        extras: &ExtraKeys,
    ) -> Result<Prompt> {
        let layout = self.layout(layout)?;
        self.check_token_count(tokens.len())?;
        Prompt::new(layout, tokens, extras)
    }

    fn check_token_count(&self, n: usize) -> Result<()> {
        if n == 0 {
            return Err(Error::invalid("the prompt has zero tokens"));
        }
        if n > self.config.max_tokens {
            return Err(Error::invalid(format!(
                "the prompt has {n} tokens; at most {} are allowed (max_tokens)",
                self.config.max_tokens
            )));
        }
        Ok(())
    }

    /// How many leading whole blocks of `prompt` are cached, where, and handles to load
    /// them. Memory only: no tier is touched.
    ///
    /// For a layout with state groups (a hybrid or recurrent model) the answer is the
    /// deepest boundary at which every group can be restored: the leading KV blocks (for
    /// the attention layers) *and* a checkpoint of the recurrent state after exactly those
    /// blocks, named in [`Lookup::state`]. KV past that boundary is not offered, and a
    /// prompt with KV but no state (or state but no KV) is a miss. Load such a hit with
    /// [`Engine::restore`].
    pub fn lookup(&self, prompt: &Prompt) -> Lookup {
        let found = if prompt.layout().has_state() {
            self.lookup_composed(prompt)
        } else {
            let found = self.index.lookup(prompt, usize::MAX);
            self.prefetch_cold(&found);
            found
        };
        self.movement.hits.lookup(
            prompt.tokens().len(),
            found.matched_tokens,
            found.blocks.len(),
        );
        found
    }

    /// Starts reading the blocks of `found` that RAM lacks, where a tier holding them
    /// prefetches.
    fn prefetch_cold(&self, found: &Lookup) {
        // Blocks RAM lacks: start reading them now, in scan order, when a tier holding
        // them prefetches. An all-RAM hit (the common case) touches nothing more.
        if found.blocks.iter().all(|b| b.tier == TierKind::Ram) {
            return;
        }
        let slots = self.stack.slots();
        let prefetching =
            |kind: TierKind| slots.iter().any(|s| s.policy.prefetch && s.kind() == kind);
        let cold: Vec<crate::hash::BlockHash> = found
            .blocks
            .iter()
            .filter(|b| b.tier != TierKind::Ram && prefetching(b.tier))
            .map(|b| b.hash)
            .collect();
        if !cold.is_empty() {
            self.prefetcher.submit(cold);
        }
    }

    /// The persistent tier (the first tier below RAM that carries durable
    /// acknowledgements), if one is attached.
    pub fn persistent(&self) -> Option<Arc<dyn Tier>> {
        self.stack.persistent().map(|s| s.tier.clone())
    }

    /// Registers `observer` for every residency event of every tier (see [`crate::events`])
    /// under `name` (lowercase letters, digits and `_`; it names the observer's counters,
    /// `observer_{name}_*`), with a queue of `queue_len` events: a slow observer never
    /// blocks a store or a load, it misses events instead (counted). Dropping the handle
    /// unregisters it.
    pub fn observe(
        &self,
        name: &str,
        observer: Arc<dyn crate::events::ResidencyObserver>,
        queue_len: usize,
    ) -> Result<crate::events::ObserverHandle> {
        self.observers.register(name, observer, queue_len)
    }

    /// The attached tier of kind `kind` (RAM included), if any.
    pub fn tier(&self, kind: TierKind) -> Option<Arc<dyn Tier>> {
        if kind == TierKind::Ram {
            return Some(self.ram.clone());
        }
        self.stack.find(kind).map(|s| s.tier.clone())
    }

    /// Stores the recurrent state reached after exactly `tokens` (and `session`, if given)
    /// under `layout`. The blob is copied; the caller keeps its buffer.
    pub fn snapshot_put(
        &self,
        layout: LayoutDigest,
        tokens: &[u32],
        session: Option<&[u8]>,
        blob: &[u8],
    ) -> Result<SnapshotPut> {
        self.poison.check()?;
        let l = self.layout(layout)?;
        self.check_token_count(tokens.len())?;
        if l.has_state() && blob.len() as u64 != l.state_bytes() {
            return Err(Error::invalid(format!(
                "a state of {} bytes; layout `{layout}` names {} bytes of state",
                blob.len(),
                l.state_bytes()
            )));
        }
        let key = SnapshotKey::new(layout, tokens, session);
        let _admitted = self.admission.read();
        let ram = &self.ram;
        // One copy into memory the bucket will own (the arena), with the same streaming
        // copy as blocks.
        let owned = self.arena.copy(blob);
        let outcome = self
            .snapshots
            .put(key, layout, owned.clone(), tokens.len() as u64, &|n| {
                ram.evict_bytes(n)
            });
        // Every tier below RAM that keeps snapshots gets it too, so it survives a restart.
        for slot in self.stack.slots().iter() {
            if slot.tier.snapshots().is_some() {
                slot.writer.enqueue_snapshot(key, layout, owned.clone());
            }
        }
        Ok(outcome)
    }

    /// The state stored for exactly `tokens` (and `session`) under `layout`, if any.
    pub fn snapshot_get(
        &self,
        layout: LayoutDigest,
        tokens: &[u32],
        session: Option<&[u8]>,
    ) -> Result<Option<Bytes>> {
        self.poison.check()?;
        self.layout(layout)?;
        self.check_token_count(tokens.len())?;
        let key = SnapshotKey::new(layout, tokens, session);
        if let Some(blob) = self.snapshots.get(&key) {
            return Ok(Some(blob));
        }
        // After a restart the bucket starts empty: restore from the fastest tier that has
        // the snapshot.
        for slot in self.stack.slots().iter() {
            let Some(store) = slot.tier.snapshots() else {
                continue;
            };
            if let Some(blob) = store.get_snapshot(&key)? {
                let ram = &self.ram;
                self.snapshots
                    .put(key, layout, blob.clone(), tokens.len() as u64, &|n| {
                        ram.evict_bytes(n)
                    });
                return Ok(Some(blob));
            }
        }
        Ok(None)
    }

    /// A buffer for one block of `len` bytes, in the RAM tier's arena when it has a free
    /// slot: a caller that fills a block piece by piece (a server reading an upload) writes
    /// it there and hands the frozen bytes to [`Engine::store_owned`], which keeps them
    /// without a copy.
    pub fn block_buffer(&self, len: usize) -> BlockBuf {
        self.arena.buffer(len)
    }

    /// Buffers for `count` blocks of `len` bytes that the caller fills and then stores
    /// together (a shared arena's reservation, a caller writing blocks in place). Room for
    /// them is made in the RAM budget first, evicting the least recently used blocks as a
    /// store would: the arena is the budget plus a little slack, so without it the buffers
    /// of a large store would find no free slot while the blocks it replaces still hold
    /// theirs, and would fall back to the heap.
    pub fn block_buffers(&self, len: usize, count: usize) -> Vec<BlockBuf> {
        let bytes = (count as u64).saturating_mul(len.next_multiple_of(4096) as u64);
        let free = self.budget.capacity().saturating_sub(self.budget.used());
        if free < bytes {
            self.ram.evict_bytes(bytes - free);
        }
        (0..count).map(|_| self.arena.buffer(len)).collect()
    }

    /// The RAM tier's arena, for inspection and tests.
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// The RAM tier, for inspection and tests.
    pub fn ram(&self) -> &RamTier {
        &self.ram
    }

    /// The prefix index, for inspection and tests.
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// Every counter, in one consistent snapshot per component: the RAM tier's and the
    /// index's counters are read together under the RAM tier's lock (so `index_entries`
    /// equals `ram_resident_blocks`, and stores minus evictions equal residency), the
    /// snapshot bucket's under its own lock.
    pub fn stats(&self) -> EngineStats {
        let slots = self.stack.slots();
        let (ram, (index, lower)) = self.ram.stats_and(|| {
            let lower = slots
                .iter()
                .map(|s| LowerTierStats {
                    kind: s.kind(),
                    tier: s.tier.stats(),
                    writer: s.writer.stats(),
                })
                .collect::<Vec<_>>();
            (self.index.stats(), lower)
        });
        let kinds: Vec<TierKind> = std::iter::once(TierKind::Ram)
            .chain(lower.iter().map(|l| l.kind))
            .collect();
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let p = &self.prefetcher.counters;
        EngineStats {
            index,
            ram,
            lower,
            moves: self.movement.stats(&kinds),
            engine: EngineCounters {
                prefetched: get(&p.prefetched),
                prefetch_used: get(&p.used),
                prefetch_skipped: get(&p.skipped),
                shutdown_saved: get(&self.movement.shutdown_saved),
                shutdown_unsaved: get(&self.movement.shutdown_unsaved),
                memory_used_bytes: self.budget.used(),
                memory_capacity_bytes: self.budget.capacity(),
                arena: self.arena.stats(),
                hits: self.movement.hits.read(),
            },
            snapshot: self.snapshots.stats(),
            checkpoint: self.checkpoints.stats(),
            state: self.state_counters.read(),
            observers: self.observers.stats(),
        }
    }
}
