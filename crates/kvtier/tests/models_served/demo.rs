//! `kvtier demo`'s engine on a tiny workload: every phase runs (the served one through the
//! binary's own launcher), every phase decodes what the cold phase decoded, warm phases
//! reuse, and the chart is a PNG.

use std::sync::Arc;

use kvtier_candle::demo::{DemoOptions, Workload, run};

use crate::loopback::InProcess;

#[test]
fn a_small_demo_runs_every_phase_with_identical_decodes() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("chart.png");
    let opts = DemoOptions {
        dir: dir.path().join("work"),
        workload: Workload {
            conversations: 2,
            turns: 2,
            system_words: 40,
            decode: 4,
        },
        chart: Some(chart.clone()),
        // The restarted phase has its own test in kvtier-candle:
        // gemma_reuse::restore_from_ssd_after_a_process_restart.
        restart_command: None,
        serve: Some(Arc::new(InProcess)),
    };
    let report = run(&opts).unwrap();
    let phases: Vec<(&str, &str)> = report
        .rows
        .iter()
        .map(|r| (r.model.as_str(), r.phase.as_str()))
        .collect();
    assert_eq!(
        phases,
        [
            ("gemma", "cold"),
            ("gemma", "RAM"),
            ("gemma", "kvtier serve"),
            ("mamba", "cold"),
            ("mamba", "RAM"),
            ("mamba", "kvtier serve"),
        ]
    );
    for r in &report.rows {
        assert_eq!(r.same_as_cold, 4, "{} {}", r.model, r.phase);
        if r.phase == "cold" {
            assert_eq!(r.turns_hit.0, 0);
        } else {
            // Gemma: the second conversation reuses the shared system prompt, second
            // turns reuse the first; Mamba: second turns restore the first's state.
            assert!(
                r.turns_hit.0 >= 2,
                "{} {}: {:?}",
                r.model,
                r.phase,
                r.turns_hit
            );
            assert!(r.bytes_loaded > 0 && r.bytes_stored > 0);
        }
    }
    let png = std::fs::read(&chart).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}
