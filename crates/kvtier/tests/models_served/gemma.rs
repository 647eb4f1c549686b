//! Gemma 3 270M through `kvtier serve`: turn 2 restores turn 1's KV blocks over HTTP and,
//! after the server restarts on the same directory, from its SSD tier.

use std::sync::{Arc, OnceLock};

use kvtier_candle::conversation::{
    DECODE, gemma_cold_turn_two, gemma_turn_one, gemma_turn_two, gemma_weights, logits_difference,
    ssd_settings,
};
use kvtier_candle::gemma::GemmaWeights;
use kvtier_candle::reuse::{Backend, GemmaRunner, TurnReport};
use kvtier_node::Settings;
use kvtier_server::LocalServer;

fn weights() -> Arc<GemmaWeights> {
    static W: OnceLock<Arc<GemmaWeights>> = OnceLock::new();
    W.get_or_init(|| gemma_weights().expect("the Gemma weights (scripts/setup.sh installs them)"))
        .clone()
}

/// Turn 1's prompt, longer than the 512-token sliding window.
fn turn_one() -> Vec<u32> {
    let p = gemma_turn_one(&weights());
    assert!(p.len() > 560, "turn one is {} tokens", p.len());
    p
}

/// Turn 2's prompt: turn 1, an answer and a new question.
fn turn_two() -> Vec<u32> {
    gemma_turn_two(&weights())
}

/// Turn 2 computed from nothing, with no cache at all: the reference.
fn cold_turn_two() -> &'static TurnReport {
    static COLD: OnceLock<TurnReport> = OnceLock::new();
    COLD.get_or_init(|| {
        let r = gemma_cold_turn_two(&weights()).unwrap();
        assert_eq!(r.reused_tokens, 0);
        r
    })
}

fn assert_same_decode(warm: &TurnReport, cold: &TurnReport) {
    assert_eq!(warm.tokens, cold.tokens, "decoded tokens differ");
    assert_eq!(warm.logits.len(), DECODE);
    if let Some(difference) = logits_difference(&warm.logits, &cold.logits) {
        panic!("{difference}");
    }
}

/// Server settings on `dir`: the SSD tier on, a small RAM, no free-space watermark (the
/// test machine's disk may be nearly full).
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
        Arc::new(Backend::served(&server.url(), None).unwrap()),
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
        Arc::new(Backend::served(&server.url(), None).unwrap()),
    )
    .unwrap();
    runner.store = false;
    let counters = runner.backend().counters().unwrap();
    assert_eq!(counters.get("ram_resident_blocks").copied().unwrap_or(0), 0);
    let again = runner.run_turn(&turn_two(), DECODE).unwrap();
    assert!(again.reused_tokens >= turn_one().len() / 16 * 16);
    assert_same_decode(&again, cold_turn_two());
    let counters = runner.backend().counters().unwrap();
    assert!(counters["ssd_hits"] > 0, "{counters:?}");
}
