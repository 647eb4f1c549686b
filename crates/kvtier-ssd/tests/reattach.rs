//! Live reattach of the SSD tier on a running engine, under concurrent stores: nothing
//! queued before the swap is lost (the old tier drains), blocks stored after it land in
//! the new tier, stores and loads keep working throughout, and a canary written under one
//! layout is never visible under another, before or after.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kvtier_core::clock::SystemClock;
use kvtier_core::tier::conformance::{Event, RecordingSink};
use kvtier_core::tier::{NoSink, RamConfig, ResidencySink, Tier, TierKind};
use kvtier_core::{BlockHash, Engine, ExtraKeys, KvDtype, LayoutKey, PersistConfig, TierOpener};
use kvtier_ssd::{SsdConfig, SsdTier};

fn opener(dir: PathBuf) -> TierOpener {
    Box::new(move |sink: Arc<dyn ResidencySink>| {
        Ok(Arc::new(SsdTier::open(
            SsdConfig::new(dir),
            Arc::new(SystemClock::new()),
            sink,
        )?) as Arc<dyn Tier>)
    })
}

fn key(dtype: KvDtype) -> LayoutKey {
    LayoutKey::new("reattach", dtype, 16, 2, 2, 64) // 16 KiB blocks
}

/// The block hashes a store directory holds, read by opening it on its own.
fn held(dir: &Path) -> Vec<BlockHash> {
    let sink = Arc::new(RecordingSink::default());
    let _tier = SsdTier::open(
        SsdConfig::new(dir),
        Arc::new(SystemClock::new()),
        sink.clone() as Arc<dyn ResidencySink>,
    )
    .unwrap();
    sink.events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Inserted(TierKind::Ssd, h) => Some(h),
            _ => None,
        })
        .collect()
}

#[test]
fn reattach_under_load_loses_nothing_and_never_aliases_layouts() {
    let root = tempfile::tempdir().unwrap();
    let (dir_a, dir_b) = (root.path().join("a"), root.path().join("b"));
    let e = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 256 << 20,
        })
        .persistent_tier(PersistConfig::default(), opener(dir_a.clone()))
        .build()
        .unwrap();
    let l16 = e.register_layout(key(KvDtype::F16)).unwrap();
    let store = |tokens: &[u32]| -> Vec<BlockHash> {
        let p = e.prompt(l16.digest(), tokens, &ExtraKeys::none()).unwrap();
        let payload = vec![(tokens[0] % 251) as u8; l16.block_bytes() as usize];
        let refs: Vec<&[u8]> = (0..p.num_blocks()).map(|_| payload.as_slice()).collect();
        e.store(&p, &refs).unwrap();
        p.hashes().to_vec()
    };
    // Before: a canary and 50 blocks, all queued for A.
    let canary: Vec<u32> = (900_000..900_016).collect();
    let canary_hash = store(&canary)[0];
    let before: Vec<BlockHash> = (0..50u32)
        .flat_map(|i| store(&(i * 100..i * 100 + 16).collect::<Vec<_>>()))
        .collect();

    // During: a thread keeps storing while the tier moves from A to B.
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 10_000u32;
            while !stop.load(Ordering::Relaxed) && i < 12_000 {
                store(&(i * 100..i * 100 + 32).collect::<Vec<_>>());
                i += 1;
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        let report = e
            .reattach_persistent(
                Some((PersistConfig::default(), opener(dir_b.clone()))),
                Duration::from_secs(30),
            )
            .unwrap();
        assert!(report.drained_clean && report.attached, "{report:?}");
        assert!(report.detached_blocks >= 51, "{report:?}");
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::Relaxed);
    });

    // After: 50 more blocks, queued for B.
    let after: Vec<BlockHash> = (0..50u32)
        .flat_map(|i| store(&(500_000 + i * 100..500_000 + i * 100 + 16).collect::<Vec<_>>()))
        .collect();
    assert!(e.shutdown(Duration::from_secs(30)).unwrap().clean);
    // Every block is still served (from RAM or B).
    let p = e.prompt(l16.digest(), &canary, &ExtraKeys::none()).unwrap();
    assert_eq!(e.lookup(&p).blocks.len(), 1);
    drop(e);

    let in_a = held(&dir_a);
    let in_b = held(&dir_b);
    for h in &before {
        assert!(
            in_a.contains(h),
            "a block queued before the reattach was lost"
        );
    }
    assert!(in_a.contains(&canary_hash));
    for h in &after {
        assert!(
            in_b.contains(h),
            "a block stored after the reattach did not reach the new tier"
        );
    }

    // Canary: reopen A under an engine of another codec; the canary's tokens miss there
    // and hit under the original layout.
    let e = Engine::builder()
        .persistent_tier(PersistConfig::default(), opener(dir_a.clone()))
        .build()
        .unwrap();
    let bf16 = e.register_layout(key(KvDtype::Bf16)).unwrap();
    let p = e
        .prompt(bf16.digest(), &canary, &ExtraKeys::none())
        .unwrap();
    assert!(
        e.lookup(&p).is_miss(),
        "a block of one layout was visible under another"
    );
    let f16 = e.register_layout(key(KvDtype::F16)).unwrap();
    let p = e.prompt(f16.digest(), &canary, &ExtraKeys::none()).unwrap();
    assert_eq!(e.lookup(&p).blocks.len(), 1);
    // Detach entirely: the engine keeps serving from RAM and the directory is released.
    let report = e
        .reattach_persistent(None, Duration::from_secs(10))
        .unwrap();
    assert!(!report.attached && report.detached_blocks >= 1);
    // The lookup above may have prefetched the block into RAM, where it rightly stays.
    assert!(
        e.lookup(&p).blocks.iter().all(|b| b.tier == TierKind::Ram),
        "the index still points at a detached tier"
    );
    assert!(e.load(&e.lookup(&p)).unwrap().complete);
    let again = SsdTier::open(
        SsdConfig::new(&dir_a),
        Arc::new(SystemClock::new()),
        Arc::new(NoSink),
    );
    assert!(
        again.is_ok(),
        "the detached store's lock was not released: {:?}",
        again.err()
    );
}
