//! The cluster's GC with real parts (issue 39, item 8): etcd members, `kvtier gateway`, and
//! `kvtier serve` replicas as child processes killed by PID — the GC leader's failover,
//! orphans, namespace budgets and pinned objects, and two replicas racing for one run.
//! (`kvtier-meta`'s tests cover the same rules with replicas as tasks of one process.)

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod cluster_support;
mod gateway;
mod server;

use std::time::{Duration, Instant};

use cluster_support::{cluster_status, eventually, replica_with};
use gateway::Gateway;
use kvtier_client::Client;
use kvtier_client::wire::LayoutInfo;
use kvtier_testkit::EtcdCluster;
use server::{Server, layout_spec, load_all, payloads, prompt, runtime};

/// Reads give up within half a second, so a GC grace of a second is allowed.
const QUICK: [&str; 2] = ["--set", "remote.deadline=500ms"];

/// One prompt of two blocks: one run object of 32 KiB in the bucket.
const BLOCKS: usize = 2;

struct Cluster {
    dir: tempfile::TempDir,
    etcd: EtcdCluster,
    gateway: Gateway,
}

impl Cluster {
    fn start(members: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let etcd = EtcdCluster::start(&dir.path().join("etcd"), members).unwrap();
        let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
        Self { dir, etcd, gateway }
    }

    /// Replica `name` with `cluster_toml` in its `[cluster]` table.
    fn replica(&self, name: &str, cluster_toml: &str) -> Server {
        replica_with(
            self.dir.path(),
            name,
            &self.gateway.endpoint,
            &self.etcd.url(),
            cluster_toml,
            &QUICK,
        )
    }

    fn status(&self) -> serde_json::Value {
        cluster_status(&self.etcd.url())
    }
}

async fn layout_on(c: &Client) -> LayoutInfo {
    c.register_layout(&layout_spec("cluster", 2)).await.unwrap()
}

async fn stat(c: &Client, name: &str) -> u64 {
    c.stats().await.unwrap()[name]
}

/// Whether `seed`'s prompt is a whole hit on `c`.
async fn hits(c: &Client, layout: &LayoutInfo, seed: u32) -> bool {
    c.lookup(&prompt(layout, seed, BLOCKS))
        .await
        .unwrap()
        .matched_tokens
        == BLOCKS * 16
}

/// Stores prompts `seeds` on `c`, 200 ms apart (distinct advertisement times: "oldest
/// first" is well defined).
async fn store_each(c: &Client, layout: &LayoutInfo, seeds: std::ops::Range<u32>) {
    for seed in seeds {
        let stored = c
            .store(
                &prompt(layout, seed, BLOCKS),
                payloads(layout, seed, BLOCKS),
            )
            .await
            .unwrap();
        assert_eq!(stored.stored, BLOCKS);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the cluster advertises `n` objects. Up to a minute: with four clusters of
/// replicas starting at once on a 2-core CI machine, 20 s was once not enough.
async fn advertised(cluster: &Cluster, n: u64) -> bool {
    eventually(Duration::from_secs(60), async || {
        let s = cluster.status();
        s["owners"]
            .as_object()
            .unwrap()
            .values()
            .map(|u| u["objects"].as_u64().unwrap())
            .sum::<u64>()
            == n
    })
    .await
}

#[test]
fn a_killed_gc_leader_is_replaced_and_the_deletes_it_left_pending_are_finished() {
    let cluster = Cluster::start(3);
    let writer = cluster.replica("w", "gc_leader = false\n");
    // Budget: two of the writer's five objects; a grace long enough that the first leader
    // dies with its withdrawals pending.
    let gc = "gc_leader = true\ngc_grace = \"10s\"\ngc_interval = \"200ms\"\n\
              [cluster.budgets]\ndefault = \"64KiB\"\n";
    let rt = runtime();
    let cw = writer.client();
    let layout = rt.block_on(async {
        let layout = layout_on(&cw).await;
        store_each(&cw, &layout, 400..405).await;
        assert!(advertised(&cluster, 5).await);
        layout
    });
    let first = cluster.replica("gc1", gc);
    let second = rt.block_on(async {
        let c1 = first.client();
        assert!(
            eventually(Duration::from_secs(30), async || stat(
                &c1,
                "cluster_budget_evictions"
            )
            .await
                == 3)
            .await
        );
        let second = cluster.replica("gc2", gc);
        let c2 = second.client();
        assert!(
            eventually(Duration::from_secs(20), async || stat(
                &c2,
                "cluster_registrations"
            )
            .await
                >= 1)
            .await
        );
        assert_eq!(
            cluster.status()["tombstones"],
            3,
            "the first leader finished"
        );
        assert_eq!(stat(&c1, "cluster_gc_deleted").await, 0);
        second
    });
    first.kill9();
    rt.block_on(async {
        let c2 = second.client();
        assert_eq!(layout_on(&c2).await, layout);
        assert!(
            eventually(Duration::from_secs(30), async || stat(
                &c2,
                "cluster_is_leader"
            )
            .await
                == 1)
            .await,
            "no new leader"
        );
        assert!(
            eventually(
                Duration::from_secs(30),
                async || cluster.status()["tombstones"] == 0
            )
            .await,
            "the new leader did not finish the pending deletes"
        );
        assert_eq!(stat(&c2, "cluster_gc_deleted").await, 3);
        assert_eq!(
            stat(&c2, "cluster_budget_evictions").await,
            0,
            "the budget was met"
        );
        // The oldest three went; the newest two load byte for byte.
        for (i, seed) in (400..405).enumerate() {
            assert_eq!(hits(&c2, &layout, seed).await, i >= 3, "object {i}");
        }
        let hit = c2.lookup(&prompt(&layout, 404, BLOCKS)).await.unwrap();
        assert_eq!(
            load_all(&c2, &layout, &hit).await.blocks,
            payloads(&layout, 404, BLOCKS)
        );
    });
    for server in [writer, second] {
        assert!(server.stop().success());
    }
}

#[test]
fn a_killed_owners_objects_are_reclaimed_only_after_orphan_after() {
    let cluster = Cluster::start(1);
    let leader = cluster.replica(
        "gc",
        "gc_leader = true\norphan_after = \"3s\"\ngc_grace = \"1s\"\ngc_interval = \"200ms\"\n\
         lease_ttl = \"2s\"\n",
    );
    let owner = cluster.replica("owner", "gc_leader = false\nlease_ttl = \"2s\"\n");
    let rt = runtime();
    let (cl, co) = (leader.client(), owner.client());
    let layout = rt.block_on(async {
        let layout = layout_on(&co).await;
        assert_eq!(layout_on(&cl).await, layout);
        store_each(&co, &layout, 7..8).await;
        assert!(
            eventually(Duration::from_secs(20), async || hits(&cl, &layout, 7)
                .await)
            .await
        );
        // A live owner's objects are never orphans.
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(hits(&cl, &layout, 7).await);
        assert_eq!(stat(&cl, "cluster_orphans_reclaimed").await, 0);
        layout
    });
    let crashed = Instant::now();
    owner.kill9();
    rt.block_on(async {
        assert!(
            eventually(Duration::from_secs(30), async || stat(
                &cl,
                "cluster_orphans_reclaimed"
            )
            .await
                == 1)
            .await
        );
        // Its member lease (2 s) had to lapse, then the owner had to stay gone 3 s more.
        assert!(
            crashed.elapsed() >= Duration::from_secs(3),
            "reclaimed {:?} after the kill",
            crashed.elapsed()
        );
        assert!(
            eventually(Duration::from_secs(20), async || !hits(&cl, &layout, 7)
                .await)
            .await
        );
        assert!(
            eventually(Duration::from_secs(20), async || stat(
                &cl,
                "cluster_gc_deleted"
            )
            .await
                == 1)
            .await,
            "the orphan was not deleted from the bucket"
        );
    });
    assert!(leader.stop().success());
}

#[test]
fn a_namespace_over_budget_sheds_its_oldest_objects_and_never_pinned_ones() {
    let cluster = Cluster::start(1);
    let pinned = cluster.replica(
        "sys",
        "gc_leader = false\nnamespace = \"tenant\"\npriority = \"pinned\"\n",
    );
    let normal = cluster.replica("chat", "gc_leader = false\nnamespace = \"tenant\"\n");
    let other = cluster.replica("else", "gc_leader = false\n");
    let rt = runtime();
    let (cp, cn, cx) = (pinned.client(), normal.client(), other.client());
    let layout = rt.block_on(async {
        let layout = layout_on(&cp).await;
        for c in [&cn, &cx] {
            assert_eq!(layout_on(c).await, layout);
        }
        store_each(&cp, &layout, 100..102).await;
        store_each(&cn, &layout, 200..206).await;
        store_each(&cx, &layout, 300..301).await;
        assert!(advertised(&cluster, 9).await);
        layout
    });
    // Budget: the two pinned objects and two of the chat replica's six (32 KiB each).
    let leader = cluster.replica(
        "gc",
        "gc_leader = true\ngc_grace = \"1s\"\ngc_interval = \"200ms\"\n\
         [cluster.budgets]\ntenant = \"128KiB\"\n",
    );
    rt.block_on(async {
        let cl = leader.client();
        assert_eq!(layout_on(&cl).await, layout);
        assert!(
            eventually(Duration::from_secs(30), async || stat(
                &cl,
                "cluster_gc_deleted"
            )
            .await
                == 4)
            .await
        );
        // A few more sweeps: nothing more goes.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            stat(&cl, "cluster_budget_evictions").await,
            4,
            "more than needed went"
        );
        let s = cluster.status();
        assert_eq!(s["namespaces"]["tenant"]["objects"], 4, "{s}");
        assert_eq!(s["namespaces"]["default"]["objects"], 1, "{s}");
        // The oldest four chat prompts went from the shared tier; the newest two, every
        // pinned one and the other namespace's stayed — as every other replica sees it.
        // (The chat replica keeps its own RAM and SSD copies: a budget is the shared tier's.)
        for c in [&cp, &cx, &cl] {
            for (i, seed) in (200..206).enumerate() {
                assert_eq!(hits(c, &layout, seed).await, i >= 4, "chat prompt {i}");
            }
            for seed in [100, 101, 300] {
                assert!(hits(c, &layout, seed).await, "prompt {seed} was withdrawn");
            }
        }
        for seed in 200..206 {
            assert!(
                hits(&cn, &layout, seed).await,
                "the writer lost its own copy"
            );
        }
    });
    for server in [pinned, normal, other, leader] {
        assert!(server.stop().success());
    }
}

#[test]
fn two_replicas_storing_the_same_prompts_at_once_leave_one_object_each() {
    let cluster = Cluster::start(1);
    let (a, b) = (cluster.replica("a", ""), cluster.replica("b", ""));
    let rt = runtime();
    let (ca, cb) = (a.client(), b.client());
    const ROUNDS: u32 = 6;
    let layout = rt.block_on(async {
        let layout = layout_on(&ca).await;
        assert_eq!(layout_on(&cb).await, layout);
        tokio::time::sleep(Duration::from_secs(2)).await;
        for round in 0..ROUNDS {
            let seed = 900 + round;
            let (p, bytes) = (
                prompt(&layout, seed, BLOCKS),
                payloads(&layout, seed, BLOCKS),
            );
            let (ra, rb) = tokio::join!(ca.store(&p, bytes.clone()), cb.store(&p, bytes));
            assert_eq!((ra.unwrap().stored, rb.unwrap().stored), (BLOCKS, BLOCKS));
        }
        // Each run advertised once, and every other copy written lost its race and was
        // deleted (a replica that saw the winner's object first wrote none).
        assert!(advertised(&cluster, u64::from(ROUNDS)).await);
        let settled = async || {
            let mut written = 0;
            let mut lost = 0;
            for c in [&ca, &cb] {
                written += stat(c, "remote_writer_saved").await / BLOCKS as u64;
                lost += stat(c, "cluster_publish_lost").await;
            }
            written == u64::from(ROUNDS) + lost
        };
        assert!(
            eventually(Duration::from_secs(20), settled).await,
            "a copy that lost its race was kept, or a run was advertised twice: {:?}",
            (
                stat(&ca, "remote_writer_saved").await,
                stat(&cb, "remote_writer_saved").await,
                stat(&ca, "cluster_publish_lost").await,
                stat(&cb, "cluster_publish_lost").await
            )
        );
        layout
    });
    // A fresh replica finds every prompt through the one advertised object, intact.
    let c = cluster.replica("c", "");
    rt.block_on(async {
        let cc = c.client();
        assert_eq!(layout_on(&cc).await, layout);
        for round in 0..ROUNDS {
            let seed = 900 + round;
            assert!(
                eventually(Duration::from_secs(20), async || hits(&cc, &layout, seed)
                    .await)
                .await
            );
            let hit = cc.lookup(&prompt(&layout, seed, BLOCKS)).await.unwrap();
            assert_eq!(
                load_all(&cc, &layout, &hit).await.blocks,
                payloads(&layout, seed, BLOCKS),
                "round {round}"
            );
        }
    });
    for server in [a, b, c] {
        assert!(server.stop().success());
    }
}
