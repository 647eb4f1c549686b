//! Recovery salvages: a damaged index entry, a damaged record header, many random flips in
//! a log — every record that still passes its own checks is served, byte for byte, and no
//! byte of an intact record is cut off.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

mod common;

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use bytes::Bytes;
use kvtier_core::clock::SystemClock;
use kvtier_core::tier::conformance::RecordingSink;
use kvtier_core::tier::{BlockMeta, Tier};
use kvtier_ssd::format::{IndexEntry, decode_index_entries};

fn only(dir: &Path, ext: &str) -> PathBuf {
    let v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    assert_eq!(v.len(), 1, "{v:?}");
    v[0].clone()
}

/// `n` blocks of 32 KiB, all in one segment, with the store closed again.
fn populate(dir: &Path, n: usize) -> Vec<(BlockMeta, Bytes)> {
    let blocks = common::chain(n, 11);
    let (tier, _) = open(dir);
    for (m, p) in &blocks {
        tier.put(m, p.clone()).unwrap();
    }
    blocks
}

/// The test settings with segments large enough for every block of a test.
fn open(dir: &Path) -> (kvtier_ssd::SsdTier, Arc<RecordingSink>) {
    let mut config = common::config(dir);
    config.store.segment_bytes = 64 << 20;
    let sink = Arc::new(RecordingSink::default());
    let tier =
        kvtier_ssd::SsdTier::open(config, Arc::new(SystemClock::new()), sink.clone()).unwrap();
    (tier, sink)
}

fn served(tier: &kvtier_ssd::SsdTier, blocks: &[(BlockMeta, Bytes)]) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, (m, p)) in blocks.iter().enumerate() {
        if let Ok(Some(got)) = tier.get(&m.hash) {
            assert_eq!(&got, p, "block {i} served with other bytes");
            out.push(i);
        }
    }
    out
}

/// Byte ranges of each entry of an index log, in order.
fn entry_ranges(log: &[u8]) -> Vec<(std::ops::Range<u64>, bool)> {
    let (entries, valid) = decode_index_entries(log);
    assert_eq!(valid, log.len());
    let mut at = 0u64;
    let mut out = Vec::new();
    for e in entries {
        let len = 4 + u64::from(u32::from_le_bytes(
            log[at as usize..at as usize + 4].try_into().unwrap(),
        ));
        out.push((at..at + len, matches!(e, IndexEntry::Record { .. })));
        at += len;
    }
    out
}

#[test]
fn one_flipped_byte_in_any_index_entry_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = populate(dir.path(), 20);
    let seg = only(dir.path(), "seg");
    let idx = only(dir.path(), "idx");
    let seg_len = std::fs::metadata(&seg).unwrap().len();
    let pristine = std::fs::read(&idx).unwrap();
    let ranges = entry_ranges(&pristine);
    assert_eq!(ranges.len(), 20);
    // Every entry, at its length field, its type, inside the header copy and at its CRC.
    for (n, (r, _)) in ranges.iter().enumerate() {
        for at in [r.start, r.start + 4, r.start + 20, r.start + 60, r.end - 1] {
            std::fs::write(&idx, &pristine).unwrap();
            common::flip(&idx, at, 0x5a);
            let (tier, _) = open(dir.path());
            assert_eq!(
                served(&tier, &blocks).len(),
                20,
                "entry {n}, byte {at}: {:?}",
                tier.recovery_report()
            );
            drop(tier);
            assert_eq!(
                std::fs::metadata(&seg).unwrap().len(),
                seg_len,
                "entry {n}: the segment was cut"
            );
        }
    }
}

#[test]
fn thirty_random_flips_in_a_log_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = populate(dir.path(), 60);
    let idx = only(dir.path(), "idx");
    let len = std::fs::metadata(&idx).unwrap().len();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..30 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        common::flip(&idx, x % len, 1 << (x % 8));
    }
    let (tier, _) = open(dir.path());
    assert_eq!(
        served(&tier, &blocks).len(),
        60,
        "{:?}",
        tier.recovery_report()
    );
    drop(tier);
    // The log was rewritten whole: a second open reads it without any repair.
    let (tier, _) = open(dir.path());
    let report = tier.recovery_report();
    assert_eq!(report.torn_index_bytes, 0, "{report:?}");
    assert_eq!(report.salvaged_records, 0, "{report:?}");
    assert_eq!(served(&tier, &blocks).len(), 60);
}

#[test]
fn a_record_damaged_in_segment_and_log_costs_that_record_only() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = populate(dir.path(), 20);
    let seg = only(dir.path(), "seg");
    let idx = only(dir.path(), "idx");
    let seg_len = std::fs::metadata(&seg).unwrap().len();
    let ranges = entry_ranges(&std::fs::read(&idx).unwrap());
    // Record 7: its header in the segment (4 KiB file header + 7 records of 4 KiB + 32 KiB)
    // and its copy in the log.
    common::flip(&seg, 4096 + 7 * (4096 + 32768) + 30, 0xff);
    common::flip(&idx, ranges[7].0.start + 40, 0xff);
    let (tier, _) = open(dir.path());
    let got = served(&tier, &blocks);
    assert_eq!(got.len(), 19, "{:?}", tier.recovery_report());
    assert!(!got.contains(&7));
    assert_eq!(tier.recovery_report().damaged_records, 1);
    drop(tier);
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), seg_len);
}

#[test]
fn records_the_log_never_heard_of_are_found() {
    // A crash between a record and its log entry, or a power loss that kept a synced record
    // but not its log entry: the record describes itself.
    let dir = tempfile::tempdir().unwrap();
    let blocks = populate(dir.path(), 10);
    let idx = only(dir.path(), "idx");
    let ranges = entry_ranges(&std::fs::read(&idx).unwrap());
    let f = OpenOptions::new().write(true).open(&idx).unwrap();
    f.set_len(ranges[4].0.end).unwrap(); // the log knows records 0..5 only
    drop(f);
    let (tier, _) = open(dir.path());
    assert_eq!(served(&tier, &blocks).len(), 10);
    assert_eq!(tier.recovery_report().salvaged_records, 5);
}

#[test]
fn a_deleted_log_and_a_garbage_log_are_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = populate(dir.path(), 10);
    let idx = only(dir.path(), "idx");
    std::fs::remove_file(&idx).unwrap();
    {
        let (tier, _) = open(dir.path());
        assert_eq!(served(&tier, &blocks).len(), 10);
    }
    let garbage: Vec<u8> = (0..50_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(only(dir.path(), "idx"), garbage).unwrap();
    let (tier, _) = open(dir.path());
    assert_eq!(served(&tier, &blocks).len(), 10);
}
