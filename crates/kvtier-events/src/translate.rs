//! From residency events to wire events: which tier is which medium, and runs of a chain
//! folded into one `BlockStored`.

use kvtier_core::events::ResidencyEvent;
use kvtier_core::layout::LayoutDigest;
use kvtier_core::tier::{BlockMeta, TierKind};

use crate::wire::{WireEvent, WireHash};

/// How a tier is named on the wire: `medium` (the tier) and `locality` (whether the bytes
/// are on this machine). Host memory keeps vLLM's own name for it, `CPU`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Medium {
    /// vLLM's `medium`: `CPU` (RAM tier), `SSD`, or `REMOTE` (shared object storage).
    pub medium: &'static str,
    /// vLLM's `locality`: `LOCAL` or `REMOTE`.
    pub locality: &'static str,
}

impl Medium {
    /// The wire names of `tier`.
    pub fn of(tier: TierKind) -> Medium {
        match tier {
            TierKind::Ram => Medium {
                medium: "CPU",
                locality: "LOCAL",
            },
            TierKind::Ssd => Medium {
                medium: "SSD",
                locality: "LOCAL",
            },
            TierKind::Remote => Medium {
                medium: "REMOTE",
                locality: "REMOTE",
            },
            // A tier kind added later, until it is given names of its own: vLLM's generic
            // name for offloaded storage.
            _ => Medium {
                medium: "STORAGE",
                locality: "LOCAL",
            },
        }
    }
}

/// What a block must match to join the open `BlockStored` run.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Run {
    tier: TierKind,
    layout: LayoutDigest,
    /// The run's last block: the next one must name it as its parent...
    last: WireHash,
    /// ...and sit right after it.
    position: u32,
    /// Whether the run's tokens are known (a run never mixes blocks with and without).
    tokens_known: bool,
}

impl Run {
    fn of(tier: TierKind, block: &BlockMeta) -> Run {
        Run {
            tier,
            layout: block.layout,
            last: block.hash.0,
            position: block.position,
            tokens_known: block.tokens_known(),
        }
    }

    fn continued_by(&self, next: &Run, parent: &WireHash) -> bool {
        self.tier == next.tier
            && self.layout == next.layout
            && self.last == *parent
            && self.position + 1 == next.position
            && self.tokens_known == next.tokens_known
    }
}

/// Tokens per block of a layout, as far as the engine knows it.
pub(crate) type BlockSizeOf<'a> = &'a dyn Fn(LayoutDigest) -> Option<u32>;

/// Whether a tier holds a block now (the engine's index, which every tier updates before
/// any observer hears of the change).
pub(crate) type HeldNow<'a> = &'a dyn Fn(TierKind, &BlockMeta) -> bool;

/// Builds the wire events of a sequence of residency events, folding a block into the
/// `BlockStored` before it when it continues that run's chain in the same tier (and
/// removals of one tier into one `BlockRemoved`). Moves between tiers publish nothing by
/// themselves: the receiving tier reports its own insertion, the source its removal.
///
/// An insertion or removal publishes what is true *now* for that tier and block, not what
/// the event says was true when it happened: so the last message about a block always
/// tells its current state, even when the events in between were dropped and a listing
/// (newer than some of the events still queued) was published meanwhile.
#[derive(Default)]
pub(crate) struct Translator {
    out: Vec<WireEvent>,
    /// The open `BlockStored` run (the last event of `out`), if any.
    run: Option<Run>,
    /// The tier of the open `BlockRemoved`.
    removing: Option<TierKind>,
}

impl Translator {
    pub(crate) fn push(
        &mut self,
        event: &ResidencyEvent,
        held_now: HeldNow<'_>,
        block_size_of: BlockSizeOf<'_>,
    ) {
        match event {
            ResidencyEvent::Inserted { tier, block }
            | ResidencyEvent::Removed { tier, block, .. } => {
                if held_now(*tier, block) {
                    self.stored(*tier, block, block_size_of);
                } else {
                    self.removed(*tier, block);
                }
            }
            _ => {}
        }
    }

    /// `tier` holds `block`.
    pub(crate) fn stored(
        &mut self,
        tier: TierKind,
        block: &BlockMeta,
        block_size_of: BlockSizeOf<'_>,
    ) {
        self.removing = None;
        let next = Run::of(tier, block);
        if let Some(run) = self.run
            && run.continued_by(&next, &block.parent.0)
            && let Some(WireEvent::Stored { hashes, tokens, .. }) = self.out.last_mut()
        {
            hashes.push(block.hash.0);
            tokens.extend_from_slice(&block.tokens);
            self.run = Some(next);
            return;
        }
        let block_size = block_size_of(block.layout).unwrap_or(block.tokens.len() as u32);
        let m = Medium::of(tier);
        self.out.push(WireEvent::Stored {
            hashes: vec![block.hash.0],
            // vLLM names no parent for a prompt's first block (kvtier's is the layout's
            // chain root, which no router knows).
            parent: (block.position > 0).then_some(block.parent.0),
            tokens: block.tokens.to_vec(),
            block_size,
            medium: m.medium,
            locality: m.locality,
        });
        self.run = Some(next);
    }

    fn removed(&mut self, tier: TierKind, block: &BlockMeta) {
        self.run = None;
        if self.removing == Some(tier)
            && let Some(WireEvent::Removed { hashes, .. }) = self.out.last_mut()
        {
            hashes.push(block.hash.0);
            return;
        }
        let m = Medium::of(tier);
        self.out.push(WireEvent::Removed {
            hashes: vec![block.hash.0],
            medium: m.medium,
            locality: m.locality,
        });
        self.removing = Some(tier);
    }

    /// Starts over: `AllBlocksCleared`.
    pub(crate) fn cleared(&mut self) {
        self.run = None;
        self.removing = None;
        self.out.push(WireEvent::AllCleared);
    }

    /// Wire events so far.
    pub(crate) fn len(&self) -> usize {
        self.out.len()
    }

    /// The wire events built, leaving the translator empty.
    pub(crate) fn take(&mut self) -> Vec<WireEvent> {
        self.run = None;
        self.removing = None;
        std::mem::take(&mut self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_core::events::Removal;
    use kvtier_core::hash::BlockHash;
    use std::sync::Arc;

    fn block(layout: u8, hash: u8, parent: u8, position: u32) -> BlockMeta {
        let mut b = BlockMeta::described(
            LayoutDigest([layout; 16]),
            BlockHash([hash; 16]),
            BlockHash([parent; 16]),
            position,
        );
        b.tokens = Arc::from(vec![u32::from(hash); 4]);
        b
    }

    fn sizes(_: LayoutDigest) -> Option<u32> {
        Some(4)
    }

    #[test]
    fn a_chain_in_one_tier_is_one_stored_event_and_anything_else_splits_it() {
        let mut t = Translator::default();
        let ins = |tier, b| ResidencyEvent::Inserted { tier, block: b };
        let held = |_: TierKind, _: &BlockMeta| true;
        let gone = |_: TierKind, _: &BlockMeta| false;
        for e in [
            ins(TierKind::Ram, block(1, 10, 1, 0)),
            ins(TierKind::Ram, block(1, 11, 10, 1)),
            ins(TierKind::Ram, block(1, 12, 11, 2)),
            // Same chain, another tier: a new event.
            ins(TierKind::Ssd, block(1, 13, 12, 3)),
            // Not the child of the last block: a new event.
            ins(TierKind::Ssd, block(1, 20, 99, 5)),
            ResidencyEvent::Removed {
                tier: TierKind::Ram,
                block: block(1, 10, 1, 0),
                cause: Removal::Evicted,
            },
            ResidencyEvent::Removed {
                tier: TierKind::Ram,
                block: block(1, 11, 10, 1),
                cause: Removal::Evicted,
            },
        ] {
            let now: HeldNow<'_> = if matches!(e, ResidencyEvent::Inserted { .. }) {
                &held
            } else {
                &gone
            };
            t.push(&e, now, &sizes);
        }
        // An insertion of a block that is gone again by the time it is published says so.
        t.push(
            &ResidencyEvent::Inserted {
                tier: TierKind::Ram,
                block: block(1, 12, 11, 2),
            },
            &gone,
            &sizes,
        );
        let out = t.take();
        assert_eq!(out.len(), 4, "{out:?}");
        match &out[0] {
            WireEvent::Stored {
                hashes,
                parent,
                tokens,
                medium,
                ..
            } => {
                assert_eq!(hashes.len(), 3);
                assert_eq!(*parent, None);
                assert_eq!(tokens.len(), 12);
                assert_eq!(*medium, "CPU");
            }
            other => panic!("{other:?}"),
        }
        match &out[2] {
            WireEvent::Stored { parent, medium, .. } => {
                assert_eq!(*parent, Some([99; 16]));
                assert_eq!(*medium, "SSD");
            }
            other => panic!("{other:?}"),
        }
        match &out[3] {
            WireEvent::Removed { hashes, .. } => assert_eq!(hashes.len(), 3),
            other => panic!("{other:?}"),
        }
        assert_eq!(t.len(), 0);
    }
}
