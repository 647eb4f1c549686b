//! The node's clock reaches its tiers: a node assembled with a mock clock set to a date
//! long past stamps its SSD records with that date, not the system's.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::sync::Arc;
use std::time::Duration;

use kvtier_core::clock::{Clock, MockClock};
use kvtier_core::{Ack, ExtraKeys, KvDtype, LayoutKey, StoreOptions};
use kvtier_node::units::ByteSize;
use kvtier_node::{Components, Node, Settings};
use kvtier_ssd::SegmentStore;

/// 2001-09-09 01:46:40 UTC: no system clock reads this today.
const LONG_AGO: Duration = Duration::from_secs(1_000_000_000);

#[test]
fn ssd_records_carry_the_injected_wall_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings {
        data_dir: dir.path().to_path_buf(),
        ..Settings::default()
    };
    settings.ssd.enabled = true;
    settings.ssd.min_free = ByteSize(0);
    let clock = MockClock::at_wall(LONG_AGO);
    let components = Components {
        clock: clock.clone() as Arc<dyn Clock>,
        ..Components::default()
    };
    let node = Node::open_with(settings.clone(), components).unwrap();
    assert_eq!(node.clock().wall_unix_nanos(), clock.wall_unix_nanos());

    let engine = &node.engine;
    let layout = engine
        .register_layout(LayoutKey::new("clock", KvDtype::F16, 16, 2, 2, 8))
        .unwrap();
    let tokens: Vec<u32> = (0..32).collect();
    let prompt = engine
        .prompt(layout.digest(), &tokens, &ExtraKeys::none())
        .unwrap();
    let kv = vec![3u8; layout.block_bytes() as usize];
    let options = StoreOptions {
        ack: Some(Ack::Written),
        ..StoreOptions::default()
    };
    engine.store_with(&prompt, &[&kv, &kv], options).unwrap();
    engine.shutdown(Duration::from_secs(10));
    drop(node);

    let (_store, records, _) = SegmentStore::open_read_only(&settings.ssd_dir()).unwrap();
    assert_eq!(records.len(), 2);
    let at = LONG_AGO.as_millis() as u64;
    for r in &records {
        assert!(
            (at..at + 1_000).contains(&r.header.created_ms),
            "stamped {} ms, the clock said {at} ms",
            r.header.created_ms
        );
    }
}
