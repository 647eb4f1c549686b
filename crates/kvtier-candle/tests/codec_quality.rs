//! The quality gate of the fp8 cold codec (ADR 0021): a prefix stored under a layout
//! registered with fp8, restored from the SSD after a process restart (so every block
//! comes back through the codec), decodes like a cold prefill within the thresholds the
//! ADR writes down — the same greedy tokens, and a small divergence of the next-token
//! distributions — on Gemma 3 270M and on the seeded hybrid model (whose recurrent state
//! goes through the lossless codec).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod fixtures;

use std::sync::Arc;

use kvtier_candle::conversation::{DECODE, logits_difference, ssd_settings};
use kvtier_candle::reuse::{Cache, GemmaRunner, HybridRunner};
use kvtier_core::tier::TierKind;
use kvtier_core::{ColdCodec, Engine, LayoutKey};

/// Gemma: at most this mean and this largest KL(cold ‖ restored) over the 32 decoded
/// steps (ADR 0021 has the measured values).
const GEMMA_MEAN_KL: f64 = 0.02;
const GEMMA_MAX_KL: f64 = 0.1;
/// The hybrid model, over its 16 steps.
const HYBRID_MEAN_KL: f64 = 0.02;
const HYBRID_MAX_KL: f64 = 0.1;

const CHILD_DIR: &str = "KVTIER_TEST_FP8_DIR";

fn fp8(mut key: LayoutKey) -> LayoutKey {
    key.cold_codec = Some(ColdCodec::Fp8E4M3);
    key
}

/// An engine with RAM and the SSD tier on `dir`, as `kvtier serve` builds it.
fn ssd_engine(dir: &std::path::Path) -> Arc<Engine> {
    kvtier_node::Node::open(ssd_settings(dir, 256 << 20))
        .unwrap()
        .engine
        .clone()
}

fn softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::MIN, |m, v| m.max(*v)) as f64;
    let exp: Vec<f64> = logits.iter().map(|v| (*v as f64 - max).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.into_iter().map(|e| e / sum).collect()
}

/// KL(cold ‖ warm) of each step's next-token distribution: mean and largest.
fn kl(warm: &[Vec<f32>], cold: &[Vec<f32>]) -> (f64, f64) {
    assert_eq!(warm.len(), cold.len());
    let per_step: Vec<f64> = warm
        .iter()
        .zip(cold)
        .map(|(w, c)| {
            let (p, q) = (softmax(c), softmax(w));
            p.iter()
                .zip(&q)
                .filter(|(p, _)| **p > 0.0)
                .map(|(p, q)| p * (p / q.max(1e-300)).ln())
                .sum()
        })
        .collect();
    let mean = per_step.iter().sum::<f64>() / per_step.len() as f64;
    let max = per_step.iter().fold(0.0f64, |m, v| m.max(*v));
    (mean, max)
}

fn ssd_fp8_bytes(engine: &Engine) -> (u64, u64) {
    let s = engine.stats();
    let ssd = s.tier(TierKind::Ssd).unwrap();
    (ssd.codec.fp8_stored_bytes, ssd.hits)
}

/// Not a test: the first process of `gemma_restored_through_fp8_decodes_like_cold`.
#[test]
#[ignore = "run by gemma_restored_through_fp8_decodes_like_cold in a child process"]
fn gemma_fp8_turn_one_in_a_child_process() {
    let dir = std::env::var(CHILD_DIR).expect("only run as a child");
    let engine = ssd_engine(std::path::Path::new(&dir));
    let w = fixtures::gemma::weights();
    let key = fp8(GemmaRunner::layout_key(&w));
    let runner =
        GemmaRunner::with_layout(w, Arc::new(Cache::embedded(engine.clone())), key).unwrap();
    let one = runner
        .run_turn(&fixtures::gemma::turn_one(), DECODE)
        .unwrap();
    assert!(one.blocks_stored > 0);
    assert!(
        engine
            .shutdown(std::time::Duration::from_secs(60))
            .unwrap()
            .clean
    );
}

#[test]
fn gemma_restored_through_fp8_decodes_like_cold() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::child::run_ignored_test(
        "gemma_fp8_turn_one_in_a_child_process",
        CHILD_DIR,
        dir.path(),
    );
    let engine = ssd_engine(dir.path());
    assert_eq!(engine.stats().ram.resident_blocks, 0);
    let w = fixtures::gemma::weights();
    let key = fp8(GemmaRunner::layout_key(&w));
    let mut runner =
        GemmaRunner::with_layout(w, Arc::new(Cache::embedded(engine.clone())), key).unwrap();
    runner.store = false;
    let two = runner
        .run_turn(&fixtures::gemma::turn_two(), DECODE)
        .unwrap();
    let one_len = fixtures::gemma::turn_one().len();
    assert!(
        two.reused_tokens >= one_len / 16 * 16,
        "{}",
        two.reused_tokens
    );
    let (fp8_bytes, hits) = ssd_fp8_bytes(&engine);
    assert!(
        fp8_bytes > 0 && hits > 0,
        "the prefix did not come through fp8"
    );
    let cold = fixtures::gemma::cold_turn_two();
    let (mean, max) = kl(&two.logits, &cold.logits);
    let agree = two
        .tokens
        .iter()
        .zip(&cold.tokens)
        .filter(|(a, b)| a == b)
        .count();
    println!("gemma fp8 gate: {agree}/{DECODE} greedy tokens, KL mean {mean:.6}, max {max:.6}");
    // Lossy for real: not bit-identical to cold.
    assert!(logits_difference(&two.logits, &cold.logits).is_some());
    assert_eq!(two.tokens, cold.tokens, "greedy tokens differ from cold");
    assert!(
        mean <= GEMMA_MEAN_KL && max <= GEMMA_MAX_KL,
        "KL mean {mean}, max {max}"
    );
}

/// Not a test: the first process of `hybrid_restored_through_fp8_decodes_like_cold`.
#[test]
#[ignore = "run by hybrid_restored_through_fp8_decodes_like_cold in a child process"]
fn hybrid_fp8_turn_one_in_a_child_process() {
    let dir = std::env::var(CHILD_DIR).expect("only run as a child");
    let engine = ssd_engine(std::path::Path::new(&dir));
    let model = fixtures::hybrid::model();
    let key = fp8(HybridRunner::layout_key(&model));
    let r = HybridRunner::with_layout(model, Arc::new(Cache::embedded(engine.clone())), 64, key)
        .unwrap();
    r.run_turn(&fixtures::cached(), fixtures::hybrid::DECODE)
        .unwrap();
    assert!(
        engine
            .shutdown(std::time::Duration::from_secs(60))
            .unwrap()
            .clean
    );
}

#[test]
fn hybrid_restored_through_fp8_decodes_like_cold() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::child::run_ignored_test(
        "hybrid_fp8_turn_one_in_a_child_process",
        CHILD_DIR,
        dir.path(),
    );
    let engine = ssd_engine(dir.path());
    let model = fixtures::hybrid::model();
    let key = fp8(HybridRunner::layout_key(&model));
    let mut r =
        HybridRunner::with_layout(model, Arc::new(Cache::embedded(engine.clone())), 64, key)
            .unwrap();
    r.store_kv = false;
    r.store_state = false;
    let warm = r
        .run_turn(&fixtures::diverging(), fixtures::hybrid::DECODE)
        .unwrap();
    assert_eq!(
        warm.reused_tokens, 128,
        "the 128-token boundary (KV and state) was not restored"
    );
    let (fp8_bytes, hits) = ssd_fp8_bytes(&engine);
    assert!(
        fp8_bytes > 0 && hits > 0,
        "the prefix did not come through fp8"
    );
    let cold = fixtures::hybrid::cold(&fixtures::diverging());
    let (mean, max) = kl(&warm.logits, &cold.logits);
    let steps = fixtures::hybrid::DECODE;
    let agree = warm
        .tokens
        .iter()
        .zip(&cold.tokens)
        .filter(|(a, b)| a == b)
        .count();
    println!("hybrid fp8 gate: {agree}/{steps} greedy tokens, KL mean {mean:.6}, max {max:.6}");
    assert!(logits_difference(&warm.logits, &cold.logits).is_some());
    assert_eq!(warm.tokens, cold.tokens, "greedy tokens differ from cold");
    assert!(
        mean <= HYBRID_MEAN_KL && max <= HYBRID_MAX_KL,
        "KL mean {mean}, max {max}"
    );
}
