//! Stores of buffers the caller hands over: kept as they are (no copy), checked like any
//! other store.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod common;

use bytes::Bytes;
use kvtier_core::tier::RamConfig;
use kvtier_core::{Engine, ErrorKind, ExtraKeys, StoreOptions};

use common::{payload_for, small_key, store_all};

fn engine() -> Engine {
    Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 1 << 20,
        })
        .max_tokens(1024)
        .build()
        .unwrap()
}

#[test]
fn owned_buffers_are_kept_without_a_copy_and_borrowed_ones_are_copied() {
    let e = engine();
    let layout = e.register_layout(small_key()).unwrap();
    let tokens: Vec<u32> = (0..48).collect();
    let prompt = e
        .prompt(layout.digest(), &tokens, &ExtraKeys::none())
        .unwrap();
    let owned: Vec<Bytes> = prompt.hashes()[..2]
        .iter()
        .map(|h| Bytes::from(payload_for(&layout, h)))
        .collect();
    let report = e
        .store_owned(&prompt, owned.clone(), StoreOptions::default())
        .unwrap();
    assert_eq!(report.stored, 2);
    // The whole prompt through the borrowed path: the first two are duplicates.
    let report = store_all(&e, &layout, &tokens).unwrap();
    assert_eq!((report.stored, report.duplicates), (1, 2));
    let third = payload_for(&layout, &prompt.hashes()[2]);

    let found = e.lookup(&prompt);
    assert_eq!(found.blocks.len(), 3);
    let loaded = e.load(&found).unwrap();
    assert!(loaded.complete);
    for (i, (got, sent)) in loaded.blocks.iter().zip(&owned).enumerate() {
        assert_eq!(got, sent, "block {i}");
        assert_eq!(
            got.as_ptr(),
            sent.as_ptr(),
            "block {i} was copied: the RAM tier should hold the caller's own buffer"
        );
    }
    assert_eq!(&loaded.blocks[2][..], &third[..]);

    // A borrowed payload is copied: the caller may reuse its memory.
    let other: Vec<u32> = (100..116).collect();
    let prompt = e
        .prompt(layout.digest(), &other, &ExtraKeys::none())
        .unwrap();
    let mine = payload_for(&layout, &prompt.hashes()[0]);
    assert_eq!(e.store(&prompt, &[&mine]).unwrap().stored, 1);
    let loaded = e.load(&e.lookup(&prompt)).unwrap();
    assert_eq!(&loaded.blocks[0][..], &mine[..]);
    assert_ne!(loaded.blocks[0].as_ptr(), mine.as_ptr());
}

#[test]
fn owned_buffers_of_the_wrong_size_store_nothing() {
    let e = engine();
    let layout = e.register_layout(small_key()).unwrap();
    let tokens: Vec<u32> = (0..48).collect();
    let prompt = e
        .prompt(layout.digest(), &tokens, &ExtraKeys::none())
        .unwrap();
    let good = Bytes::from(payload_for(&layout, &prompt.hashes()[0]));
    let long = Bytes::from(vec![0u8; good.len() + 1]);
    let err = e
        .store_owned(&prompt, vec![good.clone(), long], StoreOptions::default())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert!(err.to_string().contains("payload of block 1"), "{err}");
    // Too many payloads for the prompt's whole blocks.
    let err = e
        .store_owned(&prompt, vec![good; 4], StoreOptions::default())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert_eq!(e.lookup(&prompt).blocks.len(), 0, "nothing may be kept");
}

#[test]
fn a_prompt_stored_in_pieces_needs_each_piece_s_parent_held() {
    let e = engine();
    let layout = e.register_layout(small_key()).unwrap();
    let tokens: Vec<u32> = (0..64).collect();
    let prompt = e
        .prompt(layout.digest(), &tokens, &ExtraKeys::none())
        .unwrap();
    let payloads: Vec<Bytes> = prompt
        .hashes()
        .iter()
        .map(|h| Bytes::from(payload_for(&layout, h)))
        .collect();
    let from = |first_block| StoreOptions {
        first_block,
        ..StoreOptions::default()
    };
    // Block 3 on, with block 2 never stored: nothing kept.
    let orphan = e
        .store_owned(&prompt, payloads[3..].to_vec(), from(3))
        .unwrap();
    assert_eq!(orphan.stored, 0);
    assert_eq!(
        orphan.stopped,
        Some(kvtier_core::tier::RejectReason::ParentMissing)
    );
    assert_eq!(e.lookup(&prompt).blocks.len(), 0);
    // Blocks 0..2, then 2.. : the whole prompt, each block under its own position.
    assert_eq!(
        e.store_owned(&prompt, payloads[..2].to_vec(), from(0))
            .unwrap()
            .stored,
        2
    );
    let rest = e
        .store_owned(&prompt, payloads[2..].to_vec(), from(2))
        .unwrap();
    assert_eq!((rest.stored, rest.stopped), (payloads.len() - 2, None));
    let found = e.lookup(&prompt);
    assert_eq!(found.blocks.len(), payloads.len());
    assert_eq!(e.load(&found).unwrap().blocks, payloads);
    // Past the prompt's end: refused whole.
    let err = e
        .store_owned(&prompt, payloads[2..].to_vec(), from(3))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid);
}
