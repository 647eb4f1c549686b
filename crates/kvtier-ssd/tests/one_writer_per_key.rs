//! No tombstone deletes a key a later store wrote (ADR 0016): writes of one block racing
//! each other (the write-behind queue's and a durable store's), and compaction racing
//! deletes and stores of the keys it moves, leave after a restart exactly the keys whose
//! last operation was a store, with their bytes.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

mod common;

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_core::tier::Tier;
use kvtier_ssd::SsdTier;

/// Runs `work` while another thread compacts `tier` without pause (every sealed segment
/// not full of live records); returns how many records compaction moved meanwhile.
/// Runs `work` while a thread compacts the tier over and over; returns how many records
/// compaction moved meanwhile. `work` is handed that count as it grows, so it can keep
/// going until compaction has run against it at least once: on a loaded machine the
/// compactor may get no turn during a fixed amount of work.
fn while_compacting(tier: &SsdTier, work: impl FnOnce(&AtomicU64)) -> u64 {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let moved = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let n = tier.compact(1.0).unwrap().relocated;
                moved.fetch_add(n, Ordering::Relaxed);
            }
        });
        work(&moved);
        stop.store(true, Ordering::Relaxed);
    });
    moved.load(Ordering::Relaxed)
}

/// Whether a writer that did `done` operations should go on: its share (`at_least`), and
/// then until compaction has moved something (at most 100 times its share).
fn more(done: usize, at_least: usize, moved: &AtomicU64) -> bool {
    done < at_least || (moved.load(Ordering::Relaxed) == 0 && done < 100 * at_least)
}

#[test]
fn racing_writes_of_one_block_keep_it_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut all = Vec::new();
    {
        let (tier, _) = common::open(dir.path());
        for round in 0..60u32 {
            let blocks = common::chain(6, 10_000 + round);
            let start = Barrier::new(2);
            std::thread::scope(|s| {
                // The write-behind queue's write…
                s.spawn(|| {
                    start.wait();
                    for (meta, payload) in &blocks {
                        tier.put(meta, payload.clone()).unwrap();
                    }
                });
                // …and a `synced` store's inline write of the same blocks.
                s.spawn(|| {
                    start.wait();
                    for (meta, payload) in &blocks {
                        tier.put_to_sync(meta, payload.clone()).unwrap();
                    }
                    tier.make_durable().unwrap();
                });
            });
            for (meta, _) in &blocks {
                assert!(tier.contains(&meta.hash), "round {round}");
            }
            all.extend(blocks);
        }
        // Each block was written once: the racer that came second found it held.
        assert_eq!(tier.stats().stores, all.len() as u64);
        assert_eq!(tier.stats().dedup_skips, all.len() as u64);
    }
    let (tier, _) = common::open(dir.path());
    assert_eq!(tier.recovery_report().tombstoned, 0);
    for (meta, payload) in &all {
        let got = tier.get(&meta.hash).unwrap();
        assert_eq!(
            got.as_deref(),
            Some(&payload[..]),
            "block at position {} lost after the restart",
            meta.position
        );
    }
}

#[test]
fn compaction_racing_deletes_and_stores_loses_no_stored_key() {
    let dir = tempfile::tempdir().unwrap();
    // Eight writers, each owning its own keys, so each knows its keys' last operation.
    let owned: Vec<_> = (0..8u32).map(|w| common::chain(4, 20_000 + w)).collect();
    let mut present = vec![vec![false; 4]; owned.len()];
    {
        let (tier, _) = common::open(dir.path());
        let moved = while_compacting(&tier, |moved| {
            std::thread::scope(|s| {
                let writers: Vec<_> = owned
                    .iter()
                    .zip(present.iter_mut())
                    .enumerate()
                    .map(|(w, (blocks, present))| {
                        let tier = &tier;
                        s.spawn(move || {
                            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (w as u64 + 1);
                            let mut done = 0;
                            while more(done, 3000, moved) {
                                done += 1;
                                x ^= x << 13;
                                x ^= x >> 7;
                                x ^= x << 17;
                                let i = (x % blocks.len() as u64) as usize;
                                let (meta, payload) = &blocks[i];
                                if x >> 32 & 1 == 0 {
                                    tier.put(meta, payload.clone()).unwrap();
                                    present[i] = true;
                                } else {
                                    tier.remove(&meta.hash).unwrap();
                                    present[i] = false;
                                }
                            }
                        })
                    })
                    .collect();
                for w in writers {
                    w.join().unwrap();
                }
            });
        });
        assert!(moved > 0, "compaction never ran against the writers");
    }
    for restart in 0..2 {
        let (tier, _) = common::open(dir.path());
        for (blocks, present) in owned.iter().zip(&present) {
            for ((meta, payload), &present) in blocks.iter().zip(present) {
                let got = tier.get(&meta.hash).unwrap();
                if present {
                    assert_eq!(
                        got.as_deref(),
                        Some(&payload[..]),
                        "restart {restart}: a stored block is gone"
                    );
                } else {
                    assert_eq!(got, None, "restart {restart}: a deleted block came back");
                }
            }
        }
    }
}

#[test]
fn snapshot_puts_racing_compaction_keep_every_snapshot() {
    use bytes::Bytes;
    use kvtier_core::snapshot::SnapshotKey;
    use kvtier_core::tier::SnapshotStore;

    let dir = tempfile::tempdir().unwrap();
    let layout = common::layout().digest();
    // 20 KiB states: a few per 256 KiB segment, so puts leave sealed segments half dead.
    let blob = |k: u8| Bytes::from(vec![k; 20 << 10]);
    let keys: Vec<SnapshotKey> = (0..12u8).map(|k| SnapshotKey([k; 32])).collect();
    {
        let (tier, _) = common::open(dir.path());
        let moved = while_compacting(&tier, |moved| {
            std::thread::scope(|s| {
                let writers: Vec<_> = (0..4)
                    .map(|w| {
                        let (tier, keys) = (&tier, &keys);
                        s.spawn(move || {
                            let mut round = 0;
                            while more(round, 150, moved) {
                                let k = (w * 3 + round) % keys.len();
                                round += 1;
                                tier.put_snapshot(&keys[k], layout, &blob(k as u8)).unwrap();
                            }
                        })
                    })
                    .collect();
                for w in writers {
                    w.join().unwrap();
                }
            });
        });
        assert!(moved > 0, "compaction never ran");
    }
    for restart in 0..2 {
        let (tier, _) = common::open(dir.path());
        for (k, key) in keys.iter().enumerate() {
            assert_eq!(
                tier.get_snapshot(key).unwrap(),
                Some(blob(k as u8)),
                "restart {restart}: snapshot {k} lost"
            );
        }
    }
}
