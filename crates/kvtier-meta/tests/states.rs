//! State objects (recurrent-state snapshots and checkpoints, issue 16) in the cluster: a
//! replica's state is advertised through etcd and served by a replica that was already
//! running (it never lists the bucket again), byte for byte; a record that points at
//! another key's object, or at nothing, is never served; a withdrawn record is
//! forgotten; a replica started after the writer died still restores the state.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{CLUSTER, Replica, World, remote, wait_until};
use kvtier_core::layout::LayoutDigest;
use kvtier_core::snapshot::SnapshotKey;
use kvtier_core::tier::SnapshotStore;
use kvtier_meta::{Keys, Priority, StateAdvert};
use kvtier_remote::state::state_object_name;

const SOON: Duration = Duration::from_secs(20);

fn state(seed: u8) -> Bytes {
    common::state_bytes(seed, 300_000)
}

#[test]
fn a_running_replica_serves_another_replicas_state_through_the_cluster() {
    let world = World::start(1);
    let config = || remote(&world.url, Duration::from_secs(2));
    let a = Replica::start(&world.rt, world.etcd.endpoints(), "a", config(), |_| {});
    let b = Replica::start(&world.rt, world.etcd.endpoints(), "b", config(), |_| {});
    a.ready(&world.rt);
    b.ready(&world.rt);
    let layout = LayoutDigest([3; 16]);
    let (k1, k2, k3) = (
        SnapshotKey([1; 32]),
        SnapshotKey([2; 32]),
        SnapshotKey([4; 32]),
    );
    a.tier.put_snapshot(&k1, layout, &state(1)).unwrap();
    assert!(
        wait_until(SOON, || b.tier.contains_snapshot(&k1)),
        "B never learned of A's state"
    );
    assert_eq!(b.tier.get_snapshot(&k1).unwrap(), Some(state(1)));
    assert_eq!(a.stat("states_published"), 1);
    assert!(b.stat("states_adopted") >= 1);

    // Records written by hand: one names k1's object under k2's key, one names k3's
    // object, which does not exist.
    let keys = Keys::new(CLUSTER);
    let endpoint = a.tier.endpoint_id(0).unwrap();
    let record = |key: &SnapshotKey, object: String| StateAdvert {
        v: 1,
        object,
        endpoint: endpoint.clone(),
        layout: layout.to_hex(),
        key: kvtier_core::hash::hex(&key.0),
        bytes: 300_000,
        owner: "intruder".into(),
        generation: 1,
        priority: Priority::Normal,
        namespace: "default".into(),
        ts_ms: 0,
    };
    let mut client = world.client();
    let refused = b.stat("records_refused");
    world.rt.block_on(async {
        let wrong = record(&k2, state_object_name("kv", &layout, &k1));
        client
            .put(
                keys.state(&layout, &k2),
                serde_json::to_string(&wrong).unwrap(),
                None,
            )
            .await
            .unwrap();
        let absent = record(&k3, state_object_name("kv", &layout, &k3));
        client
            .put(
                keys.state(&layout, &k3),
                serde_json::to_string(&absent).unwrap(),
                None,
            )
            .await
            .unwrap();
    });
    assert!(wait_until(SOON, || b.tier.contains_snapshot(&k3)));
    assert!(
        wait_until(SOON, || b.stat("records_refused") > refused),
        "a record naming another key's object was not refused"
    );
    assert!(!b.tier.contains_snapshot(&k2));
    assert_eq!(b.tier.get_snapshot(&k2).unwrap(), None);
    assert_eq!(b.tier.get_snapshot(&k3).unwrap(), None, "nothing to read");
    assert!(!b.tier.contains_snapshot(&k3), "a 404 forgets the name");

    // Withdrawn: forgotten by B (the object stays in the bucket).
    world.rt.block_on(async {
        client.delete(keys.state(&layout, &k1), None).await.unwrap();
    });
    assert!(
        wait_until(SOON, || !b.tier.contains_snapshot(&k1)),
        "a withdrawn state is still served"
    );

    // Advertised again, then its writer dies: a replica started afterwards serves it.
    a.tier.put_snapshot(&k2, layout, &state(2)).unwrap();
    assert!(wait_until(SOON, || b.tier.contains_snapshot(&k2)));
    a.crash();
    let c = Replica::start(&world.rt, world.etcd.endpoints(), "c", config(), |_| {});
    c.ready(&world.rt);
    assert!(wait_until(SOON, || c.tier.contains_snapshot(&k2)));
    assert_eq!(c.tier.get_snapshot(&k2).unwrap(), Some(state(2)));
}
