//! What was stored survives a reopen: every block comes back byte for byte, the engine's
//! index hears of each, and tombstoned blocks stay dead.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

mod common;

use kvtier_core::tier::conformance::Event;
use kvtier_core::tier::{PutOutcome, Tier, TierKind};

#[test]
fn reopen_recovers_every_block_and_reports_it() -> kvtier_core::Result<()> {
    let dir = tempfile::tempdir().expect("temp dir");
    let blocks = common::chain(40, 7); // 40 × 32 KiB: several 256 KiB segments
    {
        let (tier, _) = common::open(dir.path());
        for (meta, payload) in &blocks {
            assert_eq!(tier.put(meta, payload.clone())?, PutOutcome::Stored);
        }
        assert!(tier.remove(&blocks[5].0.hash)?);
    }
    let (tier, sink) = common::open(dir.path());
    let report = tier.recovery_report().clone();
    assert_eq!(report.records, 39, "{report:?}");
    assert_eq!(report.tombstoned, 1);
    assert!(report.segments >= 4, "{report:?}");
    for (i, (meta, payload)) in blocks.iter().enumerate() {
        let got = tier.get(&meta.hash)?;
        if i == 5 {
            assert!(got.is_none(), "a removed block came back");
        } else {
            assert_eq!(
                got.as_ref(),
                Some(payload),
                "block {i} differs after reopen"
            );
        }
    }
    let inserted = sink
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Inserted(TierKind::Ssd, _)))
        .count();
    assert_eq!(inserted, 39, "the index must hear of every recovered block");
    // Layer-sized range reads verify only their chunks and return exactly the bytes.
    let (meta, payload) = &blocks[9];
    let got = tier.get_range(&meta.hash, 8192..16384)?.expect("held");
    assert_eq!(&got[..], &payload[8192..16384]);
    Ok(())
}

#[test]
fn a_second_opener_is_refused_and_told_who_holds_the_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_tier, _) = common::open(dir.path());
    let second = kvtier_ssd::SsdTier::open(
        common::config(dir.path()),
        std::sync::Arc::new(kvtier_core::clock::SystemClock::new()),
        std::sync::Arc::new(kvtier_core::tier::NoSink),
    );
    let err = second.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("in use by another process"), "{err}");
    assert!(
        err.contains(&format!("pid {}", std::process::id())),
        "{err}"
    );
}

#[test]
fn dedup_and_collision_guards() -> kvtier_core::Result<()> {
    let dir = tempfile::tempdir().expect("temp dir");
    let (tier, _) = common::open(dir.path());
    let blocks = common::chain(2, 1);
    let (meta, payload) = &blocks[0];
    assert_eq!(tier.put(meta, payload.clone())?, PutOutcome::Stored);
    assert_eq!(tier.put(meta, payload.clone())?, PutOutcome::Duplicate);
    // Same hash, other tokens: a collision. The hash is quarantined.
    let mut other = meta.clone();
    other.tokens = vec![9u32; 16].into();
    assert_eq!(
        tier.put(&other, payload.clone())?,
        PutOutcome::Rejected(kvtier_core::tier::RejectReason::Collision)
    );
    assert!(tier.is_quarantined(&meta.hash));
    let s = tier.stats();
    assert_eq!((s.stores, s.dedup_skips, s.rejected_collision), (1, 1, 1));
    // The original is still served.
    assert_eq!(tier.get(&meta.hash)?.as_ref(), Some(payload));
    Ok(())
}
