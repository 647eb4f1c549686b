//! The gateway's store on real files: reopening finds what was written, a damaged record
//! is never served, listings paginate through keys and common prefixes alike.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

use kvtier_gateway::store::{GatewayStore, ListQuery, ObjectInfo, Precondition, StoreError};
use kvtier_ssd::StoreConfig;

fn info() -> ObjectInfo {
    ObjectInfo {
        etag: "e".into(),
        ..ObjectInfo::default()
    }
}

#[test]
fn objects_buckets_and_deletes_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (s, _) = GatewayStore::open(dir.path(), StoreConfig::default()).unwrap();
        s.create_bucket("b1").unwrap();
        s.put_object("b1", "x", b"first", info()).unwrap();
        s.put_object("b1", "x", b"second", info()).unwrap();
        s.put_object("b1", "y", b"gone", info()).unwrap();
        s.delete_object("b1", "y", &Precondition::default())
            .unwrap();
        s.create_bucket("b2").unwrap();
        s.delete_bucket("b2").unwrap();
        assert_eq!(
            s.put_object("nope", "k", b"", info()).unwrap_err(),
            StoreError::NoSuchBucket
        );
    }
    let (s, opened) = GatewayStore::open(dir.path(), StoreConfig::default()).unwrap();
    assert_eq!((opened.buckets, opened.objects), (1, 1));
    let o = s.object("b1", "x").unwrap();
    assert_eq!(&s.read("b1", "x", &o, 0..o.size).unwrap()[..], b"second");
    assert_eq!(s.object("b1", "y").unwrap_err(), StoreError::NoSuchKey);
    assert!(!s.has_bucket("b2"));
}

#[test]
fn a_damaged_record_is_dropped_not_served() {
    let dir = tempfile::tempdir().unwrap();
    // Non-periodic bytes, so a 64-byte window is found exactly where it is.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..300_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    {
        let (s, _) = GatewayStore::open(dir.path(), StoreConfig::default()).unwrap();
        s.create_bucket("b").unwrap();
        s.put_object("b", "k", &data, info()).unwrap();
    }
    // Flip one byte in the middle of the object's bytes on disk.
    let seg = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "seg"))
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes
        .windows(64)
        .position(|w| w == &data[150_000..150_064])
        .unwrap();
    bytes[at + 10] ^= 0xff;
    std::fs::write(&seg, bytes).unwrap();
    let (s, _) = GatewayStore::open(dir.path(), StoreConfig::default()).unwrap();
    let o = s.object("b", "k").unwrap();
    // A range away from the damage still reads (its chunks verify) ...
    assert_eq!(&s.read("b", "k", &o, 0..1000).unwrap()[..], &data[..1000]);
    // ... the damaged chunk is refused and the object leaves the index.
    assert!(matches!(
        s.read("b", "k", &o, 140_000..160_000),
        Err(StoreError::Corrupt(_))
    ));
    assert_eq!(s.object("b", "k").unwrap_err(), StoreError::NoSuchKey);
}

#[test]
fn listings_paginate_through_keys_and_common_prefixes() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = GatewayStore::open(dir.path(), StoreConfig::default()).unwrap();
    s.create_bucket("b").unwrap();
    for k in ["a/1", "a/2", "b", "c/1", "c/2", "c/3", "d", "e/x/1"] {
        s.put_object("b", k, b"v", info()).unwrap();
    }
    let mut seen = Vec::new();
    let mut token = None;
    for _ in 0..10 {
        let page = s
            .list(
                "b",
                &ListQuery {
                    delimiter: Some("/".into()),
                    max_keys: 2,
                    continuation: token.clone(),
                    ..ListQuery::default()
                },
            )
            .unwrap();
        assert!(page.objects.len() + page.common_prefixes.len() <= 2);
        seen.extend(page.common_prefixes.iter().cloned());
        seen.extend(page.objects.iter().map(|(k, _)| k.clone()));
        if !page.truncated {
            break;
        }
        token = page.next_token;
    }
    seen.sort();
    assert_eq!(seen, ["a/", "b", "c/", "d", "e/"]);
    // Prefix and start-after together.
    let page = s
        .list(
            "b",
            &ListQuery {
                prefix: "c/".into(),
                start_after: Some("c/1".into()),
                max_keys: 1000,
                ..ListQuery::default()
            },
        )
        .unwrap();
    let keys: Vec<_> = page.objects.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["c/2", "c/3"]);
    // A token that is not ours is no page, not a panic.
    assert!(kvtier_gateway::store::decode_token("zz").is_none());
}
