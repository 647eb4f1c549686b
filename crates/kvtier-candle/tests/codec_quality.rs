//! The quality gate of the fp8 cold codec (ADR 0021): a prefix stored under a layout
//! registered with fp8, restored from the SSD after a process restart (so every block
//! comes back through the codec), predicts like a cold prefill within the thresholds the
//! ADR writes down, on Gemma 3 270M and on the seeded hybrid model (whose recurrent state
//! goes through the lossless codec).
//!
//! Measured teacher-forced: at each decoded step the restored model is given the cold
//! run's own tokens so far, and its next-token distribution is compared with the cold one
//! at the same position — the greedy token (top-1 agreement) and KL(cold ‖ restored). A
//! free-running comparison compares different contexts after the first near-tie (Gemma
//! forks at its third token here, then continues the same text a phrase shorter), which
//! says nothing more about the codec; it is printed as well.

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

/// Gemma, over its 32 decoded steps: at least this many greedy tokens as cold, at most
/// this mean and this largest KL(cold ‖ restored) (ADR 0021 has the measured values).
const GEMMA_AGREE: usize = 31;
const GEMMA_MEAN_KL: f64 = 0.02;
const GEMMA_MAX_KL: f64 = 0.1;
/// The hybrid model, over its 16 steps.
const HYBRID_AGREE: usize = 16;
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

/// KL(cold ‖ warm) of one step's next-token distributions.
fn kl(warm: &[f32], cold: &[f32]) -> f64 {
    let (p, q) = (softmax(cold), softmax(warm));
    p.iter()
        .zip(&q)
        .filter(|(p, _)| **p > 0.0)
        .map(|(p, q)| p * (p / q.max(1e-300)).ln())
        .sum()
}

/// Teacher-forced comparison over `steps` positions: `step(k)` runs the restored model on
/// the prompt plus the cold run's first `k` tokens and returns its greedy token and
/// logits. Returns (top-1 agreements, mean KL, largest KL).
fn teacher_forced(
    steps: usize,
    cold_tokens: &[u32],
    cold_logits: &[Vec<f32>],
    mut step: impl FnMut(usize) -> (u32, Vec<f32>),
) -> (usize, f64, f64) {
    let mut agree = 0;
    let mut kls = Vec::new();
    for k in 0..steps {
        let (token, logits) = step(k);
        agree += usize::from(token == cold_tokens[k]);
        kls.push(kl(&logits, &cold_logits[k]));
    }
    let mean = kls.iter().sum::<f64>() / kls.len() as f64;
    (agree, mean, kls.iter().fold(0.0f64, |m, v| m.max(*v)))
}

/// How many leading tokens two decodes share.
fn shared(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
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
    let prompt = fixtures::gemma::turn_two();
    let free = runner.run_turn(&prompt, DECODE).unwrap();
    let restored = fixtures::gemma::turn_one().len() / 16 * 16;
    assert!(free.reused_tokens >= restored, "{}", free.reused_tokens);
    let (fp8_bytes, hits) = ssd_fp8_bytes(&engine);
    assert!(
        fp8_bytes > 0 && hits > 0,
        "the prefix did not come through fp8"
    );
    let cold = fixtures::gemma::cold_turn_two();
    // Lossy for real: not bit-identical to cold.
    assert!(logits_difference(&free.logits, &cold.logits).is_some());
    let (agree, mean, max) = teacher_forced(DECODE, &cold.tokens, &cold.logits, |k| {
        let mut p = prompt.clone();
        p.extend(&cold.tokens[..k]);
        let r = runner.run_turn(&p, 1).unwrap();
        assert!(r.reused_tokens >= restored);
        (r.tokens[0], r.logits[0].clone())
    });
    println!(
        "gemma fp8 gate: teacher-forced {agree}/{DECODE} greedy tokens, KL mean {mean:.6}, max {max:.6}; free-running the same for {} tokens",
        shared(&free.tokens, &cold.tokens)
    );
    assert!(agree >= GEMMA_AGREE, "{agree}/{DECODE} greedy tokens agree");
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
    let steps = fixtures::hybrid::DECODE;
    assert!(logits_difference(&warm.logits, &cold.logits).is_some());
    let (agree, mean, max) = teacher_forced(steps, &cold.tokens, &cold.logits, |k| {
        let mut p = fixtures::diverging();
        p.extend(&cold.tokens[..k]);
        let t = r.run_turn(&p, 1).unwrap();
        assert_eq!(t.reused_tokens, 128);
        (t.tokens[0], t.logits[0].clone())
    });
    println!(
        "hybrid fp8 gate: teacher-forced {agree}/{steps} greedy tokens, KL mean {mean:.6}, max {max:.6}; free-running the same for {} tokens",
        shared(&warm.tokens, &cold.tokens)
    );
    assert!(agree >= HYBRID_AGREE, "{agree}/{steps} greedy tokens agree");
    assert!(
        mean <= HYBRID_MEAN_KL && max <= HYBRID_MAX_KL,
        "KL mean {mean}, max {max}"
    );
}
