//! The engine with RAM + SSD: write-through blocks survive a clean restart (100% hit),
//! come back byte-identical and are promoted into RAM; evict-only hands RAM's victims to
//! the SSD; a block stored under one layout is never visible under another.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvtier_core::tier::{RamConfig, ResidencySink, Tier, TierKind};
use kvtier_core::{Engine, ExtraKeys, KvDtype, LayoutKey, PersistConfig, PersistMode};
use kvtier_ssd::{SsdConfig, SsdTier};

fn key(dtype: KvDtype) -> LayoutKey {
    let mut k = LayoutKey::new("restart-test", dtype, 16, 4, 2, 64); // 32 KiB blocks
    k.weights_digest = "w".into();
    k
}

fn engine(dir: &Path, ram: u64, mode: PersistMode) -> Engine {
    let config = SsdConfig::new(dir);
    Engine::builder()
        .ram(RamConfig {
            capacity_bytes: ram,
        })
        .persistent_tier(
            PersistConfig {
                mode,
                ..PersistConfig::default()
            },
            move |sink: Arc<dyn ResidencySink>| {
                let clock = Arc::new(kvtier_core::clock::SystemClock::new());
                Ok(Arc::new(SsdTier::open(config, clock, sink)?) as Arc<dyn Tier>)
            },
        )
        .build()
        .expect("engine")
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|b| (b * 31 + i * 7) as u8).collect()
}

#[test]
fn write_through_blocks_all_hit_after_a_clean_restart() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..16 * 24).collect();
    let stored;
    {
        let e = engine(dir.path(), 64 << 20, PersistMode::WriteThrough);
        let layout = e.register_layout(key(KvDtype::F16)).unwrap();
        let prompt = e
            .prompt(layout.digest(), &tokens, &ExtraKeys::none())
            .unwrap();
        let bytes: Vec<Vec<u8>> = (0..24)
            .map(|i| payload(i, layout.block_bytes() as usize))
            .collect();
        let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
        let report = e.store(&prompt, &refs).unwrap();
        assert_eq!(report.stored, 24);
        let shutdown = e.shutdown(Duration::from_secs(10)).unwrap();
        assert!(shutdown.clean, "{shutdown:?}");
        let s = e.stats();
        assert_eq!(s.writer(TierKind::Ssd).unwrap().saved, 24);
        assert_eq!(s.tier(TierKind::Ssd).unwrap().resident_blocks, 24);
        stored = bytes;
    }
    let e = engine(dir.path(), 64 << 20, PersistMode::WriteThrough);
    let layout = e.register_layout(key(KvDtype::F16)).unwrap();
    let prompt = e
        .prompt(layout.digest(), &tokens, &ExtraKeys::none())
        .unwrap();
    let hit = e.lookup(&prompt);
    assert_eq!(hit.blocks.len(), 24, "restart hit ratio below 100%");
    assert!(hit.blocks.iter().all(|b| b.tier == TierKind::Ssd));
    let loaded = e.load(&hit).unwrap();
    assert!(loaded.complete);
    for (i, b) in loaded.blocks.iter().enumerate() {
        assert_eq!(&b[..], &stored[i][..], "block {i} differs after restart");
    }
    // Promoted (by the load or by the prefetch the lookup started): the next lookup finds
    // every block in RAM.
    let s = e.stats();
    assert_eq!(
        s.moved(TierKind::Ssd, TierKind::Ram).promoted + s.engine.prefetched,
        24,
        "{s:?}"
    );
    assert!(
        e.lookup(&prompt)
            .blocks
            .iter()
            .all(|b| b.tier == TierKind::Ram)
    );
    // Another layout (other dtype) never sees these blocks.
    let other = e.register_layout(key(KvDtype::Bf16)).unwrap();
    let p2 = e
        .prompt(other.digest(), &tokens, &ExtraKeys::none())
        .unwrap();
    assert!(e.lookup(&p2).is_miss());
}

#[test]
fn evict_only_hands_ram_victims_to_the_ssd() {
    let dir = tempfile::tempdir().unwrap();
    // RAM holds 8 blocks of 32 KiB; 6 conversations of 3 blocks each do not fit.
    let e = engine(dir.path(), 8 * (32 << 10), PersistMode::EvictOnly);
    let layout = e.register_layout(key(KvDtype::F16)).unwrap();
    let conversation = |c: u32| -> Vec<u32> { (0..48).map(|t| c * 1000 + t).collect() };
    let bytes = |c: usize| -> Vec<Vec<u8>> {
        (0..3)
            .map(|i| payload(c * 10 + i, layout.block_bytes() as usize))
            .collect()
    };
    for c in 0..6u32 {
        let prompt = e
            .prompt(layout.digest(), &conversation(c), &ExtraKeys::none())
            .unwrap();
        let b = bytes(c as usize);
        let refs: Vec<&[u8]> = b.iter().map(Vec::as_slice).collect();
        e.store(&prompt, &refs).unwrap();
    }
    assert!(e.flush(Duration::from_secs(10)));
    let s = e.stats();
    assert!(s.ram.evictions.budget >= 10, "{s:?}");
    assert_eq!(
        s.moved(TierKind::Ram, TierKind::Ssd).demotions_queued,
        s.ram.evictions.budget,
        "every victim goes to the SSD"
    );
    assert_eq!(s.moved(TierKind::Ram, TierKind::Ssd).demotions_dropped, 0);
    assert_eq!(
        s.tier(TierKind::Ssd).unwrap().resident_blocks,
        s.moved(TierKind::Ram, TierKind::Ssd).demotions_queued
    );
    // Every conversation is whole somewhere and loads byte for byte.
    for c in 0..6u32 {
        let prompt = e
            .prompt(layout.digest(), &conversation(c), &ExtraKeys::none())
            .unwrap();
        let hit = e.lookup(&prompt);
        assert_eq!(hit.blocks.len(), 3, "conversation {c}: {:?}", e.stats());
        let loaded = e.load(&hit).unwrap();
        assert!(loaded.complete);
        for (i, b) in loaded.blocks.iter().enumerate() {
            assert_eq!(
                &b[..],
                &bytes(c as usize)[i][..],
                "conversation {c} block {i}"
            );
        }
    }
}

#[test]
fn a_chain_longer_than_ram_continues_on_the_ssd() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path(), 8 * (32 << 10), PersistMode::EvictOnly);
    let layout = e.register_layout(key(KvDtype::F16)).unwrap();
    let tokens: Vec<u32> = (0..16 * 20).collect();
    let prompt = e
        .prompt(layout.digest(), &tokens, &ExtraKeys::none())
        .unwrap();
    let bytes: Vec<Vec<u8>> = (0..20)
        .map(|i| payload(i, layout.block_bytes() as usize))
        .collect();
    let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
    let report = e.store(&prompt, &refs).unwrap();
    assert_eq!((report.stored, report.stored_lower_only), (8, 12));
    assert!(e.flush(Duration::from_secs(10)));
    let hit = e.lookup(&prompt);
    assert_eq!(hit.blocks.len(), 20);
    assert_eq!(
        hit.blocks
            .iter()
            .filter(|b| b.tier == TierKind::Ssd)
            .count(),
        12
    );
    let loaded = e.load(&hit).unwrap();
    for (i, b) in loaded.blocks.iter().enumerate() {
        assert_eq!(&b[..], &bytes[i][..]);
    }
}

#[test]
fn snapshots_survive_a_restart_and_stay_exact_match() {
    let dir = tempfile::tempdir().unwrap();
    let prompt: Vec<u32> = (0..300).collect();
    let state: Vec<u8> = (0..(3 << 20)).map(|i: u32| (i * 13) as u8).collect();
    {
        let e = engine(dir.path(), 64 << 20, PersistMode::WriteThrough);
        let l = e.register_layout(key(KvDtype::F32)).unwrap();
        e.snapshot_put(l.digest(), &prompt, Some(b"chat-1"), &state)
            .unwrap();
        assert!(e.shutdown(Duration::from_secs(10)).unwrap().clean);
    }
    let e = engine(dir.path(), 64 << 20, PersistMode::WriteThrough);
    let l = e.register_layout(key(KvDtype::F32)).unwrap();
    let got = e
        .snapshot_get(l.digest(), &prompt, Some(b"chat-1"))
        .unwrap();
    assert_eq!(
        got.as_deref(),
        Some(&state[..]),
        "the snapshot did not survive the restart"
    );
    // Restored into the bucket: the next get is a bucket hit.
    assert!(
        e.snapshot_get(l.digest(), &prompt, Some(b"chat-1"))
            .unwrap()
            .is_some()
    );
    assert_eq!(e.stats().snapshot.hits, 1);
    assert!(
        e.snapshot_get(l.digest(), &prompt[..299], Some(b"chat-1"))
            .unwrap()
            .is_none()
    );
    assert!(
        e.snapshot_get(l.digest(), &prompt, Some(b"chat-2"))
            .unwrap()
            .is_none()
    );
    let other = e.register_layout(key(KvDtype::F16)).unwrap();
    assert!(
        e.snapshot_get(other.digest(), &prompt, Some(b"chat-1"))
            .unwrap()
            .is_none()
    );
}

#[test]
fn a_lookup_prefetches_ssd_only_blocks_in_scan_order() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..16 * 32).collect();
    {
        let e = engine(dir.path(), 64 << 20, PersistMode::WriteThrough);
        let l = e.register_layout(key(KvDtype::F16)).unwrap();
        let p = e.prompt(l.digest(), &tokens, &ExtraKeys::none()).unwrap();
        let bytes: Vec<Vec<u8>> = (0..32)
            .map(|i| payload(i, l.block_bytes() as usize))
            .collect();
        let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
        e.store(&p, &refs).unwrap();
        assert!(e.shutdown(Duration::from_secs(10)).unwrap().clean);
    }
    let e = engine(dir.path(), 64 << 20, PersistMode::WriteThrough);
    let l = e.register_layout(key(KvDtype::F16)).unwrap();
    let p = e.prompt(l.digest(), &tokens, &ExtraKeys::none()).unwrap();
    let hit = e.lookup(&p);
    assert!(hit.blocks.iter().all(|b| b.tier == TierKind::Ssd));
    // The lookup returned at once; the reads proceed in the background.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while e.stats().engine.prefetched < 32 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(e.stats().engine.prefetched, 32, "{:?}", e.stats());
    let loaded = e.load(&hit).unwrap();
    assert!(loaded.complete);
    for (i, b) in loaded.blocks.iter().enumerate() {
        assert_eq!(&b[..], &payload(i, l.block_bytes() as usize)[..]);
    }
    let s = e.stats();
    assert_eq!(
        (
            s.engine.prefetch_used,
            s.moved(TierKind::Ssd, TierKind::Ram).promoted
        ),
        (32, 0),
        "{s:?}"
    );
    assert_eq!(
        s.tier(TierKind::Ssd).unwrap().hits,
        32,
        "each block was read from the SSD once"
    );
}

#[test]
fn the_next_start_knows_whether_the_last_run_shut_down_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = engine(dir.path(), 64 << 20, PersistMode::WriteThrough);
        assert_eq!(
            e.previous_shutdown_clean(),
            None,
            "a first start has no record"
        );
        assert!(e.shutdown(Duration::from_secs(10)).unwrap().clean);
    }
    {
        let e = engine(dir.path(), 64 << 20, PersistMode::WriteThrough);
        assert_eq!(e.previous_shutdown_clean(), Some(true));
        // Dropped without a shutdown: like a crash, it leaves no record.
    }
    let e = engine(dir.path(), 64 << 20, PersistMode::WriteThrough);
    assert_eq!(
        e.previous_shutdown_clean(),
        None,
        "a run that never shut down was reported clean"
    );
}

#[test]
fn evict_only_keeps_the_hot_set_across_a_clean_restart() {
    // Evict-only mode never writes what RAM keeps: without the shutdown's save, a restart
    // would lose exactly the blocks RAM held — the most used ones.
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..16 * 12).collect();
    let stored: Vec<Vec<u8>>;
    {
        let e = engine(dir.path(), 64 << 20, PersistMode::EvictOnly);
        let layout = e.register_layout(key(KvDtype::F16)).unwrap();
        let prompt = e
            .prompt(layout.digest(), &tokens, &ExtraKeys::none())
            .unwrap();
        stored = (0..12)
            .map(|i| payload(i, layout.block_bytes() as usize))
            .collect();
        let refs: Vec<&[u8]> = stored.iter().map(Vec::as_slice).collect();
        assert_eq!(e.store(&prompt, &refs).unwrap().stored, 12);
        assert_eq!(
            e.stats().tier(TierKind::Ssd).unwrap().resident_blocks,
            0,
            "evict-only wrote early"
        );
        let shutdown = e.shutdown(Duration::from_secs(10)).unwrap();
        assert!(shutdown.clean, "{shutdown:?}");
        let s = e.stats();
        assert_eq!(s.engine.shutdown_saved, 12, "{s:?}");
        assert_eq!(s.engine.shutdown_unsaved, 0);
    }
    let e = engine(dir.path(), 64 << 20, PersistMode::EvictOnly);
    assert_eq!(e.previous_shutdown_clean(), Some(true));
    let layout = e.register_layout(key(KvDtype::F16)).unwrap();
    let prompt = e
        .prompt(layout.digest(), &tokens, &ExtraKeys::none())
        .unwrap();
    let hit = e.lookup(&prompt);
    assert_eq!(hit.blocks.len(), 12, "the hot set was lost by the restart");
    let loaded = e.load(&hit).unwrap();
    for (i, b) in loaded.blocks.iter().enumerate() {
        assert_eq!(&b[..], &stored[i][..], "block {i} differs after restart");
    }
}

#[test]
fn hybrid_checkpoints_survive_a_restart_and_compose_with_their_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let hybrid = || {
        let mut k = key(KvDtype::F16);
        k.state_groups = vec![kvtier_core::StateGroup {
            kind: "mamba1/f32".into(),
            num_layers: 2,
            state_bytes: 4096,
        }];
        k
    };
    let tokens: Vec<u32> = (0..16 * 8).collect();
    let state = payload(99, 4096);
    let kv: Vec<Vec<u8>>;
    {
        let e = engine(dir.path(), 64 << 20, PersistMode::WriteThrough);
        let layout = e.register_layout(hybrid()).unwrap();
        assert_eq!(e.set_checkpoint_every(layout.digest(), 64).unwrap(), 64);
        let prompt = e
            .prompt(layout.digest(), &tokens, &ExtraKeys::none())
            .unwrap();
        kv = (0..8)
            .map(|i| payload(i, layout.block_bytes() as usize))
            .collect();
        let refs: Vec<&[u8]> = kv.iter().map(Vec::as_slice).collect();
        e.store(&prompt, &refs).unwrap();
        e.checkpoint_put(&prompt, 4, &state).unwrap();
        assert!(e.shutdown(Duration::from_secs(10)).unwrap().clean);
    }
    let e = engine(dir.path(), 64 << 20, PersistMode::WriteThrough);
    let layout = e.register_layout(hybrid()).unwrap();
    e.set_checkpoint_every(layout.digest(), 64).unwrap();
    // A prompt that diverges in block 6 still reaches the checkpoint after block 4.
    let mut diverging = tokens.clone();
    diverging[6 * 16 + 3] = 7777;
    let prompt = e
        .prompt(layout.digest(), &diverging, &ExtraKeys::none())
        .unwrap();
    let hit = e.lookup(&prompt);
    let state_ref = hit
        .state
        .expect("the checkpoint is found on the SSD after a restart");
    assert_eq!((state_ref.blocks, state_ref.tier), (4, TierKind::Ssd));
    assert_eq!(hit.blocks.len(), 4);
    let restored = e.restore(&hit).unwrap();
    assert_eq!(restored.tokens, 64);
    assert_eq!(restored.state.as_deref(), Some(state.as_slice()));
    for (i, b) in restored.blocks.iter().enumerate() {
        assert_eq!(b.as_ref(), kv[i].as_slice(), "block {i}");
    }
    // The restore promoted the checkpoint into RAM.
    assert_eq!(e.lookup(&prompt).state.map(|s| s.tier), Some(TierKind::Ram));
    assert_eq!(e.stats().checkpoint.stores, 1);
}
