//! Turning block handles that crossed a process boundary back into a [`Lookup`].
//!
//! A network client looks a prompt up, keeps the returned block hashes, and asks for their
//! bytes later, maybe from another thread or process. The hashes alone must not be enough
//! to read a block under another layout or another prefix: resolving checks that they form
//! one chain of the named layout, from its root, position by position.

use super::Engine;
use crate::error::Result;
use crate::hash::{BlockHash, chain_root};
use crate::index::{BlockRef, Lookup};
use crate::layout::LayoutDigest;
use crate::tier::TierKind;

impl Engine {
    /// The leading handles of `hashes` that still name a chain of `layout`: block `i`
    /// must be held, belong to `layout`, sit at position `i`, and have block `i - 1` (or
    /// the layout's root) as its parent. Resolution stops at the first handle that does
    /// not — a block evicted since the lookup, or a handle that was never a prefix of this
    /// layout — so the caller serves what came before it and recomputes from there.
    /// Errors only for a layout that was never registered.
    pub fn resolve(&self, layout: LayoutDigest, hashes: &[BlockHash]) -> Result<Lookup> {
        self.poison.check()?;
        let geometry = self.layout(layout)?;
        let mut parent = chain_root(&geometry);
        let mut blocks = Vec::with_capacity(hashes.len());
        for (i, hash) in hashes.iter().enumerate() {
            let Some(meta) = self.index.meta_of(hash) else {
                break;
            };
            if meta.layout != layout || meta.parent != parent || meta.position as usize != i {
                break;
            }
            let Some(tier) = TierKind::fastest_in(self.index.tiers_of(hash)) else {
                break;
            };
            blocks.push(BlockRef {
                hash: *hash,
                position: i as u32,
                tier,
            });
            parent = *hash;
        }
        Ok(Lookup {
            layout,
            matched_tokens: blocks.len() * geometry.tokens_per_block(),
            blocks,
            state: None,
        })
    }
}
