//! Damaged files are misses, counted, never served and never a panic: flipped payload and
//! header bytes, truncated and deleted segments, garbage in the index logs.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use kvtier_core::tier::{ShortRead, Tier};

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

fn flip(path: &Path, offset: u64) {
    common::flip(path, offset, 0x5a);
}

/// Stores 6 blocks (all in the first segment) and closes the tier.
fn populate(dir: &Path) -> Vec<(kvtier_core::tier::BlockMeta, bytes::Bytes)> {
    let blocks = common::chain(6, 3);
    let (tier, _) = common::open(dir);
    for (m, p) in &blocks {
        tier.put(m, p.clone()).unwrap();
    }
    blocks
}

/// Every block is either served exactly or missed; returns how many were served.
fn served_exactly(
    tier: &kvtier_ssd::SsdTier,
    blocks: &[(kvtier_core::tier::BlockMeta, bytes::Bytes)],
) -> usize {
    let mut served = 0;
    for (m, p) in blocks {
        match tier.get(&m.hash) {
            Ok(Some(got)) => {
                assert_eq!(&got, p, "wrong bytes served for {}", m.hash);
                served += 1;
            }
            Ok(None) => {}
            Err(e) => panic!("a damaged record must be a miss, not an error: {e}"),
        }
    }
    served
}

#[test]
fn a_flipped_payload_byte_is_a_miss_and_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = populate(dir.path());
    // Record 2 starts at 4096 + 2 × (4096 + 32768); its payload 4 KiB later.
    let seg = &files(dir.path(), "seg")[0];
    flip(seg, 4096 + 2 * (4096 + 32768) + 4096 + 20_000);
    let (tier, _) = common::open(dir.path());
    assert_eq!(served_exactly(&tier, &blocks), 5);
    assert!(tier.is_quarantined(&blocks[2].0.hash));
    assert_eq!(tier.stats().evictions.corrupt, 1);
    assert!(
        !tier.contains(&blocks[2].0.hash),
        "a corrupt record stays indexed"
    );
    // A page read outside the damaged chunk of another block still works.
    let got = tier.get_range(&blocks[3].0.hash, 0..4096).unwrap().unwrap();
    assert_eq!(&got[..], &blocks[3].1[..4096]);
    // After a reopen the tombstone keeps it dead.
    drop(tier);
    let (tier, _) = common::open(dir.path());
    assert!(!tier.contains(&blocks[2].0.hash));
}

#[test]
fn a_read_of_a_corrupt_record_says_so_once_then_the_block_is_not_held() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = populate(dir.path());
    let seg = &files(dir.path(), "seg")[0];
    flip(seg, 4096 + 2 * (4096 + 32768) + 4096 + 20_000);
    let (tier, _) = common::open(dir.path());
    let hashes: Vec<_> = blocks.iter().map(|(m, _)| m.hash).collect();
    // The engine's hit accounting counts what `read_run` says: the run stops at block 2
    // because its bytes failed verification, not because the tier never held it.
    let read = tier.read_run(&hashes).unwrap();
    assert_eq!(read.blocks.len(), 2);
    assert_eq!(read.short, Some(ShortRead::Corrupt));
    for (got, (_, want)) in read.blocks.iter().zip(&blocks) {
        assert_eq!(got, want);
    }
    // Dropped on that read: from now on it is simply not held.
    let read = tier.read_run(&hashes[2..]).unwrap();
    assert!(read.blocks.is_empty());
    assert_eq!(read.short, Some(ShortRead::NotHeld));
    // A page of a damaged block, read first, says the same.
    drop(tier);
    let dir = tempfile::tempdir().unwrap();
    let blocks = populate(dir.path());
    let seg = &files(dir.path(), "seg")[0];
    flip(seg, 4096 + 2 * (4096 + 32768) + 4096 + 20_000);
    let (tier, _) = common::open(dir.path());
    let page = tier.read_range(&blocks[2].0.hash, 16_384..24_576).unwrap();
    assert_eq!(page.unwrap_err(), ShortRead::Corrupt);
    let whole = tier.read_run(&[blocks[3].0.hash]).unwrap();
    assert_eq!((whole.blocks.len(), whole.short), (1, None));
}

#[test]
fn a_flipped_header_byte_is_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = populate(dir.path());
    let seg = &files(dir.path(), "seg")[0];
    flip(seg, 4096 + (4096 + 32768) + 40); // inside record 1's key
    let (tier, _) = common::open(dir.path());
    assert_eq!(served_exactly(&tier, &blocks), 5);
    assert_eq!(tier.stats().evictions.corrupt, 1);
}

#[test]
fn a_truncated_segment_drops_what_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = populate(dir.path());
    let seg = &files(dir.path(), "seg")[0];
    // Cut in the middle of record 4's payload.
    let f = OpenOptions::new().write(true).open(seg).unwrap();
    f.set_len(4096 + 4 * (4096 + 32768) + 4096 + 100).unwrap();
    let (tier, _) = common::open(dir.path());
    assert_eq!(
        tier.recovery_report().dropped_missing,
        2,
        "{:?}",
        tier.recovery_report()
    );
    assert_eq!(served_exactly(&tier, &blocks), 4);
}

#[test]
fn a_deleted_segment_is_a_miss_for_its_blocks_only() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = common::chain(20, 5); // spans several segments
    {
        let (tier, _) = common::open(dir.path());
        for (m, p) in &blocks {
            tier.put(m, p.clone()).unwrap();
        }
    }
    let segs = files(dir.path(), "seg");
    assert!(segs.len() >= 3);
    std::fs::remove_file(&segs[1]).unwrap();
    let (tier, _) = common::open(dir.path());
    let served = served_exactly(&tier, &blocks);
    assert!(served > 0 && served < 20, "served {served}");
    assert_eq!(tier.recovery_report().records as usize, served);
    // The orphan index log was removed.
    assert!(!segs[1].with_extension("idx").exists());
}

#[test]
fn garbage_in_the_index_log_is_cut_off_or_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = populate(dir.path());
    let idx = &files(dir.path(), "idx")[0];
    // Append garbage: recovery cuts the torn tail and keeps every record.
    let f = OpenOptions::new().append(true).open(idx).unwrap();
    f.write_all_at(
        b"\x40\x00\x00\x00garbage-garbage-garbage",
        f.metadata().unwrap().len(),
    )
    .unwrap();
    drop(f);
    {
        let (tier, _) = common::open(dir.path());
        assert!(tier.recovery_report().torn_index_bytes > 0);
        assert_eq!(served_exactly(&tier, &blocks), 6);
    }
    // Garbage from the first byte: the log is rebuilt by scanning the segment.
    std::fs::write(&files(dir.path(), "idx")[0], b"nonsense").unwrap();
    let (tier, _) = common::open(dir.path());
    assert_eq!(
        tier.recovery_report().rescanned_segments,
        1,
        "{:?}",
        tier.recovery_report()
    );
    assert_eq!(served_exactly(&tier, &blocks), 6);
}

#[test]
fn a_segment_with_a_bad_header_keeps_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = populate(dir.path());
    let seg = files(dir.path(), "seg")[0].clone();
    let len = std::fs::metadata(&seg).unwrap().len();
    flip(&seg, 3);
    let (tier, _) = common::open(dir.path());
    assert_eq!(served_exactly(&tier, &blocks), 6);
    assert_eq!(tier.recovery_report().damaged_segment_headers, 1);
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), len);
}
