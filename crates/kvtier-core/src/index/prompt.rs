//! A prompt made ready for the index: validated, hashed at most once, reusable for lookup
//! and store.
//!
//! The hash chain is computed lazily. A lookup hashes only as far as its walk goes (in
//! growing steps: at most about four times the blocks it matched, plus a first step of
//! 16), so a prompt that misses at its first block costs one step of hashing, not one per
//! block of the prompt. Everything else ([`Prompt::hashes`], a store) computes the whole
//! chain once, and a walk that hashed every block leaves its chain for them.

use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};
use crate::hash::{self, BlockHash, ExtraKeys};
use crate::layout::Layout;
use crate::tier::BlockMeta;

/// Blocks a lookup hashes before it knows whether the first one is held.
const FIRST_STEP: usize = 16;

/// Tokens under a layout, with the hash of every whole block computed once, when first
/// needed.
#[derive(Debug, Clone)]
pub struct Prompt {
    layout: Arc<Layout>,
    tokens: Arc<[u32]>,
    /// Every whole block's hash, once something needed all of them.
    hashes: OnceLock<Vec<BlockHash>>,
    /// Extra-key tag per whole block; empty when the prompt has no extra keys.
    tags: Vec<Option<[u8; 16]>>,
}

impl Prompt {
    /// Takes `tokens` under `layout` (hashing them when first needed). Refuses an empty
    /// prompt and extra keys attached to a block past the end of the tokens.
    pub fn new(layout: Arc<Layout>, tokens: &[u32], extras: &ExtraKeys) -> Result<Self> {
        if tokens.is_empty() {
            return Err(Error::invalid("the prompt has zero tokens"));
        }
        let tpb = layout.tokens_per_block();
        let blocks_touched = tokens.len().div_ceil(tpb);
        if let Some(last) = extras.last_block()
            && last >= blocks_touched
        {
            return Err(Error::invalid(format!(
                "extra keys are attached to block {last}, but {} tokens make only {blocks_touched} blocks of {tpb}",
                tokens.len()
            )));
        }
        let tags = extras.tags(tokens.len() / tpb);
        Ok(Self {
            layout,
            tokens: tokens.into(),
            hashes: OnceLock::new(),
            tags,
        })
    }

    /// The layout.
    pub fn layout(&self) -> &Arc<Layout> {
        &self.layout
    }

    /// All tokens, including a trailing partial block.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The tokens of whole block `i`.
    pub fn block_tokens(&self, i: usize) -> &[u32] {
        let tpb = self.layout.tokens_per_block();
        &self.tokens[i * tpb..(i + 1) * tpb]
    }

    /// The hash of every whole block (computed on the first call).
    pub fn hashes(&self) -> &[BlockHash] {
        self.hashes.get_or_init(|| {
            let n = self.num_blocks();
            let mut out = Vec::with_capacity(n);
            hash::chain_extend(&self.layout, &self.tokens, &self.tags, &mut out, n);
            out
        })
    }

    /// Number of whole blocks.
    pub fn num_blocks(&self) -> usize {
        self.tokens.len() / self.layout.tokens_per_block()
    }

    /// The hashes of the first `limit` whole blocks, computed as a walk reads them.
    pub(crate) fn walk(&self, limit: usize) -> ChainWalk<'_> {
        ChainWalk {
            prompt: self,
            limit: limit.min(self.num_blocks()),
            own: Vec::new(),
        }
    }

    /// The extra-key tag of block `i`.
    pub fn extra_tag(&self, i: usize) -> Option<[u8; 16]> {
        self.tags.get(i).copied().flatten()
    }

    /// The parent hash of block `i` (the chain root for block 0).
    pub fn parent_of(&self, i: usize) -> BlockHash {
        match i.checked_sub(1) {
            Some(p) => self.hashes()[p],
            None => hash::chain_root(&self.layout),
        }
    }

    /// The description of whole block `i`, as a tier stores and the index keeps it.
    pub(crate) fn block_meta(&self, i: usize) -> BlockMeta {
        BlockMeta {
            layout: self.layout.digest(),
            hash: self.hashes()[i],
            parent: self.parent_of(i),
            position: i as u32,
            tokens: self.block_tokens(i).into(),
            extra_tag: self.extra_tag(i),
        }
    }
}

/// The chain of a [`Prompt`] as far as a walk asks for it. The prompt's whole chain is
/// used when something computed it already; otherwise the walk hashes what it reaches.
pub(crate) struct ChainWalk<'p> {
    prompt: &'p Prompt,
    limit: usize,
    own: Vec<BlockHash>,
}

impl ChainWalk<'_> {
    /// The hash of whole block `i` (below the walk's limit). Hashes ahead of `i` in
    /// doubling steps, so one call in a while does the hashing for the calls after it.
    pub(crate) fn hash(&mut self, i: usize) -> BlockHash {
        let ahead = (i + 1).max(2 * self.own.len()).max(FIRST_STEP);
        let to = if i < self.own.len() { i + 1 } else { ahead };
        self.upto(to)[i]
    }

    /// How many of the walk's hashes are there without hashing.
    pub(crate) fn known(&self) -> usize {
        match self.prompt.hashes.get() {
            Some(_) => self.limit,
            None => self.own.len(),
        }
    }

    /// The hashes of the first `to` whole blocks (at most the walk's limit).
    pub(crate) fn upto(&mut self, to: usize) -> &[BlockHash] {
        let to = to.min(self.limit);
        if let Some(all) = self.prompt.hashes.get() {
            return &all[..to];
        }
        let p = self.prompt;
        hash::chain_extend(&p.layout, &p.tokens, &p.tags, &mut self.own, to);
        &self.own[..to]
    }

    /// Leaves the chain with the prompt when the walk hashed every block of it, so a store
    /// of the same prompt does not hash it again.
    pub(crate) fn keep(self) {
        if self.own.len() == self.prompt.num_blocks() {
            let _ = self.prompt.hashes.set(self.own);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::index::PrefixIndex;
    use crate::layout::{KvDtype, LayoutKey};
    use crate::tier::{ResidencySink, TierKind};

    fn prompt(blocks: u32, seed: u32) -> Prompt {
        let layout = match Layout::new(LayoutKey::new("m", KvDtype::F16, 16, 1, 1, 8)) {
            Ok(l) => Arc::new(l),
            Err(e) => unreachable!("{e}"),
        };
        let tokens: Vec<u32> = (0..16 * blocks)
            .map(|t| t.wrapping_mul(seed) ^ seed)
            .collect();
        match Prompt::new(layout, &tokens, &ExtraKeys::none()) {
            Ok(p) => p,
            Err(e) => unreachable!("{e}"),
        }
    }

    /// An index holding the first `held` blocks of `p`, with their honest metadata
    /// (described through a copy of `p`, so `p` itself stays unhashed).
    fn holding(p: &Prompt, held: usize) -> PrefixIndex {
        let index = PrefixIndex::new();
        let twin = p.clone();
        for i in 0..held {
            index.inserted(TierKind::Ram, &twin.block_meta(i));
        }
        index
    }

    #[test]
    fn a_walk_hashes_ahead_in_doubling_steps_and_agrees_with_the_whole_chain() {
        let p = prompt(300, 7);
        let whole = hash::chain(p.layout(), p.tokens(), &ExtraKeys::none());
        let mut walk = p.walk(300);
        assert_eq!(walk.hash(0), whole[0]);
        assert_eq!(walk.own.len(), FIRST_STEP, "the first step");
        assert_eq!(walk.hash(FIRST_STEP), whole[FIRST_STEP]);
        assert_eq!(walk.own.len(), 2 * FIRST_STEP, "the second step doubles");
        assert_eq!(walk.upto(100), &whole[..100]);
        assert_eq!(
            walk.upto(1_000),
            &whole[..],
            "capped at the prompt's blocks"
        );
        assert!(
            p.hashes.get().is_none(),
            "a walk alone leaves the prompt unhashed"
        );
        walk.keep();
        assert_eq!(p.hashes.get(), Some(&whole), "a whole walk is kept");
    }

    #[test]
    fn a_walk_below_the_whole_prompt_is_not_kept() {
        let p = prompt(100, 3);
        let mut walk = p.walk(40);
        let _ = walk.upto(100);
        walk.keep();
        assert!(p.hashes.get().is_none());
        assert_eq!(
            p.hashes(),
            hash::chain(p.layout(), p.tokens(), &ExtraKeys::none())
        );
    }

    #[test]
    fn a_lookup_hashes_about_as_far_as_it_matches_and_answers_as_the_whole_chain_would() {
        // Held prefixes on both sides of every step boundary: the head (16 then 32 blocks,
        // one shard lock each) and the stretches after it (to 128, then to the end).
        for held in [
            0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 300,
        ] {
            let p = prompt(300, 11 + held as u32);
            let index = holding(&p, held);
            let found = index.lookup(&p, usize::MAX);
            let whole = hash::chain(p.layout(), p.tokens(), &ExtraKeys::none());
            assert_eq!(found.blocks.len(), held, "held {held}");
            for (i, b) in found.blocks.iter().enumerate() {
                assert_eq!((b.hash, b.position as usize), (whole[i], i), "held {held}");
            }
            // Only a walk whose last stretch (128..300) was hashed leaves the chain with
            // the prompt: one that stopped earlier hashed part of it.
            assert_eq!(p.hashes.get().is_some(), held >= 128, "held {held}");
            // The same lookup with the chain computed first answers the same.
            let again = index.lookup(&p, usize::MAX);
            assert_eq!(again.blocks, found.blocks, "held {held}");
        }
    }

    #[test]
    fn a_lookup_that_misses_at_once_hashes_one_step() {
        let p = prompt(8_192, 5);
        let index = holding(&p, 0);
        let mut walk = p.walk(p.num_blocks());
        let _ = walk.hash(0);
        assert_eq!(walk.own.len(), FIRST_STEP);
        assert!(index.lookup(&p, usize::MAX).is_miss());
        assert!(p.hashes.get().is_none(), "a miss hashed the whole prompt");
    }
}
