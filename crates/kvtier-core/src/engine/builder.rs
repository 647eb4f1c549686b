//! Settings and the builder that injects components (clock) and validates everything.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use super::Engine;
use crate::budget::MemoryBudget;
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::index::PrefixIndex;
use crate::snapshot::{SnapshotBucket, SnapshotConfig};
use crate::tier::{RamConfig, RamTier};

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
#[derive(Debug, Default)]
pub struct EngineBuilder {
    config: EngineConfig,
    snapshot_set: bool,
    clock: Option<Arc<dyn Clock>>,
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
        let ram = Arc::new(RamTier::new(budget.clone(), clock.clone(), index.clone()));
        let snapshots = SnapshotBucket::new(config.snapshot, budget.clone(), clock)?;
        Ok(Engine {
            config,
            layouts: RwLock::new(HashMap::new()),
            index,
            ram,
            snapshots,
            budget,
        })
    }
}
