//! The SSD tier with a cold-page codec (ADR 0021): encoded blocks are smaller on disk and
//! come back exactly — whole, by layer, in runs, after a restart, beside raw records and
//! under any later codec setting; pages that do not shrink, of unknown layouts, or stored
//! for a waiting caller are written raw (compaction encodes the latter); and damage
//! anywhere in an encoded record is a miss, never wrong bytes.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use kvtier_codec::Codec;
use kvtier_core::clock::SystemClock;
use kvtier_core::snapshot::SnapshotKey;
use kvtier_core::tier::conformance::{Event, RecordingSink};
use kvtier_core::tier::{BlockMeta, PutOutcome, ResidencySink, ShortRead, SnapshotStore, Tier};
use kvtier_ssd::SsdTier;
use kvtier_ssd::format::{ALIGN, RecordHeader};

/// Pages shaped like f16 KV: a few sign-and-exponent bytes, noisy mantissa bytes.
fn kv_page(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut page = Vec::with_capacity(len);
    while page.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        page.push(x as u8);
        page.push([0x38, 0x3c, 0x3d, 0xbc, 0xb8][(x >> 40) as usize % 5]);
    }
    page.truncate(len);
    Bytes::from(page)
}

/// `n` chained blocks of the test layout with KV-like payloads.
fn kv_chain(n: usize, seed: u32) -> Vec<(BlockMeta, Bytes)> {
    common::chain(n, seed)
        .into_iter()
        .enumerate()
        .map(|(i, (m, p))| (m, kv_page(p.len(), u64::from(seed) * 1000 + i as u64)))
        .collect()
}

fn open_with(dir: &Path, codec: Codec, learn: bool) -> (SsdTier, Arc<RecordingSink>) {
    let sink = Arc::new(RecordingSink::default());
    let mut config = common::config(dir);
    config.codec.default = codec;
    let tier = SsdTier::open(
        config,
        Arc::new(SystemClock::new()),
        sink.clone() as Arc<dyn ResidencySink>,
    )
    .unwrap();
    if learn {
        tier.layout_registered(&common::layout());
    }
    (tier, sink)
}

fn seg_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// Every record of a segment file: its offset and header, walked as recovery does.
fn records(seg: &Path) -> Vec<(u64, RecordHeader)> {
    let bytes = std::fs::read(seg).unwrap();
    let mut out = Vec::new();
    let mut at = ALIGN as usize;
    while at < bytes.len() {
        let Ok(h) = RecordHeader::decode(&bytes[at..]) else {
            break;
        };
        let len = h.record_len() as usize;
        out.push((at as u64, h));
        at += len;
    }
    out
}

fn disk_bytes(dir: &Path) -> u64 {
    seg_files(dir)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

/// Every block is served exactly or missed; returns how many were served.
fn served_exactly(tier: &SsdTier, blocks: &[(BlockMeta, Bytes)]) -> usize {
    blocks
        .iter()
        .filter(|(m, p)| match tier.get(&m.hash) {
            Ok(Some(got)) => {
                assert_eq!(&got, p, "wrong bytes served for {}", m.hash);
                true
            }
            Ok(None) => false,
            Err(e) => panic!("a damaged record must be a miss, not an error: {e}"),
        })
        .count()
}

#[test]
fn encoded_blocks_are_smaller_on_disk_and_come_back_exactly_every_way() {
    let layout = common::layout();
    let geometry = layout.geometry();
    let blocks = kv_chain(12, 1);
    let raw_dir = tempfile::tempdir().unwrap();
    {
        let (raw, _) = open_with(raw_dir.path(), Codec::Raw, true);
        for (m, p) in &blocks {
            raw.put(m, p.clone()).unwrap();
        }
        assert_eq!(raw.stats().codec.encoded_pages, 0);
    }
    let dir = tempfile::tempdir().unwrap();
    {
        let (tier, _) = open_with(dir.path(), Codec::Lossless, true);
        for (m, p) in &blocks {
            tier.put(m, p.clone()).unwrap();
        }
        let s = tier.stats();
        assert_eq!(s.codec.encoded_pages, 12, "{:?}", s.codec);
        assert_eq!(s.codec.lossless_decoded_bytes, 12 * layout.block_bytes());
        assert_eq!(s.codec.lossless_stored_bytes, s.resident_bytes);
        assert!(
            s.codec.lossless_stored_bytes * 10 < s.codec.lossless_decoded_bytes * 8,
            "{:?}",
            s.codec
        );
        assert_eq!(served_exactly(&tier, &blocks), 12);
        // By layer: only the segments holding the layer are read and decoded.
        for (m, p) in &blocks[..3] {
            for l in 0..geometry.num_layers {
                let r = geometry.layer_range(l..l + 1).unwrap();
                let got = tier.get_range(&m.hash, r.clone()).unwrap().unwrap();
                assert_eq!(&got[..], &p[r.start as usize..r.end as usize]);
            }
            let odd = 1000u64..20_000;
            let got = tier.get_range(&m.hash, odd.clone()).unwrap().unwrap();
            assert_eq!(&got[..], &p[1000..20_000]);
        }
        let hashes: Vec<_> = blocks.iter().map(|(m, _)| m.hash).collect();
        let run = tier.read_run(&hashes).unwrap();
        assert_eq!(run.blocks.len(), 12);
        assert!(tier.stats().codec.decoded_pages > 0);
    }
    assert!(
        disk_bytes(dir.path()) < disk_bytes(raw_dir.path()),
        "encoded {} bytes against raw {}",
        disk_bytes(dir.path()),
        disk_bytes(raw_dir.path())
    );
    // After a restart, under the same setting and under raw: the records say how they are
    // encoded, the setting only decides how new pages are written.
    for codec in [Codec::Lossless, Codec::Raw] {
        let (tier, sink) = open_with(dir.path(), codec, false);
        assert_eq!(sink.events().len(), 12);
        assert_eq!(served_exactly(&tier, &blocks), 12);
        assert_eq!(
            tier.stats().codec.lossless_decoded_bytes,
            12 * layout.block_bytes()
        );
    }
}

#[test]
fn raw_and_encoded_records_live_side_by_side_and_both_recover() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = kv_chain(10, 2);
    {
        // Written before the codec was turned on (or by an older build): version-1 records.
        let (tier, _) = open_with(dir.path(), Codec::Raw, true);
        for (m, p) in &blocks[..5] {
            tier.put(m, p.clone()).unwrap();
        }
    }
    {
        let (tier, _) = open_with(dir.path(), Codec::Lossless, true);
        for (m, p) in &blocks[5..] {
            tier.put(m, p.clone()).unwrap();
        }
        assert_eq!(tier.stats().codec.encoded_pages, 5);
    }
    let (tier, _) = open_with(dir.path(), Codec::Lossless, true);
    assert_eq!(served_exactly(&tier, &blocks), 10);
    let encoded = seg_files(dir.path())
        .iter()
        .flat_map(|s| records(s))
        .filter(|(_, h)| h.encoding.is_some())
        .count();
    assert_eq!(encoded, 5);
    // Storing a block held raw again is a duplicate, not a rewrite, whatever the codec.
    let again = tier.put(&blocks[0].0, blocks[0].1.clone()).unwrap();
    assert_eq!(again, kvtier_core::tier::PutOutcome::Duplicate);
}

#[test]
fn pages_stored_for_a_waiting_caller_are_raw_until_compaction_moves_them() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = kv_chain(20, 3);
    let (tier, _) = open_with(dir.path(), Codec::Lossless, true);
    for (i, (m, p)) in blocks.iter().enumerate() {
        if i % 2 == 0 {
            tier.put_for_caller(m, p.clone()).unwrap();
        } else {
            tier.put_to_sync(m, p.clone()).unwrap();
        }
    }
    let s = tier.stats();
    assert_eq!((s.codec.encoded_pages, s.codec.not_shrunk_pages), (0, 0));
    assert_eq!(s.codec.lossless_stored_bytes, 0);
    // Free most of the first segment, then compact it: its live records move, encoded.
    let first: Vec<_> = records(&seg_files(dir.path())[0])
        .into_iter()
        .map(|(_, h)| h.block_hash())
        .collect();
    assert!(first.len() >= 3);
    for h in &first[1..] {
        tier.remove(h).unwrap();
    }
    let done = tier.compact(0.9).unwrap();
    assert!(done.relocated >= 1, "{done:?}");
    let s = tier.stats();
    assert!(s.codec.encoded_pages >= 1, "{:?}", s.codec);
    assert!(s.codec.lossless_stored_bytes > 0);
    let kept: Vec<_> = blocks
        .iter()
        .filter(|(m, _)| !first[1..].contains(&m.hash))
        .cloned()
        .collect();
    assert_eq!(served_exactly(&tier, &kept), kept.len());
}

#[test]
fn noise_and_unknown_layouts_are_stored_raw() {
    let dir = tempfile::tempdir().unwrap();
    let noise = common::chain(3, 4)
        .into_iter()
        .map(|(m, p)| {
            let mut x = 7u64;
            let bytes: Vec<u8> = (0..p.len())
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            (m, Bytes::from(bytes))
        })
        .collect::<Vec<_>>();
    {
        let (tier, _) = open_with(dir.path(), Codec::Lossless, true);
        for (m, p) in &noise {
            tier.put(m, p.clone()).unwrap();
        }
        let s = tier.stats();
        assert_eq!((s.codec.encoded_pages, s.codec.not_shrunk_pages), (0, 3));
        assert_eq!(served_exactly(&tier, &noise), 3);
    }
    let dir = tempfile::tempdir().unwrap();
    let blocks = kv_chain(3, 5);
    let (tier, _) = open_with(dir.path(), Codec::Lossless, false);
    for (m, p) in &blocks {
        tier.put(m, p.clone()).unwrap();
    }
    let s = tier.stats();
    assert_eq!((s.codec.encoded_pages, s.codec.not_shrunk_pages), (0, 0));
    assert_eq!(served_exactly(&tier, &blocks), 3);
}

#[test]
fn a_batch_is_encoded_ahead_and_appended_and_published_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let kv = kv_chain(10, 7);
    let noise: Vec<(BlockMeta, Bytes)> = common::chain(2, 8)
        .into_iter()
        .map(|(m, p)| {
            let bytes: Vec<u8> = (0..p.len() as u64)
                .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
                .collect();
            (m, Bytes::from(bytes))
        })
        .collect();
    let (tier, sink) = open_with(dir.path(), Codec::Lossless, true);
    // Held before the batch: a duplicate in it, not encoded again.
    tier.put(&kv[0].0, kv[0].1.clone()).unwrap();
    let mut batch = kv.clone();
    batch.insert(4, noise[0].clone());
    batch.insert(7, kv[2].clone()); // a second copy within the batch
    batch.push(noise[1].clone());
    let outcomes: Vec<PutOutcome> = tier
        .put_many(&batch)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let want: Vec<PutOutcome> = batch
        .iter()
        .enumerate()
        .map(|(i, (m, _))| {
            if m.hash == kv[0].0.hash || (i == 7) {
                PutOutcome::Duplicate
            } else {
                PutOutcome::Stored
            }
        })
        .collect();
    assert_eq!(outcomes, want);
    let s = tier.stats();
    assert_eq!(
        (s.codec.encoded_pages, s.codec.not_shrunk_pages),
        (10, 2),
        "each KV page encoded once, the noise stored raw: {:?}",
        s.codec
    );
    // Published and appended in the batch's order.
    let stored: Vec<_> = batch
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| **o == PutOutcome::Stored)
        .map(|((m, _), _)| m.hash)
        .collect();
    let published: Vec<_> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Inserted(_, hash) => Some(hash),
            Event::Removed(..) => None,
        })
        .skip(1)
        .collect();
    assert_eq!(published, stored);
    let on_disk: Vec<[u8; 16]> = seg_files(dir.path())
        .iter()
        .flat_map(|seg| records(seg))
        .map(|(_, h)| h.key[..16].try_into().unwrap())
        .skip(1)
        .collect();
    let want_on_disk: Vec<[u8; 16]> = stored.iter().map(|h| h.0).collect();
    assert_eq!(on_disk, want_on_disk);
    assert_eq!(served_exactly(&tier, &kv), 10);
    assert_eq!(served_exactly(&tier, &noise), 2);
    drop(tier);
    let (tier, _) = open_with(dir.path(), Codec::Lossless, true);
    assert_eq!(served_exactly(&tier, &kv), 10);
    assert_eq!(served_exactly(&tier, &noise), 2);
}

#[test]
fn a_lossy_codec_is_refused_as_a_tier_setting() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path());
    config.codec.default = Codec::Fp8E4M3;
    let err = SsdTier::open(
        config,
        Arc::new(SystemClock::new()),
        Arc::new(RecordingSink::default()) as Arc<dyn ResidencySink>,
    )
    .unwrap_err();
    assert!(err.to_string().contains("lossy"), "{err}");
}

#[test]
fn damage_anywhere_in_an_encoded_record_is_a_miss_never_wrong_bytes() {
    let blocks = kv_chain(6, 6);
    // Places to damage, relative to a record: its header, its frame table, the start and
    // the middle of its encoded segments, its last byte.
    let places = |h: &RecordHeader| {
        let p = h.payload_offset();
        vec![
            40,
            115,
            p,
            p + 5,
            p + 30,
            p + h.payload_len / 3,
            p + h.payload_len / 2,
            p + h.payload_len - 1,
        ]
    };
    let (recs, n) = {
        let dir = tempfile::tempdir().unwrap();
        let (tier, _) = open_with(dir.path(), Codec::Lossless, true);
        for (m, p) in &blocks {
            tier.put(m, p.clone()).unwrap();
        }
        let seg = seg_files(dir.path())[0].clone();
        let recs = records(&seg);
        (recs.clone(), places(&recs[0].1).len())
    };
    assert!(recs.iter().all(|(_, h)| h.encoding.is_some()));
    for place in 0..n {
        let dir = tempfile::tempdir().unwrap();
        {
            let (tier, _) = open_with(dir.path(), Codec::Lossless, true);
            for (m, p) in &blocks {
                tier.put(m, p.clone()).unwrap();
            }
        }
        let seg = seg_files(dir.path())[0].clone();
        let (at, h) = &records(&seg)[2];
        let offset = at + places(h)[place];
        common::flip(&seg, offset, 0x5a);
        let (tier, _) = open_with(dir.path(), Codec::Lossless, true);
        // A layer read of the damaged block first (it may touch undamaged segments only:
        // then it is served, exactly), then whole reads of everything.
        let layer = common::layout().geometry().layer_range(3..4).unwrap();
        match tier.read_range(&blocks[2].0.hash, layer.clone()) {
            Ok(Ok(got)) => assert_eq!(
                &got[..],
                &blocks[2].1[layer.start as usize..layer.end as usize]
            ),
            Ok(Err(short)) => assert!(matches!(short, ShortRead::Corrupt | ShortRead::NotHeld)),
            Err(e) => panic!("damage is a miss, not an error: {e}"),
        }
        let served = served_exactly(&tier, &blocks);
        assert_eq!(
            served,
            5,
            "damage at record offset {} was served",
            places(h)[place]
        );
        assert!(!tier.contains(&blocks[2].0.hash));
    }
}

#[test]
fn snapshots_are_encoded_on_their_way_down_and_come_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let layout = common::layout();
    let key = SnapshotKey::new(layout.digest(), &[1, 2, 3], None);
    let blob = kv_page(300_000, 9);
    {
        let (tier, _) = open_with(dir.path(), Codec::Lossless, true);
        tier.put_snapshot(&key, layout.digest(), &blob).unwrap();
        assert_eq!(tier.stats().codec.encoded_pages, 1);
        assert_eq!(tier.get_snapshot(&key).unwrap().unwrap(), blob);
    }
    let recs: Vec<_> = seg_files(dir.path())
        .iter()
        .flat_map(|s| records(s))
        .collect();
    assert!(recs[0].1.encoding.is_some() && recs[0].1.payload_len < blob.len() as u64);
    let (tier, _) = open_with(dir.path(), Codec::Raw, false);
    assert_eq!(tier.get_snapshot(&key).unwrap().unwrap(), blob);
}

fn engine_with(dir: &Path, codec: Codec, attach_now: bool) -> kvtier_core::Engine {
    let mut config = common::config(dir);
    config.codec.default = codec;
    let open = move |sink: Arc<dyn ResidencySink>| {
        Ok(Arc::new(SsdTier::open(config, Arc::new(SystemClock::new()), sink)?) as Arc<dyn Tier>)
    };
    let builder = kvtier_core::Engine::builder();
    if attach_now {
        builder
            .persistent_tier(kvtier_core::PersistConfig::default(), open)
            .build()
            .unwrap()
    } else {
        let e = builder.build().unwrap();
        // Attached later, as `POST /admin/ssd` does: the tier learns the layouts the
        // engine registered before it came.
        e.register_layout(common::layout().key().clone()).unwrap();
        e.reattach_persistent(
            Some((kvtier_core::PersistConfig::default(), Box::new(open))),
            std::time::Duration::from_secs(5),
        )
        .unwrap();
        e
    }
}

#[test]
fn an_engine_store_is_encoded_by_the_writer_and_loads_back_exactly_after_a_restart() {
    use kvtier_core::ExtraKeys;
    use kvtier_core::tier::TierKind;
    let layout = common::layout();
    let blocks = kv_chain(10, 8);
    let tokens: Vec<u32> = blocks
        .iter()
        .flat_map(|(m, _)| m.tokens.iter().copied())
        .collect();
    for attach_now in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        {
            let e = engine_with(dir.path(), Codec::Lossless, attach_now);
            // Registered again only where the tier came first: registering notifies every
            // attached tier, which would hide a tier that missed the earlier layouts.
            let l = if attach_now {
                e.register_layout(layout.key().clone()).unwrap()
            } else {
                e.layout(layout.digest()).unwrap()
            };
            let prompt = e.prompt(l.digest(), &tokens, &ExtraKeys::none()).unwrap();
            let refs: Vec<&[u8]> = blocks.iter().map(|(_, p)| p.as_ref()).collect();
            e.store(&prompt, &refs).unwrap();
            assert!(
                e.shutdown(std::time::Duration::from_secs(10))
                    .unwrap()
                    .clean
            );
            let s = e.stats();
            let codec = s.tier(TierKind::Ssd).unwrap().codec;
            assert_eq!(
                codec.encoded_pages, 10,
                "attached at build: {attach_now}; {codec:?}"
            );
            assert!(codec.lossless_stored_bytes < codec.lossless_decoded_bytes);
        }
        let e = engine_with(dir.path(), Codec::Lossless, true);
        let l = e.register_layout(layout.key().clone()).unwrap();
        let prompt = e.prompt(l.digest(), &tokens, &ExtraKeys::none()).unwrap();
        let hit = e.lookup(&prompt);
        assert_eq!(hit.blocks.len(), 10);
        let loaded = e.load(&hit).unwrap();
        assert!(loaded.complete);
        for (got, (_, want)) in loaded.blocks.iter().zip(&blocks) {
            assert_eq!(got, want);
        }
    }
}

#[test]
fn only_a_layout_registered_with_fp8_gets_fp8_pages() {
    use kvtier_core::tier::conformance::test_chain;
    use kvtier_core::{ColdCodec, Layout};
    let exact = common::layout();
    let mut key = exact.key().clone();
    key.cold_codec = Some(ColdCodec::Fp8E4M3);
    let lossy = Layout::new(key).unwrap();
    assert_ne!(lossy.digest(), exact.digest());
    let with_kv = |layout: &Layout, seed: u32| -> Vec<(BlockMeta, Bytes)> {
        test_chain(layout, 4, seed)
            .into_iter()
            .enumerate()
            .map(|(i, (m, p))| (m, kv_page(p.len(), u64::from(seed) * 100 + i as u64)))
            .collect()
    };
    let exact_blocks = with_kv(&exact, 1);
    let lossy_blocks = with_kv(&lossy, 2);
    let dir = tempfile::tempdir().unwrap();
    // The tier's own setting is lossless: the fp8 layout gets fp8 all the same, the other
    // never does.
    let (tier, _) = open_with(dir.path(), Codec::Lossless, false);
    tier.layout_registered(&exact);
    tier.layout_registered(&lossy);
    for (m, p) in exact_blocks.iter().chain(&lossy_blocks) {
        tier.put(m, p.clone()).unwrap();
    }
    let s = tier.stats().codec;
    assert_eq!(s.fp8_decoded_bytes, 4 * lossy.block_bytes(), "{s:?}");
    assert!(s.fp8_stored_bytes * 10 < s.fp8_decoded_bytes * 6, "{s:?}");
    assert_eq!(s.lossless_decoded_bytes, 4 * exact.block_bytes());
    for (_, h) in seg_files(dir.path()).iter().flat_map(|s| records(s)) {
        let codec = h.encoding.map(|e| e.codec);
        if h.layout == exact.digest() {
            assert_ne!(
                codec,
                Some(Codec::Fp8E4M3),
                "an exact layout got an fp8 page"
            );
        } else {
            assert_eq!(codec, Some(Codec::Fp8E4M3));
        }
    }
    assert_eq!(served_exactly(&tier, &exact_blocks), 4);
    for (m, p) in &lossy_blocks {
        let got = tier.get(&m.hash).unwrap().unwrap();
        assert_eq!(got.len(), p.len());
        assert_ne!(&got, p, "fp8 gave back every byte: it was not applied");
        // Signs and magnitudes survive: the high byte (sign, exponent, top mantissa bits)
        // differs by at most one step almost everywhere.
        let close = got
            .chunks_exact(2)
            .zip(p.chunks_exact(2))
            .filter(|(a, b)| (i16::from(a[1] as i8) - i16::from(b[1] as i8)).abs() <= 1)
            .count();
        assert!(
            close * 100 >= 99 * (p.len() / 2),
            "{close} of {}",
            p.len() / 2
        );
    }
}
