//! The tier conformance suite: behaviour every [`Tier`] must show, written once over
//! `&dyn Tier` and run by every implementation's tests (enable the `conformance` feature).
//!
//! ```ignore
//! kvtier_core::tier::conformance::run_all(&|sink| Arc::new(MyTier::new(sink)))?;
//! ```
//!
//! Each check gets a fresh tier from the factory, with a [`RecordingSink`] attached, and a
//! capacity of at least [`MIN_CAPACITY`] bytes.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::{BlockMeta, PutOutcome, RemovalCause, ResidencySink, Tier, TierKind};
use crate::hash::BlockHash;
use crate::layout::{KvDtype, Layout, LayoutKey};

/// Smallest capacity, in bytes, a tier under test must offer.
pub const MIN_CAPACITY: u64 = 1 << 20;

/// Builds a fresh tier reporting to `sink`.
pub type Factory<'a> = &'a dyn Fn(Arc<dyn ResidencySink>) -> Arc<dyn Tier>;

/// A failed check: which one and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The check's name.
    pub check: &'static str,
    /// What was observed.
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "conformance check `{}` failed: {}",
            self.check, self.message
        )
    }
}

impl std::error::Error for Failure {}

/// A residency event seen by a [`RecordingSink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A block was admitted.
    Inserted(TierKind, BlockHash),
    /// A block was dropped.
    Removed(TierKind, BlockHash, RemovalCause),
}

/// A sink that records every event.
#[derive(Debug, Default)]
pub struct RecordingSink {
    events: Mutex<Vec<Event>>,
}

impl RecordingSink {
    /// The events so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }
}

impl ResidencySink for RecordingSink {
    fn inserted(&self, tier: TierKind, meta: &BlockMeta) {
        self.events.lock().push(Event::Inserted(tier, meta.hash));
    }

    fn removed(&self, tier: TierKind, meta: &BlockMeta, cause: RemovalCause, _: Option<&Bytes>) {
        self.events
            .lock()
            .push(Event::Removed(tier, meta.hash, cause));
    }
}

/// A chain of `n` test blocks with distinct payloads of `layout`'s size.
pub fn test_chain(layout: &Layout, n: usize, seed: u32) -> Vec<(BlockMeta, Bytes)> {
    let tokens: Vec<u32> = (0..(n * layout.tokens_per_block()) as u32)
        .map(|t| t.wrapping_mul(31) ^ seed)
        .collect();
    let size = layout.block_bytes() as usize;
    BlockMeta::chain(layout, &tokens)
        .into_iter()
        .map(|meta| {
            let h = meta.hash;
            let payload: Vec<u8> = (0..size)
                .map(|b| (b as u32 ^ h.low64() as u32 ^ (b as u32 >> 8)) as u8)
                .collect();
            (meta, Bytes::from(payload))
        })
        .collect()
}

/// The layout the checks use: 4 KiB blocks of 4 layers.
pub fn test_layout() -> Result<Layout, Failure> {
    Layout::new(LayoutKey::new("conformance", KvDtype::F16, 16, 4, 2, 16)).map_err(|e| Failure {
        check: "setup",
        message: e.to_string(),
    })
}

macro_rules! ensure {
    ($check:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(Failure { check: $check, message: format!($($msg)+) });
        }
    };
}

fn io<T>(check: &'static str, r: crate::Result<T>) -> Result<T, Failure> {
    r.map_err(|e| Failure {
        check,
        message: e.to_string(),
    })
}

/// Runs every check.
pub fn run_all(factory: Factory<'_>) -> Result<(), Failure> {
    put_then_get_returns_the_same_bytes(factory)?;
    unknown_hash_is_a_miss(factory)?;
    duplicate_put_is_not_rewritten(factory)?;
    range_reads_return_exactly_the_slice(factory)?;
    remove_drops_the_block_and_reports_it(factory)?;
    stats_count_what_happened(factory)?;
    concurrent_readers_and_writers_see_whole_blocks(factory)?;
    Ok(())
}

fn setup(factory: Factory<'_>) -> (Arc<RecordingSink>, Arc<dyn Tier>) {
    let sink = Arc::new(RecordingSink::default());
    let tier = factory(sink.clone());
    (sink, tier)
}

/// A stored block reads back byte for byte, and the sink heard of it.
pub fn put_then_get_returns_the_same_bytes(factory: Factory<'_>) -> Result<(), Failure> {
    const C: &str = "put_then_get_returns_the_same_bytes";
    let (sink, tier) = setup(factory);
    let layout = test_layout()?;
    let chain = test_chain(&layout, 3, 1);
    for (meta, payload) in &chain {
        let out = io(C, tier.put(meta, payload.clone()))?;
        ensure!(C, out == PutOutcome::Stored, "put returned {out:?}");
    }
    for (meta, payload) in &chain {
        ensure!(
            C,
            tier.contains(&meta.hash),
            "contains() is false after put"
        );
        let got = io(C, tier.get(&meta.hash))?;
        ensure!(
            C,
            got.as_ref() == Some(payload),
            "get returned other bytes for {}",
            meta.hash
        );
    }
    let inserted = sink
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Inserted(k, _) if *k == tier.kind()))
        .count();
    ensure!(
        C,
        inserted == 3,
        "sink saw {inserted} insertions, expected 3"
    );
    Ok(())
}

/// A hash never stored is a miss, not an error.
pub fn unknown_hash_is_a_miss(factory: Factory<'_>) -> Result<(), Failure> {
    const C: &str = "unknown_hash_is_a_miss";
    let (_, tier) = setup(factory);
    let h = BlockHash([0xab; 16]);
    ensure!(C, !tier.contains(&h), "contains() true for an unknown hash");
    let got = io(C, tier.get(&h))?;
    ensure!(C, got.is_none(), "get returned bytes for an unknown hash");
    let got = io(C, tier.get_range(&h, 0..16))?;
    ensure!(
        C,
        got.is_none(),
        "get_range returned bytes for an unknown hash"
    );
    Ok(())
}

/// Storing a held block again changes nothing and says so.
pub fn duplicate_put_is_not_rewritten(factory: Factory<'_>) -> Result<(), Failure> {
    const C: &str = "duplicate_put_is_not_rewritten";
    let (_, tier) = setup(factory);
    let layout = test_layout()?;
    let chain = test_chain(&layout, 1, 2);
    let (meta, payload) = &chain[0];
    io(C, tier.put(meta, payload.clone()))?;
    let before = tier.stats();
    let out = io(C, tier.put(meta, payload.clone()))?;
    ensure!(
        C,
        out == PutOutcome::Duplicate,
        "second put returned {out:?}"
    );
    let after = tier.stats();
    ensure!(
        C,
        after.resident_bytes == before.resident_bytes,
        "resident bytes changed on a duplicate"
    );
    ensure!(
        C,
        after.dedup_skips == before.dedup_skips + 1,
        "dedup_skips did not count the duplicate"
    );
    Ok(())
}

/// One layer's page comes back exactly, and bad ranges are refused.
pub fn range_reads_return_exactly_the_slice(factory: Factory<'_>) -> Result<(), Failure> {
    const C: &str = "range_reads_return_exactly_the_slice";
    let (_, tier) = setup(factory);
    let layout = test_layout()?;
    let chain = test_chain(&layout, 1, 3);
    let (meta, payload) = &chain[0];
    io(C, tier.put(meta, payload.clone()))?;
    let g = layout.geometry();
    for layer in 0..g.num_layers {
        let r = g.layer_range(layer..layer + 1).unwrap_or(0..0);
        let got = io(C, tier.get_range(&meta.hash, r.clone()))?;
        let want = payload.slice(r.start as usize..r.end as usize);
        ensure!(C, got.as_ref() == Some(&want), "layer {layer} page differs");
    }
    let len = payload.len() as u64;
    for bad in [len..len + 1, 5..5, 0..len + 1] {
        let r = tier.get_range(&meta.hash, bad.clone());
        ensure!(
            C,
            r.is_err(),
            "range {bad:?} of a {len}-byte block was not refused"
        );
    }
    Ok(())
}

/// A removed block is gone, its bytes are released and the sink heard of it.
pub fn remove_drops_the_block_and_reports_it(factory: Factory<'_>) -> Result<(), Failure> {
    const C: &str = "remove_drops_the_block_and_reports_it";
    let (sink, tier) = setup(factory);
    let layout = test_layout()?;
    let chain = test_chain(&layout, 1, 4);
    let (meta, payload) = &chain[0];
    io(C, tier.put(meta, payload.clone()))?;
    ensure!(
        C,
        io(C, tier.remove(&meta.hash))?,
        "remove of a held block returned false"
    );
    ensure!(
        C,
        !io(C, tier.remove(&meta.hash))?,
        "second remove returned true"
    );
    ensure!(
        C,
        io(C, tier.get(&meta.hash))?.is_none(),
        "get after remove returned bytes"
    );
    ensure!(
        C,
        tier.stats().resident_bytes == 0,
        "bytes still resident after remove"
    );
    let removed = sink.events().contains(&Event::Removed(
        tier.kind(),
        meta.hash,
        RemovalCause::Explicit,
    ));
    ensure!(C, removed, "sink did not hear of the removal");
    Ok(())
}

/// Hits, misses, stores and residency add up.
pub fn stats_count_what_happened(factory: Factory<'_>) -> Result<(), Failure> {
    const C: &str = "stats_count_what_happened";
    let (_, tier) = setup(factory);
    let layout = test_layout()?;
    let chain = test_chain(&layout, 2, 5);
    for (meta, payload) in &chain {
        io(C, tier.put(meta, payload.clone()))?;
    }
    io(C, tier.get(&chain[0].0.hash))?;
    io(C, tier.get(&chain[1].0.hash))?;
    io(C, tier.get(&BlockHash([1; 16])))?;
    let s = tier.stats();
    ensure!(C, s.stores == 2, "stores = {}", s.stores);
    ensure!(
        C,
        s.hits == 2 && s.misses == 1,
        "hits = {}, misses = {}",
        s.hits,
        s.misses
    );
    ensure!(
        C,
        s.resident_blocks == 2,
        "resident_blocks = {}",
        s.resident_blocks
    );
    let bytes = 2 * layout.block_bytes();
    ensure!(
        C,
        s.resident_bytes == bytes,
        "resident_bytes = {} not {bytes}",
        s.resident_bytes
    );
    Ok(())
}

/// Readers racing writers only ever see whole, correct blocks.
pub fn concurrent_readers_and_writers_see_whole_blocks(
    factory: Factory<'_>,
) -> Result<(), Failure> {
    const C: &str = "concurrent_readers_and_writers_see_whole_blocks";
    let (_, tier) = setup(factory);
    let layout = test_layout()?;
    let chains: Vec<_> = (0..4).map(|s| test_chain(&layout, 8, 100 + s)).collect();
    let wrong = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for chain in &chains {
            let tier = tier.clone();
            handles.push(scope.spawn(move || {
                let mut wrong = 0;
                for (meta, payload) in chain {
                    if tier.put(meta, payload.clone()).is_err() {
                        wrong += 1;
                    }
                    for (m, p) in chain {
                        if let Ok(Some(got)) = tier.get(&m.hash)
                            && got != *p
                        {
                            wrong += 1;
                        }
                    }
                }
                wrong
            }));
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(1))
            .sum::<usize>()
    });
    ensure!(
        C,
        wrong == 0,
        "{wrong} reads returned wrong bytes or puts failed"
    );
    Ok(())
}
