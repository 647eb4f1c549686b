//! Mamba through `kvtier serve`: turn 2 restores turn 1's state snapshot over HTTP and,
//! after the server restarts on the same directory, from its SSD tier.

use std::sync::Arc;

use kvtier_candle::conversation::{DECODE, ssd_settings};
use kvtier_candle::reuse::{Cache, MambaRunner};
use kvtier_server::LocalServer;

use crate::fixtures::mamba::{assert_same_decode, cold, model, turn_two, two_turns};

#[test]
fn turn_two_restores_through_the_server_and_after_its_restart() {
    let dir = tempfile::tempdir().unwrap();
    let settings = || ssd_settings(dir.path(), 64 << 20);
    let server = LocalServer::start(settings()).unwrap();
    let runner = MambaRunner::new(
        model(),
        Arc::new(Cache::served(&server.url(), None).unwrap()),
    )
    .unwrap();
    let (one, two) = two_turns(&runner);
    assert_eq!(two.reused_tokens, one.snapshot_tokens);
    assert_same_decode(&two, &cold().1);
    assert!(server.stop().unwrap().writer_clean);

    let server = LocalServer::start(settings()).unwrap();
    let mut runner = MambaRunner::new(
        model(),
        Arc::new(Cache::served(&server.url(), None).unwrap()),
    )
    .unwrap();
    runner.store = false;
    let again = runner
        .run_turn(&turn_two(&one), DECODE, &[one.snapshot_tokens])
        .unwrap();
    assert_eq!(again.reused_tokens, one.snapshot_tokens);
    assert_same_decode(&again, &cold().1);
    let counters = runner.backend().stats().unwrap();
    assert_eq!(
        counters["snapshot_hits"], 0,
        "RAM was empty after the restart: {counters:?}"
    );
}
