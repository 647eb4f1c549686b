//! The TTL runs across a restart, on the injected clock: a block (or snapshot) stored days
//! before the tier is reopened counts those days, so it expires when its TTL passes since
//! it was stored — not a whole TTL after the restart. Days pass by moving mock clocks
//! (the wall time the records are stamped with, the monotonic time the TTL is measured
//! on); nothing sleeps, and a tier that read the system's clock would fail here.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvtier_core::clock::{MOCK_WALL_START, MockClock};
use kvtier_core::snapshot::SnapshotKey;
use kvtier_core::tier::conformance::{RecordingSink, test_chain};
use kvtier_core::tier::{ResidencySink, SnapshotStore, Tier};
use kvtier_core::{KvDtype, Layout, LayoutKey};
use kvtier_ssd::{SsdConfig, SsdTier};

const DAY: Duration = Duration::from_secs(24 * 3600);

fn open(dir: &std::path::Path, clock: Arc<MockClock>) -> SsdTier {
    let mut config = SsdConfig::new(dir);
    config.ttl = 7 * DAY;
    // The test's tmpfs may be small; free space is not what is tested.
    config.min_free_bytes = 0;
    let sink = Arc::new(RecordingSink::default()) as Arc<dyn ResidencySink>;
    SsdTier::open(config, clock, sink).unwrap()
}

#[test]
fn blocks_stored_before_a_restart_expire_a_ttl_after_they_were_stored() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(LayoutKey::new("ttl", KvDtype::F16, 16, 2, 2, 8)).unwrap();
    let (old, young) = (
        test_chain(&layout, 1, 1).remove(0),
        test_chain(&layout, 1, 2).remove(0),
    );
    let snapshot = SnapshotKey([9; 32]);

    // First run: `old` on day 0; `young` and a snapshot on day 3.
    let first = MockClock::new();
    let tier = open(dir.path(), first.clone());
    tier.put(&old.0, old.1.clone()).unwrap();
    first.advance(3 * DAY);
    tier.put(&young.0, young.1.clone()).unwrap();
    tier.put_snapshot(&snapshot, layout.digest(), &Bytes::from_static(b"state"))
        .unwrap();
    drop(tier);

    // Second run, started on day 8: a fresh process whose monotonic clock starts at zero.
    let second = MockClock::at_wall(MOCK_WALL_START + 8 * DAY);
    let tier = open(dir.path(), second.clone());
    assert!(tier.contains(&old.0.hash) && tier.contains(&young.0.hash));
    let done = tier.enforce().unwrap();
    assert_eq!(
        done.expired, 1,
        "the 8-day-old block goes at once: {done:?}"
    );
    assert!(!tier.contains(&old.0.hash));
    assert!(tier.contains(&young.0.hash));

    // Day 9: `young` is 6 days old and stays, with its snapshot.
    second.advance(DAY);
    assert_eq!(tier.enforce().unwrap().expired, 0);
    assert!(tier.get_snapshot(&snapshot).unwrap().is_some());

    // Day 10 and a second: 7 days since `young` was stored. The snapshot was read on day
    // 9, so it has 6 days left.
    second.advance(DAY + Duration::from_secs(1));
    assert_eq!(tier.enforce().unwrap().expired, 1);
    assert!(!tier.contains(&young.0.hash));
    assert!(tier.get_snapshot(&snapshot).unwrap().is_some());
}

#[test]
fn a_wall_clock_set_back_does_not_expire_anything() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(LayoutKey::new("ttl", KvDtype::F16, 16, 2, 2, 8)).unwrap();
    let block = test_chain(&layout, 1, 3).remove(0);
    let first = MockClock::new();
    let tier = open(dir.path(), first.clone());
    tier.put(&block.0, block.1.clone()).unwrap();
    drop(tier);

    // Restarted with a wall clock a year behind: the record's stamp lies in the future.
    // Its age counts as zero, so it lives a whole TTL from now.
    let second = MockClock::at_wall(MOCK_WALL_START - 365 * DAY);
    let tier = open(dir.path(), second.clone());
    second.advance(7 * DAY - Duration::from_secs(1));
    assert_eq!(tier.enforce().unwrap().expired, 0);
    second.advance(Duration::from_secs(2));
    assert_eq!(tier.enforce().unwrap().expired, 1);
}
