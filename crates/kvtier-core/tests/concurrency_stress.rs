//! Several threads store, load, look up, snapshot and evict at once. Afterwards every
//! readable block is byte-identical to what was stored under its key, the invariants hold,
//! and the counters add up.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_core::snapshot::SnapshotConfig;
use kvtier_core::tier::RamConfig;
use kvtier_core::{Engine, ExtraKeys};

const THREADS: u64 = 4;
const OPS: u64 = 1500;

#[test]
fn mixed_load_keeps_bytes_and_counters_right() -> Result<(), kvtier_core::Error> {
    // About 40 blocks of 1 KiB fit: constant eviction pressure.
    let engine = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 48 << 10,
        })
        .snapshot(SnapshotConfig {
            max_entries: 8,
            max_bytes: 8 << 10,
            ..SnapshotConfig::default()
        })
        .build()?;
    let layout = engine.register_layout(common::small_key())?;
    let wrong = AtomicU64::new(0);
    let loads = AtomicU64::new(0);
    let snapshot_gets = AtomicU64::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    let inconsistent = AtomicU64::new(0);
    std::thread::scope(|s| {
        // A reader of stats racing the workers: every snapshot must add up.
        let (engine_ref, done_ref, inconsistent_ref) = (&engine, &done, &inconsistent);
        s.spawn(move || {
            while !done_ref.load(Ordering::Relaxed) {
                let st = engine_ref.stats();
                let ev = st.ram.evictions;
                let evicted = ev.budget + ev.ttl + ev.explicit + ev.corrupt;
                if st.index.entries != st.ram.resident_blocks
                    || st.ram.stores - evicted != st.ram.resident_blocks
                    || st.ram.resident_bytes > st.ram.capacity_bytes
                {
                    inconsistent_ref.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::yield_now();
            }
        });
        let mut workers = Vec::new();
        for t in 0..THREADS {
            let (engine, layout, wrong, loads, snapshot_gets) =
                (&engine, &layout, &wrong, &loads, &snapshot_gets);
            workers.push(s.spawn(move || {
                let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                for _ in 0..OPS {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Shared prefixes: 3 system prompts, branching conversations.
                    let depth = 1 + (x % 6) as usize;
                    let tokens: Vec<u32> = (0..depth * 16)
                        .map(|i| {
                            ((x >> (i / 16 % 8 * 2)) % 3) as u32 * 1000
                                + (i as u32 / 16) * 10
                                + i as u32 % 16
                        })
                        .collect();
                    match x % 4 {
                        0 | 1 => {
                            if common::store_all(engine, layout, &tokens).is_err() {
                                wrong.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        2 => {
                            let Ok(p) = engine.prompt(layout.digest(), &tokens, &ExtraKeys::none())
                            else {
                                wrong.fetch_add(1, Ordering::Relaxed);
                                continue;
                            };
                            let hit = engine.lookup(&p);
                            loads.fetch_add(hit.blocks.len() as u64, Ordering::Relaxed);
                            match engine.load(&hit) {
                                Ok(got) => {
                                    for (r, b) in hit.blocks.iter().zip(&got.blocks) {
                                        if b[..] != common::payload_for(layout, &r.hash)[..] {
                                            wrong.fetch_add(1, Ordering::Relaxed);
                                        }
                                    }
                                    if !got.complete {
                                        // The block that was lost counts as one miss.
                                        loads.fetch_sub(
                                            (hit.blocks.len() - got.blocks.len() - 1) as u64,
                                            Ordering::Relaxed,
                                        );
                                    }
                                }
                                Err(_) => {
                                    wrong.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        _ => {
                            let blob = vec![(x % 251) as u8; 512 + (x % 2048) as usize];
                            let key = &tokens[..1 + (x % 7) as usize];
                            let _ = engine.snapshot_put(layout.digest(), key, None, &blob);
                            snapshot_gets.fetch_add(1, Ordering::Relaxed);
                            if let Ok(Some(got)) = engine.snapshot_get(layout.digest(), key, None)
                                && got.iter().any(|b| *b != got[0])
                            {
                                wrong.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            }));
        }
        for w in workers {
            assert!(w.join().is_ok(), "a worker panicked");
        }
        done.store(true, Ordering::Relaxed);
    });
    assert_eq!(
        wrong.load(Ordering::Relaxed),
        0,
        "wrong bytes or unexpected errors"
    );
    assert_eq!(
        inconsistent.load(Ordering::Relaxed),
        0,
        "a stats snapshot did not add up"
    );
    engine
        .ram()
        .check_invariants()
        .map_err(kvtier_core::Error::invalid)?;

    let s = engine.stats();
    let ev = s.ram.evictions;
    assert!(ev.budget > 0, "the test did not create eviction pressure");
    assert_eq!(
        s.ram.stores - (ev.budget + ev.ttl + ev.explicit + ev.corrupt),
        s.ram.resident_blocks
    );
    assert_eq!(s.index.entries, s.ram.resident_blocks);
    assert_eq!(s.ram.hits + s.ram.misses, loads.load(Ordering::Relaxed));
    assert!(s.engine.memory_used_bytes <= s.engine.memory_capacity_bytes);
    assert_eq!(
        s.snapshot.hits + s.snapshot.misses,
        snapshot_gets.load(Ordering::Relaxed)
    );
    assert!(s.snapshot.resident_bytes <= 8 << 10);

    // Spot check: blocks still held under these prompts read back exactly.
    for a in 0..3u32 {
        for depth in 1..=6usize {
            let tokens: Vec<u32> = (0..depth * 16)
                .map(|i| a * 1000 + (i as u32 / 16) * 10 + i as u32 % 16)
                .collect();
            let p = engine.prompt(layout.digest(), &tokens, &ExtraKeys::none())?;
            let hit = engine.lookup(&p);
            let got = engine.load(&hit)?;
            for (r, b) in hit.blocks.iter().zip(&got.blocks) {
                assert_eq!(&b[..], &common::payload_for(&layout, &r.hash)[..]);
            }
        }
    }
    Ok(())
}
