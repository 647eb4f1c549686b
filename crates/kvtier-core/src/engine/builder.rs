//! Settings and the builder that injects components (clock) and validates everything.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use super::Engine;
use super::lower::{
    EngineSink, Lower, Movement, PersistConfig, PersistMode, RemoteAttach, TierOpener,
};
use crate::budget::MemoryBudget;
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::index::PrefixIndex;
use crate::snapshot::{SnapshotBucket, SnapshotConfig};
use crate::tier::writer::WriteBehind;
use crate::tier::{RamConfig, RamTier, ResidencySink, Tier};

/// Default for [`EngineConfig::max_tokens`]: 1,048,576 tokens.
pub const DEFAULT_MAX_TOKENS: usize = 1 << 20;

/// Everything configurable about an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// The RAM tier (its capacity also bounds snapshot bytes).
    pub ram: RamConfig,
    /// The snapshot bucket.
    pub snapshot: SnapshotConfig,
    /// Longest prompt accepted by lookup, store and snapshot calls (default 1,048,576).
    pub max_tokens: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            ram: RamConfig::default(),
            snapshot: SnapshotConfig::default(),
            max_tokens: DEFAULT_MAX_TOKENS,
        }
    }
}

/// Builds an [`Engine`]; `build` refuses invalid settings with an error, never a panic.
#[derive(Default)]
pub struct EngineBuilder {
    config: EngineConfig,
    snapshot_set: bool,
    clock: Option<Arc<dyn Clock>>,
    persistent: Option<(PersistConfig, TierOpener)>,
    remote: Option<(RemoteAttach, TierOpener)>,
}

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("config", &self.config)
            .field("persistent", &self.persistent.as_ref().map(|(c, _)| c))
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// Uses all of `config`.
    pub fn config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self.snapshot_set = true;
        self
    }

    /// RAM tier settings (default: 1 GiB).
    pub fn ram(mut self, ram: RamConfig) -> Self {
        self.config.ram = ram;
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

    /// Attaches a persistent tier below RAM (default: none). `open` is called during
    /// `build` with the sink the tier must report residency to; a tier that recovers
    /// blocks at open reports them there, which rebuilds the prefix index.
    pub fn persistent_tier(
        mut self,
        config: PersistConfig,
        open: impl FnOnce(Arc<dyn ResidencySink>) -> Result<Arc<dyn Tier>> + Send + 'static,
    ) -> Self {
        self.persistent = Some((config, Box::new(open)));
        self
    }

    /// Attaches a shared remote tier below the persistent one (default: none). Every new
    /// block is written to it through its own write-behind queue; loads read what RAM and
    /// the persistent tier do not hold from it, a run of consecutive blocks at a time, and
    /// promote the hits as `attach` says. `open` is called during `build`.
    pub fn remote_tier(
        mut self,
        attach: RemoteAttach,
        open: impl FnOnce(Arc<dyn ResidencySink>) -> Result<Arc<dyn Tier>> + Send + 'static,
    ) -> Self {
        self.remote = Some((attach, Box::new(open)));
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
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock::new()));
        let budget = Arc::new(MemoryBudget::new(config.ram.capacity_bytes));
        let index = Arc::new(PrefixIndex::new());
        let movement = Arc::new(Movement::default());
        let sink = Arc::new(EngineSink {
            index: index.clone(),
            demote_to: RwLock::new(None),
            movement: movement.clone(),
        });
        let ram = Arc::new(RamTier::new(budget.clone(), clock.clone(), sink.clone()));
        let snapshots = SnapshotBucket::new(config.snapshot, budget.clone(), clock)?;
        let lower = match self.persistent {
            None => None,
            Some((persist, open)) => {
                let (lower, writer) = open_lower(&sink, persist, open)?;
                if persist.mode == PersistMode::EvictOnly {
                    *sink.demote_to.write() = Some(Arc::downgrade(&writer));
                }
                Some(lower)
            }
        };
        let remote = match self.remote {
            None => None,
            Some((attach, open)) => {
                let persist = PersistConfig {
                    mode: PersistMode::WriteThrough,
                    ack: super::Ack::Queued,
                    promote_on_hit: attach.promote_to_ram,
                    prefetch: false,
                    writer: attach.writer,
                };
                Some((open_lower(&sink, persist, open)?.0, attach))
            }
        };
        let lower = Arc::new(RwLock::new(lower));
        let prefetcher = super::prefetch::Prefetcher::start(super::prefetch::Shared {
            ram: ram.clone(),
            index: index.clone(),
            lower: Arc::downgrade(&lower),
        })
        .map_err(|e| {
            Error::new(
                crate::ErrorKind::Unavailable,
                format!("cannot start the prefetch thread: {e}"),
            )
        })?;
        Ok(Engine {
            config,
            layouts: RwLock::new(HashMap::new()),
            index,
            ram,
            snapshots,
            budget,
            lower,
            remote,
            admission: RwLock::new(()),
            sink,
            prefetcher,
            movement,
        })
    }
}

/// Opens a persistent tier reporting to `sink` and starts its writer.
pub(super) fn open_lower(
    sink: &Arc<EngineSink>,
    config: PersistConfig,
    open: TierOpener,
) -> Result<(Arc<Lower>, Arc<WriteBehind>)> {
    let tier = open(sink.clone())?;
    let writer = WriteBehind::start(tier.clone(), config.writer).map_err(|e| {
        Error::new(
            crate::ErrorKind::Unavailable,
            format!("cannot start the {} writer thread: {e}", tier.kind().name()),
        )
    })?;
    // A queued block whose write fails or is refused leaves the index again.
    let index = Arc::downgrade(&sink.index);
    let kind = tier.kind();
    writer.on_lost(Box::new(move |meta| {
        if let Some(index) = index.upgrade() {
            index.removed(kind, meta, crate::tier::RemovalCause::Explicit, None);
        }
    }));
    let writer = Arc::new(writer);
    let lower = Arc::new(Lower {
        tier,
        writer: writer.clone(),
        config,
    });
    Ok((lower, writer))
}
