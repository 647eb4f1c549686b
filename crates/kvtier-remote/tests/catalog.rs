//! The catalog seam: objects written elsewhere are adopted only through a manifest that
//! checks out against the object's name, and leave by forget (withdrawn, object kept) or
//! delete (object gone from the store); the catalog hears of every write and delete.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod common;

use std::sync::Arc;

use kvtier_core::tier::conformance::{Event, RecordingSink, test_chain, test_layout};
use kvtier_core::tier::{NoSink, PutOutcome, RemovalCause, Tier, TierKind};
use kvtier_remote::{Adopted, Catalog, ObjectInfo, ObjectName, RemoteTier};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStoreExt, PutPayload};
use parking_lot::Mutex;

/// A catalog that names what it is told to at open and records what it hears.
#[derive(Debug, Default)]
struct Recording {
    at_open: Vec<ObjectName>,
    wrote: Mutex<Vec<ObjectInfo>>,
    deleted: Mutex<Vec<ObjectName>>,
}

impl Catalog for Recording {
    fn at_open(&self, _: &RemoteTier) -> Vec<ObjectName> {
        self.at_open.clone()
    }
    fn wrote(&self, object: &ObjectInfo) {
        self.wrote.lock().push(object.clone());
    }
    fn deleted(&self, object: &ObjectName) {
        self.deleted.lock().push(object.clone());
    }
}

/// The test bucket through a plain S3 client, as any other writer would see it.
struct RawBucket {
    store: object_store::aws::AmazonS3,
    rt: tokio::runtime::Runtime,
}

impl RawBucket {
    fn new(g: &common::Gateway) -> Self {
        let store = AmazonS3Builder::new()
            .with_endpoint(format!("http://{}", g.addr()))
            .with_bucket_name(common::BUCKET)
            .with_region("us-east-1")
            .with_access_key_id(common::ACCESS)
            .with_secret_access_key(common::SECRET)
            .with_client_options(ClientOptions::new().with_allow_http(true))
            .build()
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Self { store, rt }
    }

    fn put(&self, name: &str, bytes: Vec<u8>) {
        self.rt
            .block_on(self.store.put(&Path::from(name), PutPayload::from(bytes)))
            .unwrap();
    }

    fn get(&self, name: &str) -> Vec<u8> {
        self.rt.block_on(async {
            let got = self.store.get(&Path::from(name)).await.unwrap();
            got.bytes().await.unwrap().to_vec()
        })
    }
}

#[test]
fn objects_enter_only_through_a_checked_manifest_and_leave_by_forget_or_delete() {
    let g = common::Gateway::start();
    let config = || common::config(g.endpoint(), "catalog");
    let layout = test_layout().unwrap();
    let chain = test_chain(&layout, 4, 1);
    let hashes: Vec<_> = chain.iter().map(|(m, _)| m.hash).collect();

    // The writer's catalog hears of the object it wrote, by name and blocks.
    let heard = Arc::new(Recording::default());
    let writer = RemoteTier::open_with_catalog(config(), Arc::new(NoSink), heard.clone()).unwrap();
    for outcome in writer.put_many(&chain) {
        assert_eq!(outcome.unwrap(), PutOutcome::Stored);
    }
    let wrote = heard.wrote.lock().clone();
    assert_eq!(wrote.len(), 1, "{wrote:?}");
    assert_eq!(wrote[0].blocks, hashes);
    assert_eq!(wrote[0].block_bytes, layout.block_bytes());
    let object = wrote[0].name.clone();
    assert!(object.manifest.ends_with(".kvm"), "{object:?}");

    // A replica whose catalog names nothing holds nothing, until it adopts the object.
    let sink = Arc::new(RecordingSink::default());
    let reader =
        RemoteTier::open_with_catalog(config(), sink.clone(), Arc::new(Recording::default()))
            .unwrap();
    assert!(!reader.contains(&hashes[0]));
    assert_eq!(reader.adopt(&object), Adopted::Blocks(4));
    for (m, payload) in &chain {
        assert_eq!(reader.get(&m.hash).unwrap().as_ref(), Some(payload));
    }
    let inserted: Vec<_> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Inserted(TierKind::Remote, h) => Some(h),
            _ => None,
        })
        .collect();
    assert_eq!(inserted, hashes);
    assert_eq!(
        reader.adopt(&object),
        Adopted::Blocks(0),
        "nothing new twice"
    );

    // A catalog can point, never vouch: a manifest stored under another object's name, a
    // malformed one, a missing one and an unknown endpoint adopt nothing.
    let dir = object.manifest.rsplit_once('/').unwrap().0;
    let forged =
        format!("{dir}/00000000000000000000000000000000-11111111111111111111111111111111.kvm");
    let genuine = {
        let other = test_chain(&layout, 2, 7);
        writer.put_many(&other);
        heard.wrote.lock().last().unwrap().name.manifest.clone()
    };
    assert_ne!(genuine, object.manifest);
    let fresh_sink = Arc::new(RecordingSink::default());
    let skeptic =
        RemoteTier::open_with_catalog(config(), fresh_sink.clone(), Arc::new(Recording::default()))
            .unwrap();
    // Copy the genuine manifest's bytes under the forged name.
    let raw = RawBucket::new(&g);
    raw.put(&forged, raw.get(&genuine));
    let malformed =
        format!("{dir}/22222222222222222222222222222222-33333333333333333333333333333333.kvm");
    raw.put(&malformed, b"{\"version\":1,\"blocks\":[]}".to_vec());
    for (name, want) in [
        (forged.clone(), "refused"),
        (malformed.clone(), "refused"),
        (format!("{dir}/missing.kvm"), "unreachable"),
    ] {
        let got = skeptic.adopt(&ObjectName {
            endpoint: 0,
            manifest: name.clone(),
        });
        match (&got, want) {
            (Adopted::Refused(_), "refused") | (Adopted::Unreachable(_), "unreachable") => {}
            _ => panic!("{name}: expected {want}, got {got:?}"),
        }
    }
    let elsewhere = ObjectName {
        endpoint: 5,
        ..object.clone()
    };
    assert!(matches!(skeptic.adopt(&elsewhere), Adopted::Refused(_)));
    assert!(fresh_sink.events().is_empty(), "nothing was adopted");
    // The default catalog (a listing at open) sees the same: the genuine objects, not the
    // forged or malformed manifests.
    let listed = RemoteTier::open(config(), Arc::new(NoSink)).unwrap();
    assert!(hashes.iter().all(|h| listed.contains(h)));
    assert_eq!(
        listed.stats().resident_blocks,
        6,
        "4 + 2 genuine blocks, nothing forged"
    );

    // Forget: the reader stops serving the object, which stays in the store.
    assert_eq!(reader.forget(&object), 4);
    assert!(hashes.iter().all(|h| !reader.contains(h)));
    let removed = sink
        .events()
        .into_iter()
        .filter(|e| {
            matches!(
                e,
                Event::Removed(TierKind::Remote, _, RemovalCause::Explicit)
            )
        })
        .count();
    assert_eq!(removed, 4);
    assert!(
        RemoteTier::open(config(), Arc::new(NoSink))
            .unwrap()
            .contains(&hashes[0])
    );

    // Delete: gone from the store, the writer forgets it and its catalog hears of it.
    assert_eq!(writer.delete(&object).unwrap(), 4);
    assert_eq!(heard.deleted.lock().clone(), vec![object.clone()]);
    assert!(!writer.contains(&hashes[0]));
    let after = RemoteTier::open(config(), Arc::new(NoSink)).unwrap();
    assert!(hashes.iter().all(|h| !after.contains(h)));
    assert!(matches!(after.adopt(&object), Adopted::Unreachable(_)));
    // Deleting what is gone is not an error.
    assert_eq!(writer.delete(&object).unwrap(), 0);
}
