//! The snapshot bucket: exact match only, its own caps and TTL on an injected clock, its
//! bytes counted in the engine's memory, its own counters.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod common;

use std::time::Duration;

use kvtier_core::clock::MockClock;
use kvtier_core::snapshot::{SnapshotConfig, SnapshotPut};
use kvtier_core::tier::RamConfig;
use kvtier_core::{Engine, KvDtype, LayoutKey};

fn engine(
    clock: std::sync::Arc<MockClock>,
    config: SnapshotConfig,
    ram: u64,
) -> Result<Engine, kvtier_core::Error> {
    Engine::builder()
        .ram(RamConfig {
            capacity_bytes: ram,
        })
        .snapshot(config)
        .clock(clock)
        .build()
}

#[test]
fn only_the_exact_prompt_session_and_layout_hit() -> Result<(), kvtier_core::Error> {
    let e = engine(MockClock::new(), SnapshotConfig::default(), 1 << 30)?;
    let mamba = e.register_layout(LayoutKey::new("mamba", KvDtype::F32, 16, 24, 1, 16))?;
    let other = e.register_layout(LayoutKey::new("mamba-2", KvDtype::F32, 16, 24, 1, 16))?;
    let prompt: Vec<u32> = (0..100).collect();
    assert_eq!(
        e.snapshot_put(mamba.digest(), &prompt, Some(b"s1"), b"state-A")?,
        SnapshotPut::Stored
    );
    assert_eq!(
        e.snapshot_get(mamba.digest(), &prompt, Some(b"s1"))?
            .as_deref(),
        Some(&b"state-A"[..])
    );
    for (what, hit) in [
        (
            "a prefix",
            e.snapshot_get(mamba.digest(), &prompt[..99], Some(b"s1"))?,
        ),
        (
            "an extension",
            e.snapshot_get(mamba.digest(), &(0..101).collect::<Vec<_>>(), Some(b"s1"))?,
        ),
        (
            "another session",
            e.snapshot_get(mamba.digest(), &prompt, Some(b"s2"))?,
        ),
        ("no session", e.snapshot_get(mamba.digest(), &prompt, None)?),
        (
            "another layout",
            e.snapshot_get(other.digest(), &prompt, Some(b"s1"))?,
        ),
    ] {
        assert!(hit.is_none(), "{what} hit a snapshot");
    }
    assert_eq!(
        e.snapshot_put(mamba.digest(), &prompt, Some(b"s1"), b"state-B")?,
        SnapshotPut::Replaced
    );
    assert_eq!(
        e.snapshot_get(mamba.digest(), &prompt, Some(b"s1"))?
            .as_deref(),
        Some(&b"state-B"[..])
    );
    let s = e.stats().snapshot;
    assert_eq!(
        (
            s.hits,
            s.misses,
            s.stores,
            s.resident_entries,
            s.resident_bytes
        ),
        (2, 5, 2, 1, 7)
    );
    // Block counters are separate.
    assert_eq!(e.stats().ram.hits + e.stats().ram.misses, 0);
    Ok(())
}

#[test]
fn ttl_expires_on_the_mock_clock() -> Result<(), kvtier_core::Error> {
    let clock = MockClock::new();
    let config = SnapshotConfig {
        ttl: Duration::from_secs(3600),
        max_bytes: 1 << 16,
        ..SnapshotConfig::default()
    };
    let e = engine(clock.clone(), config, 1 << 20)?;
    let l = e.register_layout(common::small_key())?;
    e.snapshot_put(l.digest(), &[1, 2, 3], None, &[5; 100])?;
    clock.advance(Duration::from_secs(3599));
    assert!(e.snapshot_get(l.digest(), &[1, 2, 3], None)?.is_some());
    clock.advance(Duration::from_secs(2));
    assert!(e.snapshot_get(l.digest(), &[1, 2, 3], None)?.is_none());
    let s = e.stats();
    assert_eq!(
        (s.snapshot.evictions_ttl, s.snapshot.resident_bytes),
        (1, 0)
    );
    assert_eq!(
        s.engine.memory_used_bytes, 0,
        "expired snapshot bytes were not returned to the budget"
    );
    Ok(())
}

#[test]
fn entry_and_byte_caps_evict_least_recently_used() -> Result<(), kvtier_core::Error> {
    let config = SnapshotConfig {
        max_entries: 3,
        max_bytes: 1000,
        ..SnapshotConfig::default()
    };
    let e = engine(MockClock::new(), config, 1 << 20)?;
    let l = e.register_layout(common::small_key())?;
    for i in 0..3u32 {
        e.snapshot_put(l.digest(), &[i], None, &[0; 100])?;
    }
    e.snapshot_get(l.digest(), &[0], None)?; // 1 is now the least recently used
    e.snapshot_put(l.digest(), &[3], None, &[0; 100])?;
    assert!(e.snapshot_get(l.digest(), &[1], None)?.is_none());
    assert!(e.snapshot_get(l.digest(), &[0], None)?.is_some());
    assert_eq!(e.stats().snapshot.evictions_entries, 1);
    // 900 bytes more: the entry cap drops the LRU one, the byte cap one more.
    e.snapshot_put(l.digest(), &[4], None, &[0; 900])?;
    let s = e.stats().snapshot;
    assert_eq!((s.resident_entries, s.resident_bytes), (2, 1000));
    assert_eq!((s.evictions_entries, s.evictions_bytes), (2, 1));
    // [0] was read last, so it stays; [2] and [3] went.
    assert!(e.snapshot_get(l.digest(), &[0], None)?.is_some());
    assert!(e.snapshot_get(l.digest(), &[3], None)?.is_none());
    assert_eq!(
        e.snapshot_put(l.digest(), &[5], None, &[0; 1001])?,
        SnapshotPut::Rejected
    );
    assert_eq!(e.stats().snapshot.rejected, 1);
    Ok(())
}

#[test]
fn snapshot_bytes_count_against_the_shared_memory_budget() -> Result<(), kvtier_core::Error> {
    // 8 KiB of RAM: 8 blocks of 1 KiB, or fewer blocks plus snapshots.
    let config = SnapshotConfig {
        max_entries: 16,
        max_bytes: 4 << 10,
        ..SnapshotConfig::default()
    };
    let e = engine(MockClock::new(), config, 8 << 10)?;
    let l = e.register_layout(common::small_key())?;
    let tokens: Vec<u32> = (0..8 * 16).collect();
    assert_eq!(common::store_all(&e, &l, &tokens)?.stored, 8);
    assert_eq!(e.stats().engine.memory_used_bytes, 8 << 10);
    // A 3 KiB snapshot must make room by evicting three RAM blocks (leaves first).
    assert_eq!(
        e.snapshot_put(l.digest(), &[1], None, &[7; 3 << 10])?,
        SnapshotPut::Stored
    );
    let s = e.stats();
    assert_eq!(s.ram.resident_blocks, 5);
    assert_eq!(s.ram.evictions.budget, 3);
    assert_eq!(s.engine.memory_used_bytes, (5 << 10) + (3 << 10));
    e.ram()
        .check_invariants()
        .map_err(kvtier_core::Error::invalid)?;
    // And blocks cannot push snapshots out: the store stops when only its ancestors remain.
    let more: Vec<u32> = (1000..1000 + 8 * 16).collect();
    common::store_all(&e, &l, &more)?;
    assert!(e.snapshot_get(l.digest(), &[1], None)?.is_some());
    assert!(e.stats().engine.memory_used_bytes <= 8 << 10);
    Ok(())
}
