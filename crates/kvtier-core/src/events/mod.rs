//! Residency events: what every tier holds, as it changes, for anyone who needs to know.
//!
//! Every tier of an engine reports each block it admits or drops; the engine adds the
//! moves between tiers. The prefix index is fed synchronously, before anything else, and is
//! never dropped (it decides hit or miss). Everyone else — an etcd advertiser, a KV-event
//! publisher for routers, a test — registers a [`ResidencyObserver`] with
//! [`crate::Engine::observe`] and receives the events in batches on its own thread, through
//! a bounded queue: a slow observer never blocks a store or a load; what does not fit in
//! its queue is dropped and counted ([`ObserverStats::dropped`]), so an observer that must
//! be exact can tell it missed something and resynchronise (for example from
//! [`crate::Engine::index`]).

mod registry;

pub use registry::{ObserverHandle, Observers};

use crate::stats::{Counter, CounterKind};
use crate::tier::{BlockMeta, RemovalCause, TierKind};

/// Why a block left a tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Removal {
    /// Evicted to make room (byte budget or capacity).
    Evicted,
    /// Its time to live passed.
    Expired,
    /// Deleted on request (a namespace delete, an overwrite, a failed write taken back).
    Deleted,
    /// Failed verification and was dropped.
    Corrupt,
    /// The tier was detached from the engine (a live SSD change): the block may still be
    /// in the tier's files, but this engine no longer serves it from there.
    Detached,
}

impl From<RemovalCause> for Removal {
    fn from(cause: RemovalCause) -> Self {
        match cause {
            RemovalCause::Budget => Removal::Evicted,
            RemovalCause::Ttl => Removal::Expired,
            RemovalCause::Corrupt => Removal::Corrupt,
            _ => Removal::Deleted,
        }
    }
}

/// One change of residency.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResidencyEvent {
    /// `tier` now holds the block.
    Inserted {
        /// The tier.
        tier: TierKind,
        /// The block (layout, hash, parent, position, tokens, extra tag).
        block: BlockMeta,
    },
    /// `tier` no longer holds the block.
    Removed {
        /// The tier.
        tier: TierKind,
        /// The block.
        block: BlockMeta,
        /// Why.
        cause: Removal,
    },
    /// The block was read from the slower tier `from` and put into (or queued for) the
    /// faster tier `to`; `to` reports its own `Inserted` when it holds it.
    Promoted {
        /// The tier it was read from.
        from: TierKind,
        /// The tier it is going to.
        to: TierKind,
        /// The block.
        block: BlockMeta,
    },
    /// The faster tier `from` evicted the block and it was queued for the slower tier `to`
    /// (evict-only mode); `to` reports its own `Inserted` once written.
    Demoted {
        /// The tier that evicted it.
        from: TierKind,
        /// The tier it is queued for.
        to: TierKind,
        /// The block.
        block: BlockMeta,
    },
}

impl ResidencyEvent {
    /// The block the event is about.
    pub fn block(&self) -> &BlockMeta {
        match self {
            ResidencyEvent::Inserted { block, .. }
            | ResidencyEvent::Removed { block, .. }
            | ResidencyEvent::Promoted { block, .. }
            | ResidencyEvent::Demoted { block, .. } => block,
        }
    }
}

/// Receives residency events, in batches, on a thread of its own.
///
/// Events of one block from one tier arrive in the order they happened. The call may take
/// as long as it needs (a network round trip, say): events meanwhile wait in the
/// observer's bounded queue, and those that do not fit are dropped and counted.
pub trait ResidencyObserver: Send + Sync + 'static {
    /// A batch of events, oldest first.
    fn observe(&self, events: &[ResidencyEvent]);

    /// `count` events were dropped (the queue was full) since the last batch: called
    /// before the next batch, so an observer that must be exact resynchronises (from
    /// [`crate::Engine::index`], whose state is at least as new as anything dropped).
    fn missed(&self, count: u64) {
        let _ = count;
    }
}

/// One observer's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObserverStats {
    /// The name it was registered under.
    pub name: String,
    /// Events handed to it.
    pub delivered: u64,
    /// Events dropped because its queue was full.
    pub dropped: u64,
    /// Events waiting in its queue now.
    pub queued: u64,
}

impl ObserverStats {
    /// Every observer counter; names are prefixed `observer_{name}_`, and the metrics carry
    /// an `observer` label.
    #[rustfmt::skip]
    pub const COUNTERS: &'static [Counter<ObserverStats>] = &[
        Counter { name: "delivered", family: "observer_events", label: Some(("outcome", "delivered")), help: "Residency events handed to an observer, and those dropped because its queue was full", kind: CounterKind::Counter, read: |s| s.delivered },
        Counter { name: "dropped", family: "observer_events", label: Some(("outcome", "dropped")), help: "Residency events handed to an observer, and those dropped because its queue was full", kind: CounterKind::Counter, read: |s| s.dropped },
        Counter { name: "queued", family: "observer_queue_depth", label: None, help: "Residency events waiting in an observer's queue", kind: CounterKind::Gauge, read: |s| s.queued },
    ];
}
