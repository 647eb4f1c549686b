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
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
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
        let (store, rt) = common::raw_s3(&g.endpoint());
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

/// A catalog that tags every object with a writer, as cluster mode does.
#[derive(Debug, Default)]
struct Tagging {
    wrote: Mutex<Vec<ObjectInfo>>,
}

impl Catalog for Tagging {
    fn at_open(&self, _: &RemoteTier) -> Vec<ObjectName> {
        Vec::new()
    }
    fn writer_tag(&self) -> Option<String> {
        Some("replica-a.3.17".into())
    }
    fn wrote(&self, object: &ObjectInfo) {
        self.wrote.lock().push(object.clone());
    }
}

#[test]
fn a_described_object_is_indexed_at_once_and_served_only_after_its_manifest_matches() {
    let g = common::Gateway::start();
    let config = || common::config(g.endpoint(), "described");
    let layout = test_layout().unwrap();
    let chain = test_chain(&layout, 3, 4);
    let hashes: Vec<_> = chain.iter().map(|(m, _)| m.hash).collect();
    let heard = Arc::new(Tagging::default());
    let writer = RemoteTier::open_with_catalog(config(), Arc::new(NoSink), heard.clone()).unwrap();
    writer.put_many(&chain);
    let info = heard.wrote.lock()[0].clone();
    // The writer is part of the name, and of the manifest that the name is checked against.
    assert!(
        info.name.manifest.ends_with(".w.replica-a.3.17.kvm"),
        "{info:?}"
    );
    assert_eq!(info.first_position, 0);
    assert_eq!(info.first_parent, chain[0].0.parent);

    // Indexed from the description alone: no request, blocks known by hash only.
    let sink = Arc::new(RecordingSink::default());
    let reader =
        RemoteTier::open_with_catalog(config(), sink.clone(), Arc::new(Tagging::default()))
            .unwrap();
    assert_eq!(reader.adopt_described(&info), Adopted::Blocks(3));
    assert_eq!(
        reader.adopt_described(&info),
        Adopted::Blocks(0),
        "idempotent"
    );
    assert!(hashes.iter().all(|h| reader.contains(h)));
    assert_eq!(reader.record_checks(), (0, 0), "nothing read yet");
    // The first read checks the manifest (one GET), then serves verified bytes.
    let got = reader.get_run(&hashes).unwrap();
    assert_eq!(
        got,
        chain.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>()
    );
    assert_eq!(reader.record_checks(), (0, 1));
    assert_eq!(reader.get_run(&hashes).unwrap().len(), 3);
    assert_eq!(reader.record_checks(), (0, 1), "checked once");
    assert_eq!(reader.requests().0, 2, "one ranged GET per load");
    assert_eq!(reader.direct_reads(), 2, "each one a direct read");

    // A record whose digest is not the manifest's: indexed, never served, counted.
    let wrong = ObjectInfo {
        manifest_digest: [0; 32],
        ..info.clone()
    };
    let doubter =
        RemoteTier::open_with_catalog(config(), Arc::new(NoSink), Arc::new(Tagging::default()))
            .unwrap();
    assert_eq!(doubter.adopt_described(&wrong), Adopted::Blocks(3));
    assert!(doubter.get_run(&hashes).unwrap().is_empty());
    assert_eq!(doubter.record_checks(), (1, 1));
    assert!(!doubter.contains(&hashes[0]), "dropped after the mismatch");
    // Records that cannot describe this object are refused before anything is indexed.
    let mut other_run = info.clone();
    other_run.blocks.reverse();
    let mut off_root = info.clone();
    off_root.first_parent = hashes[1];
    let mut foreign = info.clone();
    foreign.name.manifest = foreign.name.manifest.replace("replica-a", "Bad/Name");
    for (what, bad) in [
        ("another run's name", other_run),
        ("a chain off the root", off_root),
        ("a bad writer tag", foreign),
    ] {
        assert!(
            matches!(doubter.adopt_described(&bad), Adopted::Refused(_)),
            "{what}"
        );
    }
    // `check` reads the manifest ahead of the first load.
    let eager =
        RemoteTier::open_with_catalog(config(), Arc::new(NoSink), Arc::new(Tagging::default()))
            .unwrap();
    eager.adopt_described(&info);
    assert!(eager.check(&info.name));
    eager.get_run(&hashes).unwrap();
    assert_eq!(
        eager.requests().0,
        1,
        "the load was one GET after the check"
    );
}
