//! The engine's residency sink: keeps the prefix index current and, when a tier below RAM
//! takes what RAM evicts (evict-only mode), hands evicted blocks to that tier's writer.

use std::fmt;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::RwLock;

use super::movement::{Moved, Movement};
use super::stack::Stack;
use crate::events::{Observers, ResidencyEvent};
use crate::index::PrefixIndex;
use crate::tier::writer::{Enqueued, WriteBehind};
use crate::tier::{BlockMeta, RemovalCause, ResidencySink, TierKind};

pub(super) struct EngineSink {
    pub index: Arc<PrefixIndex>,
    /// The writer of the first evict-only tier, if any. Weak: the writer owns its tier,
    /// which owns this sink.
    pub demote_to: RwLock<Option<Weak<WriteBehind>>>,
    pub movement: Arc<Movement>,
    /// Everyone else who wants to know, after the index.
    pub observers: Arc<Observers>,
    /// The engine's poison flag: a tier's writer closes the engine through it when its
    /// worker panics.
    pub poison: Arc<crate::poison::Poison>,
}

impl fmt::Debug for EngineSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineSink").finish_non_exhaustive()
    }
}

impl EngineSink {
    /// Points demotions at the first evict-only tier of `stack` (or nowhere).
    pub fn demote_to_first_evict_only(&self, stack: &Stack) {
        let target = stack
            .slots()
            .iter()
            .find(|s| !s.write_through())
            .map(|s| Arc::downgrade(&s.writer));
        *self.demote_to.write() = target;
    }
}

impl ResidencySink for EngineSink {
    fn inserted(&self, tier: TierKind, meta: &BlockMeta) {
        self.index.inserted(tier, meta);
        self.observers.publish(|| ResidencyEvent::Inserted {
            tier,
            block: meta.clone(),
        });
    }

    fn inserted_many(&self, tier: TierKind, metas: &[&BlockMeta]) {
        self.index.inserted_many(tier, metas);
        if self.observers.any() {
            for meta in metas {
                self.observers.publish(|| ResidencyEvent::Inserted {
                    tier,
                    block: (*meta).clone(),
                });
            }
        }
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
        self.observers.publish(|| ResidencyEvent::Removed {
            tier,
            block: meta.clone(),
            cause: cause.into(),
        });
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
        match writer.try_enqueue(meta.clone(), payload.clone()) {
            Enqueued::Queued | Enqueued::AlreadyPending => {
                self.movement
                    .count(Moved::DemotionQueued, TierKind::Ram, lower, 1);
                self.observers.publish(|| ResidencyEvent::Demoted {
                    from: TierKind::Ram,
                    to: lower,
                    block: meta.clone(),
                });
            }
            _ => {
                self.index
                    .removed(lower, meta, RemovalCause::Explicit, None);
                self.movement
                    .count(Moved::DemotionDropped, TierKind::Ram, lower, 1);
            }
        }
    }
}
