//! Encoded run objects in a cluster (issue 40): a replica that learns of an object from
//! its record alone knows neither where each block is in it nor how it is stored until
//! it reads the manifest; it serves exactly the writer's payloads after that check,
//! whatever its own codec setting.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{Replica, World, remote, wait_until};
use kvtier_codec::{Codec, CodecConfig};
use kvtier_core::tier::conformance::test_layout;
use kvtier_core::tier::{BlockMeta, Tier};

const SOON: Duration = Duration::from_secs(20);

/// `n` blocks of the test layout with smooth f16 pages (real KV shrinks the same way).
fn smooth_chain(n: usize, seed: u32) -> Vec<(BlockMeta, Bytes)> {
    let layout = test_layout().unwrap();
    let tokens: Vec<u32> = (0..(n * layout.tokens_per_block()) as u32)
        .map(|t| t.wrapping_mul(17) ^ seed)
        .collect();
    let size = layout.block_bytes() as usize;
    BlockMeta::chain(&layout, &tokens)
        .into_iter()
        .enumerate()
        .map(|(b, meta)| {
            let page: Vec<u8> = (0..size / 2)
                .flat_map(|i| {
                    let v = ((i as f32) * 0.02 + (b as u32 + seed) as f32).sin();
                    half_bits(v).to_le_bytes()
                })
                .collect();
            (meta, Bytes::from(page))
        })
        .collect()
}

/// The f16 nearest `v` in [-1, 1] (normal range only; enough for a test page).
fn half_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    if exp <= 0 {
        return sign;
    }
    sign | ((exp as u16) << 10) | ((bits >> 13) & 0x3ff) as u16
}

#[test]
fn a_replica_serves_an_encoded_object_it_learned_from_a_record_only_after_its_manifest() {
    let world = World::start(1);
    let lossless = {
        let mut c = remote(&world.url, Duration::from_secs(2));
        c.codec = CodecConfig {
            default: Codec::Lossless,
            ..CodecConfig::default()
        };
        c
    };
    let a = Replica::start(&world.rt, world.etcd.endpoints(), "a", lossless, |_| {});
    // B writes raw: how an object is stored is the object's, not the reader's.
    let b = Replica::start(
        &world.rt,
        world.etcd.endpoints(),
        "b",
        remote(&world.url, Duration::from_secs(2)),
        |_| {},
    );
    a.ready(&world.rt);
    b.ready(&world.rt);
    a.tier.layout_registered(&test_layout().unwrap());

    let chain = smooth_chain(6, 5);
    a.tier.put_many(&chain);
    let a_codec = a.tier.stats().codec;
    assert_eq!(a_codec.encoded_pages, 6, "{a_codec:?}");
    let last = chain.last().unwrap().0.hash;
    assert!(
        wait_until(SOON, || b.tier.contains(&last)),
        "advertised to b"
    );
    let hashes: Vec<_> = chain.iter().map(|(m, _)| m.hash).collect();
    let got = b.tier.get_run(&hashes).unwrap();
    assert_eq!(got.len(), 6);
    for (g, (_, want)) in got.iter().zip(&chain) {
        assert_eq!(g, want);
    }
    let (mismatches, checks) = b.tier.record_checks();
    assert_eq!(mismatches, 0);
    assert!(
        checks >= 1,
        "the manifest was read (ahead of the load, or by it) and matched its record"
    );
    let b_codec = b.tier.stats().codec;
    assert_eq!(b_codec.decoded_pages, 6, "{b_codec:?}");
    assert!(b_codec.lossless_stored_bytes < b_codec.lossless_decoded_bytes);
    // A prefix and a suffix of the run, each one GET, exact.
    let (gets, _) = b.tier.requests();
    assert_eq!(b.tier.get_run(&hashes[..2]).unwrap()[1], chain[1].1);
    assert_eq!(b.tier.get(&hashes[4]).unwrap().as_ref(), Some(&chain[4].1));
    assert_eq!(b.tier.requests().0 - gets, 2);
}
