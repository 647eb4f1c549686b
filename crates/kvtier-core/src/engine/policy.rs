//! How the engine uses each tier below RAM: [`TierPolicy`], and the two familiar shapes of
//! it — [`PersistConfig`] for a local persistent tier, [`RemoteAttach`] for a shared remote
//! one.
//!
//! - [`PersistMode::WriteThrough`]: every new block goes to RAM and, through the tier's
//!   write-behind queue, to the tier.
//! - [`PersistMode::EvictOnly`]: the tier receives what RAM evicts (a non-blocking enqueue
//!   from the eviction path; a full queue drops the block, counted).
//! - A block queued for a tier but not yet written is served from the writer's queue; a
//!   write that fails or is refused takes the index entry back (the writer's lost hook).
//! - A hit a tier holds and faster ones do not is promoted into RAM when
//!   [`TierPolicy::promote_to_ram`] is set (the payload buffer is shared, not copied).

use std::sync::Arc;

use crate::tier::writer::WriterConfig;
use crate::tier::{ResidencySink, Tier};

/// When blocks are written to the persistent tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum PersistMode {
    /// Every new block (default).
    WriteThrough,
    /// Only blocks RAM evicts.
    EvictOnly,
}

/// What a successful store promises about its blocks, weakest first. Each level says what
/// the blocks survive once the store has returned `Ok`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum Ack {
    /// In RAM and queued for the persistent tier (default). A process kill loses what is
    /// still queued; a flush or a clean shutdown writes it.
    #[default]
    #[cfg_attr(feature = "serde", serde(alias = "best_effort"))]
    Queued,
    /// Written to the persistent tier's files: survives a kill of the process (the
    /// kernel's page cache holds the bytes), not a power loss.
    #[cfg_attr(feature = "serde", serde(alias = "persistent"))]
    Written,
    /// Written and synced (`fdatasync`, shared between concurrent stores): survives a
    /// power loss.
    #[cfg_attr(feature = "serde", serde(alias = "fsync"))]
    Synced,
}

impl Ack {
    /// The level's name on the wire and in settings.
    pub fn name(self) -> &'static str {
        match self {
            Ack::Queued => "queued",
            Ack::Written => "written",
            Ack::Synced => "synced",
        }
    }
}

impl PersistMode {
    /// The mode's name in settings: `write_through` or `evict_only`.
    pub fn name(self) -> &'static str {
        match self {
            PersistMode::WriteThrough => "write_through",
            PersistMode::EvictOnly => "evict_only",
        }
    }
}

impl std::fmt::Display for PersistMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PersistMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write_through" => Ok(PersistMode::WriteThrough),
            "evict_only" => Ok(PersistMode::EvictOnly),
            _ => Err(format!("`{s}` is not a mode: write_through or evict_only")),
        }
    }
}

impl std::fmt::Display for Ack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Ack {
    type Err = String;

    /// The level's name, or its name before issue 12 (`best_effort` is `queued`,
    /// `persistent` is `written`, `fsync` is `synced`).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "queued" | "best_effort" => Ok(Ack::Queued),
            "written" | "persistent" => Ok(Ack::Written),
            "synced" | "fsync" => Ok(Ack::Synced),
            _ => Err(format!(
                "`{s}` is not a durability: queued, written or synced"
            )),
        }
    }
}

/// How the engine uses its persistent tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PersistConfig {
    /// When blocks are written (default write-through).
    pub mode: PersistMode,
    /// What a store acknowledges unless the call asks for more (default
    /// [`Ack::Queued`]).
    pub ack: Ack,
    /// Promote a block read from the persistent tier into RAM (default on).
    pub promote_on_hit: bool,
    /// Start reading blocks a lookup found only in the persistent tier right away, in
    /// scan order, promoting them into RAM (default on).
    pub prefetch: bool,
    /// The write-behind queue in front of the tier.
    pub writer: WriterConfig,
}

impl Default for PersistConfig {
    fn default() -> Self {
        Self {
            mode: PersistMode::WriteThrough,
            ack: Ack::Queued,
            promote_on_hit: true,
            prefetch: true,
            writer: WriterConfig::default(),
        }
    }
}

/// How the engine uses its remote tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAttach {
    /// The write-behind queue in front of the remote tier (default: 512 blocks, a full
    /// queue drops).
    pub writer: WriterConfig,
    /// Copy a remote hit into RAM (default on).
    pub promote_to_ram: bool,
    /// Also queue a remote hit for the persistent tier, so the next restart finds it
    /// locally (default on).
    pub promote_to_ssd: bool,
}

impl Default for RemoteAttach {
    fn default() -> Self {
        Self {
            // A full queue drops (counted) rather than writing on the caller's thread: a
            // slow endpoint must never stall a store.
            writer: WriterConfig {
                overflow: crate::tier::writer::Overflow::Drop,
                ..WriterConfig::default()
            },
            promote_to_ram: true,
            promote_to_ssd: true,
        }
    }
}

/// How the engine uses one tier below RAM. Every tier of the stack has one; the engine's
/// store, load, promotion, prefetch, flush and shutdown paths read only this, never the
/// tier's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierPolicy {
    /// When blocks are written to the tier.
    pub mode: PersistMode,
    /// The tier carries durable acknowledgements ([`Ack::Written`], [`Ack::Synced`]): the
    /// first such tier of the stack is the engine's persistent tier.
    pub takes_acks: bool,
    /// What a store acknowledges unless the call asks for more (read from the persistent
    /// tier only).
    pub ack: Ack,
    /// Copy a hit read from this tier into RAM.
    pub promote_to_ram: bool,
    /// Also queue a hit read from this tier for the faster tiers below RAM that lack it,
    /// so they hold it next time (a remote hit lands on the local SSD).
    pub fill_faster: bool,
    /// Read blocks a lookup found only here right away, in scan order, into RAM.
    pub prefetch: bool,
    /// The tier stores and reads runs of consecutive blocks as one unit (the remote tier:
    /// one object per store, one ranged GET per run): a store's blocks are queued as one
    /// run and a load asks for the whole run of following blocks no faster tier holds.
    pub runs: bool,
    /// The write-behind queue in front of the tier.
    pub writer: WriterConfig,
}

impl From<PersistConfig> for TierPolicy {
    fn from(c: PersistConfig) -> Self {
        Self {
            mode: c.mode,
            takes_acks: true,
            ack: c.ack,
            promote_to_ram: c.promote_on_hit,
            fill_faster: false,
            prefetch: c.prefetch,
            runs: false,
            writer: c.writer,
        }
    }
}

impl From<RemoteAttach> for TierPolicy {
    fn from(a: RemoteAttach) -> Self {
        Self {
            mode: PersistMode::WriteThrough,
            takes_acks: false,
            ack: Ack::Queued,
            promote_to_ram: a.promote_to_ram,
            fill_faster: a.promote_to_ssd,
            prefetch: false,
            runs: true,
            writer: a.writer,
        }
    }
}

/// Opens a tier, given the sink it must report residency to.
pub type TierOpener =
    Box<dyn FnOnce(Arc<dyn ResidencySink>) -> crate::Result<Arc<dyn Tier>> + Send>;
