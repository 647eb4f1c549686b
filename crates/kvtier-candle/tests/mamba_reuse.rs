//! Mamba with its recurrent state in kvtier's snapshot bucket: a turn whose prompt starts
//! with exactly an earlier turn's tokens restores that state and decodes exactly like a
//! cold run (same tokens, bit-identical logits), from RAM and from the SSD in a new
//! process. A snapshot is never used for any other prefix, model or weights. The same
//! turns through `kvtier serve` (and after it restarts) are tested in
//! `crates/kvtier/tests/models_served` (this crate does not depend on the server).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod fixtures;

use std::sync::Arc;

use kvtier_candle::conversation::{DECODE, mamba_model};
use kvtier_candle::mamba::MambaModel;
use kvtier_candle::reuse::{Cache, MambaRunner};
use kvtier_core::Engine;
use kvtier_node::Settings;

use fixtures::mamba::{assert_same_decode, cold, model, turn_one, turn_two, two_turns};

fn model_with_seed(seed: u64) -> Arc<MambaModel> {
    mamba_model(seed).unwrap()
}

#[test]
fn turn_two_restores_the_snapshot_from_ram_bit_identically() {
    let engine = Arc::new(Engine::builder().build().unwrap());
    let runner = MambaRunner::new(model(), Arc::new(Cache::embedded(engine.clone()))).unwrap();
    let (one, two) = two_turns(&runner);
    assert_same_decode(&one, &cold().0);
    assert_eq!(two.reused_tokens, one.snapshot_tokens);
    assert!(two.bytes_loaded > 0 && two.refused.is_none());
    assert_same_decode(&two, &cold().1);
    let stats = engine.stats().snapshot;
    assert_eq!(stats.hits, 1);
    assert_eq!(stats.stores, 2);
    assert!(stats.resident_bytes >= 2 * two.bytes_loaded);
    // A hint one token short or one token long names no snapshot: nothing is restored.
    let mut runner = runner;
    runner.store = false;
    for hint in [one.snapshot_tokens - 1, one.snapshot_tokens + 1] {
        let other = runner.run_turn(&turn_two(&one), DECODE, &[hint]).unwrap();
        assert_eq!(other.reused_tokens, 0, "hint {hint}");
        assert_same_decode(&other, &cold().1);
    }
}

const CHILD_DIR: &str = "KVTIER_TEST_MAMBA_TURN_ONE_DIR";

fn ssd_settings(dir: &std::path::Path) -> Settings {
    kvtier_candle::conversation::ssd_settings(dir, 64 << 20)
}

/// Not a test: the first process of `turn_two_restores_from_ssd_after_a_process_restart`.
#[test]
#[ignore = "run by turn_two_restores_from_ssd_after_a_process_restart in a child process"]
fn mamba_turn_one_in_a_child_process() {
    let dir = std::env::var(CHILD_DIR).expect("only run as a child");
    let app = kvtier_node::Node::open(ssd_settings(std::path::Path::new(&dir))).unwrap();
    let runner = MambaRunner::new(model(), Arc::new(Cache::embedded(app.engine.clone()))).unwrap();
    let one = runner.run_turn(&turn_one(), DECODE, &[]).unwrap();
    assert!(one.bytes_stored > 0);
    let shutdown = app
        .engine
        .shutdown(std::time::Duration::from_secs(60))
        .unwrap();
    assert!(shutdown.clean, "{shutdown:?}");
}

#[test]
fn turn_two_restores_from_ssd_after_a_process_restart() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::child::run_ignored_test("mamba_turn_one_in_a_child_process", CHILD_DIR, dir.path());
    let app = kvtier_node::Node::open(ssd_settings(dir.path())).unwrap();
    assert_eq!(app.engine.stats().snapshot.resident_entries, 0);
    let mut runner =
        MambaRunner::new(model(), Arc::new(Cache::embedded(app.engine.clone()))).unwrap();
    runner.store = false;
    let hint = turn_one().len() + DECODE - 1;
    let two = runner
        .run_turn(&turn_two(&cold().0), DECODE, &[hint])
        .unwrap();
    assert_eq!(two.reused_tokens, hint);
    assert_same_decode(&two, &cold().1);
}

#[test]
fn snapshots_of_other_weights_or_a_damaged_blob_are_never_restored() {
    let engine = Arc::new(Engine::builder().build().unwrap());
    let backend = Arc::new(Cache::embedded(engine.clone()));
    // The same shape with other weights: its own layout, so its snapshot is invisible.
    let other = MambaRunner::new(model_with_seed(8), backend.clone()).unwrap();
    let one = other.run_turn(&turn_one(), DECODE, &[]).unwrap();
    let mut runner = MambaRunner::new(model(), backend.clone()).unwrap();
    runner.store = false;
    let two = runner
        .run_turn(&turn_two(&cold().0), DECODE, &[one.snapshot_tokens])
        .unwrap();
    assert_eq!(two.reused_tokens, 0);
    assert_same_decode(&two, &cold().1);

    // A blob of the wrong size is refused by kvtier itself (the layout names the state's
    // size); one of the right size that is not a state is refused by the model, and the
    // turn computes.
    let layout = engine
        .register_layout(MambaRunner::layout_key(&model()))
        .unwrap();
    // What turn 1 consumed: its prompt and all but the last decoded token.
    let consumed: Vec<u32> = turn_two(&cold().0)[..turn_one().len() + DECODE - 1].to_vec();
    assert!(
        engine
            .snapshot_put(layout.digest(), &consumed, None, b"KVMS not a state")
            .is_err()
    );
    let not_a_state = vec![0u8; kvtier_candle::mamba::state_len(model().config())];
    engine
        .snapshot_put(layout.digest(), &consumed, None, &not_a_state)
        .unwrap();
    let three = runner
        .run_turn(&turn_two(&cold().0), DECODE, &[consumed.len()])
        .unwrap();
    assert_eq!(three.reused_tokens, 0);
    assert!(three.refused.is_some());
    assert_same_decode(&three, &cold().1);
}
