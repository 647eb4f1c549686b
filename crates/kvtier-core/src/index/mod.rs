//! The prefix index: the one structure that decides hit or miss, from memory alone.
//!
//! It maps each held block's hash to what the block was computed for (layout, parent,
//! position, tokens, extra-key tag) and which tiers hold it. Tiers keep it current through
//! [`ResidencySink`]: an entry exists exactly while at least one tier holds the block.
//!
//! A lookup walks the prompt's hash chain from the first block and stops at the first block
//! that is not held. At every step it checks that the entry's layout, parent, position,
//! tokens and extra-key tag are exactly the request's, so even a 128-bit hash collision
//! cannot make it serve a block computed for another prefix: when in doubt, miss.

mod prompt;

use bytes::Bytes;

pub use prompt::Prompt;

use crate::hash::BlockHash;
use crate::layout::LayoutDigest;
use crate::shard::ShardedMap;
use crate::stats::{IndexStats, StripedCounter};
use crate::tier::{BlockMeta, RemovalCause, ResidencySink, TierKind};

/// A handle to one matched block: enough to load it from the tier that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRef {
    /// The block's key.
    pub hash: BlockHash,
    /// The block's position in the prompt.
    pub position: u32,
    /// The fastest tier that held the block when it was looked up.
    pub tier: TierKind,
}

/// The answer to "how much of this prompt is cached?".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookup {
    /// The matched leading blocks, in order.
    pub blocks: Vec<BlockRef>,
    /// Tokens covered by the matched blocks.
    pub matched_tokens: usize,
}

impl Lookup {
    /// True when nothing matched.
    pub fn is_miss(&self) -> bool {
        self.blocks.is_empty()
    }
}

#[derive(Debug)]
struct Entry {
    meta: BlockMeta,
    tiers: u8,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    map: ShardedMap<Entry>,
    lookups: StripedCounter,
    lookup_hits: StripedCounter,
    matched_blocks: StripedCounter,
    verify_mismatches: StripedCounter,
}

impl PrefixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// The longest held prefix of `prompt`'s whole blocks, at most `max_blocks` long.
    pub fn lookup(&self, prompt: &Prompt, max_blocks: usize) -> Lookup {
        let layout = prompt.layout().digest();
        let tpb = prompt.layout().tokens_per_block();
        let mut parent: BlockHash = layout.into();
        let mut blocks = Vec::new();
        for (i, hash) in prompt.hashes().iter().take(max_blocks).enumerate() {
            let tokens = &prompt.tokens()[i * tpb..(i + 1) * tpb];
            let guard = self.map.read(hash);
            let Some(entry) = guard.get(hash) else {
                break;
            };
            let m = &entry.meta;
            let same = m.layout == layout
                && m.parent == parent
                && m.position as usize == i
                && m.extra_tag == prompt.extra_tag(i)
                && *m.tokens == *tokens;
            if !same {
                drop(guard);
                self.verify_mismatches.incr();
                tracing::warn!(block = %hash, position = i, "index entry does not match the prompt it was found for; treating as a miss");
                break;
            }
            let Some(tier) = TierKind::fastest_in(entry.tiers) else {
                break;
            };
            blocks.push(BlockRef {
                hash: *hash,
                position: i as u32,
                tier,
            });
            parent = *hash;
        }
        self.lookups.incr();
        if !blocks.is_empty() {
            self.lookup_hits.incr();
            self.matched_blocks.add(blocks.len() as u64);
        }
        Lookup {
            matched_tokens: blocks.len() * tpb,
            blocks,
        }
    }

    /// Whether any tier holds `hash`.
    pub fn contains(&self, hash: &BlockHash) -> bool {
        self.map.read(hash).contains_key(hash)
    }

    /// The tiers holding `hash`, as a mask of [`TierKind::bit`]s (0 when none).
    pub fn tiers_of(&self, hash: &BlockHash) -> u8 {
        self.map.read(hash).get(hash).map_or(0, |e| e.tiers)
    }

    /// Blocks known to the index now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when the index knows no block.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether a block of `layout` with this hash is held, for callers that check a parent.
    pub fn holds_in_layout(&self, hash: &BlockHash, layout: LayoutDigest) -> bool {
        self.map
            .read(hash)
            .get(hash)
            .is_some_and(|e| e.meta.layout == layout && e.tiers != 0)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> IndexStats {
        let lookups = self.lookups.get();
        let hits = self.lookup_hits.get();
        IndexStats {
            lookups,
            lookup_hits: hits,
            lookup_misses: lookups.saturating_sub(hits),
            matched_blocks: self.matched_blocks.get(),
            verify_mismatches: self.verify_mismatches.get(),
            entries: self.len() as u64,
        }
    }
}

impl ResidencySink for PrefixIndex {
    fn inserted(&self, tier: TierKind, meta: &BlockMeta) {
        let mut shard = self.map.write(&meta.hash);
        match shard.get_mut(&meta.hash) {
            Some(e) if e.meta == *meta => e.tiers |= tier.bit(),
            Some(e) => {
                // Same hash, different content: a collision. Keep neither; a miss is safe.
                tracing::warn!(block = %meta.hash, "two different blocks share one hash; dropping the index entry");
                e.tiers = 0;
                shard.remove(&meta.hash);
            }
            None => {
                shard.insert(
                    meta.hash,
                    Entry {
                        meta: meta.clone(),
                        tiers: tier.bit(),
                    },
                );
            }
        }
    }

    fn removed(&self, tier: TierKind, meta: &BlockMeta, _: RemovalCause, _: Option<&Bytes>) {
        let mut shard = self.map.write(&meta.hash);
        if let Some(e) = shard.get_mut(&meta.hash) {
            e.tiers &= !tier.bit();
            if e.tiers == 0 {
                shard.remove(&meta.hash);
            }
        }
    }
}
