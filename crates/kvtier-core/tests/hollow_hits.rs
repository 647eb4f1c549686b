//! Hit accounting (issue 36, item 6): what a lookup promised and what the load after it
//! delivered, in tokens, per tier, and the promised tokens it did not deliver, by reason. A hit that
//! turns hollow between lookup and load shows up here, and nowhere else.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

mod stand_in;

use std::sync::Arc;
use std::time::Duration;

use kvtier_core::stats::HitStats;
use kvtier_core::tier::{ShortRead, Tier, TierKind};
use kvtier_core::{Engine, ErrorKind, ExtraKeys, Layout, Lookup};

/// Stores four whole blocks and a partial one; returns the prompt's tokens.
fn store_four_blocks(e: &Engine, layout: &Layout) -> kvtier_core::Result<Vec<u32>> {
    let tokens: Vec<u32> = (0..(4 * layout.tokens_per_block() + 3) as u32).collect();
    let prompt = e.prompt(layout.digest(), &tokens, &ExtraKeys::none())?;
    let payload = vec![7u8; layout.block_bytes() as usize];
    e.store(&prompt, &[&payload, &payload, &payload, &payload])?;
    assert!(e.flush(Duration::from_secs(5)));
    Ok(tokens)
}

/// An engine over a stand-in lower tier holding four whole blocks, and their lookup.
struct FourBlocks {
    e: Engine,
    layout: Arc<Layout>,
    lower: Arc<stand_in::StandIn>,
    tokens: Vec<u32>,
    /// Tokens per block.
    tpb: u64,
    lookup: Lookup,
}

fn four_blocks_looked_up() -> kvtier_core::Result<FourBlocks> {
    let (e, layout, lower) = stand_in::engine();
    let tokens = store_four_blocks(&e, &layout)?;
    let tpb = layout.tokens_per_block() as u64;
    let lookup = e.lookup(&e.prompt(layout.digest(), &tokens, &ExtraKeys::none())?);
    assert_eq!(lookup.blocks.len(), 4);
    Ok(FourBlocks {
        e,
        layout,
        lower,
        tokens,
        tpb,
        lookup,
    })
}

fn hits(e: &Engine) -> HitStats {
    e.stats().engine.hits
}

#[test]
fn a_load_after_evicting_part_of_a_hit_counts_the_gap_as_evicted() -> kvtier_core::Result<()> {
    let FourBlocks {
        e,
        lower,
        tokens,
        tpb,
        lookup,
        ..
    } = four_blocks_looked_up()?;
    let h = hits(&e);
    assert_eq!(h.lookup_tokens_asked, tokens.len() as u64);
    assert_eq!(h.lookup_tokens_promised, 4 * tpb);
    assert_eq!(h.lookup_blocks_promised, 4);

    // Between the lookup and the load: block 2 leaves every tier, and block 0 leaves RAM
    // (taking its descendants with it there; they stay on the lower tier).
    let b = |i: usize| lookup.blocks[i].hash;
    assert!(e.ram().remove(&b(2))?);
    assert!(lower.remove(&b(2))?);
    assert!(e.ram().remove(&b(0))?);
    assert!(!e.ram().contains(&b(1)));

    let loaded = e.load(&lookup)?;
    assert_eq!(loaded.blocks.len(), 2);
    assert!(!loaded.complete);
    let h = hits(&e);
    assert_eq!(h.load_tokens_asked, 4 * tpb);
    assert_eq!(h.load_tokens_delivered_ssd, 2 * tpb, "{h:?}");
    assert_eq!(h.load_tokens_delivered_ram, 0, "{h:?}");
    assert_eq!(h.load_tokens_delivered_remote, 0);
    // Promised − delivered, all under `evicted`: block 2 went away, and block 3 cannot be
    // used without it.
    let delivered =
        h.load_tokens_delivered_ram + h.load_tokens_delivered_ssd + h.load_tokens_delivered_remote;
    assert_eq!(h.lookup_tokens_promised - delivered, 2 * tpb);
    assert_eq!(h.load_tokens_undelivered_evicted, 2 * tpb);
    assert_eq!(undelivered_other_than_evicted(&h), 0, "{h:?}");

    // The same names in the flat list `/v1/stats` answers with.
    let flat: std::collections::HashMap<String, u64> = e.stats().counters().into_iter().collect();
    assert_eq!(flat["engine_lookup_tokens_promised"], 4 * tpb);
    assert_eq!(flat["engine_load_tokens_delivered_ssd"], 2 * tpb);
    assert_eq!(flat["engine_load_tokens_undelivered_evicted"], 2 * tpb);
    Ok(())
}

/// Reads one hit counter.
type Counted = fn(&HitStats) -> u64;

fn undelivered_other_than_evicted(h: &HitStats) -> u64 {
    h.load_tokens_undelivered_corrupt
        + h.load_tokens_undelivered_deadline
        + h.load_tokens_undelivered_failed
        + h.load_tokens_undelivered_refused
}

#[test]
fn a_read_that_fails_counts_the_gap_by_its_error() -> kvtier_core::Result<()> {
    let FourBlocks {
        e,
        lower,
        tpb,
        lookup,
        ..
    } = four_blocks_looked_up()?;
    let b = |i: usize| lookup.blocks[i].hash;

    // Block 1 is read from the lower tier, and that read fails verification.
    assert!(e.ram().remove(&b(1))?);
    lower.fail_reads_of(b(1), ErrorKind::Corrupt);
    let err = e.load(&lookup).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    let h = hits(&e);
    assert_eq!(h.load_tokens_delivered_ram, tpb, "{h:?}");
    assert_eq!(h.load_tokens_undelivered_corrupt, 3 * tpb, "{h:?}");

    // A tier that is unreachable fails the read: `failed`.
    lower.fail_reads_of(b(1), ErrorKind::Unavailable);
    assert_eq!(e.load(&lookup).unwrap_err().kind(), ErrorKind::Unavailable);
    let h = hits(&e);
    assert_eq!(h.load_tokens_delivered_ram, 2 * tpb, "{h:?}");
    assert_eq!(h.load_tokens_undelivered_failed, 3 * tpb, "{h:?}");
    assert_eq!(h.load_tokens_undelivered_evicted, 0);
    assert_eq!(h.load_tokens_asked, 8 * tpb);
    Ok(())
}

#[test]
fn a_tier_that_answers_a_miss_for_a_reason_is_counted_under_that_reason() -> kvtier_core::Result<()>
{
    let FourBlocks {
        e,
        lower,
        tpb,
        lookup,
        ..
    } = four_blocks_looked_up()?;
    let b = |i: usize| lookup.blocks[i].hash;
    // Block 2 is read from the lower tier (and so are its descendants).
    assert!(e.ram().remove(&b(2))?);

    // The read of block 2 answers a miss: its bytes failed their checksum (the SSD and
    // remote tiers drop such a block and answer a miss), then ran out of the tier's
    // deadline, then failed otherwise. A load returns two blocks each time, and the two
    // promised blocks it did not deliver are counted under the reason the tier gave.
    let cases: [(ShortRead, Counted); 4] = [
        (ShortRead::Corrupt, |h: &HitStats| {
            h.load_tokens_undelivered_corrupt
        }),
        (ShortRead::Deadline, |h: &HitStats| {
            h.load_tokens_undelivered_deadline
        }),
        (ShortRead::Failed, |h: &HitStats| {
            h.load_tokens_undelivered_failed
        }),
        (ShortRead::NotHeld, |h: &HitStats| {
            h.load_tokens_undelivered_evicted
        }),
    ];
    for (why, counted) in cases {
        lower.miss_reads_of(b(2), why);
        let before = hits(&e);
        let loaded = e.load(&lookup)?;
        assert_eq!(loaded.blocks.len(), 2, "{why:?}");
        assert!(!loaded.complete);
        let after = hits(&e);
        assert_eq!(
            counted(&after) - counted(&before),
            2 * tpb,
            "{why:?}: {after:?}"
        );
        let others = |h: &HitStats| {
            h.load_tokens_undelivered_evicted + undelivered_other_than_evicted(h) - counted(h)
        };
        assert_eq!(others(&after), others(&before), "{why:?}: {after:?}");

        // Layer by layer (each block read from the tier the lookup found it in: block 2
        // and the block after it from the lower tier), the same.
        let mut relooked = lookup.clone();
        for r in &mut relooked.blocks[2..] {
            r.tier = TierKind::Ssd;
        }
        let before = hits(&e);
        let loaded = e.load_layers(&relooked, 0..1)?;
        assert_eq!(loaded.blocks.len(), 2, "{why:?}");
        assert_eq!(counted(&hits(&e)) - counted(&before), 2 * tpb, "{why:?}");
    }
    Ok(())
}

#[test]
fn a_load_a_closed_engine_refuses_is_counted_as_refused() -> kvtier_core::Result<()> {
    let FourBlocks { e, tpb, lookup, .. } = four_blocks_looked_up()?;

    kvtier_testkit::time_panic_reports();
    e.inject_background_panic();
    let err = kvtier_testkit::first_error_after_panic(Duration::from_secs(1), || e.load(&lookup));
    assert_eq!(err.kind(), ErrorKind::Closed);
    let h = hits(&e);
    assert_eq!(h.load_tokens_undelivered_refused, 4 * tpb, "{h:?}");
    assert_eq!(h.load_tokens_undelivered_evicted, 0, "{h:?}");

    // Layer by layer, the same: counted once, by the range from layer 0.
    let asked = h.load_tokens_asked;
    for layers in [0..1, 1..2] {
        let err = e.load_layers(&lookup, layers).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Closed);
    }
    let h = hits(&e);
    assert_eq!(h.load_tokens_undelivered_refused, 8 * tpb, "{h:?}");
    assert_eq!(h.load_tokens_asked, asked + 4 * tpb, "{h:?}");
    Ok(())
}

#[test]
fn a_hit_loaded_layer_by_layer_is_counted_once() -> kvtier_core::Result<()> {
    let FourBlocks {
        e,
        layout,
        tpb,
        lookup,
        ..
    } = four_blocks_looked_up()?;
    let layers = layout.key().num_layers;
    assert!(layers >= 2, "the test layout has {layers} layers");
    for l in 0..layers {
        let loaded = e.load_layers(&lookup, l..l + 1)?;
        assert_eq!(loaded.blocks.len(), 4);
    }
    let h = hits(&e);
    // One hit, loaded in `layers` ranges: four blocks asked and delivered, not 4 × layers.
    assert_eq!(h.load_tokens_asked, 4 * tpb, "{h:?}");
    assert_eq!(h.load_tokens_delivered_ram, 4 * tpb, "{h:?}");

    // A block gone before the first range is counted as evicted, once.
    assert!(e.ram().remove(&lookup.blocks[3].hash)?);
    let mut short = lookup.clone();
    short.blocks[3].tier = TierKind::Ram;
    let loaded = e.load_layers(&short, 0..1)?;
    assert_eq!(loaded.blocks.len(), 3);
    assert!(!loaded.complete);
    let h = hits(&e);
    assert_eq!(h.load_tokens_asked, 8 * tpb, "{h:?}");
    assert_eq!(h.load_tokens_undelivered_evicted, tpb, "{h:?}");
    Ok(())
}
