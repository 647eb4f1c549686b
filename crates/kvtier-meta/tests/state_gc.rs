//! State objects (recurrent-state snapshots and checkpoints) age out through the cluster's
//! GC like run objects: a namespace over budget sheds its oldest objects of either kind,
//! never pinned ones; a dead writer's states are reclaimed as orphans; a read running when
//! its state is withdrawn completes, later ones miss; while a state's tombstone stands, no
//! replica advertises that key again.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod common;

use std::time::{Duration, Instant};

use common::{CLUSTER, Replica, World, remote, state_bytes as state, wait_until};
use kvtier_core::layout::LayoutDigest;
use kvtier_core::snapshot::SnapshotKey;
use kvtier_core::tier::conformance::{test_chain, test_layout};
use kvtier_core::tier::{SnapshotStore, Tier};
use kvtier_meta::record::{Advertised, Priority, Tombstone};
use kvtier_meta::{Keys, StateAdvert};
use kvtier_remote::RemoteTier;

const SOON: Duration = Duration::from_secs(20);

fn key(seed: u8) -> SnapshotKey {
    SnapshotKey([seed; 32])
}

/// Whether the bucket still holds the state object of `key` (listed, not read).
fn state_in_bucket(tier: &RemoteTier, key: &SnapshotKey) -> bool {
    tier.list_states().iter().any(|s| s.key == *key)
}

#[test]
fn a_namespace_over_budget_sheds_its_oldest_states_and_runs_together_never_pinned_ones() {
    let w = World::start(1);
    let World { etcd, url, rt, .. } = &w;
    let layout = test_layout().unwrap();
    // Every object in this test, run or state, holds the same bytes.
    let object_bytes = 2 * layout.block_bytes();
    let size = object_bytes as usize;
    let state_layout = LayoutDigest([5; 16]);
    let sys = Replica::start(rt, etcd.endpoints(), "sys", remote(url, SOON), |c| {
        c.priority = Priority::Pinned;
        c.namespace = "tenant".into();
    });
    let chat = Replica::start(rt, etcd.endpoints(), "chat", remote(url, SOON), |c| {
        c.namespace = "tenant".into();
    });
    sys.ready(rt);
    chat.ready(rt);

    // While a tombstone of a key stands, its state is not advertised again, and the
    // writer stops serving it (the object under that name is about to be deleted).
    let keys = Keys::new(CLUSTER);
    let held = key(90);
    let tombstone_key = keys
        .tombstone_of(&keys.state(&state_layout, &held))
        .unwrap();
    let tombstone = Tombstone {
        v: 1,
        of: Advertised::State(StateAdvert {
            v: 1,
            object: kvtier_remote::state::state_object_name("kv", &state_layout, &held),
            endpoint: chat.tier.endpoint_id(0).unwrap(),
            layout: state_layout.to_hex(),
            key: kvtier_core::hash::hex(&held.0),
            bytes: 10,
            owner: "gone".into(),
            generation: 1,
            priority: Priority::Normal,
            namespace: "tenant".into(),
            ts_ms: 0,
        }),
        by: "gone".into(),
        generation: 1,
        at_ms: 0,
        reason: "owner".into(),
    };
    let mut client = w.client();
    rt.block_on(async {
        client
            .put(
                tombstone_key.as_str(),
                serde_json::to_string(&tombstone).unwrap(),
                None,
            )
            .await
            .unwrap();
    });
    let lost = chat.stat("publish_lost");
    chat.tier
        .put_snapshot(&held, state_layout, &state(90, 1000))
        .unwrap();
    assert!(
        wait_until(SOON, || chat.stat("publish_lost") == lost + 1),
        "a state was advertised over its tombstone"
    );
    assert!(!chat.tier.contains_snapshot(&held));
    assert_eq!(chat.stat("states_published"), 0);
    rt.block_on(async {
        client.delete(tombstone_key.as_str(), None).await.unwrap();
    });

    // Pinned: one state and one run. The chat replica: a state, then a run, three times.
    sys.tier
        .put_snapshot(&key(1), state_layout, &state(1, size))
        .unwrap();
    sys.tier.put_many(&test_chain(&layout, 2, 100));
    let mut order = Vec::new();
    for i in 0..3u8 {
        let k = key(10 + i);
        chat.tier
            .put_snapshot(&k, state_layout, &state(10 + i, size))
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let chain = test_chain(&layout, 2, 200 + u32::from(i));
        chat.tier.put_many(&chain);
        order.push((k, chain[1].0.hash));
        // Distinct advertisement times: oldest first is well defined.
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(wait_until(SOON, || chat.catalog.view().len() == 8));
    let s = w.status();
    let tenant = s.namespaces["tenant"];
    assert_eq!(
        (tenant.objects, tenant.states, tenant.bytes, tenant.pinned),
        (4, 4, 8 * object_bytes, 2)
    );

    // Budget: the pinned two and the newest two; the oldest four of the chat replica's
    // six (two states, two runs) go.
    let leader = Replica::start(rt, etcd.endpoints(), "gc", remote(url, SOON), |c| {
        c.gc_leader = true;
        c.gc_grace = Duration::from_millis(300);
        c.gc_interval = Duration::from_millis(50);
        c.budgets.insert("tenant".into(), 4 * object_bytes);
    });
    leader.ready(rt);
    assert!(wait_until(SOON, || leader.stat("budget_evictions") == 4));
    assert!(wait_until(SOON, || {
        w.status().tombstones == 0 && leader.stat("gc_deleted") == 4
    }));
    let tenant = w.status().namespaces["tenant"];
    assert_eq!(
        (tenant.objects, tenant.states, tenant.bytes, tenant.pinned),
        (2, 2, 4 * object_bytes, 2)
    );
    assert!(wait_until(SOON, || !chat
        .tier
        .contains_snapshot(&order[1].0)));
    for (i, (state_key, run_last)) in order.iter().enumerate() {
        let kept = i == 2;
        assert_eq!(chat.tier.contains_snapshot(state_key), kept, "state {i}");
        assert_eq!(chat.tier.contains(run_last), kept, "run {i}");
        assert_eq!(
            state_in_bucket(&chat.tier, state_key),
            kept,
            "state {i} in the bucket"
        );
    }
    assert_eq!(
        chat.tier.get_snapshot(&order[2].0).unwrap(),
        Some(state(12, size))
    );
    assert!(chat.tier.contains_snapshot(&key(1)), "a pinned state went");
    assert!(state_in_bucket(&chat.tier, &key(1)));
    assert_eq!(leader.stat("budget_evictions"), 4, "more than needed went");
    drop((sys, chat, leader));
}

#[test]
fn a_dead_writers_states_are_reclaimed_as_orphans() {
    let w = World::start(1);
    let World { etcd, url, rt, .. } = &w;
    let orphan_after = Duration::from_secs(2);
    let leader = Replica::start(rt, etcd.endpoints(), "gc", remote(url, SOON), |c| {
        c.gc_leader = true;
        c.gc_grace = Duration::from_millis(200);
        c.orphan_after = orphan_after;
    });
    let owner = Replica::start(rt, etcd.endpoints(), "owner", remote(url, SOON), |_| {});
    leader.ready(rt);
    owner.ready(rt);
    let layout = LayoutDigest([6; 16]);
    owner
        .tier
        .put_snapshot(&key(1), layout, &state(1, 50_000))
        .unwrap();
    assert!(wait_until(SOON, || leader.tier.contains_snapshot(&key(1))));
    // A live writer's states are never orphans.
    std::thread::sleep(orphan_after + Duration::from_secs(1));
    assert!(leader.tier.contains_snapshot(&key(1)));
    assert_eq!(leader.stat("orphans_reclaimed"), 0);

    let crashed = Instant::now();
    owner.crash();
    assert!(wait_until(SOON, || leader.stat("orphans_reclaimed") == 1));
    assert!(
        crashed.elapsed() >= orphan_after,
        "reclaimed {:?} after the crash",
        crashed.elapsed()
    );
    assert!(!leader.tier.contains_snapshot(&key(1)));
    assert!(wait_until(SOON, || !state_in_bucket(&leader.tier, &key(1))));
    assert!(wait_until(SOON, || w.status().tombstones == 0));
    assert_eq!(leader.tier.get_snapshot(&key(1)).unwrap(), None);
    drop(leader);
}

#[test]
fn a_state_read_running_when_it_is_withdrawn_completes_and_later_reads_miss() {
    let w = World::start(1);
    let World {
        etcd,
        gateway: g,
        url,
        rt,
        ..
    } = &w;
    let size = 300_000;
    // B's link to the store passes one state in about 2.4 s, under its 3 s read deadline.
    let deadline = Duration::from_secs(3);
    let slow = common::Throttle::start(url, size * 10 / 24);
    // Grace: longer than a withdrawal's propagation plus the read deadline.
    let grace = deadline + Duration::from_secs(1);
    let a = Replica::start(rt, etcd.endpoints(), "a", remote(url, deadline), |c| {
        c.gc_grace = grace
    });
    let b = Replica::start(
        rt,
        etcd.endpoints(),
        "b",
        remote(&slow.url, deadline),
        |c| c.gc_grace = grace,
    );
    // The leader allows one state's bytes: a second state makes the first one go.
    let leader = Replica::start(rt, etcd.endpoints(), "gc", remote(url, deadline), |c| {
        c.gc_leader = true;
        c.gc_grace = grace;
        c.gc_interval = Duration::from_millis(50);
        c.budgets.insert("default".into(), size as u64);
    });
    for r in [&a, &b, &leader] {
        r.ready(rt);
    }
    let layout = LayoutDigest([7; 16]);
    a.tier
        .put_snapshot(&key(1), layout, &state(1, size))
        .unwrap();
    assert!(wait_until(SOON, || b.tier.contains_snapshot(&key(1))));

    let tier = b.tier.clone();
    let reading = std::thread::spawn(move || {
        let t = Instant::now();
        (tier.get_snapshot(&key(1)), t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    a.tier
        .put_snapshot(&key(2), layout, &state(2, size))
        .unwrap();
    // The withdrawal reaches B within the propagation allowance: a read starting now
    // misses without asking the store.
    assert!(
        wait_until(Duration::from_secs(2), || !b
            .tier
            .contains_snapshot(&key(1))),
        "the oldest state was not withdrawn"
    );
    let gets_before = g.counters().snapshot().0;
    assert_eq!(b.tier.get_snapshot(&key(1)).unwrap(), None);
    assert_eq!(
        g.counters().snapshot().0,
        gets_before,
        "the miss asked the store"
    );

    let (got, took) = reading.join().unwrap();
    assert!(
        took > Duration::from_secs(1),
        "the read was not slow ({took:?})"
    );
    assert_eq!(
        got.unwrap(),
        Some(state(1, size)),
        "the read that started before the withdrawal was cut (after {took:?})"
    );
    assert!(
        wait_until(SOON, || !state_in_bucket(&a.tier, &key(1))),
        "never deleted"
    );
    assert!(state_in_bucket(&a.tier, &key(2)));
    assert_eq!(leader.stat("budget_evictions"), 1);
    drop((a, b, leader));
}
