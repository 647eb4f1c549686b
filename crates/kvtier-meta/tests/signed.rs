//! The cluster's signing key (issue 39, item 3): a party that can write only the bucket,
//! or only etcd, cannot make a replica serve bytes of its choosing or delete what it
//! serves. Each attack is shown to work against replicas without a key (the control),
//! then to be a miss, counted, against replicas with one.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{ACCESS, BUCKET, CLUSTER, Replica, SECRET, World, adverts, remote, wait_until};
use kvtier_core::tier::conformance::{test_chain, test_layout};
use kvtier_core::tier::{NoSink, Tier};
use kvtier_meta::record::LayoutDeleted;
use kvtier_meta::signed::RecordSigning;
use kvtier_meta::{Advert, Keys};
use kvtier_remote::{RemoteConfig, RemoteTier, SigningKey};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

const SOON: Duration = Duration::from_secs(20);

fn cluster_key() -> SigningKey {
    SigningKey::from_bytes(&[0x5a; 32])
}

fn signed(mut config: RemoteConfig) -> RemoteConfig {
    config.signing_key = Some(cluster_key());
    config
}

/// Two replicas of the cluster, signing with the cluster key or not.
fn pair(world: &World, with_key: bool) -> (Replica, Replica) {
    let config = || {
        let c = remote(&world.url, Duration::from_secs(2));
        if with_key { signed(c) } else { c }
    };
    let key = with_key.then(cluster_key);
    let start = |name: &str, leader: bool| {
        let key = key.clone();
        Replica::start(
            &world.rt,
            world.etcd.endpoints(),
            name,
            config(),
            move |c| {
                c.signing_key = key;
                c.gc_leader = leader;
            },
        )
    };
    let (a, b) = (start("a", true), start("b", false));
    a.ready(&world.rt);
    b.ready(&world.rt);
    (a, b)
}

/// The bucket through a plain S3 client: what a party holding only the bucket's
/// credentials can do.
fn bucket_put(world: &World, name: &str, bytes: Vec<u8>) {
    let store = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(&world.url)
        .with_bucket_name(BUCKET)
        .with_region("us-east-1")
        .with_access_key_id(ACCESS)
        .with_secret_access_key(SECRET)
        .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
        .build()
        .expect("S3 client");
    world
        .rt
        .block_on(store.put(&Path::from(name), PutPayload::from(bytes)))
        .unwrap();
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The CRC-32C (Castagnoli, reflected) table.
fn crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    for (i, t) in table.iter_mut().enumerate() {
        let mut c = i as u32;
        for _ in 0..8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
        }
        *t = c;
    }
    table
}

/// `forged` with its last four bytes rewritten so its CRC-32C is `target`: what anyone
/// can do to a checksum that is not a MAC.
fn forge_crc(mut forged: Vec<u8>, target: u32) -> Vec<u8> {
    let table = crc_table();
    let n = forged.len() - 4;
    let mut state = kvtier_remote::object::crc(&forged[..n]) ^ 0xFFFF_FFFF;
    // Backwards from the final state: the table index each of the four steps must use
    // (a table entry's top byte names its index uniquely).
    let mut want = target ^ 0xFFFF_FFFF;
    let mut index = [0usize; 4];
    for k in (0..4).rev() {
        index[k] = (0..256).find(|&j| table[j] >> 24 == want >> 24).unwrap();
        want = (want ^ table[index[k]]) << 8;
    }
    for k in 0..4 {
        forged[n + k] = ((state ^ index[k] as u32) & 0xff) as u8;
        state = (state >> 8) ^ table[index[k]];
    }
    forged
}

#[test]
fn a_payload_forged_in_the_bucket_alone_is_never_served_by_a_replica_with_the_key() {
    let layout = test_layout().unwrap();
    let chain = test_chain(&layout, 2, 11);
    let first = chain[0].0.hash;
    let block = chain[0].1.len();
    for with_key in [false, true] {
        let world = World::start(1);
        let (a, b) = pair(&world, with_key);
        a.tier.put_many(&chain);
        assert!(wait_until(SOON, || b.tier.contains(&first)));
        assert_eq!(b.tier.get(&first).unwrap().as_ref(), Some(&chain[0].1));
        let (manifest, _) = adverts(&b).pop().unwrap();
        let data = manifest.replace(".kvm", ".kvo");

        // A bucket writer replaces the first block with bytes of its choosing whose
        // CRC-32C is the manifest's (the manifest and the record are untouched).
        let mut chosen = vec![0xAB; block];
        chosen[..5].copy_from_slice(b"FORGE");
        let chosen = forge_crc(chosen, kvtier_remote::object::crc(&chain[0].1));
        assert_eq!(
            kvtier_remote::object::crc(&chosen),
            kvtier_remote::object::crc(&chain[0].1)
        );
        let mut object = chosen.clone();
        object.extend_from_slice(&chain[1].1);
        bucket_put(&world, &data, object);

        let served = b.tier.get(&first).unwrap();
        let refused = b.tier.stats().refused_unsigned;
        if with_key {
            assert_eq!(served, None, "a forged payload was served under the key");
            assert!(refused >= 1, "the refusal was not counted");
        } else {
            // The control: without a key, the CRC is all there is, and it is fooled.
            assert_eq!(served, Some(Bytes::from(chosen)));
            assert_eq!(refused, 0);
        }
    }
}

#[test]
fn a_manifest_and_payload_written_to_the_bucket_without_the_key_are_never_adopted() {
    let world = World::start(1);
    let layout = test_layout().unwrap();
    let chain = test_chain(&layout, 3, 12);
    let last = chain[2].0.hash;
    // A bucket writer without the key writes a complete, self-consistent object (the
    // format is public): a keyless tier listing the bucket at open.
    let own_prefix = |mut c: RemoteConfig| {
        c.prefix = "listed".into();
        c
    };
    let config = || own_prefix(remote(&world.url, Duration::from_secs(2)));
    let intruder = RemoteTier::open(config(), std::sync::Arc::new(NoSink)).unwrap();
    intruder.put_many(&chain);
    assert!(intruder.contains(&last));

    let keyless = RemoteTier::open(config(), std::sync::Arc::new(NoSink)).unwrap();
    assert_eq!(keyless.get(&last).unwrap().as_ref(), Some(&chain[2].1));
    let keyed = RemoteTier::open(signed(config()), std::sync::Arc::new(NoSink)).unwrap();
    assert!(!keyed.contains(&last), "an unsigned manifest was adopted");
    assert_eq!(keyed.get(&last).unwrap(), None);
    assert!(keyed.stats().refused_unsigned >= 1);

    // What a key holder writes, a key holder reads.
    let other = test_chain(&layout, 2, 13);
    keyed.put_many(&other);
    let reader = RemoteTier::open(signed(config()), std::sync::Arc::new(NoSink)).unwrap();
    assert_eq!(
        reader.get(&other[1].0.hash).unwrap().as_ref(),
        Some(&other[1].1)
    );
    // A reader with another key refuses it too.
    let mut foreign = config();
    foreign.signing_key = Some(SigningKey::from_bytes(&[1; 32]));
    let foreign = RemoteTier::open(foreign, std::sync::Arc::new(NoSink)).unwrap();
    assert!(!foreign.contains(&other[1].0.hash));
}

#[test]
fn records_forged_in_etcd_alone_neither_delete_nor_move_what_a_replica_serves() {
    let layout = test_layout().unwrap();
    let chain = test_chain(&layout, 2, 14);
    let first = chain[0].0.hash;
    for with_key in [false, true] {
        let world = World::start(1);
        let (a, b) = pair(&world, with_key);
        a.tier.put_many(&chain);
        assert!(wait_until(SOON, || b.tier.contains(&first)));
        let mut client = world.client();
        let unsigned = Keys::new(CLUSTER);

        // An etcd writer without the key records a delete of the layout.
        let marker = unsigned.deleted(&layout.digest());
        let value = unsigned.seal(
            &marker,
            &LayoutDeleted {
                v: 1,
                by: "intruder".into(),
                at_ms: now_ms(),
            },
        );
        world
            .rt
            .block_on(client.put(marker.as_str(), value, None))
            .unwrap();
        if !with_key {
            // The control: every replica drops the layout.
            assert!(wait_until(SOON, || !b.tier.contains(&first)));
            continue;
        }
        // The GC leader reads it, refuses it and counts it.
        assert!(wait_until(SOON, || a.stat("records_forged") >= 1));
        // Several leader sweeps later, nothing was withdrawn.
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(b.tier.get(&first).unwrap().as_ref(), Some(&chain[0].1));
        assert_eq!(a.stat("deleted_withdrawn"), 0);

        // It rewrites A's advertisement under its own name: B stops serving the run (a
        // miss, counted), and never takes the intruder's word for whose it is.
        let key = Keys::new(CLUSTER).objects();
        let got = world
            .rt
            .block_on(client.get(
                key.as_str(),
                Some(kvtier_meta::etcd_client::GetOptions::new().with_prefix()),
            ))
            .unwrap();
        let kv = got.kvs().first().unwrap();
        let advert_key = kv.key_str().unwrap().to_owned();
        let mut advert: Advert = unsigned.open(kv.key(), kv.value()).unwrap();
        advert.owner = "intruder".into();
        let forged_before = b.stat("records_forged");
        world
            .rt
            .block_on(client.put(
                advert_key.as_str(),
                unsigned.seal(&advert_key, &advert),
                None,
            ))
            .unwrap();
        assert!(wait_until(SOON, || b.stat("records_forged") > forged_before));
        assert!(wait_until(SOON, || !b.tier.contains(&first)));
        assert!(adverts(&b).iter().all(|(_, owner)| owner != "intruder"));

        // The same marker signed with the cluster's key is a delete.
        let again = test_chain(&layout, 2, 15);
        a.tier.put_many(&again);
        assert!(wait_until(SOON, || b.tier.contains(&again[0].0.hash)));
        let keys = Keys::signed(
            CLUSTER,
            RecordSigning::new(Some(cluster_key()), Default::default()),
        );
        let value = keys.seal(
            &marker,
            &LayoutDeleted {
                v: 1,
                by: "operator".into(),
                at_ms: now_ms(),
            },
        );
        world
            .rt
            .block_on(client.put(marker.as_str(), value, None))
            .unwrap();
        assert!(wait_until(SOON, || !b.tier.contains(&again[0].0.hash)));
        assert!(a.stat("deleted_withdrawn") >= 1);
    }
}
