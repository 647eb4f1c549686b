//! Settings and the builder that injects components (clock) and validates everything.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use super::Engine;
use super::movement::Movement;
use super::policy::{PersistConfig, RemoteAttach, TierOpener, TierPolicy};
use super::sink::EngineSink;
use super::stack::{Slot, Stack};
use crate::arena::{Arena, ArenaConfig};
use crate::budget::MemoryBudget;
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::index::PrefixIndex;
use crate::layout::Layout;
use crate::poison::Poison;
use crate::snapshot::{CheckpointConfig, Eviction, SnapshotBucket, SnapshotConfig};
use crate::tier::writer::WriteBehind;
use crate::tier::{RamConfig, RamTier, ResidencySink, Tier};

/// Default for [`EngineConfig::max_tokens`]: 1,048,576 tokens.
pub const DEFAULT_MAX_TOKENS: usize = 1 << 20;

/// Everything configurable about an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// The RAM tier (its capacity also bounds snapshot bytes).
    pub ram: RamConfig,
    /// The memory the RAM tier's blocks are copied into (see [`crate::arena`]).
    pub arena: ArenaConfig,
    /// The snapshot bucket.
    pub snapshot: SnapshotConfig,
    /// The checkpoint bucket and the default distance between checkpoints.
    pub checkpoint: CheckpointConfig,
    /// Longest prompt accepted by lookup, store and snapshot calls (default 1,048,576).
    pub max_tokens: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            ram: RamConfig::default(),
            arena: ArenaConfig::default(),
            snapshot: SnapshotConfig::default(),
            checkpoint: CheckpointConfig::default(),
            max_tokens: DEFAULT_MAX_TOKENS,
        }
    }
}

/// Builds an [`Engine`]; `build` refuses invalid settings with an error, never a panic.
#[derive(Default)]
pub struct EngineBuilder {
    config: EngineConfig,
    snapshot_set: bool,
    checkpoint_set: bool,
    clock: Option<Arc<dyn Clock>>,
    poison: Option<Arc<Poison>>,
    /// The tiers below RAM, in the order they were added (the stack sorts them).
    tiers: Vec<(TierPolicy, TierOpener)>,
}

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("config", &self.config)
            .field(
                "tiers",
                &self.tiers.iter().map(|(p, _)| p).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// Uses all of `config`.
    pub fn config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self.snapshot_set = true;
        self.checkpoint_set = true;
        self
    }

    /// RAM tier settings (default: 1 GiB).
    pub fn ram(mut self, ram: RamConfig) -> Self {
        self.config.ram = ram;
        self
    }

    /// The RAM tier's arena (default: on, not prefaulted, not locked).
    pub fn arena(mut self, arena: ArenaConfig) -> Self {
        self.config.arena = arena;
        self
    }

    /// Checkpoint bucket settings (default: 16,384 entries, 24 h TTL, 256 MiB or a quarter
    /// of the RAM capacity, a checkpoint every 256 tokens).
    pub fn checkpoint(mut self, checkpoint: CheckpointConfig) -> Self {
        self.config.checkpoint = checkpoint;
        self.checkpoint_set = true;
        self
    }

    /// Snapshot bucket settings (default: 4,096 entries, 24 h TTL, and 256 MiB or a
    /// quarter of the RAM capacity, whichever is smaller).
    pub fn snapshot(mut self, snapshot: SnapshotConfig) -> Self {
        self.config.snapshot = snapshot;
        self.snapshot_set = true;
        self
    }

    /// Longest accepted prompt in tokens (default 1,048,576).
    pub fn max_tokens(mut self, max_tokens: usize) -> Self {
        self.config.max_tokens = max_tokens;
        self
    }

    /// The clock for TTLs and LRU order (default: the system's monotonic clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The engine's poison flag (default: a fresh one), for an assembly whose own
    /// background threads (an SSD tier's maintenance) must close the engine when they
    /// panic, as the engine's threads do. See [`crate::poison`].
    pub fn poison(mut self, poison: Arc<Poison>) -> Self {
        self.poison = Some(poison);
        self
    }

    /// Attaches a persistent tier below RAM (default: none). `open` is called during
    /// `build` with the sink the tier must report residency to; a tier that recovers
    /// blocks at open reports them there, which rebuilds the prefix index.
    pub fn persistent_tier(
        self,
        config: PersistConfig,
        open: impl FnOnce(Arc<dyn ResidencySink>) -> Result<Arc<dyn Tier>> + Send + 'static,
    ) -> Self {
        self.tier(config.into(), open)
    }

    /// Attaches a shared remote tier below the persistent one (default: none). Every new
    /// block is written to it through its own write-behind queue; loads read what RAM and
    /// the persistent tier do not hold from it, a run of consecutive blocks at a time, and
    /// promote the hits as `attach` says. `open` is called during `build`.
    pub fn remote_tier(
        self,
        attach: RemoteAttach,
        open: impl FnOnce(Arc<dyn ResidencySink>) -> Result<Arc<dyn Tier>> + Send + 'static,
    ) -> Self {
        self.tier(attach.into(), open)
    }

    /// Attaches a tier below RAM used as `policy` says (the general form of
    /// [`EngineBuilder::persistent_tier`] and [`EngineBuilder::remote_tier`]). The engine
    /// keeps its tiers ordered fastest first by kind, one tier per kind: `build` refuses a
    /// second tier of a kind already attached. `open` is called during `build`.
    pub fn tier(
        mut self,
        policy: TierPolicy,
        open: impl FnOnce(Arc<dyn ResidencySink>) -> Result<Arc<dyn Tier>> + Send + 'static,
    ) -> Self {
        self.tiers.push((policy, Box::new(open)));
        self
    }

    /// Validates the settings and builds the engine.
    pub fn build(self) -> Result<Engine> {
        let mut config = self.config;
        if !self.snapshot_set {
            config.snapshot.max_bytes = config
                .snapshot
                .max_bytes
                .min(config.ram.capacity_bytes / 4)
                .max(1);
        }
        if !self.checkpoint_set {
            config.checkpoint.bucket.max_bytes = config
                .checkpoint
                .bucket
                .max_bytes
                .min(config.ram.capacity_bytes / 4)
                .max(1);
        }
        if config.ram.capacity_bytes == 0 {
            return Err(Error::invalid("ram capacity must be at least one byte"));
        }
        if config.max_tokens == 0 {
            return Err(Error::invalid("max_tokens must be at least 1"));
        }
        if config.snapshot.max_bytes > config.ram.capacity_bytes {
            return Err(Error::invalid(format!(
                "snapshot max_bytes ({}) exceeds the RAM capacity ({}) it is taken from",
                config.snapshot.max_bytes, config.ram.capacity_bytes
            )));
        }
        if config.checkpoint.bucket.max_bytes > config.ram.capacity_bytes {
            return Err(Error::invalid(format!(
                "checkpoint max_bytes ({}) exceeds the RAM capacity ({}) it is taken from",
                config.checkpoint.bucket.max_bytes, config.ram.capacity_bytes
            )));
        }
        config.checkpoint.validate()?;
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock::new()));
        let budget = Arc::new(MemoryBudget::new(config.ram.capacity_bytes));
        let arena = Arena::new(config.ram.capacity_bytes, config.arena)?;
        let index = Arc::new(PrefixIndex::new());
        let movement = Arc::new(Movement::default());
        let observers = Arc::new(crate::events::Observers::default());
        let poison = self.poison.unwrap_or_default();
        let sink = Arc::new(EngineSink {
            poison: poison.clone(),
            index: index.clone(),
            demote_to: RwLock::new(None),
            movement: movement.clone(),
            observers: observers.clone(),
        });
        let ram = Arc::new(RamTier::new(budget.clone(), clock.clone(), sink.clone()));
        let snapshots = SnapshotBucket::new(config.snapshot, budget.clone(), clock.clone())?;
        let checkpoints = SnapshotBucket::with_eviction(
            config.checkpoint.bucket,
            Eviction::Scored,
            budget.clone(),
            clock,
        )?;
        let stack = Arc::new(Stack::default());
        for (policy, open) in self.tiers {
            attach(&stack, &sink, policy, open, &Vec::new)?;
        }
        let prefetcher = super::prefetch::Prefetcher::start(super::prefetch::Shared {
            ram: ram.clone(),
            index: index.clone(),
            stack: Arc::downgrade(&stack),
            observers: observers.clone(),
            poison: poison.clone(),
        })
        .map_err(|e| {
            Error::new(
                crate::ErrorKind::Unavailable,
                "cannot start the prefetch thread",
            )
            .with_source(e)
        })?;
        Ok(Engine {
            config,
            layouts: RwLock::new(HashMap::new()),
            index,
            ram,
            snapshots,
            checkpoints,
            checkpoint_every: RwLock::new(HashMap::new()),
            state_counters: Default::default(),
            budget,
            arena,
            stack,
            admission: RwLock::new(()),
            sink,
            prefetcher,
            movement,
            observers,
            poison,
        })
    }
}

/// Opens a tier reporting to `sink`, starts its writer and adds it to `stack` (pointing
/// RAM's demotions at it when it is the first evict-only tier). Returns the slot.
pub(super) fn attach(
    stack: &Stack,
    sink: &Arc<EngineSink>,
    policy: TierPolicy,
    open: TierOpener,
    layouts: &dyn Fn() -> Vec<Arc<Layout>>,
) -> Result<Arc<Slot>> {
    let tier = open(sink.clone())?;
    let kind = tier.kind();
    let poison = sink.poison.clone();
    let on_panic: crate::tier::writer::PanicHook = Box::new(move |reason| poison.poison(reason));
    let writer = WriteBehind::start_with(tier.clone(), policy.writer, on_panic).map_err(|e| {
        Error::new(
            crate::ErrorKind::Unavailable,
            format!("cannot start the {} writer thread", kind.name()),
        )
        .with_source(e)
    })?;
    // A queued block whose write fails or is refused leaves the index again (and the
    // observers hear of it; an observer may get this removal for a block the tier never
    // reported inserted).
    let lost_to = Arc::downgrade(sink);
    writer.on_lost(Box::new(move |meta| {
        if let Some(sink) = lost_to.upgrade() {
            sink.removed(kind, meta, crate::tier::RemovalCause::Explicit, None);
        }
    }));
    let slot = Arc::new(Slot {
        tier,
        writer: Arc::new(writer),
        policy,
    });
    if let Err(e) = stack.insert(slot.clone()) {
        slot.writer.stop(std::time::Duration::from_secs(1));
        return Err(e);
    }
    // After joining the stack, so a layout registered meanwhile is learned either here or
    // by `register_layout`.
    for layout in layouts() {
        slot.tier.layout_registered(&layout);
    }
    sink.demote_to_first_evict_only(stack);
    Ok(slot)
}
