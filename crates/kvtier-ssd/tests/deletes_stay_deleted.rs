//! A deleted or overwritten key never comes back: not after one restart, not after the
//! restart that removes the segment holding the delete, in one segment or across several.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

use std::path::Path;

use kvtier_core::hash::BlockHash;
use kvtier_core::layout::LayoutDigest;
use kvtier_ssd::format::{Kind, RecordHeader, chunk_crcs};
use kvtier_ssd::store::Recovered;
use kvtier_ssd::{SegmentStore, StoreConfig};

fn header(key: u8, payload: &[u8]) -> RecordHeader {
    RecordHeader {
        kind: Kind::Object,
        layout: LayoutDigest([7; 16]),
        key: [key; 32],
        parent: BlockHash([0; 16]),
        position: 0,
        tokens: Vec::new(),
        extra_tag: None,
        payload_len: payload.len() as u64,
        created_ms: 1,
        chunk_log2: 12,
        chunk_crcs: chunk_crcs(payload, 12),
        encoding: None,
    }
}

fn open(dir: &Path) -> (SegmentStore, Vec<Recovered>) {
    let (store, recovered, _) = SegmentStore::open(dir, StoreConfig::default()).unwrap();
    (store, recovered)
}

/// The payload of `key` as recovery sees it, read and verified.
fn value(store: &SegmentStore, recovered: &[Recovered], key: u8) -> Option<Vec<u8>> {
    let r = recovered.iter().find(|r| r.header.key == [key; 32])?;
    Some(store.read(&r.loc, &r.header.key, None).ok()?.to_vec())
}

#[test]
fn overwrite_then_delete_in_one_segment_stays_deleted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = open(dir.path());
        store.append(&header(1, b"one"), b"one").unwrap();
        let two = store.append(&header(1, b"two"), b"two").unwrap();
        store.append(&header(2, b"other"), b"other").unwrap();
        store.tombstone(&two, [1; 32]).unwrap();
    }
    for round in 0..3 {
        let (store, recovered) = open(dir.path());
        assert_eq!(
            value(&store, &recovered, 1),
            None,
            "round {round}: the key came back"
        );
        assert_eq!(value(&store, &recovered, 2).as_deref(), Some(&b"other"[..]));
    }
}

#[test]
fn overwrite_then_delete_across_segments_stays_deleted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = open(dir.path());
        store.append(&header(1, b"one"), b"one").unwrap();
    }
    {
        // A new run writes a new segment.
        let (store, recovered) = open(dir.path());
        assert_eq!(value(&store, &recovered, 1).as_deref(), Some(&b"one"[..]));
        let two = store.append(&header(1, b"two"), b"two").unwrap();
        store.tombstone(&two, [1; 32]).unwrap();
    }
    // The first restart finds the newer segment with nothing live and removes it; the
    // older copy must be dead by then, and stay dead at every later restart.
    for round in 0..3 {
        let (store, recovered) = open(dir.path());
        assert_eq!(
            value(&store, &recovered, 1),
            None,
            "round {round}: the key came back"
        );
    }
}

#[test]
fn an_overwrite_survives_restarts_and_the_old_value_never_returns() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = open(dir.path());
        store.append(&header(1, b"one"), b"one").unwrap();
    }
    {
        let (store, _) = open(dir.path());
        store.append(&header(1, b"two"), b"two").unwrap();
    }
    for round in 0..3 {
        let (store, recovered) = open(dir.path());
        assert_eq!(
            value(&store, &recovered, 1).as_deref(),
            Some(&b"two"[..]),
            "round {round}"
        );
        assert_eq!(
            recovered.iter().filter(|r| r.header.key == [1; 32]).count(),
            1
        );
    }
}

#[test]
fn a_read_only_open_changes_nothing_and_works_beside_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    let (owner, _) = open(dir.path());
    owner.append(&header(1, b"one"), b"one").unwrap();
    let two = owner.append(&header(2, b"two"), b"two").unwrap();
    owner.tombstone(&two, [2; 32]).unwrap();
    owner.record_shutdown(true).unwrap();
    let snapshot = |dir: &Path| {
        let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let before = snapshot(dir.path());
    // The owner holds the lock; a read-only open neither needs nor takes it.
    let (ro, recovered, report) = SegmentStore::open_read_only(dir.path()).unwrap();
    assert_eq!(value(&ro, &recovered, 1).as_deref(), Some(&b"one"[..]));
    assert_eq!(value(&ro, &recovered, 2), None);
    assert_eq!(report.previous_shutdown_clean, Some(true));
    assert!(ro.append(&header(3, b"x"), b"x").is_err());
    assert!(ro.tombstone(&recovered[0].loc, [1; 32]).is_err());
    drop(ro);
    assert_eq!(
        snapshot(dir.path()),
        before,
        "a read-only open changed the directory"
    );
}

#[test]
fn stray_entries_named_like_segments_do_not_stop_the_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = open(dir.path());
        store.append(&header(1, b"one"), b"one").unwrap();
    }
    std::fs::create_dir(dir.path().join("00000000000000aa.seg")).unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("nowhere"),
        dir.path().join("00000000000000ab.seg"),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("00000000000000ac.idx")).unwrap();
    let (store, recovered, report) =
        SegmentStore::open(dir.path(), StoreConfig::default()).unwrap();
    assert_eq!(value(&store, &recovered, 1).as_deref(), Some(&b"one"[..]));
    assert_eq!(report.stray_files, 3, "{report:?}");
    // New segments never take a name a stray entry holds.
    let loc = store.append(&header(2, b"two"), b"two").unwrap();
    assert!(loc.segment > 0xac);
    assert!(dir.path().join("00000000000000aa.seg").is_dir());
}

#[test]
fn an_open_writes_nothing_until_the_first_append() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = open(dir.path());
        store.append(&header(1, b"one"), b"one").unwrap();
        store.record_shutdown(true).unwrap();
    }
    let segs = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
            .count()
    };
    assert_eq!(segs(dir.path()), 1);
    {
        let (_store, recovered) = open(dir.path());
        assert_eq!(recovered.len(), 1);
    }
    assert_eq!(
        segs(dir.path()),
        1,
        "an open without appends created a segment"
    );
}
