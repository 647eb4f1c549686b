//! The tier abstraction: where block payloads live.
//!
//! A tier stores immutable block payloads under their [`BlockHash`]. It does not decide hit
//! or miss — the [`crate::index::PrefixIndex`] does, from memory — but it tells the index
//! what it holds through a [`ResidencySink`], which it calls for every block it admits or
//! drops, so the index always knows which tiers hold a block.
//!
//! The trait is synchronous and object-safe. A call may block on I/O (the SSD tier reads
//! on its own threads; a remote tier waits on its runtime), so async callers run loads on
//! a blocking pool; the RAM tier never blocks on I/O. Lookups never touch a tier.

mod ram;
mod ram_book;
pub(crate) mod reject;
pub mod writer;

#[cfg(feature = "conformance")]
pub mod conformance;

use std::fmt::Debug;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

pub use ram::{RamConfig, RamTier};
pub use reject::RejectReason;

use crate::error::Result;
use crate::hash::BlockHash;
use crate::layout::LayoutDigest;
use crate::snapshot::SnapshotKey;
use crate::stats::TierStats;

/// The kinds of tier, fastest first. The discriminant is the tier's bit in residency masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum TierKind {
    /// Host memory.
    Ram = 0,
    /// Local persistent storage.
    Ssd = 1,
    /// Shared object storage.
    Remote = 2,
}

impl TierKind {
    /// Every kind, fastest first.
    pub const ALL: [TierKind; 3] = [TierKind::Ram, TierKind::Ssd, TierKind::Remote];

    /// This kind's bit in a residency mask.
    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }

    /// The fastest kind present in `mask`.
    pub fn fastest_in(mask: u8) -> Option<TierKind> {
        TierKind::ALL.into_iter().find(|k| mask & k.bit() != 0)
    }

    /// The letter a lookup answer on the wire names this tier by: `r` RAM, `s` SSD, `o`
    /// object storage.
    pub fn letter(self) -> char {
        match self {
            TierKind::Ram => 'r',
            TierKind::Ssd => 's',
            TierKind::Remote => 'o',
        }
    }

    /// The tier a wire letter names (see [`TierKind::letter`]).
    pub fn from_letter(letter: char) -> Option<TierKind> {
        TierKind::ALL.into_iter().find(|k| k.letter() == letter)
    }

    /// The stats prefix of this tier (`ram`, `ssd`, `remote`).
    pub fn name(self) -> &'static str {
        match self {
            TierKind::Ram => "ram",
            TierKind::Ssd => "ssd",
            TierKind::Remote => "remote",
        }
    }
}

/// What identifies a block and lets anyone holding it check that it is the block asked for.
/// Persistent tiers write all of it into their record headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMeta {
    /// The layout the payload was computed under.
    pub layout: LayoutDigest,
    /// The block's key.
    pub hash: BlockHash,
    /// The previous block's key; for the first block, the chain root (the layout digest).
    pub parent: BlockHash,
    /// The block's position in its chain (0 for the first block).
    pub position: u32,
    /// The block's own tokens (exactly `tokens_per_block` of them) — or none when they are
    /// not known yet: a block learned from a cluster advertisement, which names blocks by
    /// hash only ([`BlockMeta::described`]). Such a block is indexed by its hash chain and
    /// its tokens are checked against the object's manifest before any byte of it is
    /// served; until then no tier but the remote one holds it.
    pub tokens: Arc<[u32]>,
    /// The block's extra-key tag, if it has extra keys (not known when the tokens are not).
    pub extra_tag: Option<[u8; 16]>,
}

impl BlockMeta {
    /// A block known by its place in a chain only (layout, hash, parent, position): its
    /// tokens and extra keys are still to be checked against its object's manifest.
    pub fn described(
        layout: LayoutDigest,
        hash: BlockHash,
        parent: BlockHash,
        position: u32,
    ) -> Self {
        Self {
            layout,
            hash,
            parent,
            position,
            tokens: Arc::from(&[][..]),
            extra_tag: None,
        }
    }

    /// The blocks of `tokens` (whole blocks only, no extra keys) as one chain of `layout`
    /// from its root: what a store of that prompt would write.
    pub fn chain(layout: &crate::layout::Layout, tokens: &[u32]) -> Vec<BlockMeta> {
        let tpb = layout.tokens_per_block();
        let hashes = crate::hash::chain(layout, tokens, &crate::hash::ExtraKeys::none());
        let mut parent = crate::hash::chain_root(layout);
        hashes
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let meta = BlockMeta {
                    layout: layout.digest(),
                    hash: *h,
                    parent,
                    position: i as u32,
                    tokens: tokens[i * tpb..(i + 1) * tpb].into(),
                    extra_tag: None,
                };
                parent = *h;
                meta
            })
            .collect()
    }

    /// Whether the block's tokens are known (always, except for [`BlockMeta::described`]).
    pub fn tokens_known(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// Same layout, hash, parent and position: the same place in the same chain.
    pub fn same_place(&self, other: &BlockMeta) -> bool {
        self.layout == other.layout
            && self.hash == other.hash
            && self.parent == other.parent
            && self.position == other.position
    }
}

/// How a [`Tier::put`] ended. Refusals are outcomes, not errors: the block is simply not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The block was admitted.
    Stored,
    /// The block was already held; its recency was refreshed and nothing was rewritten.
    Duplicate,
    /// The tier refused the block.
    Rejected(RejectReason),
}

/// Why a tier's read delivered less than it was asked for. Ordered by how much it tells an
/// operator: when several tiers fall short on one block, the hit accounting counts the
/// greatest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ShortRead {
    /// The tier does not hold the block (any more).
    NotHeld,
    /// The read failed (the store refused or was unreachable); the tier answered a miss.
    Failed,
    /// The read did not finish within the tier's deadline; the tier answered a miss.
    Deadline,
    /// The bytes failed verification; the tier dropped them and answered a miss.
    Corrupt,
}

/// What a read of a run of blocks delivered ([`Tier::read_run`]).
#[derive(Debug, Clone, Default)]
pub struct RunRead {
    /// The payloads of the leading blocks asked for, in order.
    pub blocks: Vec<Bytes>,
    /// Why the run ended before the last block asked for; `None` when it did not.
    pub short: Option<ShortRead>,
}

/// Why a block left a tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RemovalCause {
    /// Evicted to make room within the byte budget.
    Budget,
    /// Expired.
    Ttl,
    /// Removed on request.
    Explicit,
    /// Failed verification.
    Corrupt,
}

/// Receives residency changes from tiers. The engine's implementation keeps the prefix
/// index current.
///
/// Tiers call it while holding their own bookkeeping lock, so events for one block from one
/// tier arrive in order. An implementation must be quick and must never call back into a
/// tier (lock order: tier, then index).
pub trait ResidencySink: Send + Sync + Debug + 'static {
    /// `tier` now holds the block described by `meta`.
    fn inserted(&self, tier: TierKind, meta: &BlockMeta);

    /// `tier` now holds all of `metas` (recovery reports a whole store at once). The
    /// default reports them one by one; the index takes each shard's lock once.
    fn inserted_many(&self, tier: TierKind, metas: &[&BlockMeta]) {
        for meta in metas {
            self.inserted(tier, meta);
        }
    }

    /// `tier` no longer holds `meta`'s block. `payload` is the evicted bytes when the tier
    /// still has them (so a lower tier can take them over), `None` otherwise.
    fn removed(
        &self,
        tier: TierKind,
        meta: &BlockMeta,
        cause: RemovalCause,
        payload: Option<&Bytes>,
    );
}

/// A sink that ignores every event, for a tier used on its own.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoSink;

impl ResidencySink for NoSink {
    fn inserted(&self, _: TierKind, _: &BlockMeta) {}
    fn removed(&self, _: TierKind, _: &BlockMeta, _: RemovalCause, _: Option<&Bytes>) {}
}

/// A place that holds block payloads.
///
/// Implementations must be safe to call from many threads at once, must never return bytes
/// other than those stored under the hash asked for (a tier that cannot verify returns a
/// miss), and must report every admission and removal to their [`ResidencySink`].
pub trait Tier: Send + Sync + Debug + 'static {
    /// Which kind of tier this is.
    fn kind(&self) -> TierKind;

    /// Admits a block. The caller guarantees that `meta.hash` is the chain hash of
    /// `meta.parent`, `meta.tokens` and `meta.extra_tag`, and that `payload` has the size its
    /// layout implies. A block already held is refreshed, not rewritten
    /// ([`PutOutcome::Duplicate`]). Errors mean the tier failed (I/O), not that it refused.
    fn put(&self, meta: &BlockMeta, payload: Bytes) -> Result<PutOutcome>;

    /// The whole payload of `hash`, or `None` when the tier does not hold it (or holds bytes
    /// that fail verification). A hit refreshes the block's recency.
    fn get(&self, hash: &BlockHash) -> Result<Option<Bytes>>;

    /// Admits several blocks at once, in order; one outcome per item. A tier that writes
    /// better in batches (the remote tier packs consecutive blocks of a chain into one
    /// object) overrides it; the default puts them one by one.
    fn put_many(&self, items: &[(BlockMeta, Bytes)]) -> Vec<Result<PutOutcome>> {
        items
            .iter()
            .map(|(meta, payload)| self.put(meta, payload.clone()))
            .collect()
    }

    /// Whether the write-behind worker may hand this tier blocks that were queued one by
    /// one together, through [`Tier::put_many`] (the SSD tier encodes a batch's next
    /// pages while it writes the ones before). Default: no, each block on its own.
    fn takes_batches(&self) -> bool {
        false
    }

    /// [`Tier::put`] on the thread of a caller waiting for its acknowledgement (a store
    /// acknowledged as `written`, or a write-behind queue overflowing onto its caller): a
    /// tier that spends CPU on a write where it can (encoding a page, ADR 0021) skips that
    /// here, so the caller waits for the disk and no more. Default: [`Tier::put`].
    fn put_for_caller(&self, meta: &BlockMeta, payload: Bytes) -> Result<PutOutcome> {
        self.put(meta, payload)
    }

    /// A layout the engine serves, registered now or before the tier was attached; may
    /// come more than once. A tier that encodes pages learns from it the element type and
    /// page size of the layout's blocks (an unknown layout's pages are kept raw). Default:
    /// nothing.
    fn layout_registered(&self, layout: &crate::layout::Layout) {
        let _ = layout;
    }

    /// [`Tier::put`] for a caller that calls [`Tier::make_durable`] right after (a durable
    /// acknowledgement): a tier with a faster way to stable storage for such writes uses
    /// it (the SSD tier writes them with `O_DIRECT`). Default: [`Tier::put`].
    fn put_to_sync(&self, meta: &BlockMeta, payload: Bytes) -> Result<PutOutcome> {
        self.put(meta, payload)
    }

    /// The payloads of the leading blocks of `hashes` the tier holds, in order, stopping
    /// at the first it does not. A tier that reads runs in one request (the remote tier:
    /// one ranged GET) overrides it; the default gets them one by one.
    fn get_run(&self, hashes: &[BlockHash]) -> Result<Vec<Bytes>> {
        let mut out = Vec::with_capacity(hashes.len());
        for h in hashes {
            match self.get(h)? {
                Some(b) => out.push(b),
                None => break,
            }
        }
        Ok(out)
    }

    /// [`Tier::get_run`], saying why the run ended where it did: what the engine's hit
    /// accounting counts a promised block that was not delivered under. A tier that turns
    /// a failed read into a miss (a block that fails its checksum, a read past its
    /// deadline) overrides it; the default counts every short run as [`ShortRead::NotHeld`].
    fn read_run(&self, hashes: &[BlockHash]) -> Result<RunRead> {
        let blocks = self.get_run(hashes)?;
        let short = (blocks.len() < hashes.len()).then_some(ShortRead::NotHeld);
        Ok(RunRead { blocks, short })
    }

    /// Bytes `range` of `hash`'s payload — one layer's page, say — without reading the rest.
    /// `None` when the block is not held; an [`crate::ErrorKind::Invalid`] error when the
    /// range is empty or reaches past the payload.
    fn get_range(&self, hash: &BlockHash, range: Range<u64>) -> Result<Option<Bytes>>;

    /// [`Tier::get_range`], saying why no bytes came (see [`Tier::read_run`]). Default:
    /// [`Tier::get_range`], a miss counted as [`ShortRead::NotHeld`].
    fn read_range(
        &self,
        hash: &BlockHash,
        range: Range<u64>,
    ) -> Result<std::result::Result<Bytes, ShortRead>> {
        Ok(self.get_range(hash, range)?.ok_or(ShortRead::NotHeld))
    }

    /// Whether the tier holds `hash`, without touching its recency.
    fn contains(&self, hash: &BlockHash) -> bool;

    /// Drops `hash`. A tier that keeps chains closed drops the block's descendants with it.
    /// Returns whether the block was held.
    fn remove(&self, hash: &BlockHash) -> Result<bool>;

    /// A consistent snapshot of the tier's counters.
    fn stats(&self) -> TierStats;

    /// Deletes what this tier keeps of `layout` beyond the blocks and states the engine
    /// removes ([`Tier::remove`], [`SnapshotStore::remove_layout_snapshots`]): the objects
    /// of a shared store that hold them, blocks and states, which another replica may have
    /// written. Returns how many objects went. Default: nothing more.
    fn remove_layout(&self, layout: LayoutDigest) -> Result<u64> {
        let _ = layout;
        Ok(0)
    }

    /// The tier's store for recurrent-state snapshots, if it keeps them (a persistent tier
    /// does, so snapshots survive a restart). Default: none.
    fn snapshots(&self) -> Option<&dyn SnapshotStore> {
        None
    }

    /// Makes every block this tier has acknowledged (returned `Stored` or `Duplicate` for)
    /// survive a power loss, returning once it does. A tier whose puts are durable when they
    /// return (an object store answering 200) needs nothing: the default. A tier that
    /// acknowledges from the page cache must override it (the SSD tier: `fdatasync`, shared
    /// between concurrent callers).
    fn make_durable(&self) -> Result<()> {
        Ok(())
    }

    /// Records how the engine shut down (`clean`: every queued write landed), durably, so
    /// the next start can report it. Default: nothing to record (a volatile tier).
    fn record_shutdown(&self, clean: bool) -> Result<()> {
        let _ = clean;
        Ok(())
    }

    /// How the previous run ended, as recorded by [`Tier::record_shutdown`]: `Some(true)`
    /// clean, `Some(false)` a partial flush, `None` no record (a crash, a kill, a first
    /// start, or a volatile tier).
    fn previous_shutdown_clean(&self) -> Option<bool> {
        None
    }
}

/// Where a tier keeps snapshots of the snapshot bucket (exact-prefix recurrent state).
pub trait SnapshotStore: Send + Sync + Debug {
    /// Keeps `blob` under `key` (replacing what was there).
    fn put_snapshot(&self, key: &SnapshotKey, layout: LayoutDigest, blob: &Bytes) -> Result<()>;

    /// The blob under exactly `key`, verified, or `None`.
    fn get_snapshot(&self, key: &SnapshotKey) -> Result<Option<Bytes>>;

    /// Whether a blob is kept under `key`, from memory alone (lookups ask this; the read
    /// that follows verifies it).
    fn contains_snapshot(&self, key: &SnapshotKey) -> bool;

    /// Deletes every blob this tier keeps for `layout` (snapshots and checkpoints: the
    /// layout is being deleted), so that none is served again, after a restart included;
    /// returns how many. A shared store's objects are [`Tier::remove_layout`]'s: here a
    /// tier of one only stops serving them.
    fn remove_layout_snapshots(&self, layout: LayoutDigest) -> Result<u64>;
}

#[cfg(test)]
mod names {
    use super::{RejectReason, TierKind};

    #[test]
    fn each_reason_is_named_by_its_own_row_and_each_tier_letter_reads_back() {
        // `name` indexes the table by discriminant: the rows must stay in that order.
        for (reason, name) in RejectReason::NAMES {
            assert_eq!(reason.name(), name);
            // Each reason is counted under its name, as label and as flat stats name.
            let counted = crate::stats::TierStats::COUNTERS
                .iter()
                .any(|c| c.label == Some(("reason", name)) && c.name == format!("rejected_{name}"));
            assert!(counted, "no rejection counter for {name}");
        }
        for kind in TierKind::ALL {
            assert_eq!(TierKind::from_letter(kind.letter()), Some(kind));
        }
        assert_eq!(TierKind::from_letter('x'), None);
    }
}
