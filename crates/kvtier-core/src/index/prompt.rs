//! A prompt made ready for the index: validated, hashed once, reusable for lookup and store.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::hash::{self, BlockHash, ExtraKeys};
use crate::layout::Layout;

/// Tokens under a layout, with the hash of every whole block computed once.
#[derive(Debug, Clone)]
pub struct Prompt {
    layout: Arc<Layout>,
    tokens: Arc<[u32]>,
    hashes: Vec<BlockHash>,
    /// Extra-key tag per whole block; empty when the prompt has no extra keys.
    tags: Vec<Option<[u8; 16]>>,
}

impl Prompt {
    /// Hashes `tokens` under `layout`. Refuses an empty prompt and extra keys attached to
    /// a block past the end of the tokens.
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
        let hashes = hash::chain(&layout, tokens, extras);
        let tags = if extras.is_empty() {
            Vec::new()
        } else {
            (0..hashes.len()).map(|i| extras.tag(i)).collect()
        };
        Ok(Self {
            layout,
            tokens: tokens.into(),
            hashes,
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

    /// The hash of every whole block.
    pub fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// Number of whole blocks.
    pub fn num_blocks(&self) -> usize {
        self.hashes.len()
    }

    /// The extra-key tag of block `i`.
    pub fn extra_tag(&self, i: usize) -> Option<[u8; 16]> {
        self.tags.get(i).copied().flatten()
    }

    /// The parent hash of block `i` (the chain root for block 0).
    pub fn parent_of(&self, i: usize) -> BlockHash {
        match i.checked_sub(1) {
            Some(p) => self.hashes[p],
            None => hash::chain_root(&self.layout),
        }
    }
}
