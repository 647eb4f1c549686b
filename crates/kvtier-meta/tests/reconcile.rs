//! `kvtier cluster reconcile`'s core: an object whose writer died between its manifest PUT
//! and its advertisement is advertised (and then served by every replica); what cannot be
//! advertised is deleted only once older than the bound. A state object nobody advertised
//! is advertised as `unowned`, served, counted, and reclaimed by the GC leader as an
//! orphan.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Replica, World, remote, wait_until};
use kvtier_core::layout::LayoutDigest;
use kvtier_core::snapshot::SnapshotKey;
use kvtier_core::tier::SnapshotStore;
use kvtier_core::tier::conformance::{test_chain, test_layout};
use kvtier_core::tier::{NoSink, Tier};
use kvtier_meta::reconcile::{self, Options};
use kvtier_remote::{Catalog, ObjectInfo, ObjectName, RemoteTier};
use object_store::ObjectStoreExt;
use object_store::path::Path;

const SOON: Duration = Duration::from_secs(10);

/// A writer that names its objects like a cluster replica and dies before advertising
/// any of them: it remembers what it wrote and tells nobody.
#[derive(Debug, Default)]
struct Mute {
    sequence: AtomicU64,
    wrote: parking_lot::Mutex<Vec<ObjectInfo>>,
}

impl Catalog for Mute {
    fn at_open(&self, _: &RemoteTier) -> Vec<ObjectName> {
        Vec::new()
    }
    fn writer_tag(&self) -> Option<String> {
        Some(format!(
            "mute.3.{}",
            self.sequence.fetch_add(1, Ordering::Relaxed)
        ))
    }
    fn wrote(&self, object: &ObjectInfo) {
        self.wrote.lock().push(object.clone());
    }
}

#[test]
fn reconcile_advertises_what_a_crash_left_unadvertised_and_removes_only_old_debris() {
    let w = World::start(1);
    let World { etcd, url, rt, .. } = &w;
    let layout = test_layout().unwrap();

    let mute = Arc::new(Mute::default());
    let writer = Arc::new(
        RemoteTier::open_with_catalog(remote(url, SOON), Arc::new(NoSink), mute.clone()).unwrap(),
    );
    let kept = test_chain(&layout, 3, 1);
    writer.put_many(&kept);
    writer.put_many(&test_chain(&layout, 2, 2));
    let (unadvertised, orphan_data) = {
        let wrote = mute.wrote.lock();
        (wrote[0].clone(), wrote[1].clone())
    };
    // Debris: the second object's manifest is lost (data only), and a damaged manifest.
    let raw = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(url.as_str())
        .with_bucket_name(common::BUCKET)
        .with_region("us-east-1")
        .with_access_key_id(common::ACCESS)
        .with_secret_access_key(common::SECRET)
        .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
        .build()
        .unwrap();
    let damaged = unadvertised.name.manifest.replace("mute.3.", "mute.3.9");
    rt.block_on(async {
        raw.delete(&Path::from(orphan_data.name.manifest.as_str()))
            .await
            .unwrap();
        raw.put(
            &Path::from(damaged.as_str()),
            b"{\"not\":\"a manifest\"}".to_vec().into(),
        )
        .await
        .unwrap();
    });

    let reader = Replica::start(rt, etcd.endpoints(), "reader", remote(url, SOON), |_| {});
    reader.ready(rt);
    let last = kept[2].0.hash;
    assert!(!reader.tier.contains(&last), "nobody advertised it yet");

    let mut client = w.client();
    let options = |older_than: Duration, dry_run: bool| Options {
        cluster: common::CLUSTER.into(),
        older_than,
        namespace: "default".into(),
        dry_run,
        now_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    };
    let hour = Duration::from_secs(3600);
    // A dry run changes nothing.
    let dry = rt
        .block_on(reconcile::reconcile(
            &mut client,
            &writer,
            &options(Duration::ZERO, true),
        ))
        .unwrap();
    assert_eq!((dry.readvertised, dry.removed), (1, 2), "{dry:?}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(!reader.tier.contains(&last));

    // Young debris stays; the unadvertised object is advertised and served everywhere.
    let first = rt
        .block_on(reconcile::reconcile(
            &mut client,
            &writer,
            &options(hour, false),
        ))
        .unwrap();
    assert_eq!(
        (first.readvertised, first.young, first.removed),
        (1, 2, 0),
        "{first:?}"
    );
    assert!(wait_until(SOON, || reader.tier.contains(&last)));
    assert_eq!(reader.tier.get(&last).unwrap(), Some(kept[2].1.clone()));
    let s = w.status();
    assert_eq!(s.owners["mute"].objects, 1, "{s:?}");

    // Old debris goes; the advertised object stays.
    let second = rt
        .block_on(reconcile::reconcile(
            &mut client,
            &writer,
            &options(Duration::ZERO, false),
        ))
        .unwrap();
    assert_eq!(
        (second.advertised, second.readvertised, second.removed),
        (1, 0, 2),
        "{second:?}"
    );
    let left: Vec<String> = writer.list_objects().into_iter().map(|o| o.name).collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&unadvertised.name.manifest));
    assert!(
        !left.iter().any(|n| n.contains("mute.3.9")
            || n.contains(&orphan_data.name.manifest.replace(".kvm", "")))
    );
    assert_eq!(reader.tier.get(&last).unwrap(), Some(kept[2].1.clone()));
    drop(reader);
}

#[test]
fn reconcile_advertises_an_unadvertised_state_as_unowned_and_the_leader_reclaims_it() {
    let w = World::start(1);
    let World { etcd, url, rt, .. } = &w;
    // Started before the state is written: it lists states only at its open.
    let reader = Replica::start(rt, etcd.endpoints(), "reader", remote(url, SOON), |_| {});
    reader.ready(rt);
    let writer = Arc::new(
        RemoteTier::open_with_catalog(
            remote(url, SOON),
            Arc::new(NoSink),
            Arc::new(Mute::default()),
        )
        .unwrap(),
    );
    let (key, layout) = (SnapshotKey([8; 32]), LayoutDigest([9; 16]));
    let state: bytes::Bytes = (0..40_000u32).map(|i| (i % 251) as u8).collect();
    writer.put_snapshot(&key, layout, &state).unwrap();
    assert!(!reader.tier.contains_snapshot(&key));

    let mut client = w.client();
    let options = |dry_run: bool| Options {
        cluster: common::CLUSTER.into(),
        older_than: Duration::from_secs(3600),
        namespace: "default".into(),
        dry_run,
        now_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    };
    let dry = rt
        .block_on(reconcile::reconcile(&mut client, &writer, &options(true)))
        .unwrap();
    assert_eq!(dry.states_readvertised, 1, "{dry:?}");
    assert_eq!(w.status().owners.get("unowned").map(|u| u.states), None);

    let first = rt
        .block_on(reconcile::reconcile(&mut client, &writer, &options(false)))
        .unwrap();
    assert_eq!(
        (first.states_readvertised, first.removed),
        (1, 0),
        "{first:?}"
    );
    assert!(wait_until(SOON, || reader.tier.contains_snapshot(&key)));
    assert_eq!(reader.tier.get_snapshot(&key).unwrap(), Some(state.clone()));
    let unowned = w.status().owners["unowned"];
    assert_eq!((unowned.states, unowned.bytes), (1, state.len() as u64));
    let again = rt
        .block_on(reconcile::reconcile(&mut client, &writer, &options(false)))
        .unwrap();
    assert_eq!(
        (again.states_advertised, again.states_readvertised),
        (1, 0),
        "{again:?}"
    );

    // Nobody owns it: the GC leader reclaims it once `orphan_after` has passed.
    let leader = Replica::start(rt, etcd.endpoints(), "gc", remote(url, SOON), |c| {
        c.gc_leader = true;
        c.gc_grace = Duration::from_millis(200);
        c.orphan_after = Duration::from_secs(1);
    });
    leader.ready(rt);
    assert!(wait_until(SOON, || leader.stat("orphans_reclaimed") == 1));
    assert!(wait_until(SOON, || !reader.tier.contains_snapshot(&key)));
    assert!(wait_until(SOON, || writer.list_states().is_empty()));
    drop((reader, leader));
}
