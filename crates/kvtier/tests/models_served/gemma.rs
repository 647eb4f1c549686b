//! Gemma 3 270M through `kvtier serve`: turn 2 restores turn 1's KV blocks over HTTP and,
//! after the server restarts on the same directory, from its SSD tier.

use std::sync::Arc;

use kvtier_candle::conversation::{DECODE, ssd_settings};
use kvtier_candle::reuse::{Cache, GemmaRunner};
use kvtier_node::Settings;
use kvtier_server::LocalServer;

use crate::fixtures::gemma::{assert_same_decode, cold_turn_two, turn_one, turn_two, weights};

fn settings(dir: &std::path::Path) -> Settings {
    ssd_settings(dir, 256 << 20)
}

#[test]
fn restore_through_the_server_and_after_its_restart_from_ssd() {
    let dir = tempfile::tempdir().unwrap();
    let settings = || settings(dir.path());
    let server = LocalServer::start(settings()).unwrap();
    let runner = GemmaRunner::new(
        weights(),
        Arc::new(Cache::served(&server.url(), None).unwrap()),
    )
    .unwrap();
    runner.run_turn(&turn_one(), DECODE).unwrap();
    let two = runner.run_turn(&turn_two(), DECODE).unwrap();
    assert!(two.reused_tokens >= turn_one().len() / 16 * 16);
    assert_same_decode(&two, cold_turn_two());
    let stopped = server.stop().unwrap();
    assert!(stopped.writer_clean);

    // A new server on the same directory: RAM is empty, the blocks come from the SSD.
    let server = LocalServer::start(settings()).unwrap();
    let mut runner = GemmaRunner::new(
        weights(),
        Arc::new(Cache::served(&server.url(), None).unwrap()),
    )
    .unwrap();
    runner.store = false;
    let counters = runner.backend().stats().unwrap();
    assert_eq!(counters.get("ram_resident_blocks").copied().unwrap_or(0), 0);
    let again = runner.run_turn(&turn_two(), DECODE).unwrap();
    assert!(again.reused_tokens >= turn_one().len() / 16 * 16);
    assert_same_decode(&again, cold_turn_two());
    let counters = runner.backend().stats().unwrap();
    assert!(counters["ssd_hits"] > 0, "{counters:?}");
}
