//! Mamba through `kvtier serve`: turn 2 restores turn 1's state snapshot over HTTP and,
//! after the server restarts on the same directory, from its SSD tier.

use std::sync::{Arc, OnceLock};

use kvtier_candle::conversation::{
    DECODE, MAMBA_SEED, logits_difference, mamba_cold, mamba_model, mamba_turn_one, mamba_turn_two,
    ssd_settings,
};
use kvtier_candle::mamba::MambaModel;
use kvtier_candle::reuse::{Backend, MambaRunner, MambaTurn};
use kvtier_server::LocalServer;

fn model() -> Arc<MambaModel> {
    static M: OnceLock<Arc<MambaModel>> = OnceLock::new();
    M.get_or_init(|| mamba_model(MAMBA_SEED).unwrap()).clone()
}

fn turn_one() -> Vec<u32> {
    mamba_turn_one()
}

/// Turn 2: turn 1, every token turn 1 decoded, and a new question.
fn turn_two(one: &MambaTurn) -> Vec<u32> {
    mamba_turn_two(&one.tokens)
}

/// Turn 1 and turn 2 computed from nothing, with no cache: the reference.
fn cold() -> &'static (MambaTurn, MambaTurn) {
    static COLD: OnceLock<(MambaTurn, MambaTurn)> = OnceLock::new();
    COLD.get_or_init(|| mamba_cold(&model()).unwrap())
}

fn assert_same_decode(warm: &MambaTurn, cold: &MambaTurn) {
    assert_eq!(warm.tokens, cold.tokens, "decoded tokens differ");
    assert_eq!(warm.logits.len(), DECODE);
    if let Some(difference) = logits_difference(&warm.logits, &cold.logits) {
        panic!("{difference}");
    }
}

/// Runs turn 1 then turn 2 (with turn 1's end as the hint) on `runner`.
fn two_turns(runner: &MambaRunner) -> (MambaTurn, MambaTurn) {
    let one = runner.run_turn(&turn_one(), DECODE, &[]).unwrap();
    assert_eq!(one.reused_tokens, 0);
    assert_eq!(one.snapshot_tokens, turn_one().len() + DECODE - 1);
    let two = runner
        .run_turn(&turn_two(&one), DECODE, &[one.snapshot_tokens])
        .unwrap();
    (one, two)
}

#[test]
fn turn_two_restores_through_the_server_and_after_its_restart() {
    let dir = tempfile::tempdir().unwrap();
    let settings = || ssd_settings(dir.path(), 64 << 20);
    let server = LocalServer::start(settings()).unwrap();
    let runner = MambaRunner::new(
        model(),
        Arc::new(Backend::served(&server.url(), None).unwrap()),
    )
    .unwrap();
    let (one, two) = two_turns(&runner);
    assert_eq!(two.reused_tokens, one.snapshot_tokens);
    assert_same_decode(&two, &cold().1);
    assert!(server.stop().unwrap().writer_clean);

    let server = LocalServer::start(settings()).unwrap();
    let mut runner = MambaRunner::new(
        model(),
        Arc::new(Backend::served(&server.url(), None).unwrap()),
    )
    .unwrap();
    runner.store = false;
    let again = runner
        .run_turn(&turn_two(&one), DECODE, &[one.snapshot_tokens])
        .unwrap();
    assert_eq!(again.reused_tokens, one.snapshot_tokens);
    assert_same_decode(&again, &cold().1);
    let counters = runner.backend().counters().unwrap();
    assert_eq!(
        counters["snapshot_hits"], 0,
        "RAM was empty after the restart: {counters:?}"
    );
}
