//! A replica whose watch falls behind a compaction — cut off from etcd meanwhile, or
//! connected but consuming slowly — resyncs from a full read: its index ends equal to the
//! live set, and nothing withdrawn meanwhile comes back. Replays and watches that carry
//! more than gRPC's default message bound (long runs make large records) complete.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Replica, World, adverts, flood, remote, wait_until};
use kvtier_core::hash::BlockHash;
use kvtier_core::tier::Tier;
use kvtier_core::tier::conformance::{test_chain, test_layout};
use kvtier_meta::Withdrawal;
use kvtier_testkit::Cuttable;

const SOON: Duration = Duration::from_secs(20);

/// Stores `n` one-block objects on `r` from `seed` on; their hashes.
fn store(r: &Replica, seed: u32, n: u32) -> Vec<BlockHash> {
    let layout = test_layout().unwrap();
    (seed..seed + n)
        .map(|s| {
            let chain = test_chain(&layout, 1, s);
            r.tier.put_many(&chain);
            chain[0].0.hash
        })
        .collect()
}

/// Compacts etcd at its current revision.
fn compact(rt: &tokio::runtime::Runtime, endpoints: &[String]) -> i64 {
    rt.block_on(async {
        let mut c = kvtier_meta::connect_once(endpoints).await.unwrap();
        let rev = c.get("x", None).await.unwrap().header().unwrap().revision();
        c.compact(
            rev,
            Some(etcd_client::CompactionOptions::new().with_physical()),
        )
        .await
        .unwrap();
        rev
    })
}

fn objects(r: &Replica) -> BTreeSet<String> {
    adverts(r).into_iter().map(|(o, _)| o).collect()
}

/// A withdraws every other object it advertised among `of`; the hashes withdrawn.
fn withdraw_half(rt: &tokio::runtime::Runtime, a: &Replica, of: &[BlockHash]) -> Vec<BlockHash> {
    let mut gone = Vec::new();
    let view = a.catalog.view().all();
    for (i, h) in of.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        let hex = h.to_hex();
        let (_, seen) = view
            .iter()
            .find(|(_, s)| {
                s.advert
                    .run()
                    .is_some_and(|r| r.blocks == vec![hex.clone()])
            })
            .unwrap_or_else(|| panic!("object {i} not advertised"));
        let out = rt
            .block_on(a.catalog.withdraw(seen.advert.object()))
            .unwrap();
        assert!(matches!(out, Withdrawal::Withdrawn(_)), "{out:?}");
        gone.push(*h);
    }
    gone
}

#[test]
fn a_replica_cut_off_from_etcd_past_a_compaction_resyncs_to_the_live_set() {
    let w = World::start(1);
    let World { etcd, url, rt, .. } = &w;
    let link = Cuttable::start(&etcd.endpoints()[0]).unwrap();
    let fast = |c: &mut kvtier_meta::ClusterConfig| c.gc_grace = Duration::from_millis(100);
    let a = Replica::start(rt, etcd.endpoints(), "a", remote(url, SOON), fast);
    let b = Replica::start(rt, vec![link.url.clone()], "b", remote(url, SOON), fast);
    a.ready(rt);
    b.ready(rt);
    let before = store(&a, 0, 10);
    assert!(wait_until(SOON, || before
        .iter()
        .all(|h| b.tier.contains(h))));

    link.cut();
    let during = store(&a, 100, 20);
    let withdrawn = withdraw_half(rt, &a, &before);
    assert!(wait_until(SOON, || a.catalog.view().len() == 25));
    compact(rt, &etcd.endpoints());
    assert!(
        b.tier.contains(&withdrawn[0]),
        "B heard of the withdrawal while cut off"
    );
    link.heal();

    assert!(wait_until(SOON, || b.stat("resyncs_compacted") >= 1));
    assert!(wait_until(SOON, || objects(&b) == objects(&a)));
    for h in &during {
        assert!(b.tier.contains(h), "an object stored while away is missing");
    }
    for h in &withdrawn {
        assert!(!b.tier.contains(h), "a withdrawn object came back");
    }
    drop((a, b));
}

#[test]
fn a_stalled_watch_consumer_resyncs_to_the_live_set_across_a_compaction() {
    let w = World::start(1);
    let World { etcd, url, rt, .. } = &w;
    let fast = |c: &mut kvtier_meta::ClusterConfig| c.gc_grace = Duration::from_millis(100);
    let a = Replica::start(rt, etcd.endpoints(), "a", remote(url, SOON), fast);
    let b = Replica::start(rt, etcd.endpoints(), "b", remote(url, SOON), fast);
    a.ready(rt);
    b.ready(rt);
    let stored = store(&a, 0, 300);
    assert!(wait_until(SOON, || a.catalog.view().len() == 300));
    let withdrawn = withdraw_half(rt, &a, &stored[..40]);
    assert!(wait_until(SOON, || objects(&b) == objects(&a)));
    // B's consumer stalls (a test hook) while more is written than every buffer between
    // etcd and it holds (the HTTP/2 window; etcd's queue of responses, one per
    // revision): etcd parks B's watcher as slow, still connected. A consumer that is
    // merely slow does not do: etcd catches it up in large batches within a fraction of
    // a second, too soon for a compaction to pass it.
    b.catalog.hold_watch(true);
    let junk = flood(rt, &etcd.endpoints(), "slow", 3000, 4 << 10);
    rt.block_on(junk.delete());
    // Changes B's parked watcher never sees as events: only the resync can teach them.
    let mut withdrawn = withdrawn;
    withdrawn.extend(withdraw_half(rt, &a, &stored[40..80]));
    let late = store(&a, 1000, 20);
    assert!(wait_until(SOON, || a.catalog.view().len() == 280));
    compact(rt, &etcd.endpoints());
    b.catalog.hold_watch(false);

    // etcd cancels the watch once B has drained what was queued before; B resyncs.
    assert!(
        wait_until(Duration::from_secs(90), || b.stat("resyncs_compacted") >= 1),
        "etcd never cancelled the stalled watch: the resync path was not exercised"
    );
    assert_eq!(
        b.stat("watch_resumes"),
        0,
        "the stream broke: not the path under test"
    );
    assert!(wait_until(SOON, || objects(&b) == objects(&a)));
    assert!(late.iter().all(|h| b.tier.contains(h)));
    for h in &withdrawn {
        assert!(!b.tier.contains(h), "a withdrawn object came back");
    }
    assert!(
        stored[1..]
            .iter()
            .step_by(2)
            .take(20)
            .all(|h| b.tier.contains(h))
    );
    eprintln!(
        "stalled consumer: resyncs after compaction {}, watch resumes {}",
        b.stat("resyncs_compacted"),
        b.stat("watch_resumes")
    );
    drop((a, b));
}

#[test]
fn a_replay_of_pages_larger_than_grpcs_default_bound_completes() {
    let w = World::start(1);
    let World { etcd, url, rt, .. } = &w;
    let a = Replica::start(rt, etcd.endpoints(), "a", remote(url, SOON), |_| {});
    a.ready(rt);
    let stored = store(&a, 0, 20);
    assert!(wait_until(SOON, || a.catalog.view().len() == 20));
    // 8 MiB in 128 records of 64 KiB — an advertisement of a run of about 1,000 blocks
    // is that large — in one page of the replay.
    let junk = flood(rt, &etcd.endpoints(), "large", 128, 64 << 10);

    let b = Replica::start(rt, etcd.endpoints(), "b", remote(url, SOON), |_| {});
    b.ready(rt);
    assert!(stored.iter().all(|h| b.tier.contains(h)));
    assert_eq!(b.stat("records_refused"), junk.records);
    drop((a, b));
}

#[test]
fn a_watch_resuming_after_a_gap_larger_than_grpcs_default_bound_catches_up() {
    let w = World::start(1);
    let World { etcd, url, rt, .. } = &w;
    let link = Cuttable::start(&etcd.endpoints()[0]).unwrap();
    let a = Replica::start(rt, etcd.endpoints(), "a", remote(url, SOON), |_| {});
    let b = Replica::start(rt, vec![link.url.clone()], "b", remote(url, SOON), |_| {});
    a.ready(rt);
    b.ready(rt);

    link.cut();
    // While B is away: 8 MiB of records, then objects it must learn. B's watch resumes
    // from before all of it, and etcd sends the gap in one batch.
    let junk = flood(rt, &etcd.endpoints(), "gap", 128, 64 << 10);
    let during = store(&a, 100, 10);
    assert!(wait_until(SOON, || a.catalog.view().len() == 10));
    link.heal();

    assert!(
        wait_until(SOON, || during.iter().all(|h| b.tier.contains(h))),
        "B never caught up (watch resumes: {})",
        b.stat("watch_resumes")
    );
    assert_eq!(b.stat("records_refused"), junk.records);
    assert_eq!(b.stat("resyncs_compacted"), 0, "nothing was compacted");
    drop((a, b));
}
