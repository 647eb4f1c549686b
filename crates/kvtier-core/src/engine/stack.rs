//! The tiers below RAM as one ordered list: the tier stack.
//!
//! RAM is the engine's head (it holds the working set and decides eviction); below it each
//! attached tier is a [`Slot`] — the tier, its write-behind queue and its [`TierPolicy`] —
//! kept fastest first (by [`TierKind`], one tier per kind). The engine's paths are loops
//! over the slots that ask only the policy what to do, so a new kind of tier needs a slot,
//! not a new branch in the engine.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::RwLock;

use super::policy::{PersistMode, TierPolicy};
use crate::error::{Error, ErrorKind, Result};
use crate::hash::BlockHash;
use crate::tier::writer::WriteBehind;
use crate::tier::{RunRead, ShortRead, Tier, TierKind};

/// One tier below RAM.
pub(super) struct Slot {
    pub tier: Arc<dyn Tier>,
    pub writer: Arc<WriteBehind>,
    pub policy: TierPolicy,
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("tier", &self.tier)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Slot {
    pub fn kind(&self) -> TierKind {
        self.tier.kind()
    }

    /// The block's bytes from the tier or, not written yet, from its queue (a block on its
    /// way down is never invisible).
    pub fn get(&self, hash: &BlockHash) -> Result<Option<Bytes>> {
        Ok(self
            .tier
            .get(hash)?
            .or_else(|| self.writer.pending_payload(hash)))
    }

    /// The leading blocks of `hashes` the tier holds, and why the run ended there (see
    /// [`Tier::read_run`]): as one request when the tier reads runs, the first block only
    /// otherwise. A block still queued for the tier (not written yet) is answered from the
    /// queue: a block on its way down is never invisible.
    pub fn read_run(&self, hashes: &[BlockHash]) -> Result<RunRead> {
        let Some(first) = hashes.first() else {
            return Ok(RunRead::default());
        };
        let queued = |short| {
            let payload = self.writer.pending_payload(first)?;
            let more = hashes.len() > 1;
            Some(RunRead {
                blocks: vec![payload],
                short: if more { short } else { None },
            })
        };
        if self.policy.runs {
            if let Some(read) = queued(Some(ShortRead::NotHeld)) {
                return Ok(read);
            }
            return self.tier.read_run(hashes);
        }
        let read = self.tier.read_run(std::slice::from_ref(first))?;
        if read.blocks.is_empty()
            && let Some(from_queue) = queued(read.short)
        {
            return Ok(from_queue);
        }
        Ok(read)
    }

    /// Whether the tier holds the block or has it queued.
    pub fn holds_or_queued(&self, hash: &BlockHash) -> bool {
        self.tier.contains(hash) || self.writer.is_pending(hash)
    }

    /// Whether a new block goes to this tier as it is stored (not only when RAM evicts it).
    pub fn write_through(&self) -> bool {
        self.policy.mode == PersistMode::WriteThrough
    }
}

/// The attached tiers below RAM, fastest first. Readers take a cheap snapshot of the list
/// ([`Stack::slots`]) and work on it without a lock; attaching and detaching replace the list.
#[derive(Debug, Default)]
pub(super) struct Stack {
    slots: RwLock<Arc<[Arc<Slot>]>>,
}

impl Stack {
    /// The slots now, fastest first.
    pub fn slots(&self) -> Arc<[Arc<Slot>]> {
        self.slots.read().clone()
    }

    /// The slot of tier kind `kind`, if attached.
    pub fn find(&self, kind: TierKind) -> Option<Arc<Slot>> {
        self.slots().iter().find(|s| s.kind() == kind).cloned()
    }

    /// The persistent tier: the first slot that carries durable acknowledgements.
    pub fn persistent(&self) -> Option<Arc<Slot>> {
        self.slots().iter().find(|s| s.policy.takes_acks).cloned()
    }

    /// Adds `slot` in its place by speed. Refuses RAM (the engine's head) and a second
    /// tier of a kind already attached.
    pub fn insert(&self, slot: Arc<Slot>) -> Result<()> {
        let kind = slot.kind();
        let mut slots = self.slots.write();
        if kind == TierKind::Ram || slots.iter().any(|s| s.kind() == kind) {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "a {} tier cannot be attached below RAM: the engine has one already",
                    kind.name()
                ),
            ));
        }
        let mut list: Vec<Arc<Slot>> = slots.iter().cloned().collect();
        let at = list.partition_point(|s| s.kind() < kind);
        list.insert(at, slot);
        *slots = list.into();
        Ok(())
    }

    /// Takes out the first slot `pick` chooses, if any.
    pub fn take(&self, pick: impl Fn(&Slot) -> bool) -> Option<Arc<Slot>> {
        let mut slots = self.slots.write();
        let at = slots.iter().position(|s| pick(s))?;
        let mut list: Vec<Arc<Slot>> = slots.iter().cloned().collect();
        let taken = list.remove(at);
        *slots = list.into();
        Some(taken)
    }
}
