//! The engine: layouts, the prefix index, the tiers and the snapshot bucket behind one API.
//!
//! ```text
//! register_layout(key) ─► Layout            prompt(layout, tokens, extras) ─► Prompt (hashed once)
//! lookup(&Prompt) ─► Lookup (memory only)   load(&Lookup) ─► the matched blocks' bytes
//! store(&Prompt, payloads)                  snapshot_put / snapshot_get (exact prefix)
//! flush / shutdown / reattach_persistent    stats
//! resolve(layout, hashes) ─► Lookup         delete_namespace(layout)
//! ```
//!
//! With a persistent tier (`EngineBuilder::persistent_tier`), blocks reach it through a
//! write-behind queue (write-through or evict-only), lookups start prefetching what only
//! it holds, and loads promote its hits into RAM; see `lower` and `prefetch`.

mod builder;
mod lower;
mod namespace;
mod prefetch;
mod resolve;
mod store;

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::RwLock;

pub use builder::{DEFAULT_MAX_TOKENS, EngineBuilder, EngineConfig};
pub use lower::{Ack, PersistConfig, PersistMode, RemoteAttach, TierOpener};

pub use store::{StoreOptions, StoreReport};

use crate::budget::MemoryBudget;
use crate::error::{Error, Result};
use crate::hash::ExtraKeys;
use crate::index::{BlockRef, Lookup, PrefixIndex, Prompt};
use crate::layout::{Layout, LayoutDigest, LayoutKey};
use crate::snapshot::{SnapshotBucket, SnapshotKey, SnapshotPut};
use crate::stats::EngineStats;
use crate::tier::{RamTier, Tier, TierKind};

/// What [`Engine::reattach_persistent`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reattached {
    /// The old tier's writer wrote everything queued before the deadline.
    pub drained_clean: bool,
    /// Blocks still queued when the deadline passed (lost for the old tier).
    pub left_in_queue: u64,
    /// Blocks the index stopped attributing to the old tier.
    pub detached_blocks: u64,
    /// A new tier was attached.
    pub attached: bool,
    /// Blocks the new tier held when it was opened (recovered from its directory).
    pub attached_blocks: u64,
}

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
    budget: Arc<MemoryBudget>,
    /// The persistent tier; swapped by [`Engine::reattach_persistent`].
    lower: Arc<RwLock<Option<Arc<lower::Lower>>>>,
    /// The shared remote tier below it, if any (fixed for the engine's life).
    remote: Option<(Arc<lower::Lower>, RemoteAttach)>,
    /// Stores and snapshot puts hold it shared; a reattach holds it exclusively, so an
    /// admission either lands before the swap (and is drained into the old tier) or
    /// waits for the new tier — none is acknowledged into the gap between them.
    admission: RwLock<()>,
    sink: Arc<lower::EngineSink>,
    prefetcher: prefetch::Prefetcher,
    movement: Arc<lower::Movement>,
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

    /// Validates and registers `key`, returning the layout. Registering the same key again
    /// returns the same layout. Refuses a layout whose block is larger than the RAM budget.
    pub fn register_layout(&self, key: LayoutKey) -> Result<Arc<Layout>> {
        let layout = Layout::new(key)?;
        let capacity = self.budget.capacity();
        if layout.block_bytes() > capacity {
            return Err(Error::no_space(format!(
                "one block of layout `{}` takes {} bytes, more than the whole RAM capacity of {capacity} bytes",
                layout.digest(),
                layout.block_bytes()
            )));
        }
        let mut layouts = self.layouts.write();
        let entry = layouts
            .entry(layout.digest())
            .or_insert_with(|| Arc::new(layout));
        Ok(entry.clone())
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
    pub fn lookup(&self, prompt: &Prompt) -> Lookup {
        let found = self.index.lookup(prompt, usize::MAX);
        // Blocks only the persistent tier holds: start reading them now, in scan order.
        let cold: Vec<crate::hash::BlockHash> = found
            .blocks
            .iter()
            .filter(|b| b.tier != TierKind::Ram)
            .map(|b| b.hash)
            .collect();
        if !cold.is_empty() && self.lower().is_some_and(|l| l.config.prefetch) {
            self.prefetcher.submit(cold);
        }
        found
    }

    /// Loads the blocks of `refs` in order, stopping at the first block no longer held.
    /// RAM is tried first (a block may have been promoted since the lookup), then the
    /// persistent tier, then the remote tier for the whole run of following blocks
    /// neither holds (one request for the run). A block read from a lower tier is
    /// promoted as configured.
    pub fn load(&self, refs: &[BlockRef]) -> Result<Loaded> {
        let mut blocks = Vec::with_capacity(refs.len());
        let mut i = 0;
        while i < refs.len() {
            let r = &refs[i];
            if let Some(b) = self.ram.get(&r.hash)? {
                self.prefetcher.note_ram_hit(&r.hash);
                blocks.push(b);
                i += 1;
                continue;
            }
            if let Some(b) = self.load_lower(&r.hash)? {
                blocks.push(b);
                i += 1;
                continue;
            }
            let Some((remote, attach)) = &self.remote else {
                break;
            };
            let lower = self.lower();
            let local = |h: &crate::hash::BlockHash| {
                self.ram.contains(h) || lower.as_ref().is_some_and(|l| l.tier.contains(h))
            };
            let end = (i + 1..refs.len())
                .find(|&j| local(&refs[j].hash))
                .unwrap_or(refs.len());
            let hashes: Vec<crate::hash::BlockHash> = refs[i..end].iter().map(|r| r.hash).collect();
            let got = remote.tier.get_run(&hashes)?;
            let n = got.len();
            for (k, b) in got.into_iter().enumerate() {
                self.promote_remote(&hashes[k], &b, attach, lower.as_deref());
                blocks.push(b);
            }
            if n < hashes.len() {
                break;
            }
            i = end;
        }
        let complete = blocks.len() == refs.len();
        Ok(Loaded { blocks, complete })
    }

    /// Copies a remote hit into RAM and queues it for the persistent tier, as configured.
    fn promote_remote(
        &self,
        hash: &crate::hash::BlockHash,
        bytes: &Bytes,
        attach: &RemoteAttach,
        lower: Option<&lower::Lower>,
    ) {
        let Some(meta) = self.index.meta_of(hash) else {
            return;
        };
        if attach.promote_to_ram
            && self.ram.put(&meta, bytes.clone()).ok() == Some(crate::tier::PutOutcome::Stored)
        {
            self.movement
                .promotions
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if attach.promote_to_ssd
            && let Some(lower) = lower
            && !lower.tier.contains(hash)
        {
            lower.writer.enqueue(meta, bytes.clone());
        }
    }

    fn load_lower(&self, hash: &crate::hash::BlockHash) -> Result<Option<Bytes>> {
        let Some(lower) = self.lower() else {
            return Ok(None);
        };
        // Not written yet: the queued bytes (a block RAM evicted moments ago).
        let Some(bytes) = lower
            .tier
            .get(hash)?
            .or_else(|| lower.writer.pending_payload(hash))
        else {
            return Ok(None);
        };
        if lower.config.promote_on_hit
            && let Some(meta) = self.index.meta_of(hash)
            && self.ram.put(&meta, bytes.clone())? == crate::tier::PutOutcome::Stored
        {
            self.movement
                .promotions
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(Some(bytes))
    }

    /// Stops the persistent tier's writer: no new writes, everything queued is written
    /// (within `timeout`). In evict-only mode it first writes the blocks only RAM holds —
    /// the hot set, which evict-only mode otherwise never writes — within half of
    /// `timeout` (counted: `engine_shutdown_saved_blocks`, `engine_shutdown_unsaved_blocks`;
    /// a shutdown that leaves some unsaved is recorded as partial). Returns the writer's
    /// report, or `None` without a persistent tier. The remote tier's writer, if any, is
    /// stopped first the same way (a partial drain is logged). The engine keeps serving
    /// reads afterwards; stores reach RAM only.
    pub fn shutdown(&self, timeout: std::time::Duration) -> Option<crate::tier::writer::Shutdown> {
        let started = std::time::Instant::now();
        if let Some((remote, _)) = &self.remote {
            let report = remote.writer.stop(timeout);
            if !report.clean {
                tracing::warn!(
                    left = report.left_in_queue,
                    "the remote tier's queue did not drain before the deadline"
                );
            }
        }
        let lower = self.lower()?;
        let unsaved = if lower.config.mode == PersistMode::EvictOnly {
            self.save_ram_only(&lower, started + timeout / 2)
        } else {
            0
        };
        let left = timeout.saturating_sub(started.elapsed());
        let mut report = lower.writer.stop(left);
        if unsaved > 0 {
            report.clean = false;
            report.partial = true;
        }
        if let Err(e) = lower.tier.make_durable() {
            tracing::warn!(error = %e, "could not sync the persistent tier at shutdown");
        }
        if let Err(e) = lower.tier.record_shutdown(report.clean) {
            tracing::warn!(error = %e, "could not record how the engine shut down");
        }
        Some(report)
    }

    /// Writes every block RAM holds and the persistent tier lacks, on this thread, until
    /// `deadline`; returns how many it could not write.
    fn save_ram_only(&self, lower: &lower::Lower, deadline: std::time::Instant) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let todo: Vec<(crate::tier::BlockMeta, Bytes)> = self
            .ram
            .held_blocks()
            .into_iter()
            .filter(|(m, _)| !lower.tier.contains(&m.hash) && !lower.writer.is_pending(&m.hash))
            .collect();
        let mut unsaved = 0;
        for (n, batch) in todo.chunks(64).enumerate() {
            if std::time::Instant::now() >= deadline {
                unsaved = (todo.len() - n * 64) as u64;
                break;
            }
            for outcome in lower.tier.put_many(batch) {
                match outcome {
                    Ok(crate::tier::PutOutcome::Stored | crate::tier::PutOutcome::Duplicate) => {
                        self.movement.shutdown_saved.fetch_add(1, Relaxed);
                    }
                    _ => unsaved += 1,
                }
            }
        }
        self.movement.shutdown_unsaved.fetch_add(unsaved, Relaxed);
        if unsaved > 0 {
            tracing::warn!(
                unsaved,
                "evict-only shutdown could not write every RAM-only block to the persistent tier"
            );
        }
        unsaved
    }

    /// How the previous run of the persistent tier ended (see
    /// [`Tier::previous_shutdown_clean`]); `None` without a persistent tier.
    pub fn previous_shutdown_clean(&self) -> Option<bool> {
        self.lower().and_then(|l| l.tier.previous_shutdown_clean())
    }

    /// Waits until every block queued for the persistent tier and the remote tier is
    /// written (or `timeout` passes, for both together), and syncs the persistent tier.
    /// Returns whether they drained and synced; `true` without either.
    pub fn flush(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        // Drained, then synced: what a flush reports done survives a power loss.
        let local = self.lower().is_none_or(|l| {
            let drained = l.writer.flush(timeout);
            match l.tier.make_durable() {
                Ok(()) => drained,
                Err(e) => {
                    tracing::warn!(error = %e, "flush could not sync the persistent tier");
                    false
                }
            }
        });
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let remote = self
            .remote
            .as_ref()
            .is_none_or(|(r, _)| r.writer.flush(left));
        local && remote
    }

    /// The remote tier, if one is attached.
    pub fn remote(&self) -> Option<Arc<dyn Tier>> {
        self.remote.as_ref().map(|(r, _)| r.tier.clone())
    }

    /// Swaps the persistent tier on a running engine (seed 000's quiesce → detach →
    /// reattach): stores in flight finish and new stores and snapshot puts wait until the
    /// swap is done (so every acknowledged write reaches the old tier or the new one); the
    /// current tier is taken out at once (loads miss on it meanwhile), its writer is drained and stopped (every acknowledged block is
    /// written, within `drain_timeout`), the index forgets what it held, and the tier is
    /// closed (its directory lock released). Then `new`, if given, is opened — it may be
    /// the same directory with other settings, another directory, or another layout's
    /// codec — and recovered blocks are reported to the index. With `None` the engine
    /// stays detached. If opening fails the engine stays detached and the error is
    /// returned.
    pub fn reattach_persistent(
        &self,
        new: Option<(PersistConfig, TierOpener)>,
        drain_timeout: std::time::Duration,
    ) -> Result<Reattached> {
        self.reattach_persistent_or_restore(new, None, drain_timeout)
    }

    /// [`Engine::reattach_persistent`], and if opening `new` fails, `restore` is opened in
    /// its place within the same quiesce (typically the tier that was attached, with its
    /// old settings), so no store is ever acknowledged while the engine is unexpectedly
    /// without its persistent tier. The error of `new` is still returned; whether
    /// `restore` took its place shows in [`Engine::persistent`].
    pub fn reattach_persistent_or_restore(
        &self,
        new: Option<(PersistConfig, TierOpener)>,
        restore: Option<(PersistConfig, TierOpener)>,
        drain_timeout: std::time::Duration,
    ) -> Result<Reattached> {
        // Quiesce: wait for stores in flight; new ones wait until the swap is done.
        let _quiesced = self.admission.write();
        let old = self.lower.write().take();
        *self.sink.demote_to.write() = None;
        let mut report = Reattached::default();
        if let Some(old) = old {
            let drained = old.writer.stop(drain_timeout);
            report.drained_clean = drained.clean;
            report.left_in_queue = drained.left_in_queue;
            report.detached_blocks = self.index.clear_tier(old.tier.kind());
            // A prefetch or load in flight may still hold the old tier; wait (within the
            // deadline) until it lets go, so the tier is closed — its directory lock
            // released — before a new one opens, possibly on the same directory.
            let deadline = std::time::Instant::now() + drain_timeout;
            while Arc::strong_count(&old) > 1 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            drop(old);
        } else {
            report.drained_clean = true;
        }
        let Some((config, open)) = new else {
            return Ok(report);
        };
        match self.attach_lower(config, open) {
            Ok(blocks) => {
                report.attached_blocks = blocks;
                report.attached = true;
                Ok(report)
            }
            Err(e) => {
                if let Some((config, open)) = restore {
                    match self.attach_lower(config, open) {
                        Ok(_) => {
                            tracing::warn!(error = %e, "the new persistent tier did not open; the previous one is attached again");
                        }
                        Err(again) => {
                            tracing::error!(error = %e, restore_error = %again, "neither the new nor the previous persistent tier opened; running without one");
                        }
                    }
                }
                Err(e)
            }
        }
    }

    /// Opens and attaches a persistent tier; returns the blocks it held.
    fn attach_lower(&self, config: PersistConfig, open: TierOpener) -> Result<u64> {
        let (lower, writer) = builder::open_lower(&self.sink, config, open)?;
        if config.mode == PersistMode::EvictOnly {
            *self.sink.demote_to.write() = Some(Arc::downgrade(&writer));
        }
        let blocks = lower.tier.stats().resident_blocks;
        *self.lower.write() = Some(lower);
        Ok(blocks)
    }

    /// The persistent tier, if one is attached.
    pub fn persistent(&self) -> Option<Arc<dyn Tier>> {
        self.lower().map(|l| l.tier.clone())
    }

    /// The attached persistent tier, if any (a cheap clone of a handle).
    fn lower(&self) -> Option<Arc<lower::Lower>> {
        self.lower.read().clone()
    }

    /// Loads only layers `layers` of each matched block of `lookup` (one page per layer per
    /// block, each a zero-copy slice when the block is in RAM). The page boundaries come
    /// from the layout the lookup was made under, never from the caller.
    pub fn load_layers(&self, lookup: &Lookup, layers: Range<u32>) -> Result<Loaded> {
        let layout = self.layout(lookup.layout)?;
        let range = layout
            .geometry()
            .layer_range(layers.clone())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "layer range {}..{} is empty or past the layout's {} layers",
                    layers.start,
                    layers.end,
                    layout.geometry().num_layers
                ))
            })?;
        self.load_with(&lookup.blocks, |r| {
            if let Some(bytes) = self.tier(r.tier)?.get_range(&r.hash, range.clone())? {
                return Ok(Some(bytes));
            }
            // Not written yet: a slice of the queued bytes (see `load_lower`).
            let queued = self
                .lower()
                .filter(|l| l.tier.kind() == r.tier)
                .and_then(|l| l.writer.pending_payload(&r.hash));
            Ok(queued
                .filter(|b| b.len() as u64 >= range.end)
                .map(|b| b.slice(range.start as usize..range.end as usize)))
        })
    }

    fn load_with(
        &self,
        refs: &[BlockRef],
        mut get: impl FnMut(&BlockRef) -> Result<Option<Bytes>>,
    ) -> Result<Loaded> {
        let mut blocks = Vec::with_capacity(refs.len());
        for r in refs {
            match get(r)? {
                Some(b) => blocks.push(b),
                None => {
                    return Ok(Loaded {
                        blocks,
                        complete: false,
                    });
                }
            }
        }
        Ok(Loaded {
            blocks,
            complete: true,
        })
    }

    fn tier(&self, kind: TierKind) -> Result<Arc<dyn Tier>> {
        match (self.lower(), kind) {
            (_, TierKind::Ram) => Ok(self.ram.clone()),
            (Some(lower), k) if lower.tier.kind() == k => Ok(lower.tier.clone()),
            (_, TierKind::Remote) if self.remote.is_some() => Ok(self
                .remote
                .as_ref()
                .map(|(r, _)| r.tier.clone())
                .ok_or_else(|| {
                    Error::new(
                        crate::ErrorKind::Unavailable,
                        "the remote tier is not attached",
                    )
                })?),
            (_, other) => Err(Error::new(
                crate::ErrorKind::Unavailable,
                format!("the {} tier is not attached", other.name()),
            )),
        }
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
        self.layout(layout)?;
        self.check_token_count(tokens.len())?;
        let key = SnapshotKey::new(layout, tokens, session);
        let _admitted = self.admission.read();
        let ram = &self.ram;
        // One copy into memory the bucket will own, with the same streaming copy as blocks.
        let owned = crate::tier::copy_payload(blob);
        let outcome = self
            .snapshots
            .put(key, owned.clone(), &|n| ram.evict_bytes(n));
        // A persistent tier keeps it too, so it survives a restart.
        if let Some(lower) = self.lower() {
            lower.writer.enqueue_snapshot(key, layout, owned);
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
        self.layout(layout)?;
        self.check_token_count(tokens.len())?;
        let key = SnapshotKey::new(layout, tokens, session);
        if let Some(blob) = self.snapshots.get(&key) {
            return Ok(Some(blob));
        }
        // After a restart the bucket starts empty: restore from the persistent tier.
        let Some(lower) = self.lower() else {
            return Ok(None);
        };
        let Some(store) = lower.tier.snapshots() else {
            return Ok(None);
        };
        let Some(blob) = store.get_snapshot(&key)? else {
            return Ok(None);
        };
        let ram = &self.ram;
        self.snapshots
            .put(key, blob.clone(), &|n| ram.evict_bytes(n));
        Ok(Some(blob))
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
        let (ram, (index, lower)) = self.ram.stats_and(|| {
            (
                self.index.stats(),
                self.lower().map(|l| (l.tier.stats(), l.writer.stats())),
            )
        });
        let m = &self.movement;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        EngineStats {
            index,
            ram,
            ssd: lower.map(|(t, _)| t),
            writer: lower.map(|(_, w)| w),
            remote: self.remote.as_ref().map(|(r, _)| r.tier.stats()),
            remote_writer: self.remote.as_ref().map(|(r, _)| r.writer.stats()),
            promotions: get(&m.promotions),
            prefetched: get(&self.prefetcher.counters.prefetched),
            prefetch_used: get(&self.prefetcher.counters.used),
            prefetch_skipped: get(&self.prefetcher.counters.skipped),
            demotions_queued: get(&m.demotions_queued),
            demotions_dropped: get(&m.demotions_dropped),
            shutdown_saved: get(&m.shutdown_saved),
            shutdown_unsaved: get(&m.shutdown_unsaved),
            snapshot: self.snapshots.stats(),
            memory_used_bytes: self.budget.used(),
            memory_capacity_bytes: self.budget.capacity(),
        }
    }
}
