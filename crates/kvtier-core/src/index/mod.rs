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

/// The recurrent state a lookup of a layout with state groups found: a checkpoint taken
/// after exactly the lookup's blocks (see `Engine::lookup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateRef {
    /// The checkpoint's key.
    pub key: crate::snapshot::SnapshotKey,
    /// Whole blocks of the prompt the state covers.
    pub blocks: usize,
    /// The fastest tier that held it when it was looked up.
    pub tier: TierKind,
}

/// The answer to "how much of this prompt is cached?".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookup {
    /// The layout the prompt was hashed under; loads of layers use its geometry.
    pub layout: LayoutDigest,
    /// The matched leading blocks, in order.
    pub blocks: Vec<BlockRef>,
    /// Tokens covered by the matched blocks (the hit accounting counts a load of them in
    /// these tokens: a lookup made by hand from part of another carries its share).
    pub matched_tokens: usize,
    /// For a layout with state groups: the recurrent state at the end of `blocks` (for a
    /// recurrent-only layout `blocks` is empty and this alone is the hit). `None` for an
    /// attention-only layout, and for a miss.
    pub state: Option<StateRef>,
}

impl Lookup {
    /// True when nothing matched.
    pub fn is_miss(&self) -> bool {
        self.blocks.is_empty() && self.state.is_none()
    }
}

/// Walks longer than this many blocks lock all shards once.
const LOCK_ALL_AFTER: usize = 32;

/// What a walk step found.
enum Step {
    /// The block is held and is exactly the prompt's block: held in these tiers.
    Held(TierKind),
    /// Not held.
    Absent,
    /// An entry under this hash belongs to another prefix (a collision or a bug).
    Mismatch,
}

/// One indexed block. The fields every walk step reads sit inline in the hash-map bucket;
/// the rest lives behind one pointer, read only to verify the tokens.
#[derive(Debug)]
struct Entry {
    parent: BlockHash,
    position: u32,
    /// Mask of [`TierKind::bit`]s of the tiers holding the block.
    tiers: u8,
    cold: Box<Cold>,
}

/// Blocks of up to this many tokens keep them inline in [`Cold`]: one pointer chase to
/// verify instead of two.
const INLINE_TOKENS: usize = 16;

#[derive(Debug)]
struct Cold {
    inline_tokens: [u32; INLINE_TOKENS],
    meta: BlockMeta,
}

impl Entry {
    fn new(meta: &BlockMeta, tiers: u8) -> Self {
        let mut inline_tokens = [0u32; INLINE_TOKENS];
        if meta.tokens.len() <= INLINE_TOKENS {
            inline_tokens[..meta.tokens.len()].copy_from_slice(&meta.tokens);
        }
        Self {
            parent: meta.parent,
            position: meta.position,
            tiers,
            cold: Box::new(Cold {
                inline_tokens,
                meta: meta.clone(),
            }),
        }
    }

    /// The links: the parent and position the walk expects, and some tier holds it.
    fn links(&self, parent: &BlockHash, position: usize) -> bool {
        self.parent == *parent && self.position as usize == position && self.tiers != 0
    }

    /// The contents: exactly the prompt's tokens and extra keys for block `i`. A block
    /// learned from a cluster advertisement has no tokens yet: its hash (computed from the
    /// prompt's tokens by the walk) is all the index can match, and the remote tier checks
    /// its manifest's tokens against that hash before serving a byte of it (ADR 0013).
    fn contents(&self, prompt: &Prompt, i: usize) -> bool {
        let tokens = prompt.block_tokens(i);
        let c = &self.cold;
        if !c.meta.tokens_known() {
            return true;
        }
        let same_tokens = if tokens.len() <= INLINE_TOKENS {
            c.meta.tokens.len() == tokens.len() && c.inline_tokens[..tokens.len()] == *tokens
        } else {
            *c.meta.tokens == *tokens
        };
        same_tokens && c.meta.extra_tag == prompt.extra_tag(i)
    }

    fn step(entry: Option<&Entry>, prompt: &Prompt, parent: &BlockHash, i: usize) -> Step {
        match entry {
            None => Step::Absent,
            Some(e) if e.tiers == 0 => Step::Absent,
            Some(e) if e.links(parent, i) && e.contents(prompt, i) => {
                TierKind::fastest_in(e.tiers).map_or(Step::Absent, Step::Held)
            }
            Some(_) => Step::Mismatch,
        }
    }
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
    ///
    /// Every step checks the entry's parent link and position, and its tokens and extra
    /// keys against the prompt's. The first block's parent is the layout's chain root, so
    /// a matched walk is one chain of this layout with exactly these tokens: even a hash
    /// collision cannot serve another prefix.
    pub fn lookup(&self, prompt: &Prompt, max_blocks: usize) -> Lookup {
        let n = prompt.num_blocks().min(max_blocks);
        // Hashed as far as the walk goes: a prompt that misses early is not hashed whole.
        let mut chain = prompt.walk(n);
        let mut blocks: Vec<BlockRef> = Vec::new();
        let mut parent: BlockHash = prompt.layout().digest().into();
        let mut mismatch = false;
        let push = |blocks: &mut Vec<BlockRef>, hash: BlockHash, tier| {
            let position = blocks.len() as u32;
            blocks.push(BlockRef {
                hash,
                position,
                tier,
            });
        };
        // Short walks lock one shard per block.
        let head = n.min(LOCK_ALL_AFTER);
        let mut going = true;
        for i in 0..head {
            let hash = chain.hash(i);
            match Entry::step(self.map.read(&hash).get(&hash), prompt, &parent, i) {
                Step::Held(tier) => push(&mut blocks, hash, tier),
                Step::Absent => going = false,
                Step::Mismatch => (going, mismatch) = (false, true),
            }
            if !going {
                break;
            }
            parent = hash;
        }
        // A walk still going goes on in stretches, each four times as long as the walk so
        // far (or, when the prompt's chain is known already, one stretch to the end): the
        // stretch is hashed first, then every shard's reader lock is taken once for it (a
        // 128K-token prompt pays at most 4 × 64 lock round trips instead of 8,192, and no
        // hash is computed under a lock), and a walk that stops has hashed at most about
        // four times what it matched. Each stretch follows the links first (bucket-resident
        // fields only) and then verifies the contents of what it found, so the pointer
        // chases of the second pass overlap each other.
        let mut from = head;
        while going && from < n {
            let to = if chain.known() >= n {
                n
            } else {
                n.min(4 * from)
            };
            let hashes = &chain.upto(to)[from..];
            let all = self.map.read_all();
            let mut found: Vec<(&Entry, BlockHash)> = Vec::with_capacity(to - from);
            for (k, hash) in hashes.iter().enumerate() {
                match all.get(hash) {
                    Some(e) if e.links(&parent, from + k) => found.push((e, *hash)),
                    Some(e) if e.tiers != 0 => {
                        mismatch = true;
                        break;
                    }
                    _ => break,
                }
                parent = *hash;
            }
            going = found.len() == to - from;
            for (k, (e, hash)) in found.into_iter().enumerate() {
                if !e.contents(prompt, from + k) {
                    (going, mismatch) = (false, true);
                    break;
                }
                match TierKind::fastest_in(e.tiers) {
                    Some(tier) => push(&mut blocks, hash, tier),
                    None => {
                        going = false;
                        break;
                    }
                }
            }
            from = to;
        }
        chain.keep();
        if mismatch {
            self.verify_mismatches.incr();
            tracing::warn!(
                position = blocks.len(),
                "an index entry does not match the prompt it was found for; treating it as a miss"
            );
        }
        self.lookups.incr();
        if !blocks.is_empty() {
            self.lookup_hits.incr();
            self.matched_blocks.add(blocks.len() as u64);
        }
        Lookup {
            layout: prompt.layout().digest(),
            matched_tokens: blocks.len() * prompt.layout().tokens_per_block(),
            blocks,
            state: None,
        }
    }

    /// Forgets that `tier` holds anything (it was detached); entries no other tier holds
    /// go. Returns how many blocks the tier was recorded as holding.
    pub fn clear_tier(&self, tier: TierKind) -> u64 {
        self.clear_tier_with(tier, |_| {})
    }

    /// [`PrefixIndex::clear_tier`], calling `each` with every block it forgets for `tier`
    /// (under the index's shard lock: `each` must be quick and must not call the index).
    pub fn clear_tier_with(&self, tier: TierKind, mut each: impl FnMut(&BlockMeta)) -> u64 {
        let mut cleared = 0;
        self.map.for_each_mut(|shard| {
            shard.retain(|_, e| {
                if e.tiers & tier.bit() != 0 {
                    cleared += 1;
                    e.tiers &= !tier.bit();
                    each(&e.cold.meta);
                }
                e.tiers != 0
            });
        });
        cleared
    }

    /// Every block the index knows of, with the tiers holding it (a mask of
    /// [`TierKind::bit`]s): a listing for an observer that resynchronises. One shard at a
    /// time, so not atomic across shards (an observer applies the events that follow).
    pub fn entries(&self) -> Vec<(BlockMeta, u8)> {
        let mut out = Vec::with_capacity(self.len());
        self.map.for_each_mut(|shard| {
            out.extend(
                shard
                    .values()
                    .filter(|e| e.tiers != 0)
                    .map(|e| (e.cold.meta.clone(), e.tiers)),
            );
        });
        out
    }

    /// Every block of `layout` the index knows of (for deleting a namespace).
    pub fn hashes_of_layout(&self, layout: LayoutDigest) -> Vec<BlockHash> {
        let mut out = Vec::new();
        self.map.for_each_mut(|shard| {
            out.extend(
                shard
                    .iter()
                    .filter(|(_, e)| e.cold.meta.layout == layout)
                    .map(|(h, _)| *h),
            );
        });
        out
    }

    /// The metadata of `hash`, if any tier holds it.
    pub fn meta_of(&self, hash: &BlockHash) -> Option<BlockMeta> {
        self.map.read(hash).get(hash).map(|e| e.cold.meta.clone())
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

impl PrefixIndex {
    fn insert_locked(shard: &mut crate::shard::ShardMap<Entry>, tier: TierKind, meta: &BlockMeta) {
        match shard.get_mut(&meta.hash) {
            Some(e) if e.cold.meta == *meta => e.tiers |= tier.bit(),
            // A block known by its place only, and the same block with its tokens: one
            // block; the entry keeps (or now learns) the tokens.
            Some(e)
                if e.cold.meta.same_place(meta)
                    && (!e.cold.meta.tokens_known() || !meta.tokens_known()) =>
            {
                let tiers = e.tiers | tier.bit();
                if meta.tokens_known() {
                    *e = Entry::new(meta, tiers);
                } else {
                    e.tiers = tiers;
                }
            }
            Some(_) => {
                // Same hash, different content: a collision. Index neither; a miss is safe.
                tracing::warn!(block = %meta.hash, "two different blocks share one hash; dropping the index entry");
                shard.remove(&meta.hash);
            }
            None => {
                shard.insert(meta.hash, Entry::new(meta, tier.bit()));
            }
        }
    }
}

impl ResidencySink for PrefixIndex {
    fn inserted_many(&self, tier: TierKind, metas: &[&BlockMeta]) {
        let mut by_shard: Vec<Vec<&BlockMeta>> = Vec::new();
        for meta in metas {
            let i = self.map.shard_index(&meta.hash);
            if by_shard.len() <= i {
                by_shard.resize_with(i + 1, Vec::new);
            }
            by_shard[i].push(meta);
        }
        for group in by_shard.iter().filter(|g| !g.is_empty()) {
            let mut shard = self.map.write(&group[0].hash);
            for meta in group {
                Self::insert_locked(&mut shard, tier, meta);
            }
        }
    }

    fn inserted(&self, tier: TierKind, meta: &BlockMeta) {
        let mut shard = self.map.write(&meta.hash);
        Self::insert_locked(&mut shard, tier, meta);
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
