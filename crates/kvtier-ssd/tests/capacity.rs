//! Budgets and TTL on the SSD tier, with a mock clock: a namespace never holds more than
//! its budget, the least recently used blocks go first, the store's total capacity holds
//! across namespaces, and blocks past their TTL are dropped by a maintenance pass.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

use std::sync::Arc;
use std::time::Duration;

use kvtier_core::clock::MockClock;
use kvtier_core::tier::conformance::{Event, RecordingSink, test_chain};
use kvtier_core::tier::{PutOutcome, RejectReason, RemovalCause, ResidencySink, Tier, TierKind};
use kvtier_core::{KvDtype, Layout, LayoutKey};
use kvtier_ssd::{SsdConfig, SsdTier};

const BLOCK: u64 = 32 << 10;

fn layout(name: &str) -> Layout {
    Layout::new(LayoutKey::new(name, KvDtype::F16, 16, 4, 2, 64)).unwrap() // 32 KiB blocks
}

fn tier(
    dir: &std::path::Path,
    edit: impl FnOnce(&mut SsdConfig),
) -> (SsdTier, Arc<MockClock>, Arc<RecordingSink>) {
    let mut config = SsdConfig::new(dir);
    config.store.segment_bytes = 1 << 20;
    edit(&mut config);
    let clock = MockClock::new();
    let sink = Arc::new(RecordingSink::default());
    let t = SsdTier::open(
        config,
        clock.clone(),
        sink.clone() as Arc<dyn ResidencySink>,
    )
    .unwrap();
    (t, clock, sink)
}

/// Independent first blocks (no chains needed on the SSD tier).
fn blocks(l: &Layout, n: usize, seed: u32) -> Vec<(kvtier_core::tier::BlockMeta, bytes::Bytes)> {
    (0..n)
        .map(|i| test_chain(l, 1, seed * 1000 + i as u32).remove(0))
        .collect()
}

#[test]
fn a_namespace_never_exceeds_its_budget_and_lru_goes_first() {
    let dir = tempfile::tempdir().unwrap();
    let a = layout("a");
    let (t, clock, _) = tier(dir.path(), |c| {
        c.namespace_overrides.insert(a.digest(), 4 * BLOCK);
    });
    let bs = blocks(&a, 10, 1);
    for (i, (m, p)) in bs.iter().enumerate() {
        clock.advance(Duration::from_secs(1));
        assert_eq!(t.put(m, p.clone()).unwrap(), PutOutcome::Stored);
        assert!(
            t.namespace_bytes(&a.digest()) <= 4 * BLOCK,
            "budget exceeded after block {i}"
        );
        if i == 2 {
            // Read block 0: it is now more recent than 1 and 2.
            clock.advance(Duration::from_secs(1));
            assert!(t.get(&bs[0].0.hash).unwrap().is_some());
        }
        if i == 5 {
            // Blocks 4 and 5 each needed room: 1 and 2 went, not the recently read 0.
            assert!(
                t.contains(&bs[0].0.hash),
                "the recently read block was evicted"
            );
            assert!(
                !t.contains(&bs[1].0.hash) && !t.contains(&bs[2].0.hash),
                "older blocks stayed"
            );
        }
    }
    assert!(t.contains(&bs[9].0.hash));
    assert!(t.stats().evictions.budget >= 6);
    // A block larger than the whole budget is refused.
    let big = Layout::new(LayoutKey::new("a-big", KvDtype::F16, 16, 40, 2, 64)).unwrap();
    let (t2, _, _) = tier(tempfile::tempdir().unwrap().path(), |c| {
        c.namespace_bytes = Some(4 * BLOCK)
    });
    let (m, p) = test_chain(&big, 1, 5).remove(0);
    assert_eq!(
        t2.put(&m, p).unwrap(),
        PutOutcome::Rejected(RejectReason::NoSpace)
    );
}

#[test]
fn the_store_capacity_holds_across_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    let (t, clock, _) = tier(dir.path(), |c| c.capacity_bytes = 6 * BLOCK);
    let (a, b) = (layout("a"), layout("b"));
    for ((ma, pa), (mb, pb)) in blocks(&a, 8, 1).into_iter().zip(blocks(&b, 8, 2)) {
        clock.advance(Duration::from_secs(1));
        t.put(&ma, pa).unwrap();
        t.put(&mb, pb).unwrap();
        assert!(t.stats().resident_bytes <= 6 * BLOCK);
    }
    assert!(t.namespace_bytes(&a.digest()) > 0 && t.namespace_bytes(&b.digest()) > 0);
}

#[test]
fn blocks_past_their_ttl_are_dropped_by_maintenance() {
    let dir = tempfile::tempdir().unwrap();
    let (t, clock, sink) = tier(dir.path(), |_| {});
    let a = layout("a");
    let bs = blocks(&a, 3, 1);
    for (m, p) in &bs[..2] {
        t.put(m, p.clone()).unwrap();
    }
    clock.advance(Duration::from_secs(6 * 24 * 3600));
    t.put(&bs[2].0, bs[2].1.clone()).unwrap();
    t.get(&bs[0].0.hash).unwrap(); // read: block 0 is fresh again
    clock.advance(Duration::from_secs(24 * 3600 + 1));
    let done = t.enforce().unwrap();
    assert_eq!(done.expired, 1, "only block 1 went 7 days untouched");
    assert!(!t.contains(&bs[1].0.hash));
    assert!(t.contains(&bs[0].0.hash) && t.contains(&bs[2].0.hash));
    assert!(sink.events().contains(&Event::Removed(
        TierKind::Ssd,
        bs[1].0.hash,
        RemovalCause::Ttl
    )));
    assert_eq!(t.stats().evictions.ttl, 1);
    // The drop is durable: after a reopen block 1 is still gone.
    drop(t);
    let (t, _, _) = tier(dir.path(), |_| {});
    assert!(!t.contains(&bs[1].0.hash) && t.contains(&bs[0].0.hash));
}
