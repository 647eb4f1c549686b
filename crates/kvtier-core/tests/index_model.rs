//! Property tests against a naive model: the prefix index answers exactly like a
//! brute-force walk over what the RAM tier holds, the byte budget is never exceeded, and
//! chain-aware eviction never leaves a block whose parent is gone.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod common;

use std::sync::Arc;

use kvtier_core::hash::{self, ExtraKeys};
use kvtier_core::snapshot::SnapshotConfig;
use kvtier_core::tier::{RamConfig, Tier};
use kvtier_core::{Engine, KvDtype, Layout, LayoutKey};
use proptest::prelude::*;

use common::payload_for;

/// A prompt is a path in a tree: block `i`'s tokens depend on the choice made at depth `i`
/// and on all choices before it, so prompts share prefixes the way chats do.
fn tokens_of(path: &[u8], tpb: usize, tail: usize) -> Vec<u32> {
    let mut out = Vec::new();
    let mut acc: u32 = 17;
    for &c in path {
        acc = acc.wrapping_mul(31).wrapping_add(u32::from(c) + 1);
        out.extend((0..tpb as u32).map(|t| acc.wrapping_mul(1_000_003).wrapping_add(t) % 50_000));
    }
    out.extend((0..tail as u32).map(|t| 60_000 + t));
    out
}

#[derive(Debug, Clone)]
enum Op {
    Store {
        big: bool,
        path: Vec<u8>,
        tail: usize,
    },
    Lookup {
        big: bool,
        path: Vec<u8>,
    },
    Snapshot {
        path: Vec<u8>,
        len: usize,
    },
}

fn path() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(0u8..3, 1..6)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), path(), 0usize..16).prop_map(|(big, path, tail)| Op::Store { big, path, tail }),
        4 => (any::<bool>(), path()).prop_map(|(big, path)| Op::Lookup { big, path }),
        1 => (path(), 1usize..3000).prop_map(|(path, len)| Op::Snapshot { path, len }),
    ]
}

struct World {
    engine: Engine,
    small: Arc<Layout>,
    big: Arc<Layout>,
    capacity: u64,
}

fn world() -> World {
    // Small blocks are 1 KiB, big ones 3 KiB: the budget fits about a dozen.
    let capacity = 12 << 10;
    let engine = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: capacity,
        })
        .snapshot(SnapshotConfig {
            max_entries: 4,
            max_bytes: 4 << 10,
            ..SnapshotConfig::default()
        })
        .build()
        .expect("valid settings");
    let small = engine
        .register_layout(common::small_key())
        .expect("small layout");
    let big = engine
        .register_layout(LayoutKey::new("test-model", KvDtype::F16, 16, 6, 2, 4))
        .expect("big layout");
    World {
        engine,
        small,
        big,
        capacity,
    }
}

/// The brute-force answer: hash each block from scratch and ask the tier itself.
fn naive_matched(w: &World, layout: &Layout, tokens: &[u32]) -> usize {
    let tpb = layout.tokens_per_block();
    let mut parent = hash::chain_root(layout);
    let mut n = 0;
    for block in tokens.chunks_exact(tpb) {
        let h = hash::block_hash(parent, block, None);
        if !w.engine.ram().contains(&h) {
            break;
        }
        n += 1;
        parent = h;
    }
    n
}

fn check_invariants(w: &World) -> Result<(), TestCaseError> {
    w.engine
        .ram()
        .check_invariants()
        .map_err(TestCaseError::fail)?;
    let s = w.engine.stats();
    prop_assert!(
        s.engine.memory_used_bytes <= w.capacity,
        "budget exceeded: {} > {}",
        s.engine.memory_used_bytes,
        w.capacity
    );
    prop_assert!(s.ram.resident_bytes + s.snapshot.resident_bytes <= w.capacity);
    prop_assert_eq!(
        s.index.entries,
        s.ram.resident_blocks,
        "index and RAM disagree on what is held"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn index_answers_like_a_brute_force_walk(ops in prop::collection::vec(op(), 1..60)) {
        let w = world();
        for op in ops {
            match op {
                Op::Store { big, path, tail } => {
                    let layout = if big { &w.big } else { &w.small };
                    let tokens = tokens_of(&path, layout.tokens_per_block(), tail);
                    let report = common::store_all(&w.engine, layout, &tokens).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert!(report.stored + report.duplicates <= path.len());
                }
                Op::Lookup { big, path } => {
                    let layout = if big { &w.big } else { &w.small };
                    let tokens = tokens_of(&path, layout.tokens_per_block(), 3);
                    let prompt = w.engine.prompt(layout.digest(), &tokens, &ExtraKeys::none()).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let hit = w.engine.lookup(&prompt);
                    prop_assert_eq!(hit.blocks.len(), naive_matched(&w, layout, &tokens));
                    prop_assert_eq!(hit.matched_tokens, hit.blocks.len() * layout.tokens_per_block());
                    let loaded = w.engine.load(&hit).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert!(loaded.complete, "nothing evicts between this lookup and load");
                    for (r, bytes) in hit.blocks.iter().zip(&loaded.blocks) {
                        prop_assert_eq!(&bytes[..], &payload_for(layout, &r.hash)[..], "wrong bytes for block {}", r.position);
                    }
                }
                Op::Snapshot { path, len } => {
                    let tokens = tokens_of(&path, 4, 0);
                    let blob = vec![path.len() as u8; len];
                    w.engine.snapshot_put(w.small.digest(), &tokens, None, &blob).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    if let Some(got) = w.engine.snapshot_get(w.small.digest(), &tokens, None).map_err(|e| TestCaseError::fail(e.to_string()))? {
                        prop_assert_eq!(&got[..], &blob[..]);
                    }
                }
            }
            check_invariants(&w)?;
        }
    }

    #[test]
    fn layouts_never_serve_each_others_blocks(path in path()) {
        // The same tokens stored under one layout are a miss under every other.
        let w = world();
        let tokens = tokens_of(&path, 16, 0);
        common::store_all(&w.engine, &w.small, &tokens).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut other_keys = Vec::new();
        let mut k = common::small_key(); k.dtype = KvDtype::Bf16; other_keys.push(k);
        let mut k = common::small_key(); k.weights_digest = "w2".into(); other_keys.push(k);
        let mut k = common::small_key(); k.tenant_salt = b"b".to_vec(); other_keys.push(k);
        for key in other_keys {
            let other = w.engine.register_layout(key).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let prompt = w.engine.prompt(other.digest(), &tokens, &ExtraKeys::none()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(w.engine.lookup(&prompt).is_miss());
        }
        let prompt = w.engine.prompt(w.small.digest(), &tokens, &ExtraKeys::none()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(!w.engine.lookup(&prompt).is_miss());
    }
}

#[test]
fn eviction_takes_the_least_recently_used_leaf_first() -> Result<(), kvtier_core::Error> {
    // Capacity for exactly 4 blocks of 1 KiB (snapshots get nothing here).
    let engine = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 4 << 10,
        })
        .snapshot(SnapshotConfig {
            max_bytes: 1,
            ..SnapshotConfig::default()
        })
        .build()?;
    let layout = engine.register_layout(common::small_key())?;
    // Chain A: a0 -> a1 (a1 is a leaf). Chain B: b0 (leaf). Chain C: c0 (leaf).
    let a = tokens_of(&[0, 0], 16, 0);
    let b = tokens_of(&[1], 16, 0);
    let c = tokens_of(&[2], 16, 0);
    common::store_all(&engine, &layout, &a)?;
    common::store_all(&engine, &layout, &b)?;
    common::store_all(&engine, &layout, &c)?;
    // Touch A and C, so B is the least recently used leaf.
    for t in [&a, &c] {
        let p = engine.prompt(layout.digest(), t, &ExtraKeys::none())?;
        engine.load(&engine.lookup(&p))?;
    }
    let d = tokens_of(&[0, 1], 16, 0); // a0 -> d1: needs one more slot
    common::store_all(&engine, &layout, &d)?;
    let held = |t: &[u32]| -> Result<usize, kvtier_core::Error> {
        Ok(engine
            .lookup(&engine.prompt(layout.digest(), t, &ExtraKeys::none())?)
            .blocks
            .len())
    };
    assert_eq!(
        held(&b)?,
        0,
        "the least recently used leaf was not the one evicted"
    );
    assert_eq!((held(&a)?, held(&c)?, held(&d)?), (2, 1, 2));
    // Now a0 has two children: it is not a leaf and must survive any amount of pressure
    // from other chains while they stay.
    for i in 0..10u8 {
        common::store_all(&engine, &layout, &tokens_of(&[2, i], 16, 0))?;
        engine
            .ram()
            .check_invariants()
            .map_err(kvtier_core::Error::invalid)?;
    }
    assert!(engine.stats().ram.evictions.budget >= 10);
    Ok(())
}

#[test]
fn a_layer_is_a_zero_copy_slice_of_the_block() -> Result<(), kvtier_core::Error> {
    let engine = Engine::builder().build()?;
    let layout = engine.register_layout(common::small_key())?;
    let tokens: Vec<u32> = (0..32).collect();
    common::store_all(&engine, &layout, &tokens)?;
    let prompt = engine.prompt(layout.digest(), &tokens, &ExtraKeys::none())?;
    let hit = engine.lookup(&prompt);
    let whole = engine.load(&hit)?;
    let layer1 = engine.load_layers(&hit, 1..2)?;
    let page = layout.geometry().page_bytes() as usize;
    for (w, l) in whole.blocks.iter().zip(&layer1.blocks) {
        assert_eq!(&l[..], &w[page..2 * page]);
        // Same memory, not a copy.
        assert_eq!(l.as_ptr(), w[page..].as_ptr());
    }
    let again = engine.ram().get(&hit.blocks[0].hash)?.expect("held");
    assert_eq!(
        again.as_ptr(),
        whole.blocks[0].as_ptr(),
        "a RAM load copied the payload"
    );
    Ok(())
}
