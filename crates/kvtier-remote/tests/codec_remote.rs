//! The remote tier through the codec seam (issue 40, ADR 0021), against `kvtier gateway`:
//! a lossless tier's objects are smaller and every hit gives back exactly the stored
//! payloads with one ranged GET; raw and encoded blocks mix in one object and any tier
//! reads them whatever its own setting; damage inside a frame is a miss even when the
//! object's checksums are made to match; signed encoded objects are served; only a
//! layout registered with fp8 gets fp8 pages; states shrink and come back exact; a write
//! a caller waits on stays raw.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::Gateway;
use futures_util::StreamExt;
use kvtier_codec::{Codec, CodecConfig};
use kvtier_core::engine::RemoteAttach;
use kvtier_core::layout::{ColdCodec, KvDtype, LayoutDigest, LayoutKey};
use kvtier_core::snapshot::SnapshotKey;
use kvtier_core::tier::{BlockMeta, RamConfig, SnapshotStore, Tier, TierKind};
use kvtier_core::{Engine, ExtraKeys};
use kvtier_remote::object::{ENCODED_MANIFEST_VERSION, MANIFEST_VERSION, Manifest};
use kvtier_remote::{Endpoint, RemoteConfig, RemoteTier, SigningKey};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

const TPB: usize = 16;

fn key(name: &str, fp8: bool) -> LayoutKey {
    let mut k = LayoutKey::new(name, KvDtype::Bf16, TPB as u32, 4, 2, 64);
    if fp8 {
        k.cold_codec = Some(ColdCodec::Fp8E4M3);
    }
    k
}

fn lossless(endpoint: &Endpoint, prefix: &str) -> RemoteConfig {
    let mut c = common::config(endpoint.clone(), prefix);
    c.codec = CodecConfig {
        default: Codec::Lossless,
        ..CodecConfig::default()
    };
    c
}

/// An engine over a remote tier of `config`, with `keys` registered; the tier too.
fn engine(config: RemoteConfig, keys: &[LayoutKey]) -> (Engine, Arc<RemoteTier>) {
    let held: Arc<parking_lot::Mutex<Option<Arc<RemoteTier>>>> = Arc::default();
    let slot = held.clone();
    let engine = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 64 << 20,
        })
        .remote_tier(RemoteAttach::default(), move |sink| {
            let tier = Arc::new(RemoteTier::open(config, sink)?);
            *slot.lock() = Some(tier.clone());
            Ok(tier)
        })
        .build()
        .expect("engine");
    for k in keys {
        engine.register_layout(k.clone()).expect("layout");
    }
    let tier = held.lock().clone().expect("remote tier built");
    (engine, tier)
}

fn tokens(n_blocks: usize, seed: u32) -> Vec<u32> {
    (0..(n_blocks * TPB) as u32).map(|t| t * 7 + seed).collect()
}

/// A bf16 page of a smooth signal, as real KV is: its high bytes repeat, so the byte
/// planes shrink.
fn page(len: usize, seed: u32) -> Vec<u8> {
    (0..len / 2)
        .flat_map(|i| {
            let v = ((i as f32) * 0.013 + seed as f32).sin() * 2.0;
            ((v.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect()
}

fn store(engine: &Engine, layout: LayoutDigest, t: &[u32], seed: u32) -> Vec<Vec<u8>> {
    let prompt = engine.prompt(layout, t, &ExtraKeys::none()).unwrap();
    let size = engine.layout(layout).unwrap().block_bytes() as usize;
    let pages: Vec<Vec<u8>> = (0..t.len() / TPB)
        .map(|b| page(size, seed * 1000 + b as u32))
        .collect();
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    engine.store(&prompt, &refs).unwrap();
    assert!(engine.flush(Duration::from_secs(20)), "writer drained");
    pages
}

/// Looks `t` up and loads it: the blocks loaded, all from the remote tier.
fn load(engine: &Engine, layout: LayoutDigest, t: &[u32]) -> Vec<Bytes> {
    let prompt = engine.prompt(layout, t, &ExtraKeys::none()).unwrap();
    let found = engine.lookup(&prompt);
    assert!(found.blocks.iter().all(|b| b.tier == TierKind::Remote));
    let loaded = engine.load(&found).unwrap();
    assert!(loaded.complete);
    loaded.blocks
}

/// Every object under `prefix`: (name, size).
fn objects(endpoint: &Endpoint, prefix: &str) -> Vec<(String, u64)> {
    let (store, rt) = common::raw_s3(endpoint);
    let mut all: Vec<(String, u64)> = rt.block_on(async {
        store
            .list(Some(&Path::from(prefix)))
            .filter_map(|m| async move { m.ok() })
            .map(|m| (m.location.to_string(), m.size))
            .collect()
            .await
    });
    all.sort();
    all
}

fn manifest(endpoint: &Endpoint, name: &str) -> Manifest {
    let (store, rt) = common::raw_s3(endpoint);
    let bytes = rt.block_on(async {
        store
            .get(&Path::from(name))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
    });
    serde_json::from_slice(&bytes).unwrap()
}

/// The longest run object under `prefix`: its data name, size and manifest.
fn longest(endpoint: &Endpoint, prefix: &str) -> (String, u64, Manifest) {
    let all = objects(endpoint, prefix);
    all.iter()
        .filter(|(n, _)| n.ends_with(".kvm"))
        .map(|(n, _)| {
            let m = manifest(endpoint, n);
            let data = n.replace(".kvm", ".kvo");
            let size = all.iter().find(|(d, _)| *d == data).unwrap().1;
            (data, size, m)
        })
        .max_by_key(|(_, _, m)| m.blocks.len())
        .expect("a run object")
}

#[test]
fn encoded_objects_are_smaller_and_every_hit_is_exact_with_one_get() {
    let gateway = Gateway::start();
    let endpoint = gateway.endpoint();
    let k = key("codec-remote", false);
    let signing = SigningKey::from_bytes(&[3; 32]);
    for signed in [false, true] {
        let prefix = if signed { "exact-signed" } else { "exact" };
        let config = || {
            let mut c = lossless(&endpoint, prefix);
            c.signing_key = signed.then(|| signing.clone());
            c
        };
        let t = tokens(8, 1);
        let expected = {
            let (engine, tier) = engine(config(), std::slice::from_ref(&k));
            // A 4-block prefix, then the whole: the longer object repeats the first four
            // frames as stored.
            store(&engine, k.digest(), &t[..4 * TPB], 1);
            let expected = store(&engine, k.digest(), &t, 1);
            let codec = tier.stats().codec;
            assert!(codec.encoded_pages >= 8, "{codec:?}");
            assert!(
                codec.lossless_stored_bytes < codec.lossless_decoded_bytes,
                "{codec:?}"
            );
            expected
        };
        let (data, size, m) = longest(&endpoint, prefix);
        assert_eq!(m.blocks.len(), 8, "{data}");
        assert_eq!(m.version, ENCODED_MANIFEST_VERSION);
        assert!(m.blocks.iter().all(|b| b.encoded.is_some()));
        let decoded = 8 * m.block_bytes;
        assert!(
            size * 10 < decoded * 9,
            "{size} stored bytes for {decoded} decoded"
        );

        // A restarted engine: every prefix is one ranged GET and exactly the pages.
        for n in [8, 3, 6] {
            let (engine, tier) = engine(config(), std::slice::from_ref(&k));
            let (gets, _) = tier.requests();
            let got = load(&engine, k.digest(), &t[..n * TPB]);
            assert_eq!(got.len(), n);
            for (g, want) in got.iter().zip(&expected) {
                assert_eq!(&g[..], &want[..], "signed: {signed}, {n} blocks");
            }
            assert_eq!(tier.requests().0 - gets, 1, "{n} blocks in one GET");
            assert!(tier.stats().codec.decoded_pages >= n as u64);
        }
    }
}

#[test]
fn raw_and_encoded_blocks_mix_and_any_tier_reads_them_whatever_its_setting() {
    let gateway = Gateway::start();
    let endpoint = gateway.endpoint();
    let k = key("codec-mixed", false);
    let t = tokens(8, 2);
    {
        let (engine, _) = engine(
            common::config(endpoint.clone(), "mixed"),
            std::slice::from_ref(&k),
        );
        store(&engine, k.digest(), &t[..4 * TPB], 2);
    }
    let (_, _, m) = longest(&endpoint, "mixed");
    assert_eq!(m.version, MANIFEST_VERSION, "a raw tier writes version 1");
    assert!(m.blocks.iter().all(|b| b.encoded.is_none()));
    let expected = {
        let (engine, _) = engine(lossless(&endpoint, "mixed"), std::slice::from_ref(&k));
        store(&engine, k.digest(), &t, 2)
    };
    let (_, _, m) = longest(&endpoint, "mixed");
    let encoded: Vec<bool> = m.blocks.iter().map(|b| b.encoded.is_some()).collect();
    assert_eq!(
        encoded,
        [false, false, false, false, true, true, true, true],
        "the raw ancestors are copied as stored, the new blocks encoded"
    );
    for config in [
        common::config(endpoint.clone(), "mixed"),
        lossless(&endpoint, "mixed"),
    ] {
        let (engine, tier) = engine(config, std::slice::from_ref(&k));
        let got = load(&engine, k.digest(), &t);
        assert_eq!(got.len(), 8);
        for (g, want) in got.iter().zip(&expected) {
            assert_eq!(&g[..], &want[..]);
        }
        assert_eq!(tier.requests().0, 1);
    }
}

#[test]
fn damage_inside_a_frame_is_a_miss_even_with_the_objects_checksums_made_to_match() {
    let gateway = Gateway::start();
    let endpoint = gateway.endpoint();
    let k = key("codec-damage", false);
    let t = tokens(4, 3);
    {
        let (engine, _) = engine(lossless(&endpoint, "damage"), std::slice::from_ref(&k));
        store(&engine, k.digest(), &t, 3);
    }
    let (data, _, m) = longest(&endpoint, "damage");
    let (raw, rt) = common::raw_s3(&endpoint);
    let original = rt.block_on(async {
        raw.get(&Path::from(data.as_str()))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
    });
    let manifest_name = data.replace(".kvo", ".kvm");
    // Block 2's frame: after blocks 0 and 1.
    let start: u64 = m.blocks[..2].iter().map(|b| b.encoded.unwrap().bytes).sum();
    let len = m.blocks[2].encoded.unwrap().bytes;
    for at in [start + 20, start + len / 2, start + len - 1] {
        let mut bad = original.to_vec();
        bad[at as usize] ^= 0x20;
        let mut forged = m.clone();
        forged.blocks[2].crc32c =
            kvtier_remote::object::crc(&bad[start as usize..(start + len) as usize]);
        let manifest_bytes = forged.to_bytes(None).unwrap();
        rt.block_on(async {
            raw.put(&Path::from(data.as_str()), PutPayload::from(bad))
                .await
                .unwrap();
            raw.put(
                &Path::from(manifest_name.as_str()),
                PutPayload::from(manifest_bytes),
            )
            .await
            .unwrap();
        });
        let (engine, tier) = engine(lossless(&endpoint, "damage"), std::slice::from_ref(&k));
        let prompt = engine.prompt(k.digest(), &t, &ExtraKeys::none()).unwrap();
        let found = engine.lookup(&prompt);
        assert_eq!(found.blocks.len(), 4, "the manifest still points");
        let loaded = engine.load(&found).unwrap();
        assert!(
            !loaded.complete,
            "damage at byte {at} of the object was served"
        );
        assert!(
            loaded.blocks.is_empty(),
            "one GET: nothing of a bad run is served"
        );
        let stats = tier.stats();
        assert_eq!(stats.codec.decode_failures, 1, "{:?}", stats.codec);
        assert_eq!(stats.evictions.corrupt, 4, "the object is forgotten");
    }
}

#[test]
fn only_a_layout_registered_with_fp8_gets_fp8_pages() {
    let gateway = Gateway::start();
    let endpoint = gateway.endpoint();
    let plain = key("codec-fp8", false);
    let fp8 = key("codec-fp8", true);
    assert_ne!(plain.digest(), fp8.digest());
    let t = tokens(4, 4);
    let (stored_plain, stored_fp8) = {
        // A raw tier: fp8 is the layout's promise, not the tier's setting.
        let (engine, _) = engine(
            common::config(endpoint.clone(), "fp8"),
            &[plain.clone(), fp8.clone()],
        );
        (
            store(&engine, plain.digest(), &t, 4),
            store(&engine, fp8.digest(), &t, 4),
        )
    };
    let codecs = |layout: LayoutDigest| -> Vec<Option<Codec>> {
        let prefix = format!("fp8/{}", layout.to_hex());
        let (_, _, m) = longest(&endpoint, &prefix);
        m.blocks
            .iter()
            .map(|b| b.encoded.map(|e| e.codec))
            .collect()
    };
    assert_eq!(codecs(plain.digest()), vec![None; 4]);
    assert_eq!(codecs(fp8.digest()), vec![Some(Codec::Fp8E4M3); 4]);

    let (engine, _) = engine(
        common::config(endpoint.clone(), "fp8"),
        &[plain.clone(), fp8.clone()],
    );
    for (g, want) in load(&engine, plain.digest(), &t).iter().zip(&stored_plain) {
        assert_eq!(&g[..], &want[..], "the plain layout is exact");
    }
    // The fp8 layout's pages come back within e4m3's precision of what was stored: 3
    // mantissa bits (a relative error of at most 1/16, plus bf16's rounding), and not
    // exactly (they did go through fp8).
    for (g, want) in load(&engine, fp8.digest(), &t).iter().zip(&stored_fp8) {
        assert_eq!(g.len(), want.len());
        assert_ne!(&g[..], &want[..]);
        let bf16 = |b: &[u8]| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
        for (a, b) in g.chunks_exact(2).zip(want.chunks_exact(2)) {
            let (a, b) = (bf16(a), bf16(b));
            assert!((a - b).abs() <= b.abs() * 0.07 + 0.01, "{a} for {b}");
        }
    }
}

#[test]
fn states_shrink_and_come_back_exact_and_a_write_a_caller_waits_on_stays_raw() {
    let gateway = Gateway::start();
    let endpoint = gateway.endpoint();
    let k = key("codec-state", false);
    let tier = RemoteTier::open(
        lossless(&endpoint, "state"),
        Arc::new(kvtier_core::tier::NoSink),
    )
    .unwrap();
    let layout = kvtier_core::layout::Layout::new(k.clone()).unwrap();
    tier.layout_registered(&layout);

    // A state of f32 words of a smooth signal.
    let state: Vec<u8> = (0..50_000u32)
        .flat_map(|i| ((i as f32 * 0.001).cos()).to_le_bytes())
        .collect();
    let skey = SnapshotKey([9; 32]);
    tier.put_snapshot(&skey, k.digest(), &Bytes::from(state.clone()))
        .unwrap();
    let (name, size) = objects(&endpoint, "state/state").pop().unwrap();
    assert!(
        (size as usize) < state.len() * 9 / 10,
        "{name}: {size} bytes for a {}-byte state",
        state.len()
    );
    let reopened = RemoteTier::open(
        common::config(endpoint.clone(), "state"),
        Arc::new(kvtier_core::tier::NoSink),
    )
    .unwrap();
    assert_eq!(
        reopened.get_snapshot(&skey).unwrap().as_deref(),
        Some(&state[..]),
        "a raw tier reads an encoded state"
    );

    // A block written for a waiting caller is raw; the writer's path encodes.
    let t = tokens(2, 5);
    let mut parent = kvtier_core::hash::BlockHash::from(k.digest());
    let metas: Vec<BlockMeta> = t
        .chunks(TPB)
        .enumerate()
        .map(|(i, chunk)| {
            let hash = kvtier_core::hash::block_hash(parent, chunk, None);
            let m = BlockMeta {
                layout: k.digest(),
                hash,
                parent,
                position: i as u32,
                tokens: Arc::from(chunk),
                extra_tag: None,
            };
            parent = hash;
            m
        })
        .collect();
    let size = layout.block_bytes() as usize;
    tier.put_for_caller(&metas[0], Bytes::from(page(size, 1)))
        .unwrap();
    let first = manifest(
        &endpoint,
        &format!(
            "state/{}/{}-{}.kvm",
            k.digest().to_hex(),
            metas[0].hash.to_hex(),
            metas[0].hash.to_hex()
        ),
    );
    assert_eq!(first.version, MANIFEST_VERSION);
    assert!(first.blocks[0].encoded.is_none());
    tier.put_many(&[(metas[1].clone(), Bytes::from(page(size, 2)))]);
    let (_, _, both) = longest(&endpoint, &format!("state/{}", k.digest().to_hex()));
    assert_eq!(
        both.blocks
            .iter()
            .map(|b| b.encoded.is_some())
            .collect::<Vec<_>>(),
        [false, true]
    );
    for (i, m) in metas.iter().enumerate() {
        assert_eq!(
            reopened_get(&endpoint, m).as_deref(),
            Some(&page(size, i as u32 + 1)[..])
        );
    }
}

/// Block `m` read by a freshly opened raw tier under prefix `state`.
fn reopened_get(endpoint: &Endpoint, m: &BlockMeta) -> Option<Bytes> {
    let tier = RemoteTier::open(
        common::config(endpoint.clone(), "state"),
        Arc::new(kvtier_core::tier::NoSink),
    )
    .unwrap();
    tier.get(&m.hash).unwrap()
}
