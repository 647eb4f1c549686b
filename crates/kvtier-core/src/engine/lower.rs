//! The persistent tier below RAM, and how blocks move between the two.
//!
//! - [`PersistMode::WriteThrough`]: every new block goes to RAM and, through the
//!   write-behind queue, to the persistent tier.
//! - [`PersistMode::EvictOnly`]: the persistent tier receives what RAM evicts (a
//!   non-blocking enqueue from the eviction path; a full queue drops the block, counted).
//! - A block queued for the persistent tier but not yet written is served from the
//!   writer's queue, and the index names the persistent tier for it from the moment it is
//!   queued; a write that fails or is refused takes that entry back (the writer's lost
//!   hook).
//! - A hit that only the persistent tier holds is promoted into RAM when
//!   [`PersistConfig::promote_on_hit`] is set (the payload buffer is shared, not copied).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::RwLock;

use bytes::Bytes;

use crate::index::PrefixIndex;
use crate::tier::writer::{WriteBehind, WriterConfig};
use crate::tier::{BlockMeta, RemovalCause, ResidencySink, Tier, TierKind};

/// When blocks are written to the persistent tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersistMode {
    /// Every new block (default).
    WriteThrough,
    /// Only blocks RAM evicts.
    EvictOnly,
}

/// What a successful store promises about its blocks, weakest first. Each level says what
/// the blocks survive once the store has returned `Ok`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ack {
    /// In RAM and queued for the persistent tier (default). A process kill loses what is
    /// still queued; a flush or a clean shutdown writes it.
    #[default]
    Queued,
    /// Written to the persistent tier's files: survives a kill of the process (the
    /// kernel's page cache holds the bytes), not a power loss.
    Written,
    /// Written and synced (`fdatasync`, shared between concurrent stores): survives a
    /// power loss.
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

/// Opens the persistent tier, given the sink it must report residency to.
pub type TierOpener =
    Box<dyn FnOnce(Arc<dyn ResidencySink>) -> crate::Result<Arc<dyn Tier>> + Send>;

/// The attached persistent tier.
pub(super) struct Lower {
    pub tier: Arc<dyn Tier>,
    pub writer: Arc<WriteBehind>,
    pub config: PersistConfig,
}

impl fmt::Debug for Lower {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lower")
            .field("tier", &self.tier)
            .field("config", &self.config)
            .finish()
    }
}

/// Movement counters (prefix `engine_`).
#[derive(Debug, Default)]
pub(super) struct Movement {
    pub promotions: AtomicU64,
    pub demotions_queued: AtomicU64,
    pub demotions_dropped: AtomicU64,
    /// Evict-only mode: RAM-only blocks a clean shutdown wrote to the persistent tier,
    /// and those it could not (deadline passed, tier refused or failed).
    pub shutdown_saved: AtomicU64,
    pub shutdown_unsaved: AtomicU64,
}

/// The engine's residency sink: keeps the prefix index current and, in evict-only mode,
/// hands what RAM evicts to the persistent tier's writer.
pub(super) struct EngineSink {
    pub index: Arc<PrefixIndex>,
    /// Weak: the writer owns the persistent tier, which owns this sink.
    pub demote_to: RwLock<Option<Weak<WriteBehind>>>,
    pub movement: Arc<Movement>,
}

impl fmt::Debug for EngineSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineSink").finish_non_exhaustive()
    }
}

impl ResidencySink for EngineSink {
    fn inserted(&self, tier: TierKind, meta: &BlockMeta) {
        self.index.inserted(tier, meta);
    }

    fn inserted_many(&self, tier: TierKind, metas: &[&BlockMeta]) {
        self.index.inserted_many(tier, metas);
    }

    fn removed(
        &self,
        tier: TierKind,
        meta: &BlockMeta,
        cause: RemovalCause,
        payload: Option<&Bytes>,
    ) {
        let demote = tier == TierKind::Ram && cause == RemovalCause::Budget && payload.is_some();
        // Only a RAM budget eviction can demote; ask the index only then.
        let already_lower = demote && self.index.tiers_of(&meta.hash) & !TierKind::Ram.bit() != 0;
        self.index.removed(tier, meta, cause, payload);
        if !demote || already_lower {
            return;
        }
        let writer = self.demote_to.read().as_ref().and_then(Weak::upgrade);
        let (Some(writer), Some(payload)) = (writer, payload) else {
            return;
        };
        // The block stays findable on its way down: the index names the lower tier now
        // (before the worker can write or lose it, so its report lands after this), and
        // loads read the queued bytes until the write is done.
        let lower = writer.target_kind();
        self.index.inserted(lower, meta);
        // Called under the RAM tier's lock: never wait here.
        use crate::tier::writer::Enqueued;
        match writer.try_enqueue(meta.clone(), payload.clone()) {
            Enqueued::Queued | Enqueued::AlreadyPending => {
                self.movement
                    .demotions_queued
                    .fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                self.index
                    .removed(lower, meta, RemovalCause::Explicit, None);
                self.movement
                    .demotions_dropped
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
