//! A full disk (ENOSPC) on a real filesystem: a 1 MiB tmpfs the test mounts (root is
//! needed; CI runs as root). Writes fail with a `NoSpace` error and are counted, nothing
//! panics, what was stored before stays readable, and an engine over the tier keeps
//! serving from RAM while its writer counts the failures.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use kvtier_core::tier::{RamConfig, Tier, TierKind};
use kvtier_core::{Engine, ErrorKind, ExtraKeys, PersistConfig};
use kvtier_ssd::{SsdConfig, SsdTier};

/// A tmpfs of `size`, unmounted when dropped.
struct SmallFs {
    dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl SmallFs {
    fn mount(size: &str) -> Self {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("fs");
        std::fs::create_dir(&dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status();
        assert!(
            status.is_ok_and(|s| s.success()),
            "this test mounts a small tmpfs and needs root (CI runs as root)"
        );
        Self {
            dir,
            _parent: parent,
        }
    }
    fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

#[test]
fn the_free_space_watermark_stops_admission_before_the_disk_fills() {
    let fs = SmallFs::mount("1m");
    let mut config = common::config(fs.path());
    config.min_free_bytes = 512 << 10;
    let tier = SsdTier::open(
        config,
        Arc::new(kvtier_core::clock::SystemClock::new()),
        Arc::new(kvtier_core::tier::NoSink),
    )
    .unwrap();
    let mut refused = 0;
    for (m, p) in &common::chain(40, 4) {
        match tier.put(m, p.clone()).unwrap() {
            kvtier_core::tier::PutOutcome::Rejected(kvtier_core::tier::RejectReason::NoSpace) => {
                refused += 1
            }
            kvtier_core::tier::PutOutcome::Stored => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(refused > 0, "the watermark never stopped admission");
    assert_eq!(tier.rejected_low_disk(), refused);
    assert_eq!(
        tier.stats().io_errors,
        0,
        "the disk filled despite the watermark"
    );
}

#[test]
fn a_full_disk_is_an_error_not_a_crash_and_earlier_blocks_survive() {
    let fs = SmallFs::mount("1m");
    let mut config = common::config(fs.path());
    config.min_free_bytes = 0; // let it really fill
    let tier = SsdTier::open(
        config,
        Arc::new(kvtier_core::clock::SystemClock::new()),
        Arc::new(kvtier_core::tier::NoSink),
    )
    .unwrap();
    let blocks = common::chain(40, 9); // 40 × 36 KiB > 1 MiB
    let mut stored = Vec::new();
    let mut no_space = 0;
    for (m, p) in &blocks {
        match tier.put(m, p.clone()) {
            Ok(_) => stored.push((m.clone(), p.clone())),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
                no_space += 1;
            }
        }
    }
    assert!(no_space > 0, "the disk never filled");
    assert!(!stored.is_empty());
    assert_eq!(tier.stats().io_errors, no_space);
    for (m, p) in &stored {
        assert_eq!(
            tier.get(&m.hash).unwrap().as_ref(),
            Some(p),
            "a block stored before the disk filled is gone"
        );
    }
}

#[test]
fn the_engine_keeps_serving_from_ram_when_the_disk_is_full() {
    let fs = SmallFs::mount("1m");
    let dir = fs.path().to_path_buf();
    let e = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 64 << 20,
        })
        .persistent_tier(PersistConfig::default(), move |sink| {
            let mut c = SsdConfig::new(dir);
            c.store.segment_bytes = 256 << 10;
            c.min_free_bytes = 0;
            Ok(Arc::new(SsdTier::open(
                c,
                Arc::new(kvtier_core::clock::SystemClock::new()),
                sink,
            )?) as Arc<dyn Tier>)
        })
        .build()
        .unwrap();
    let layout = e
        .register_layout(kvtier_core::LayoutKey::new(
            "full",
            kvtier_core::KvDtype::F16,
            16,
            4,
            2,
            64,
        ))
        .unwrap();
    let tokens: Vec<u32> = (0..16 * 40).collect();
    let prompt = e
        .prompt(layout.digest(), &tokens, &ExtraKeys::none())
        .unwrap();
    let payload = vec![7u8; layout.block_bytes() as usize];
    let refs: Vec<&[u8]> = (0..40).map(|_| payload.as_slice()).collect();
    assert_eq!(e.store(&prompt, &refs).unwrap().stored, 40);
    // The queue drains, but what the full disk refused is not on it, and the flush says
    // so — it does not report "drained" over lost writes.
    let flushed = e.flush_report(Duration::from_secs(10));
    let s = e.stats();
    let w = s.writer(TierKind::Ssd).unwrap();
    assert!(w.failed > 0, "{s:?}");
    assert!(!flushed.clean(), "{flushed:?}");
    assert_eq!(
        flushed.unwritten(),
        w.failed + w.rejected,
        "{flushed:?} {w:?}"
    );
    // RAM serves everything.
    let hit = e.lookup(&prompt);
    assert_eq!(hit.blocks.len(), 40);
    let loaded = e.load(&hit).unwrap();
    assert!(loaded.complete && loaded.blocks.iter().all(|b| b[..] == payload[..]));
    drop(e);
}

#[test]
fn a_store_on_a_full_disk_opens_serves_and_writes_again_when_space_returns() {
    let fs = SmallFs::mount("1m");
    let mut config = common::config(fs.path());
    config.min_free_bytes = 0;
    let open = |config: &kvtier_ssd::SsdConfig| {
        SsdTier::open(
            config.clone(),
            Arc::new(kvtier_core::clock::SystemClock::new()),
            Arc::new(kvtier_core::tier::NoSink),
        )
    };
    let blocks = common::chain(6, 4);
    {
        let tier = open(&config).unwrap();
        for (m, p) in &blocks[..3] {
            tier.put(m, p.clone()).unwrap();
        }
        tier.record_shutdown(true).unwrap();
    }
    // Fill what is left of the filesystem to the last byte.
    let filler = fs.path().join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![7u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        let mut one = [7u8; 1];
        while f.write_all(&one).is_ok() {
            one[0] = 8;
        }
    }
    // The open writes nothing it needs: it succeeds and serves what is there.
    let tier = open(&config).expect("a store on a full disk must open");
    for (m, p) in &blocks[..3] {
        assert_eq!(tier.get(&m.hash).unwrap().as_ref(), Some(p));
    }
    assert_eq!(tier.previous_shutdown_clean(), Some(true));
    // Writes are refused with NoSpace, counted; nothing panics, nothing is lost.
    let err = tier.put(&blocks[3].0, blocks[3].1.clone()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoSpace, "{err}");
    assert!(tier.stats().io_errors > 0);
    // Space returns: the next write goes through, without a restart.
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(
        tier.put(&blocks[3].0, blocks[3].1.clone()).unwrap(),
        kvtier_core::tier::PutOutcome::Stored
    );
    assert_eq!(
        tier.get(&blocks[3].0.hash).unwrap().as_ref(),
        Some(&blocks[3].1)
    );
}
