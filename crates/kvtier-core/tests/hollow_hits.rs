//! Hit accounting (issue 36, item 6): what a lookup promised and what the load after it
//! delivered, per tier, and the promised blocks it did not deliver, by reason. A hit that
//! turns hollow between lookup and load shows up here, and nowhere else.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

mod stand_in;

use std::time::Duration;

use kvtier_core::stats::HitStats;
use kvtier_core::tier::{Tier, TierKind};
use kvtier_core::{Engine, ErrorKind, ExtraKeys, Layout};

/// Stores four whole blocks and a partial one; returns the prompt's tokens.
fn store_four_blocks(e: &Engine, layout: &Layout) -> kvtier_core::Result<Vec<u32>> {
    let tokens: Vec<u32> = (0..(4 * layout.tokens_per_block() + 3) as u32).collect();
    let prompt = e.prompt(layout.digest(), &tokens, &ExtraKeys::none())?;
    let payload = vec![7u8; layout.block_bytes() as usize];
    e.store(&prompt, &[&payload, &payload, &payload, &payload])?;
    assert!(e.flush(Duration::from_secs(5)));
    Ok(tokens)
}

fn hits(e: &Engine) -> HitStats {
    e.stats().engine.hits
}

#[test]
fn a_load_after_evicting_part_of_a_hit_counts_the_gap_as_evicted() -> kvtier_core::Result<()> {
    let (e, layout, lower) = stand_in::engine();
    let tokens = store_four_blocks(&e, &layout)?;
    let tpb = layout.tokens_per_block() as u64;

    let lookup = e.lookup(&e.prompt(layout.digest(), &tokens, &ExtraKeys::none())?);
    assert_eq!(lookup.blocks.len(), 4);
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

    let loaded = e.load(&lookup.blocks)?;
    assert_eq!(loaded.blocks.len(), 2);
    assert!(!loaded.complete);
    let h = hits(&e);
    assert_eq!(h.load_blocks_asked, 4);
    assert_eq!(h.load_blocks_delivered_ssd, 2, "{h:?}");
    assert_eq!(h.load_blocks_delivered_ram, 0, "{h:?}");
    assert_eq!(h.load_blocks_delivered_remote, 0);
    // Promised − delivered, all under `evicted`: block 2 went away, and block 3 cannot be
    // used without it.
    let delivered =
        h.load_blocks_delivered_ram + h.load_blocks_delivered_ssd + h.load_blocks_delivered_remote;
    assert_eq!(h.lookup_blocks_promised - delivered, 2);
    assert_eq!(h.load_blocks_undelivered_evicted, 2);
    assert_eq!(h.load_blocks_undelivered_corrupt, 0);
    assert_eq!(h.load_blocks_undelivered_failed, 0);

    // The same names in the flat list `/v1/stats` answers with.
    let flat: std::collections::HashMap<String, u64> = e.stats().counters().into_iter().collect();
    assert_eq!(flat["engine_lookup_tokens_promised"], 4 * tpb);
    assert_eq!(flat["engine_load_blocks_delivered_ssd"], 2);
    assert_eq!(flat["engine_load_blocks_undelivered_evicted"], 2);
    Ok(())
}

#[test]
fn a_read_that_fails_counts_the_gap_by_its_error() -> kvtier_core::Result<()> {
    let (e, layout, lower) = stand_in::engine();
    let tokens = store_four_blocks(&e, &layout)?;
    let lookup = e.lookup(&e.prompt(layout.digest(), &tokens, &ExtraKeys::none())?);
    assert_eq!(lookup.blocks.len(), 4);
    let b = |i: usize| lookup.blocks[i].hash;

    // Block 1 is read from the lower tier, and that read fails verification.
    assert!(e.ram().remove(&b(1))?);
    lower.fail_reads_of(b(1), ErrorKind::Corrupt);
    let err = e.load(&lookup.blocks).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    let h = hits(&e);
    assert_eq!(h.load_blocks_delivered_ram, 1, "{h:?}");
    assert_eq!(h.load_blocks_undelivered_corrupt, 3, "{h:?}");

    // Any other failure (a deadline, an unavailable tier) counts as `failed`.
    lower.fail_reads_of(b(1), ErrorKind::Unavailable);
    assert_eq!(
        e.load(&lookup.blocks).unwrap_err().kind(),
        ErrorKind::Unavailable
    );
    let h = hits(&e);
    assert_eq!(h.load_blocks_delivered_ram, 2, "{h:?}");
    assert_eq!(h.load_blocks_undelivered_failed, 3, "{h:?}");
    assert_eq!(h.load_blocks_undelivered_evicted, 0);
    assert_eq!(h.load_blocks_asked, 8);
    Ok(())
}

#[test]
fn a_hit_loaded_layer_by_layer_is_counted_once() -> kvtier_core::Result<()> {
    let (e, layout, _lower) = stand_in::engine();
    let tokens = store_four_blocks(&e, &layout)?;
    let lookup = e.lookup(&e.prompt(layout.digest(), &tokens, &ExtraKeys::none())?);
    assert_eq!(lookup.blocks.len(), 4);
    let layers = layout.key().num_layers;
    assert!(layers >= 2, "the test layout has {layers} layers");
    for l in 0..layers {
        let loaded = e.load_layers(&lookup, l..l + 1)?;
        assert_eq!(loaded.blocks.len(), 4);
    }
    let h = hits(&e);
    // One hit, loaded in `layers` ranges: four blocks asked and delivered, not 4 × layers.
    assert_eq!(h.load_blocks_asked, 4, "{h:?}");
    assert_eq!(h.load_blocks_delivered_ram, 4, "{h:?}");

    // A block gone before the first range is counted as evicted, once.
    assert!(e.ram().remove(&lookup.blocks[3].hash)?);
    let mut short = lookup.clone();
    short.blocks[3].tier = TierKind::Ram;
    let loaded = e.load_layers(&short, 0..1)?;
    assert_eq!(loaded.blocks.len(), 3);
    assert!(!loaded.complete);
    let h = hits(&e);
    assert_eq!(h.load_blocks_asked, 8, "{h:?}");
    assert_eq!(h.load_blocks_undelivered_evicted, 1, "{h:?}");
    Ok(())
}
