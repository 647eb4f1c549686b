//! Loading blocks: RAM first, then down the tier stack, promoting hits as each tier's
//! policy says.

use std::ops::Range;

use bytes::Bytes;

use super::hits::Ended;
use super::movement::Moved;
use super::stack::Slot;
use super::{Engine, Loaded};
use crate::error::{Error, ErrorKind, Result};
use crate::events::ResidencyEvent;
use crate::hash::BlockHash;
use crate::index::{BlockRef, Lookup};
use crate::tier::writer::Enqueued;
use crate::tier::{BlockMeta, PutOutcome, ShortRead, Tier, TierKind};

impl Engine {
    /// Loads the matched blocks of `lookup` in order, stopping at the first block no longer
    /// held. Each block is read from the fastest tier holding it: RAM first (a block may
    /// have been promoted since the lookup), then each tier below in order. A tier that
    /// reads runs (the remote tier) is asked for the whole run of following blocks no
    /// faster tier holds, in one request. A block read below RAM is promoted as its tier's
    /// policy says.
    ///
    /// Every load is counted in the hit accounting (`engine::hits`), in tokens of the
    /// lookup's layout: those delivered by the tier that served them, and the rest by why
    /// they were not.
    pub fn load(&self, lookup: &Lookup) -> Result<Loaded> {
        let refs = &lookup.blocks;
        let mut blocks = Vec::with_capacity(refs.len());
        let mut served = [0u64; TierKind::ALL.len()];
        // A closed engine refuses the load; the refusal is counted like any other end.
        let outcome = self
            .poison
            .check()
            .and_then(|()| self.load_into(refs, &mut blocks, &mut served));
        self.count_load(lookup, &served, &outcome);
        outcome?;
        let complete = blocks.len() == refs.len();
        Ok(Loaded { blocks, complete })
    }

    /// Counts a load of `lookup`'s blocks in the hit accounting: `served[kind]` blocks
    /// delivered by each tier, ended as `outcome` says. Tokens per block come from the
    /// lookup itself (its matched tokens over its blocks): a load stays a few atomic
    /// operations, with no lock taken to find the layout.
    fn count_load(
        &self,
        lookup: &Lookup,
        served: &[u64; TierKind::ALL.len()],
        outcome: &Result<Option<ShortRead>>,
    ) {
        let tokens_per_block = match lookup.blocks.len() {
            0 => 0,
            n => (lookup.matched_tokens / n) as u64,
        };
        let ended = match outcome {
            Ok(short) => Ended::Short(*short),
            Err(e) => Ended::Error(e.kind()),
        };
        self.movement
            .hits
            .load(tokens_per_block, lookup.blocks.len(), served, ended);
    }

    /// The body of [`Engine::load`]: pushes each block read onto `blocks`, counting it in
    /// `served` under the tier that served it. When it stops short, says why the first
    /// block it could not deliver was not (the greatest reason any tier gave for it).
    fn load_into(
        &self,
        refs: &[BlockRef],
        blocks: &mut Vec<Bytes>,
        served: &mut [u64; TierKind::ALL.len()],
    ) -> Result<Option<ShortRead>> {
        let slots = self.stack.slots();
        let mut i = 0;
        // Why block `.0` fell short so far: a tier that dropped a corrupt block and a
        // later tier that never held it are counted as corrupt.
        let mut why: Option<(usize, ShortRead)> = None;
        let mut note = |at: usize, short: Option<ShortRead>| {
            if let Some(short) = short {
                why = match why {
                    Some((j, w)) if j == at => Some((at, w.max(short))),
                    _ => Some((at, short)),
                };
            }
        };
        'blocks: while i < refs.len() {
            let hash = refs[i].hash;
            if let Some(b) = self.ram.get(&hash)? {
                self.prefetcher.note_ram_hit(&hash);
                served[TierKind::Ram as usize] += 1;
                blocks.push(b);
                i += 1;
                continue;
            }
            for (at, slot) in slots.iter().enumerate() {
                // A tier that reads runs is asked for the run of blocks from here that no
                // faster tier holds; any other for this block.
                let end = if slot.policy.runs {
                    let faster = &slots[..at];
                    let held_faster = |h: &BlockHash| {
                        self.ram.contains(h) || faster.iter().any(|s| s.tier.contains(h))
                    };
                    (i + 1..refs.len())
                        .find(|&j| held_faster(&refs[j].hash))
                        .unwrap_or(refs.len())
                } else {
                    i + 1
                };
                let hashes: Vec<BlockHash> = refs[i..end].iter().map(|r| r.hash).collect();
                let read = slot.read_run(&hashes)?;
                let n = read.blocks.len();
                note(i + n, read.short);
                if n == 0 {
                    continue;
                }
                served[slot.kind() as usize] += n as u64;
                for (k, b) in read.blocks.into_iter().enumerate() {
                    self.promote(&slots, at, &hashes[k], &b);
                    blocks.push(b);
                }
                // A short run (the tier lost a block) goes on from the top with the block
                // it lacked: the next loop ends the load unless some tier holds it.
                i += n;
                continue 'blocks;
            }
            // No tier delivered block `i`: it was evicted since the lookup unless a tier
            // said otherwise.
            return Ok(Some(match why {
                Some((j, w)) if j == i => w,
                _ => ShortRead::NotHeld,
            }));
        }
        Ok(None)
    }

    /// Promotes `bytes`, read from `slots[at]`, as that tier's policy says: into RAM
    /// and/or queued for the faster tiers below RAM that lack it. Each move is counted by
    /// its true source and destination. Best effort: a refused promotion fails no load.
    pub(super) fn promote(
        &self,
        slots: &[std::sync::Arc<Slot>],
        at: usize,
        hash: &BlockHash,
        bytes: &Bytes,
    ) {
        let from = &slots[at];
        let (to_ram, fill) = (from.policy.promote_to_ram, from.policy.fill_faster);
        if !to_ram && !fill {
            return;
        }
        // A block whose tokens are not known (not yet checked against its manifest) is
        // never copied into another tier: those write the tokens into their records.
        let Some(meta) = self.index.meta_of(hash).filter(BlockMeta::tokens_known) else {
            return;
        };
        if to_ram && matches!(self.ram.put(&meta, bytes.clone()), Ok(PutOutcome::Stored)) {
            self.movement
                .count(Moved::Promoted, from.kind(), TierKind::Ram, 1);
            self.observers.publish(|| ResidencyEvent::Promoted {
                from: from.kind(),
                to: TierKind::Ram,
                block: meta.clone(),
            });
        }
        if fill {
            for faster in slots[..at].iter().filter(|s| !s.holds_or_queued(hash)) {
                if matches!(
                    faster.writer.enqueue(meta.clone(), bytes.clone()),
                    Enqueued::Queued
                ) {
                    self.movement
                        .count(Moved::Promoted, from.kind(), faster.kind(), 1);
                    self.observers.publish(|| ResidencyEvent::Promoted {
                        from: from.kind(),
                        to: faster.kind(),
                        block: meta.clone(),
                    });
                }
            }
        }
    }

    /// Loads only layers `layers` of each matched block of `lookup` (one page per layer per
    /// block, each a zero-copy slice when the block is in RAM). The page boundaries come
    /// from the layout the lookup was made under, never from the caller.
    ///
    /// A hit loaded layer by layer is counted in the hit accounting once, by the range
    /// that starts at layer 0 (every layered load of a hit reads it: delivered means its
    /// first layers came), refusals included.
    pub fn load_layers(&self, lookup: &Lookup, layers: Range<u32>) -> Result<Loaded> {
        let mut blocks = Vec::with_capacity(lookup.blocks.len());
        let mut served = [0u64; TierKind::ALL.len()];
        let outcome = self
            .poison
            .check()
            .and_then(|()| self.load_layers_into(lookup, layers.clone(), &mut blocks, &mut served));
        if layers.start == 0 {
            self.count_load(lookup, &served, &outcome);
        }
        let complete = outcome?.is_none();
        Ok(Loaded { blocks, complete })
    }

    /// The body of [`Engine::load_layers`], as [`Engine::load_into`] is of a whole load.
    fn load_layers_into(
        &self,
        lookup: &Lookup,
        layers: Range<u32>,
        blocks: &mut Vec<Bytes>,
        served: &mut [u64; TierKind::ALL.len()],
    ) -> Result<Option<ShortRead>> {
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
        for r in &lookup.blocks {
            match self.read_range(r, range.clone())? {
                Ok(b) => {
                    served[r.tier as usize] += 1;
                    blocks.push(b);
                }
                Err(short) => return Ok(Some(short)),
            }
        }
        Ok(None)
    }

    /// Bytes `range` of the block `r` names, from the tier the lookup found it in (or, not
    /// written there yet, a slice of the queued bytes); or why the tier could not deliver
    /// them.
    fn read_range(
        &self,
        r: &BlockRef,
        range: Range<u64>,
    ) -> Result<std::result::Result<Bytes, ShortRead>> {
        if r.tier == TierKind::Ram {
            return Ok(self
                .ram
                .get_range(&r.hash, range)?
                .ok_or(ShortRead::NotHeld));
        }
        let slot = self.stack.find(r.tier).ok_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                format!("the {} tier is not attached", r.tier.name()),
            )
        })?;
        let short = match slot.tier.read_range(&r.hash, range.clone())? {
            Ok(bytes) => return Ok(Ok(bytes)),
            Err(short) => short,
        };
        Ok(slot
            .writer
            .pending_payload(&r.hash)
            .filter(|b| b.len() as u64 >= range.end)
            .map(|b| b.slice(range.start as usize..range.end as usize))
            .ok_or(short))
    }
}
