//! Layouts with state groups (issue 16): a hit is served only at a boundary where the KV
//! blocks *and* a checkpoint of the recurrent state exist, and a restore returns both or
//! nothing. The property test checks the rule against a plain model of what was stored.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

use std::collections::{HashMap, HashSet};

use kvtier_core::snapshot::{CheckpointConfig, SnapshotConfig, SnapshotPut};
use kvtier_core::tier::RamConfig;
use kvtier_core::{Engine, ExtraKeys, KvDtype, Layout, LayoutKey, StateGroup, TierKind};
use proptest::prelude::*;

const TPB: usize = 4;
const STATE_BYTES: u64 = 48;

fn hybrid_key(model: &str, attention_layers: u32) -> LayoutKey {
    let mut k = LayoutKey::new(model, KvDtype::F32, TPB as u32, attention_layers, 1, 2);
    k.weights_digest = "w".into();
    k.tokenizer_digest = "t".into();
    k.state_groups = vec![StateGroup {
        kind: "mamba1/f32".into(),
        num_layers: 2,
        state_bytes: STATE_BYTES,
    }];
    k
}

fn engine(checkpoint: CheckpointConfig) -> Engine {
    Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 1 << 30,
        })
        .checkpoint(checkpoint)
        .build()
        .unwrap()
}

fn every(blocks: usize) -> CheckpointConfig {
    CheckpointConfig {
        every_tokens: (blocks * TPB) as u32,
        ..CheckpointConfig::default()
    }
}

/// Bytes no other (prompt, block) pair has: the prefix's hash decides them.
fn kv_bytes(layout: &Layout, tokens: &[u32], block: usize) -> Vec<u8> {
    let seed = tokens[..(block + 1) * TPB]
        .iter()
        .fold(block as u32, |a, &t| a.wrapping_mul(31).wrapping_add(t));
    (0..layout.block_bytes())
        .map(|i| (seed as u64 + i) as u8)
        .collect()
}

fn state_bytes(tokens: &[u32], blocks: usize) -> Vec<u8> {
    let seed = tokens[..blocks * TPB]
        .iter()
        .fold(7u32, |a, &t| a.wrapping_mul(131).wrapping_add(t));
    (0..STATE_BYTES).map(|i| (seed as u64 ^ i) as u8).collect()
}

#[test]
fn kv_without_state_and_state_without_kv_are_misses() {
    let e = engine(every(2));
    let l = e.register_layout(hybrid_key("hybrid", 2)).unwrap();
    let tokens: Vec<u32> = (0..(8 * TPB) as u32).collect();
    let p = e.prompt(l.digest(), &tokens, &ExtraKeys::none()).unwrap();

    // KV of all 8 blocks, no state: refused.
    let kv: Vec<Vec<u8>> = (0..8).map(|i| kv_bytes(&l, &tokens, i)).collect();
    let refs: Vec<&[u8]> = kv.iter().map(Vec::as_slice).collect();
    e.store(&p, &refs).unwrap();
    let found = e.lookup(&p);
    assert!(found.is_miss() && found.matched_tokens == 0, "{found:?}");
    assert_eq!(e.stats().state.refused, 1);

    // A checkpoint at 4 blocks: served at 4, KV past it not offered.
    e.checkpoint_put(&p, 4, &state_bytes(&tokens, 4)).unwrap();
    let found = e.lookup(&p);
    assert_eq!(found.blocks.len(), 4);
    assert_eq!(found.matched_tokens, 4 * TPB);
    assert_eq!(
        found.state.map(|s| (s.blocks, s.tier)),
        Some((4, TierKind::Ram))
    );
    assert_eq!(e.stats().state.trimmed, 1);
    let r = e.restore(&found).unwrap();
    assert_eq!(r.tokens, 4 * TPB);
    assert_eq!(r.blocks.len(), 4);
    for (i, b) in r.blocks.iter().enumerate() {
        assert_eq!(b.as_ref(), kv_bytes(&l, &tokens, i).as_slice());
    }
    assert_eq!(r.state.as_deref(), Some(state_bytes(&tokens, 4).as_slice()));

    // State without KV: a prompt diverging in block 3 has a checkpoint at 6 of its own,
    // but KV only for the 3 blocks it shares, and no checkpoint at 2: a miss.
    let mut other = tokens.clone();
    other[3 * TPB] = 999;
    let q = e.prompt(l.digest(), &other, &ExtraKeys::none()).unwrap();
    e.checkpoint_put(&q, 6, &state_bytes(&other, 6)).unwrap();
    let found = e.lookup(&q);
    assert!(found.is_miss(), "{found:?}");
}

#[test]
fn a_restore_returns_nothing_when_either_part_went_away() {
    let e = engine(every(1));
    let l = e.register_layout(hybrid_key("hybrid", 1)).unwrap();
    let tokens: Vec<u32> = (100..(100 + 3 * TPB) as u32).collect();
    let p = e.prompt(l.digest(), &tokens, &ExtraKeys::none()).unwrap();
    let kv: Vec<Vec<u8>> = (0..3).map(|i| kv_bytes(&l, &tokens, i)).collect();
    let refs: Vec<&[u8]> = kv.iter().map(Vec::as_slice).collect();
    e.store(&p, &refs).unwrap();
    e.checkpoint_put(&p, 1, &state_bytes(&tokens, 1)).unwrap();
    e.checkpoint_put(&p, 3, &state_bytes(&tokens, 3)).unwrap();

    // A KV block evicted between lookup and restore.
    let found = e.lookup(&p);
    assert_eq!(found.blocks.len(), 3);
    let ram = e.tier(TierKind::Ram).unwrap();
    assert!(ram.remove(&p.hashes()[1]).unwrap());
    let r = e.restore(&found).unwrap();
    assert_eq!((r.tokens, r.blocks.len(), r.state.is_none()), (0, 0, true));
    assert_eq!(e.stats().state.restore_misses, 1);

    // A lookup edited by its caller is refused, not half served.
    let mut edited = e.lookup(&p);
    assert_eq!(edited.blocks.len(), 1, "block 0 and its checkpoint remain");
    assert_eq!(e.restore(&edited).unwrap().tokens, TPB);
    edited.blocks.clear();
    assert!(e.restore(&edited).is_err());
}

#[test]
fn checkpoints_are_refused_off_their_boundaries_or_size_and_for_layouts_without_state() {
    let e = engine(every(2));
    let l = e.register_layout(hybrid_key("hybrid", 1)).unwrap();
    let tokens: Vec<u32> = (0..(5 * TPB) as u32 + 1).collect();
    let p = e.prompt(l.digest(), &tokens, &ExtraKeys::none()).unwrap();
    let good = state_bytes(&tokens, 2);
    assert_eq!(e.checkpoint_boundaries(&p).unwrap(), vec![2, 4]);
    for (blocks, blob, needle) in [
        (0, good.clone(), "every 2 blocks"),
        (3, good.clone(), "every 2 blocks"),
        (6, good.clone(), "every 2 blocks"),
        (2, good[..10].to_vec(), "names 48 bytes of state"),
    ] {
        let err = e.checkpoint_put(&p, blocks, &blob).unwrap_err().to_string();
        assert!(err.contains(needle), "`{err}` should mention `{needle}`");
    }
    assert_eq!(e.checkpoint_put(&p, 2, &good).unwrap(), SnapshotPut::Stored);

    let plain = e
        .register_layout(LayoutKey::new("dense", KvDtype::F32, TPB as u32, 1, 1, 2))
        .unwrap();
    let q = e
        .prompt(plain.digest(), &tokens, &ExtraKeys::none())
        .unwrap();
    let err = e.checkpoint_put(&q, 2, &good).unwrap_err().to_string();
    assert!(err.contains("names no state groups"), "{err}");

    let mut recurrent = hybrid_key("recurrent", 0);
    recurrent.num_layers = 0;
    let r = e.register_layout(recurrent).unwrap();
    let rp = e.prompt(r.digest(), &tokens, &ExtraKeys::none()).unwrap();
    let err = e.store(&rp, &[&[][..]]).unwrap_err().to_string();
    assert!(err.contains("no attention layers"), "{err}");
    let err = e
        .snapshot_put(r.digest(), &tokens, None, &good[..5])
        .unwrap_err()
        .to_string();
    assert!(err.contains("names 48 bytes of state"), "{err}");

    // The per-layout distance, rounded up to whole blocks.
    assert_eq!(e.set_checkpoint_every(r.digest(), 5).unwrap(), 2 * TPB);
    assert!(e.set_checkpoint_every(r.digest(), 0).is_err());
}

#[test]
fn a_recurrent_layout_restores_the_deepest_checkpoint_on_the_prompts_chain() {
    let e = engine(every(2));
    let mut key = hybrid_key("mamba", 0);
    key.num_layers = 0;
    let l = e.register_layout(key).unwrap();
    let cached: Vec<u32> = (0..(10 * TPB) as u32).collect();
    let p = e.prompt(l.digest(), &cached, &ExtraKeys::none()).unwrap();
    for b in e.checkpoint_boundaries(&p).unwrap() {
        e.checkpoint_put(&p, b, &state_bytes(&cached, b)).unwrap();
    }
    // Diverges inside block 7: the checkpoint after 6 blocks is the deepest shared one.
    let mut diverging = cached.clone();
    diverging[7 * TPB + 1] = 5000;
    let q = e
        .prompt(l.digest(), &diverging, &ExtraKeys::none())
        .unwrap();
    let found = e.lookup(&q);
    assert!(found.blocks.is_empty());
    assert_eq!(found.matched_tokens, 6 * TPB);
    let r = e.restore(&found).unwrap();
    assert_eq!(r.tokens, 6 * TPB);
    assert_eq!(r.state.as_deref(), Some(state_bytes(&cached, 6).as_slice()));
    // Another tenant's salt names another layout: nothing.
    let mut salted = hybrid_key("mamba", 0);
    salted.num_layers = 0;
    salted.tenant_salt = b"tenant-b".to_vec();
    let s = e.register_layout(salted).unwrap();
    let sp = e.prompt(s.digest(), &cached, &ExtraKeys::none()).unwrap();
    assert!(e.lookup(&sp).is_miss());
    let stats = e.stats();
    assert_eq!(stats.checkpoint.stores, 5);
    assert_eq!(stats.snapshot.stores, 0, "checkpoints are counted apart");
}

#[test]
fn checkpoint_eviction_weighs_hits_and_length_among_the_oldest() {
    let e = engine(CheckpointConfig {
        bucket: SnapshotConfig {
            max_entries: 3,
            ..SnapshotConfig::default()
        },
        every_tokens: TPB as u32,
    });
    let mut key = hybrid_key("mamba", 0);
    key.num_layers = 0;
    let l = e.register_layout(key).unwrap();
    let prompt = |seed: u32, blocks: usize| {
        let t: Vec<u32> = (0..(blocks * TPB) as u32)
            .map(|i| i + seed * 1000)
            .collect();
        e.prompt(l.digest(), &t, &ExtraKeys::none()).unwrap()
    };
    let (a, b, c) = (prompt(1, 1), prompt(2, 3), prompt(3, 1));
    let blob = vec![1u8; STATE_BYTES as usize];
    e.checkpoint_put(&a, 1, &blob).unwrap();
    e.checkpoint_put(&b, 3, &blob).unwrap();
    e.checkpoint_put(&c, 1, &blob).unwrap();
    // `a` is read once: it has a hit, `c` none and the same length, `b` is longer.
    let hit = e.lookup(&a);
    assert!(e.restore(&hit).unwrap().state.is_some());
    e.checkpoint_put(&prompt(4, 1), 1, &blob).unwrap();
    assert!(!e.lookup(&a).is_miss(), "read once: kept");
    assert!(!e.lookup(&b).is_miss(), "three blocks long: kept");
    assert!(e.lookup(&c).is_miss(), "never read and short: evicted");
    assert_eq!(e.stats().checkpoint.evictions_entries, 1);
}

/// One step of the property test: a prompt from a small tree of shared prefixes, and
/// which of its blocks and checkpoints get stored.
#[derive(Debug, Clone)]
struct Stored {
    path: Vec<u8>,
    kv_blocks: usize,
    checkpoints: Vec<usize>,
}

fn tokens_of(path: &[u8]) -> Vec<u32> {
    // Each path byte picks one of three variants of the next block: prompts share
    // prefixes and diverge at block boundaries and inside blocks.
    let mut t = Vec::new();
    for (i, &b) in path.iter().enumerate() {
        for j in 0..TPB {
            let base = (i * 10 + j) as u32;
            t.push(match b {
                0 => base,
                1 => base + 100_000,
                _ if j == TPB / 2 => base + 7,
                _ => base,
            });
        }
    }
    t
}

fn stored() -> impl Strategy<Value = Stored> {
    (
        prop::collection::vec(0u8..3, 1..9),
        0usize..9,
        prop::collection::vec(1usize..9, 0..4),
    )
        .prop_map(|(path, kv, cps)| {
            let n = path.len();
            Stored {
                kv_blocks: kv.min(n),
                checkpoints: cps.into_iter().filter(|&c| c <= n).collect(),
                path,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn a_hit_is_served_only_where_every_group_is_present(
        stores in prop::collection::vec(stored(), 1..8),
        asks in prop::collection::vec(prop::collection::vec(0u8..3, 1..9), 1..8),
        attention in 0u32..2,
    ) {
        let e = engine(every(1));
        let l = e.register_layout(hybrid_key("prop", attention)).unwrap();
        // The model: every KV block and checkpoint stored, by the exact token prefix.
        let mut kv: HashMap<Vec<u32>, Vec<u8>> = HashMap::new();
        let mut state: HashMap<Vec<u32>, Vec<u8>> = HashMap::new();
        for s in &stores {
            let tokens = tokens_of(&s.path);
            let p = e.prompt(l.digest(), &tokens, &ExtraKeys::none()).unwrap();
            if l.has_kv() && s.kv_blocks > 0 {
                let payloads: Vec<Vec<u8>> = (0..s.kv_blocks).map(|i| kv_bytes(&l, &tokens, i)).collect();
                let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
                e.store(&p, &refs).unwrap();
                for (i, b) in payloads.into_iter().enumerate() {
                    kv.insert(tokens[..(i + 1) * TPB].to_vec(), b);
                }
            }
            for &c in &s.checkpoints {
                let blob = state_bytes(&tokens, c);
                e.checkpoint_put(&p, c, &blob).unwrap();
                state.insert(tokens[..c * TPB].to_vec(), blob);
            }
        }
        let asked: HashSet<Vec<u8>> = asks.into_iter().collect();
        for path in asked {
            let tokens = tokens_of(&path);
            let p = e.prompt(l.digest(), &tokens, &ExtraKeys::none()).unwrap();
            let n = path.len();
            let kv_run = (0..n).take_while(|&i| kv.contains_key(&tokens[..(i + 1) * TPB])).count();
            let bound = if l.has_kv() { kv_run } else { n };
            let expected = (1..=bound).rev().find(|&b| state.contains_key(&tokens[..b * TPB])).unwrap_or(0);
            let found = e.lookup(&p);
            prop_assert_eq!(found.matched_tokens, expected * TPB);
            let r = e.restore(&found).unwrap();
            prop_assert_eq!(r.tokens, expected * TPB);
            if expected == 0 {
                prop_assert!(r.state.is_none() && r.blocks.is_empty());
                continue;
            }
            prop_assert_eq!(r.state.as_deref(), state.get(&tokens[..expected * TPB]).map(Vec::as_slice));
            let want_blocks = if l.has_kv() { expected } else { 0 };
            prop_assert_eq!(r.blocks.len(), want_blocks);
            for (i, b) in r.blocks.iter().enumerate() {
                prop_assert_eq!(Some(b.as_ref()), kv.get(&tokens[..(i + 1) * TPB]).map(Vec::as_slice));
            }
        }
    }
}

#[test]
fn state_group_layouts_of_two_models_never_alias() {
    let e = engine(every(1));
    let a = e.register_layout(hybrid_key("model-a", 1)).unwrap();
    let mut other = hybrid_key("model-a", 1);
    other.state_groups[0].kind = "gated-delta/bf16".into();
    let b = e.register_layout(other).unwrap();
    assert_ne!(a.digest(), b.digest());
    let tokens: Vec<u32> = (0..TPB as u32).collect();
    let pa = e.prompt(a.digest(), &tokens, &ExtraKeys::none()).unwrap();
    let pb = e.prompt(b.digest(), &tokens, &ExtraKeys::none()).unwrap();
    let kv = kv_bytes(&a, &tokens, 0);
    e.store(&pa, &[&kv]).unwrap();
    e.checkpoint_put(&pa, 1, &state_bytes(&tokens, 1)).unwrap();
    assert!(!e.lookup(&pa).is_miss());
    assert!(
        e.lookup(&pb).is_miss(),
        "another state kind is another model"
    );
}
