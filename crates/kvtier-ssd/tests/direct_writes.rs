//! Durable stores written with `O_DIRECT` (`Tier::put_to_sync`), mixed with buffered ones
//! and from several threads at once: every block reads back byte for byte, before and
//! after a reopen, and the direct path was really taken where the filesystem allows it.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

mod common;

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use bytes::Bytes;
use kvtier_core::tier::{BlockMeta, PutOutcome, Tier};

/// Whether `dir`'s filesystem accepts `O_DIRECT` at all (tmpfs does not).
fn supports_direct(dir: &Path) -> bool {
    let probe = dir.join("probe");
    let ok = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(probe);
    ok
}

fn assert_served(tier: &kvtier_ssd::SsdTier, blocks: &[(BlockMeta, Bytes)]) {
    for (i, (m, p)) in blocks.iter().enumerate() {
        let got = tier.get(&m.hash).unwrap();
        assert_eq!(got.as_ref(), Some(p), "block {i} not served as written");
    }
}

#[test]
fn direct_and_buffered_records_mix_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = common::chain(24, 5);
    {
        let (tier, _) = common::open(dir.path());
        for (i, (m, p)) in blocks.iter().enumerate() {
            // Two durable stores, then one buffered, so direct records sit right after
            // buffered ones in the page cache and the other way round.
            let outcome = if i % 3 == 2 {
                tier.put(m, p.clone())
            } else {
                tier.put_to_sync(m, p.clone())
            };
            assert_eq!(outcome.unwrap(), PutOutcome::Stored);
            if i % 3 != 2 {
                tier.make_durable().unwrap();
            }
        }
        if supports_direct(dir.path()) {
            assert_eq!(tier.direct_writes(), 16, "durable stores did not go direct");
        }
        assert_served(&tier, &blocks);
    }
    let (tier, _) = common::open(dir.path());
    assert_eq!(tier.recovery_report().records, 24);
    assert_served(&tier, &blocks);
}

#[test]
fn concurrent_durable_stores_all_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = common::chain(64, 9);
    {
        let (tier, _) = common::open(dir.path());
        std::thread::scope(|s| {
            for part in blocks.chunks(8) {
                let tier = &tier;
                s.spawn(move || {
                    for (m, p) in part {
                        assert_eq!(tier.put_to_sync(m, p.clone()).unwrap(), PutOutcome::Stored);
                        tier.make_durable().unwrap();
                    }
                });
            }
        });
        assert_served(&tier, &blocks);
    }
    let (tier, _) = common::open(dir.path());
    assert_eq!(tier.recovery_report().records, 64);
    assert_served(&tier, &blocks);
}
