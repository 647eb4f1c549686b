//! Gemma 3 270M with its KV in kvtier: a restored prefix decodes exactly like a cold
//! prefill (same tokens, bit-identical logits) from RAM and from the SSD after a process
//! restart; blocks of another layout or other weights are never loaded into the model.
//! The same turns through `kvtier serve` are tested in `crates/kvtier/tests/models_served`
//! (this crate does not depend on the server).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod fixtures;

use std::sync::Arc;

use kvtier_candle::conversation::{DECODE, ssd_settings};
use kvtier_candle::reuse::{Cache, GemmaRunner, LoadMode};
use kvtier_core::tier::TierKind;
use kvtier_core::{Engine, KvDtype};
use kvtier_node::Settings;

use fixtures::gemma::{assert_same_decode, cold_turn_two, turn_one, turn_two, weights};

fn embedded_runner() -> (Arc<Engine>, GemmaRunner) {
    let engine = Arc::new(Engine::builder().build().unwrap());
    let runner = GemmaRunner::new(weights(), Arc::new(Cache::embedded(engine.clone()))).unwrap();
    (engine, runner)
}

#[test]
fn restore_from_ram_decodes_bit_identically_and_turn_two_hits() {
    let (engine, mut runner) = embedded_runner();
    let one = runner.run_turn(&turn_one(), DECODE).unwrap();
    assert_eq!(one.reused_tokens, 0);
    assert!(one.blocks_stored >= turn_one().len() / 16);
    let hits_before = engine.stats().index.lookup_hits;
    for mode in [LoadMode::Whole, LoadMode::Layerwise] {
        runner.load_mode = mode;
        let two = runner.run_turn(&turn_two(), DECODE).unwrap();
        // Turn 2 reuses all of turn 1's whole blocks (turn 1's prompt and decoded tokens).
        assert!(
            two.reused_tokens >= turn_one().len() / 16 * 16,
            "{mode:?}: {}",
            two.reused_tokens
        );
        assert!(two.reused_tokens % 16 == 0 && two.reused_tokens < turn_two().len());
        assert_eq!(
            two.bytes_loaded,
            (two.reused_tokens / 16) as u64 * runner.layout().block_bytes()
        );
        assert!(two.refused.is_none(), "{:?}", two.refused);
        assert_same_decode(&two, cold_turn_two());
    }
    assert!(engine.stats().index.lookup_hits >= hits_before + 2);
}

/// Embedded SSD settings on `dir`: the SSD tier on, a small RAM, no free-space
/// watermark (the test machine's disk may be nearly full).
fn settings(dir: &std::path::Path) -> Settings {
    ssd_settings(dir, 256 << 20)
}

/// An engine with RAM and the SSD tier on `dir`, as `kvtier serve` builds it.
fn ssd_engine(dir: &std::path::Path) -> Arc<Engine> {
    kvtier_node::Node::open(settings(dir))
        .unwrap()
        .engine
        .clone()
}

const CHILD_DIR: &str = "KVTIER_TEST_TURN_ONE_DIR";

/// Not a test: the first process of `restore_from_ssd_after_a_process_restart`, run by it
/// in a child process. Runs turn 1 on an SSD-backed engine and shuts the engine down.
#[test]
#[ignore = "run by restore_from_ssd_after_a_process_restart in a child process"]
fn turn_one_in_a_child_process() {
    let dir = std::env::var(CHILD_DIR).expect("only run as a child");
    let engine = ssd_engine(std::path::Path::new(&dir));
    let runner = GemmaRunner::new(weights(), Arc::new(Cache::embedded(engine.clone()))).unwrap();
    let one = runner.run_turn(&turn_one(), DECODE).unwrap();
    assert!(one.blocks_stored > 0);
    let shutdown = engine.shutdown(std::time::Duration::from_secs(60)).unwrap();
    assert!(shutdown.clean, "{shutdown:?}");
}

#[test]
fn restore_from_ssd_after_a_process_restart() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::child::run_ignored_test("turn_one_in_a_child_process", CHILD_DIR, dir.path());
    // This process never computed turn 1: whatever is reused comes from the SSD.
    let engine = ssd_engine(dir.path());
    assert_eq!(engine.stats().ram.resident_blocks, 0);
    let mut runner =
        GemmaRunner::new(weights(), Arc::new(Cache::embedded(engine.clone()))).unwrap();
    runner.store = false;
    let two = runner.run_turn(&turn_two(), DECODE).unwrap();
    assert!(
        two.reused_tokens >= turn_one().len() / 16 * 16,
        "{}",
        two.reused_tokens
    );
    assert!(
        engine
            .stats()
            .tier(TierKind::Ssd)
            .map(|s| s.hits)
            .unwrap_or(0)
            > 0
    );
    assert_same_decode(&two, cold_turn_two());
}

#[test]
fn blocks_of_another_layout_or_other_weights_are_never_loaded() {
    let (engine, runner) = embedded_runner();
    let backend = runner.backend().clone();
    let own = GemmaRunner::layout_key(&weights());
    // Turn 1 stored under three foreign layouts: 32 tokens per block, other weights, f16.
    let mut bigger = own.clone();
    bigger.tokens_per_block = 32;
    let foreign = GemmaRunner::with_layout(weights(), backend.clone(), bigger).unwrap();
    foreign.run_turn(&turn_one(), 1).unwrap();
    let mut other_weights = own.clone();
    other_weights.weights_digest = "0".repeat(64);
    let foreign = GemmaRunner::with_layout(weights(), backend.clone(), other_weights).unwrap();
    foreign.run_turn(&turn_one(), 1).unwrap();
    let mut half = own.clone();
    half.dtype = KvDtype::F16;
    assert!(GemmaRunner::with_layout(weights(), backend.clone(), half.clone()).is_err());
    // f16 bytes stored straight into the engine under the f16 layout.
    let layout = engine.register_layout(half).unwrap();
    let tokens = turn_two();
    let prompt = engine
        .prompt(layout.digest(), &tokens, &kvtier_core::ExtraKeys::none())
        .unwrap();
    let payload = vec![0u8; layout.block_bytes() as usize];
    let blocks: Vec<&[u8]> = (0..prompt.num_blocks())
        .map(|_| payload.as_slice())
        .collect();
    engine.store(&prompt, &blocks).unwrap();
    assert!(engine.index().len() > 3 * (tokens.len() / 32));

    let mut runner = runner;
    runner.store = false;
    let two = runner.run_turn(&turn_two(), DECODE).unwrap();
    assert_eq!(two.reused_tokens, 0);
    assert_eq!(two.bytes_loaded, 0);
    assert_same_decode(&two, cold_turn_two());
}
