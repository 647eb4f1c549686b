//! Space comes back by whole segments: mostly-dead segments have their live records moved
//! and are deleted; every moved block still reads back exactly, before and after a reopen.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

mod common;

use kvtier_core::tier::Tier;

fn disk_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "seg"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

#[test]
fn mostly_dead_segments_are_rewritten_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = common::chain(28, 11); // 28 × 36 KiB records in 256 KiB segments
    let (tier, _) = common::open(dir.path());
    for (m, p) in &blocks {
        tier.put(m, p.clone()).unwrap();
    }
    // Keep every fourth block.
    for (i, (m, _)) in blocks.iter().enumerate() {
        if i % 4 != 0 {
            assert!(tier.remove(&m.hash).unwrap());
        }
    }
    let before = disk_bytes(dir.path());
    let done = tier.compact(0.5).unwrap();
    assert!(done.segments >= 3, "{done:?}");
    assert!(done.relocated >= 3, "{done:?}");
    assert_eq!(tier.compaction_totals(), (done.segments, done.relocated));
    let after = disk_bytes(dir.path());
    assert!(
        after < before,
        "compaction freed nothing: {before} -> {after}"
    );
    let check = |tier: &kvtier_ssd::SsdTier| {
        for (i, (m, p)) in blocks.iter().enumerate() {
            let got = tier.get(&m.hash).unwrap();
            if i % 4 == 0 {
                assert_eq!(got.as_ref(), Some(p), "moved block {i} differs");
            } else {
                assert!(got.is_none(), "removed block {i} came back");
            }
        }
    };
    check(&tier);
    drop(tier);
    let (tier, _) = common::open(dir.path());
    assert_eq!(tier.recovery_report().records, 7);
    check(&tier);
}
