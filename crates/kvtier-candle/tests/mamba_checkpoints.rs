//! Mamba with periodic checkpoints (issue 16): a prompt that diverges mid-way from a
//! cached one restores the deepest checkpoint before the divergence and replays only the
//! rest, and decodes exactly like a cold run (same tokens, bit-identical logits) — from
//! RAM, and from the SSD in a new process. A checkpoint that is not the model's state at
//! its boundary is refused and the turn computes from nothing.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod fixtures;

use std::sync::Arc;

use kvtier_candle::conversation::{DECODE, ssd_settings};
use kvtier_candle::reuse::{Cache, MambaRunner, MambaTurn};
use kvtier_core::{Engine, ExtraKeys};

use fixtures::mamba::{assert_same_decode, model};
use fixtures::{cached, diverging};

const EVERY: usize = 64;

/// `prompt` computed from nothing, with no cache.
fn cold(prompt: &[u32]) -> MambaTurn {
    let engine = Arc::new(Engine::builder().build().unwrap());
    let mut runner = MambaRunner::new(model(), Arc::new(Cache::embedded(engine))).unwrap();
    runner.store = false;
    runner.run_turn(prompt, DECODE, &[]).unwrap()
}

fn runner(engine: &Arc<Engine>) -> MambaRunner {
    MambaRunner::new(model(), Arc::new(Cache::embedded(engine.clone())))
        .unwrap()
        .with_checkpoints(EVERY)
        .unwrap()
}

#[test]
fn a_prompt_diverging_at_150_restores_the_128_token_checkpoint_from_ram() {
    let engine = Arc::new(Engine::builder().build().unwrap());
    let runner = runner(&engine);
    let first = runner.run_turn(&cached(), DECODE, &[]).unwrap();
    assert_eq!(first.reused_tokens, 0);
    assert_eq!(first.checkpoints_stored, 3, "at 64, 128 and 192 tokens");
    assert_same_decode(&first, &cold(&cached()));

    let second = runner.run_turn(&diverging(), DECODE, &[]).unwrap();
    assert!(second.from_checkpoint && second.refused.is_none());
    assert_eq!(second.reused_tokens, 128, "22 shared tokens are replayed");
    assert_same_decode(&second, &cold(&diverging()));
    let stats = engine.stats();
    assert_eq!(stats.checkpoint.hits, 1);
    assert_eq!(stats.state.hits, 1);
    // It read tokens 129..190 only: no checkpoint boundary (192 is past its end).
    assert_eq!(second.checkpoints_stored, 0);
}

#[test]
fn a_checkpoint_that_is_not_the_state_at_its_boundary_is_refused() {
    let engine = Arc::new(Engine::builder().build().unwrap());
    let layout = engine
        .register_layout(MambaRunner::layout_key(&model()))
        .unwrap();
    // The state after 64 tokens of another prompt, filed under the cached prompt's
    // 128-token boundary: the size is right, the position inside is not.
    let other: Vec<u32> = (0..64u32).map(|i| (i * 7 + 3) % 200).collect();
    let other_turn = runner(&engine).run_turn(&other, 1, &[]).unwrap();
    assert_eq!(other_turn.checkpoints_stored, 1);
    let p = engine
        .prompt(layout.digest(), &other, &ExtraKeys::none())
        .unwrap();
    let hit = engine.lookup(&p);
    let wrong = engine.restore(&hit).unwrap().state.unwrap();
    let q = engine
        .prompt(layout.digest(), &cached(), &ExtraKeys::none())
        .unwrap();
    engine.checkpoint_put(&q, 8, &wrong).unwrap();
    let mut reader = runner(&engine);
    reader.store = false;
    let turn = reader.run_turn(&diverging(), DECODE, &[]).unwrap();
    assert_eq!(turn.reused_tokens, 0);
    assert!(
        turn.refused
            .as_deref()
            .is_some_and(|r| r.contains("says it is at 64")),
        "{:?}",
        turn.refused
    );
    assert_same_decode(&turn, &cold(&diverging()));
}

const CHILD_DIR: &str = "KVTIER_TEST_MAMBA_CHECKPOINT_DIR";

/// Not a test: the first process of `checkpoints_restore_from_ssd_after_a_process_restart`.
#[test]
#[ignore = "run by checkpoints_restore_from_ssd_after_a_process_restart in a child process"]
fn mamba_checkpoints_in_a_child_process() {
    let dir = std::env::var(CHILD_DIR).expect("only run as a child");
    let node = kvtier_node::Node::open(ssd_settings(std::path::Path::new(&dir), 64 << 20)).unwrap();
    let turn = runner(&node.engine)
        .run_turn(&cached(), DECODE, &[])
        .unwrap();
    assert_eq!(turn.checkpoints_stored, 3);
    let shutdown = node
        .engine
        .shutdown(std::time::Duration::from_secs(60))
        .unwrap();
    assert!(shutdown.clean, "{shutdown:?}");
}

#[test]
fn checkpoints_restore_from_ssd_after_a_process_restart() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::child::run_ignored_test(
        "mamba_checkpoints_in_a_child_process",
        CHILD_DIR,
        dir.path(),
    );
    let node = kvtier_node::Node::open(ssd_settings(dir.path(), 64 << 20)).unwrap();
    assert_eq!(node.engine.stats().checkpoint.resident_entries, 0);
    let mut runner = runner(&node.engine);
    runner.store = false;
    let turn = runner.run_turn(&diverging(), DECODE, &[]).unwrap();
    assert_eq!(turn.reused_tokens, 128);
    assert!(turn.from_checkpoint);
    assert_same_decode(&turn, &cold(&diverging()));
}
