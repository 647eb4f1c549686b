//! Deleting shared objects safely: only the owner deletes (or the GC leader, for an owner
//! long gone or a namespace over budget); a withdrawal stops new reads at once, the delete
//! comes after the grace window, and a read already running is never cut.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Replica, World, adverts, in_bucket, remote, wait_until};
use kvtier_core::tier::Tier;
use kvtier_core::tier::conformance::{test_chain, test_layout};
use kvtier_meta::record::Priority;
use kvtier_meta::{Withdrawal, status};

const SOON: Duration = Duration::from_secs(10);

#[test]
fn only_the_owner_withdraws_and_the_object_goes_after_the_grace_window() {
    let w = World::start(1);
    let World { etcd, url, rt, .. } = &w;
    let grace = Duration::from_millis(1500);
    let with_grace = |c: &mut kvtier_meta::ClusterConfig| c.gc_grace = grace;
    let a = Replica::start(rt, etcd.endpoints(), "a", remote(url, SOON), with_grace);
    let b = Replica::start(rt, etcd.endpoints(), "b", remote(url, SOON), with_grace);
    a.ready(rt);
    b.ready(rt);
    let layout = test_layout().unwrap();
    let chain = test_chain(&layout, 3, 5);
    let last = chain.last().unwrap().0.hash;
    a.tier.put_many(&chain);
    assert!(
        wait_until(SOON, || b.tier.contains(&last)),
        "B never learned of A's object"
    );
    let known = adverts(&b);
    assert_eq!(known.len(), 1);
    let (object, owner) = known[0].clone();
    assert_eq!(owner, "a");

    // B may read A's object but not delete it.
    let refused = rt.block_on(b.catalog.withdraw(&object)).unwrap();
    assert_eq!(refused, Withdrawal::NotOwner("a".into()));
    assert_eq!(b.stat("deletes_refused"), 1);
    assert!(b.tier.contains(&last) && in_bucket(&b.tier, &object));

    // A withdraws: both stop serving it at once; it stays in the bucket for the grace
    // window, then it and its tombstone are gone.
    let withdrawn = Instant::now();
    let outcome = rt.block_on(a.catalog.withdraw(&object)).unwrap();
    assert!(matches!(outcome, Withdrawal::Withdrawn(_)), "{outcome:?}");
    assert!(wait_until(SOON, || !b.tier.contains(&last) && !a.tier.contains(&last)));
    assert!(withdrawn.elapsed() < grace);
    assert!(
        in_bucket(&b.tier, &object),
        "deleted before the grace window ended"
    );
    assert!(wait_until(SOON, || !in_bucket(&b.tier, &object)));
    assert!(
        withdrawn.elapsed() >= grace,
        "deleted after {:?}",
        withdrawn.elapsed()
    );
    assert!(wait_until(SOON, || { w.status().tombstones == 0 }));
    assert_eq!(a.stat("gc_tombstones"), 1);
    assert_eq!(a.stat("gc_deleted"), 1);
    // Withdrawing it again finds nothing to withdraw.
    assert_eq!(
        rt.block_on(a.catalog.withdraw(&object)).unwrap(),
        Withdrawal::Unknown
    );

    // With the tombstone gone the run can be stored and advertised again, as a new object.
    a.tier.put_many(&chain);
    assert!(
        wait_until(SOON, || b.tier.contains(&last)),
        "the run never came back"
    );
    let again = adverts(&b);
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].0, object, "a new object, under a new name");
    drop((a, b));
}

#[test]
fn a_read_running_when_its_object_is_withdrawn_completes_and_later_reads_miss() {
    let w = World::start(1);
    let World {
        etcd,
        gateway: g,
        url,
        rt,
        ..
    } = &w;
    let layout = test_layout().unwrap();
    let block_bytes = layout.block_bytes() as usize;
    // B's link to the store passes one block in about 2.4 s, under its 3 s read deadline.
    let deadline = Duration::from_secs(3);
    let slow = common::Throttle::start(url, block_bytes * 10 / 24);
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
    a.ready(rt);
    b.ready(rt);
    let chain = test_chain(&layout, 4, 9);
    let (first, last) = (chain[0].0.hash, chain[3].0.hash);
    a.tier.put_many(&chain);
    assert!(wait_until(SOON, || b.tier.contains(&last)));
    // Let B's background manifest check (slow too) finish first.
    assert!(wait_until(SOON, || b.tier.record_checks().1 >= 1));
    std::thread::sleep(Duration::from_millis(200));
    let object = adverts(&b)[0].0.clone();

    let tier = b.tier.clone();
    let gets_before_read = g.counters().snapshot().0;
    let reading = std::thread::spawn(move || {
        let t = Instant::now();
        (tier.get(&last), t.elapsed())
    });
    // The read is running once the store has answered its GET (the body then trickles
    // through the throttle). On a loaded machine the request may take longer than any
    // fixed pause to get there, and would then be counted as the later miss's.
    assert!(
        wait_until(SOON, || g.counters().snapshot().0 > gets_before_read),
        "the read never reached the store"
    );
    let outcome = rt.block_on(a.catalog.withdraw(&object)).unwrap();
    assert!(matches!(outcome, Withdrawal::Withdrawn(_)), "{outcome:?}");
    // The withdrawal reaches B within the propagation allowance: a read starting now
    // misses without asking the store.
    assert!(wait_until(Duration::from_secs(1), || !b
        .tier
        .contains(&first)));
    let gets_before = g.counters().snapshot().0;
    assert_eq!(
        b.tier.get(&first).unwrap(),
        None,
        "a read after the withdrawal hit"
    );
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
        got.unwrap().as_ref(),
        Some(&chain[3].1),
        "the read that started before the withdrawal was cut (after {took:?})"
    );
    assert!(
        wait_until(SOON, || !in_bucket(&a.tier, &object)),
        "never deleted"
    );
    drop((a, b));
}

#[test]
fn the_leader_shrinks_a_namespace_to_budget_oldest_first_and_leaves_pinned_objects() {
    let w = World::start(1);
    let World { etcd, url, rt, .. } = &w;
    let layout = test_layout().unwrap();
    let object_bytes = 2 * layout.block_bytes();
    let pinned = Replica::start(rt, etcd.endpoints(), "sys", remote(url, SOON), |c| {
        c.priority = Priority::Pinned;
        c.namespace = "tenant".into();
    });
    let normal = Replica::start(rt, etcd.endpoints(), "chat", remote(url, SOON), |c| {
        c.namespace = "tenant".into();
    });
    let other = Replica::start(rt, etcd.endpoints(), "else", remote(url, SOON), |_| {});
    for r in [&pinned, &normal, &other] {
        r.ready(rt);
    }
    for seed in 0..2 {
        pinned.tier.put_many(&test_chain(&layout, 2, 100 + seed));
    }
    let mut chat = Vec::new();
    for seed in 0..6 {
        let chain = test_chain(&layout, 2, 200 + seed);
        normal.tier.put_many(&chain);
        chat.push(chain[1].0.hash);
        // Distinct advertisement times: oldest first is well defined.
        std::thread::sleep(Duration::from_millis(20));
    }
    other.tier.put_many(&test_chain(&layout, 2, 300));
    assert!(wait_until(SOON, || normal.catalog.view().len() == 9));

    // Budget: the two pinned objects and two of the chat replica's six.
    let budget = 4 * object_bytes;
    // A leader whose own watch lags its sweeps (test hook): its view still holds what it
    // withdrew for several sweeps, and it must not withdraw more because of that.
    let leader = Replica::start(rt, etcd.endpoints(), "gc", remote(url, SOON), |c| {
        c.gc_leader = true;
        c.gc_grace = Duration::from_millis(300);
        c.gc_interval = Duration::from_millis(20);
        c.watch_delay = Duration::from_millis(300);
        c.budgets.insert("tenant".into(), budget);
    });
    leader.ready(rt);
    assert!(wait_until(SOON, || leader.stat("budget_evictions") == 4));
    assert!(wait_until(SOON, || {
        let s = w.status();
        s.tombstones == 0 && leader.stat("gc_deleted") == 4
    }));
    let s = w.status();
    assert_eq!(s.leader.as_deref(), Some("gc"));
    let tenant = s.namespaces["tenant"];
    assert_eq!(
        (tenant.objects, tenant.bytes, tenant.pinned),
        (4, budget, 2)
    );
    assert_eq!(
        s.namespaces["default"].objects, 1,
        "another namespace was touched"
    );
    // The oldest four chat objects went; the newest two and every pinned one stayed.
    assert!(wait_until(SOON, || !normal.tier.contains(&chat[3])));
    for (i, h) in chat.iter().enumerate() {
        assert_eq!(normal.tier.contains(h), i >= 4, "chat object {i}");
    }
    for seed in 0..2 {
        let h = test_chain(&layout, 2, 100 + seed)[1].0.hash;
        assert!(normal.tier.contains(&h), "a pinned object was withdrawn");
    }
    assert_eq!(leader.stat("budget_evictions"), 4, "more than needed went");
    drop((pinned, normal, other, leader));
}

#[test]
fn the_leader_reclaims_a_dead_owners_objects_only_after_the_configured_time() {
    let w = World::start(1);
    let World { etcd, url, rt, .. } = &w;
    let layout = test_layout().unwrap();
    let orphan_after = Duration::from_secs(2);
    let leader = Replica::start(rt, etcd.endpoints(), "gc", remote(url, SOON), |c| {
        c.gc_leader = true;
        c.gc_grace = Duration::from_millis(200);
        c.orphan_after = orphan_after;
    });
    let owner = Replica::start(rt, etcd.endpoints(), "owner", remote(url, SOON), |_| {});
    leader.ready(rt);
    owner.ready(rt);
    let chain = test_chain(&layout, 2, 7);
    let last = chain[1].0.hash;
    owner.tier.put_many(&chain);
    assert!(wait_until(SOON, || leader.tier.contains(&last)));
    // A live owner's objects are never orphans.
    std::thread::sleep(orphan_after + Duration::from_secs(1));
    assert!(leader.tier.contains(&last));
    assert_eq!(leader.stat("orphans_reclaimed"), 0);
    let object = adverts(&leader)[0].0.clone();

    let crashed = Instant::now();
    owner.crash();
    assert!(wait_until(SOON, || leader.stat("orphans_reclaimed") == 1));
    // Its member lease (2 s) had to lapse, then the owner had to stay gone 2 s more.
    assert!(
        crashed.elapsed() >= orphan_after,
        "reclaimed {:?} after the crash",
        crashed.elapsed()
    );
    // The leader's own tier forgets the object when its follower sees the tombstone it
    // wrote: after the count, not with it.
    assert!(wait_until(SOON, || !leader.tier.contains(&last)));
    assert!(wait_until(SOON, || !in_bucket(&leader.tier, &object)));
    drop(leader);
}

#[test]
fn a_new_leader_finishes_the_tombstones_a_dead_leader_left() {
    let w = World::start(3);
    let World { etcd, url, rt, .. } = &w;
    let layout = test_layout().unwrap();
    let object_bytes = 2 * layout.block_bytes();
    let writer = Replica::start(rt, etcd.endpoints(), "w", remote(url, SOON), |_| {});
    writer.ready(rt);
    let mut lasts = Vec::new();
    for seed in 0..5 {
        let chain = test_chain(&layout, 2, 400 + seed);
        writer.tier.put_many(&chain);
        lasts.push(chain[1].0.hash);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(wait_until(SOON, || writer.catalog.view().len() == 5));
    let gc = |c: &mut kvtier_meta::ClusterConfig| {
        c.gc_leader = true;
        // Long enough that the first leader dies with its tombstones pending.
        c.gc_grace = Duration::from_secs(3);
        c.budgets.insert("default".into(), 2 * object_bytes);
    };
    let first = Replica::start(rt, etcd.endpoints(), "gc1", remote(url, SOON), gc);
    first.ready(rt);
    assert!(wait_until(SOON, || first.stat("budget_evictions") == 3));
    let second = Replica::start(rt, etcd.endpoints(), "gc2", remote(url, SOON), gc);
    second.ready(rt);
    let pending = w.status();
    assert_eq!(
        pending.tombstones, 3,
        "the first leader finished before dying"
    );
    assert_eq!(first.stat("gc_deleted"), 0);
    first.crash();

    assert!(wait_until(Duration::from_secs(20), || second
        .stat("is_leader")
        == 1));
    assert!(wait_until(SOON, || { w.status().tombstones == 0 }));
    assert_eq!(second.stat("gc_deleted"), 3);
    assert_eq!(
        second.stat("budget_evictions"),
        0,
        "the budget was met already"
    );
    // Nothing live was deleted: the two newest objects load byte for byte.
    for (i, h) in lasts.iter().enumerate() {
        assert_eq!(writer.tier.contains(h), i >= 3, "object {i}");
    }
    let newest = test_chain(&layout, 2, 404);
    assert_eq!(
        writer.tier.get(&newest[1].0.hash).unwrap(),
        Some(newest[1].1.clone())
    );
    let s = w.status();
    assert_eq!(s.namespaces["default"].objects, 2);
    drop((writer, second));
}

#[test]
fn two_replicas_racing_for_one_run_under_gc_never_advertise_a_missing_object() {
    const ROUNDS: u32 = 100;
    let w = World::start(1);
    let World { etcd, url, rt, .. } = &w;
    let layout = test_layout().unwrap();
    let a = Replica::start(rt, etcd.endpoints(), "a", remote(url, SOON), |_| {});
    let b = Replica::start(rt, etcd.endpoints(), "b", remote(url, SOON), |_| {});
    // Grace 0 and a budget of nothing: every advertised object is deleted as soon as
    // the leader sees it.
    let leader = Replica::start(rt, etcd.endpoints(), "gc", remote(url, SOON), |c| {
        c.gc_leader = true;
        c.gc_grace = Duration::ZERO;
        c.gc_interval = Duration::from_millis(20);
        c.budgets.insert("default".into(), 0);
    });
    for r in [&a, &b, &leader] {
        r.ready(rt);
    }
    let chain = Arc::new(test_chain(&layout, 2, 77));
    let done = Arc::new(AtomicBool::new(false));
    let (checked, violations) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    // The checker: every advertisement it reads must name an object in the bucket, unless
    // the advertisement was withdrawn meanwhile.
    let checker = {
        let (done, checked, violations) = (done.clone(), checked.clone(), violations.clone());
        let endpoints = etcd.endpoints();
        let probe = a.tier.clone();
        std::thread::spawn(move || {
            let rt = common::runtime();
            let mut client = rt.block_on(kvtier_meta::connect_once(&endpoints)).unwrap();
            let prefix = kvtier_meta::Keys::new(common::CLUSTER).objects();
            while !done.load(Ordering::SeqCst) {
                let (_, records) = match rt.block_on(status::read_prefix(&mut client, &prefix)) {
                    Ok(r) => r,
                    Err(e) => panic!("checker cannot read: {e}"),
                };
                for r in records {
                    let advert: kvtier_meta::Advert = serde_json::from_slice(&r.value).unwrap();
                    checked.fetch_add(1, Ordering::SeqCst);
                    if in_bucket(&probe, &advert.object) {
                        continue;
                    }
                    let now = rt.block_on(client.get(r.key.clone(), None)).unwrap();
                    if now.kvs().first().map(|kv| kv.mod_revision()) == Some(r.revision) {
                        violations.fetch_add(1, Ordering::SeqCst);
                        eprintln!("advertised but missing: {}", advert.object);
                    }
                }
            }
        })
    };
    for round in 0..ROUNDS {
        let (ca, cb) = (chain.clone(), chain.clone());
        let (ta, tb) = (a.tier.clone(), b.tier.clone());
        let ja = std::thread::spawn(move || ta.put_many(&ca));
        let jb = std::thread::spawn(move || tb.put_many(&cb));
        ja.join().unwrap();
        jb.join().unwrap();
        // Wait until the leader took this round's winner away again.
        let last = chain[1].0.hash;
        if !wait_until(SOON, || !a.tier.contains(&last) && !b.tier.contains(&last)) {
            done.store(true, Ordering::SeqCst);
            panic!(
                "round {round}: a={} b={} a:{:?} b:{:?} leader:{:?} views a={:?} b={:?} l={:?}",
                a.tier.contains(&last),
                b.tier.contains(&last),
                a.catalog.stats().snapshot(),
                b.catalog.stats().snapshot(),
                leader.catalog.stats().snapshot(),
                adverts(&a),
                adverts(&b),
                adverts(&leader)
            );
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    done.store(true, Ordering::SeqCst);
    checker.join().unwrap();
    assert_eq!(violations.load(Ordering::SeqCst), 0);
    assert!(
        checked.load(Ordering::SeqCst) > 0,
        "the checker saw no advertisement"
    );
    let published = a.stat("published") + b.stat("published");
    let lost = a.stat("publish_lost") + b.stat("publish_lost");
    // A round whose run is still tombstoned when both publish advertises nothing (both
    // copies are deleted by their writers); every other round advertises one winner.
    assert!(published >= u64::from(ROUNDS) / 4, "{published} published");
    assert!(lost > 0, "the replicas never raced for a run");
    assert_eq!(
        leader.stat("gc_deleted"),
        published,
        "every winner was deleted"
    );
    drop((a, b, leader));
}
