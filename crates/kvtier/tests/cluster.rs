//! Cluster mode with real parts: three etcd members, `kvtier gateway` as the shared S3
//! store, and `kvtier serve` replicas as child processes, killed by PID.
//!
//! - Propagation: a prompt stored on A is a hit on B within a second, and B's load is
//!   one ranged GET at the gateway (counted by a proxy in front of it), byte-identical.
//! - Replay: B is killed with SIGKILL, A stores 1,000 prompts, B restarts and hits them all.
//! - The etcd raft leader is SIGKILLed during a store loop; nothing stalls, all is advertised.
//! - Partition: B runs in a network namespace whose link to etcd the test takes down.
//! - Ownership: only the owner withdraws through the admin API.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod cluster_support;
mod gateway;
mod server;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cluster_support::{cluster_status, config, eventually, replica, shared_layout};
use gateway::Gateway;
use kvtier_client::wire::frame::EndStatus;
use kvtier_testkit::{EtcdCluster, TlsFiles};
use server::{Server, layout_spec, load_all, payloads, prompt, runtime};

/// Counts the HTTP requests a replica sends to the gateway: a TCP proxy that reads each
/// request head on the way through.
struct CountingProxy {
    url: String,
    gets: Arc<AtomicU64>,
    ranged_gets: Arc<AtomicU64>,
    /// Manifests PUT through the proxy, by object name.
    manifests: Arc<parking_lot::Mutex<Vec<String>>>,
}

impl CountingProxy {
    fn start(target: &str) -> Self {
        let target = target.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let gets = Arc::new(AtomicU64::new(0));
        let ranged_gets = Arc::new(AtomicU64::new(0));
        let manifests: Arc<parking_lot::Mutex<Vec<String>>> = Arc::default();
        let (g, r, m) = (gets.clone(), ranged_gets.clone(), manifests.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(&target) else {
                    continue;
                };
                let (g, r, m) = (g.clone(), r.clone(), m.clone());
                let (mut c_read, mut u_write) =
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                // Requests: counted by their heads (a replica that only reads sends no bodies).
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = match c_read.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let raw = String::from_utf8_lossy(&buf[..n]);
                        for line in raw.lines().filter(|l| l.starts_with("PUT /")) {
                            // `PUT /BUCKET/OBJECT HTTP/1.1`
                            if let Some(path) = line.split(' ').nth(1)
                                && let Some((_, object)) =
                                    path.trim_start_matches('/').split_once('/')
                                && object.ends_with(".kvm")
                            {
                                m.lock().push(object.to_owned());
                            }
                        }
                        let text = raw.to_ascii_lowercase();
                        for head in text.split("\r\n\r\n").filter(|h| h.starts_with("get ")) {
                            g.fetch_add(1, Ordering::SeqCst);
                            if head.contains("\r\nrange: bytes=") {
                                r.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        if u_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = u_write.shutdown(std::net::Shutdown::Write);
                });
                let (mut u_read, mut c_write) = (upstream, client);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut u_read, &mut c_write);
                    let _ = c_write.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Self {
            url,
            gets,
            ranged_gets,
            manifests,
        }
    }

    fn counts(&self) -> (u64, u64) {
        (
            self.gets.load(Ordering::SeqCst),
            self.ranged_gets.load(Ordering::SeqCst),
        )
    }
}

#[test]
fn a_prompt_stored_on_one_replica_is_a_hit_on_another_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdCluster::start(&dir.path().join("etcd"), 3).unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
    let proxy = CountingProxy::start(&gateway.endpoint);
    let a_config = config(dir.path(), "a", &gateway.endpoint, &etcd.url());
    let b_config = config(dir.path(), "b", &proxy.url, &etcd.url());
    let a = Server::start(
        &dir.path().join("a"),
        &["--config", &a_config, "--set", "ssd.enabled=false"],
    );
    let b = Server::start(
        &dir.path().join("b"),
        &["--config", &b_config, "--set", "ssd.enabled=false"],
    );
    let rt = runtime();
    rt.block_on(async {
        let (ca, cb) = (a.client(), b.client());
        let spec = layout_spec("cluster", 4);
        let layout = ca.register_layout(&spec).await.unwrap();
        assert_eq!(cb.register_layout(&spec).await.unwrap(), layout);
        // Give both replicas time to register and B's watch time to open.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let p = prompt(&layout, 11, 8);
        assert_eq!(cb.lookup(&p).await.unwrap().matched_tokens, 0);
        let stored = ca.store(&p, payloads(&layout, 11, 8)).await.unwrap();
        assert_eq!(stored.stored, 8);
        let t = Instant::now();
        let hit = loop {
            let hit = cb.lookup(&p).await.unwrap();
            if hit.matched_tokens == 8 * 16 || t.elapsed() > Duration::from_secs(10) {
                break hit;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let seen = t.elapsed();
        assert_eq!(hit.matched_tokens, 8 * 16, "B never saw A's prompt");
        assert!(
            seen < Duration::from_secs(1),
            "B saw A's prompt after {seen:?}"
        );
        assert_eq!(hit.tiers, "oooooooo");
        // B checks the object's manifest in the background once it learns of it; then
        // the load is one ranged GET.
        eventually(Duration::from_secs(5), async || proxy.counts().0 >= 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = proxy.counts();
        let got = load_all(&cb, &layout, &hit).await;
        let after = proxy.counts();
        assert_eq!(got.status, EndStatus::Complete);
        assert_eq!(
            got.blocks,
            payloads(&layout, 11, 8),
            "B's bytes differ from A's"
        );
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (1, 1),
            "B's load was not exactly one ranged GET"
        );
        let stats = cb.stats().await.unwrap();
        assert_eq!(stats["cluster_adverts_applied"], 1, "{stats:?}");
        assert_eq!(stats["remote_hits"], 8, "{stats:?}");
        let metrics = cb.metrics().await.unwrap();
        assert!(
            metrics.contains("kvtier_cluster_adverts_applied_total{} 1"),
            "{metrics}"
        );
        assert_eq!(ca.stats().await.unwrap()["cluster_published"], 1);
    });
    assert!(a.stop().success());
    assert!(b.stop().success());
    drop(etcd);
}

#[test]
fn a_replica_killed_while_another_stores_hits_everything_after_restart() {
    const PROMPTS: u32 = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdCluster::start(&dir.path().join("etcd"), 3).unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
    let a_config = config(dir.path(), "a", &gateway.endpoint, &etcd.url());
    let b_config = config(dir.path(), "b", &gateway.endpoint, &etcd.url());
    let b_args = ["--config", b_config.as_str(), "--set", "ssd.enabled=false"];
    let a = Server::start(
        &dir.path().join("a"),
        &["--config", &a_config, "--set", "ssd.enabled=false"],
    );
    let b = Server::start(&dir.path().join("b"), &b_args);
    let rt = runtime();
    let spec = layout_spec("cluster", 2);
    let layout = rt.block_on(async { b.client().register_layout(&spec).await.unwrap() });
    b.kill9();
    rt.block_on(async {
        let ca = a.client();
        assert_eq!(ca.register_layout(&spec).await.unwrap(), layout);
        for seed in 0..PROMPTS {
            let stored = ca
                .store(
                    &prompt(&layout, 1000 + seed, 1),
                    payloads(&layout, 1000 + seed, 1),
                )
                .await
                .unwrap();
            assert_eq!(stored.stored, 1);
            // The remote tier's write-behind queue drops when full (by design, so a slow
            // store never stalls); pace the stores so every one reaches the bucket.
            if seed % 100 == 99 {
                eventually(Duration::from_secs(30), async || {
                    ca.stats().await.unwrap()["remote_writer_queue_depth"] == 0
                })
                .await;
            }
        }
        eventually(Duration::from_secs(30), async || {
            ca.stats().await.unwrap()["cluster_published"] >= u64::from(PROMPTS)
        })
        .await;
        let stats = ca.stats().await.unwrap();
        assert_eq!(stats["remote_writer_dropped_full"], 0, "{stats:?}");
        assert_eq!(stats["cluster_published"], u64::from(PROMPTS), "{stats:?}");
    });
    let b = Server::start(&dir.path().join("b"), &b_args);
    rt.block_on(async {
        let cb = b.client();
        assert_eq!(cb.register_layout(&spec).await.unwrap(), layout);
        let missing = await_hits(&cb, &layout, 1000, PROMPTS, Duration::from_secs(60)).await;
        assert!(
            missing.is_empty(),
            "{} of {PROMPTS} prompts never hit on B",
            missing.len()
        );
        // A sample loads byte for byte.
        for seed in [0, PROMPTS / 2, PROMPTS - 1] {
            let hit = cb.lookup(&prompt(&layout, 1000 + seed, 1)).await.unwrap();
            let got = load_all(&cb, &layout, &hit).await;
            assert_eq!(got.blocks, payloads(&layout, 1000 + seed, 1));
        }
    });
    assert!(a.stop().success());
    assert!(b.stop().success());
    drop(etcd);
}

/// Stores `n` one-block prompts from `seed` on `client`, one every `every`; the slowest
/// store call.
async fn store_loop(
    client: &kvtier_client::Client,
    layout: &kvtier_client::wire::LayoutInfo,
    seed: u32,
    n: u32,
    every: Duration,
    mut at: impl FnMut(u32),
) -> Duration {
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        at(i);
        let t = Instant::now();
        let stored = client
            .store(&prompt(layout, seed + i, 1), payloads(layout, seed + i, 1))
            .await
            .unwrap_or_else(|e| panic!("store {i} failed: {e}"));
        slowest = slowest.max(t.elapsed());
        assert_eq!(stored.stored, 1);
        tokio::time::sleep(every).await;
    }
    slowest
}

/// Waits until every prompt `seed..seed + n` is a hit on `client`; those still missing.
async fn await_hits(
    client: &kvtier_client::Client,
    layout: &kvtier_client::wire::LayoutInfo,
    seed: u32,
    n: u32,
    within: Duration,
) -> Vec<u32> {
    let t = Instant::now();
    let mut missing: Vec<u32> = (0..n).collect();
    while !missing.is_empty() && t.elapsed() < within {
        let mut still = Vec::new();
        for i in missing {
            if client
                .lookup(&prompt(layout, seed + i, 1))
                .await
                .unwrap()
                .matched_tokens
                != 16
            {
                still.push(i);
            }
        }
        missing = still;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    missing
}

#[test]
fn killing_the_etcd_leader_during_a_store_loop_stalls_no_store_and_loses_no_advertisement() {
    const N: u32 = 150;
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = EtcdCluster::start(&dir.path().join("etcd"), 3).unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
    let no_ssd = ["--set", "ssd.enabled=false"];
    let a = replica(dir.path(), "a", &gateway.endpoint, &etcd.url(), &no_ssd);
    let b = replica(dir.path(), "b", &gateway.endpoint, &etcd.url(), &no_ssd);
    let leader = etcd.leader().expect("an etcd leader");
    let rt = runtime();
    rt.block_on(async {
        let (ca, cb) = (a.client(), b.client());
        let layout = shared_layout(&ca, &cb).await;
        let mut killed_at = None;
        let slowest = store_loop(&ca, &layout, 5000, N, Duration::from_millis(20), |i| {
            if i == N / 3 {
                etcd.kill(leader).unwrap();
                killed_at = Some(Instant::now());
            }
        })
        .await;
        let killed_at = killed_at.unwrap();
        eprintln!("slowest store while the etcd leader died: {slowest:?}");
        assert!(
            slowest < Duration::from_secs(1),
            "a store stalled for {slowest:?}"
        );
        let missing = await_hits(&cb, &layout, 5000, N, Duration::from_secs(30)).await;
        assert!(
            missing.is_empty(),
            "{} prompts never advertised: {missing:?}",
            missing.len()
        );
        eprintln!(
            "everything advertised {:?} after the leader was killed",
            killed_at.elapsed()
        );
        let stats = ca.stats().await.unwrap();
        assert_eq!(stats["cluster_published"], u64::from(N), "{stats:?}");
        assert_eq!(stats["cluster_publish_dropped"], 0);
    });
    assert!(a.stop().success());
    assert!(b.stop().success());
    drop(etcd);
}

#[test]
fn a_partitioned_replica_serves_locally_and_comes_back_under_a_new_generation() {
    let dir = tempfile::tempdir().unwrap();
    // B is a host of its own: a network namespace with two links to the test's, one
    // carrying its clients' and S3 traffic, one its etcd traffic. The partition takes
    // the etcd link down: packets vanish and B's open connections hang, as on a real
    // network (B still reaches the bucket and its clients).
    const DATA: usize = 0;
    const ETCD: usize = 1;
    let host = kvtier_testkit::Host::create(2).unwrap_or_else(|e| {
        panic!("{e} (this test runs B in a network namespace and needs root, as CI runs)")
    });
    let etcd = EtcdCluster::start_also_on(&dir.path().join("etcd"), 3, &[host.link(ETCD).outside])
        .unwrap();
    let gateway = Gateway::start_at(
        &format!("{}:0", host.link(DATA).outside),
        &dir.path().join("s3"),
        &["--create-bucket", "shared"],
    );
    let ttl = ["--set", "cluster.lease_ttl=2s"];
    let a = replica(dir.path(), "a", &gateway.endpoint, &etcd.url(), &ttl);
    let b_etcd = etcd.url_at(host.link(ETCD).outside);
    let b_config = config(dir.path(), "b", &gateway.endpoint, &b_etcd);
    let mut b_args = vec!["--config", b_config.as_str()];
    b_args.extend_from_slice(&ttl);
    let b = Server::start_in(&host, DATA, &dir.path().join("b"), &b_args);
    let rt = runtime();
    rt.block_on(async {
        let (ca, cb) = (a.client(), b.client());
        let layout = shared_layout(&ca, &cb).await;
        eventually(Duration::from_secs(20), async || {
            cb.stats().await.unwrap()["cluster_registrations"] > 0
        })
        .await;
        assert_eq!(cb.stats().await.unwrap()["cluster_registrations"], 1);
        cb.store(&prompt(&layout, 7000, 1), payloads(&layout, 7000, 1))
            .await
            .unwrap();
        assert!(
            await_hits(&ca, &layout, 7000, 1, Duration::from_secs(10))
                .await
                .is_empty()
        );

        host.cut(ETCD).unwrap();
        // Long enough for B's lease to lapse (2 s TTL).
        tokio::time::sleep(Duration::from_secs(4)).await;
        // B keeps serving: its own earlier prompt, and a new store, locally.
        let hit = cb.lookup(&prompt(&layout, 7000, 1)).await.unwrap();
        assert_eq!(hit.matched_tokens, 16);
        let got = load_all(&cb, &layout, &hit).await;
        assert_eq!(got.blocks, payloads(&layout, 7000, 1));
        let t = Instant::now();
        cb.store(&prompt(&layout, 7001, 1), payloads(&layout, 7001, 1))
            .await
            .unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "a store waited on etcd"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            ca.lookup(&prompt(&layout, 7001, 1))
                .await
                .unwrap()
                .matched_tokens,
            0,
            "B advertised while partitioned"
        );

        host.heal(ETCD).unwrap();
        assert!(
            await_hits(&ca, &layout, 7001, 1, Duration::from_secs(20))
                .await
                .is_empty()
        );
        let stats = cb.stats().await.unwrap();
        assert_eq!(stats["cluster_registrations"], 2, "{stats:?}");
        let status = cluster_status(&etcd.url());
        assert_eq!(status["generations"]["b"], 2, "{status}");
        assert_eq!(status["owners"]["b"]["objects"], 2, "{status}");
        // The fence: nothing was accepted under generation 1 once its lease was lost.
        // The prompt stored before the cut is advertised under 1, the one stored while
        // cut off (queued under 1) under 2.
        let mut generations = advertised_generations(&etcd, "b").await;
        generations.sort_unstable();
        assert_eq!(generations, [1, 2], "{stats:?}");
        // The one advertisement queued while cut off is refused under generation 1 at
        // most once (when the publisher, not the keepalive, is first to learn the lease
        // is gone: 0 or 1 by timing), then published under 2 — never refused in a loop.
        assert!(stats["cluster_fenced"] <= 1, "{stats:?}");
        assert_eq!(stats["cluster_published"], 2, "{stats:?}");
    });
    assert!(a.stop().success());
    assert!(b.stop().success());
    drop(etcd);
    drop(host);
}

/// The owner generation of every advertisement `owner` has in cluster `test`, read
/// from etcd directly.
async fn advertised_generations(etcd: &EtcdCluster, owner: &str) -> Vec<u64> {
    use kvtier_meta::etcd_client::{Client, GetOptions};
    let mut client = Client::connect(etcd.endpoints(), None).await.unwrap();
    let got = client
        .get(
            "kvtier/test/objects/",
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    got.kvs()
        .iter()
        .map(|kv| serde_json::from_slice::<serde_json::Value>(kv.value()).unwrap())
        .filter(|advert| advert["owner"] == owner)
        .map(|advert| advert["generation"].as_u64().unwrap())
        .collect()
}

#[test]
fn only_the_owner_deletes_through_the_admin_api() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdCluster::start(&dir.path().join("etcd"), 3).unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
    let proxy = CountingProxy::start(&gateway.endpoint);
    let grace = ["--set", "cluster.gc_grace=2s"];
    let a = replica(dir.path(), "a", &proxy.url, &etcd.url(), &grace);
    let b = replica(dir.path(), "b", &gateway.endpoint, &etcd.url(), &grace);
    let rt = runtime();
    rt.block_on(async {
        let (ca, cb) = (a.client(), b.client());
        let layout = shared_layout(&ca, &cb).await;
        let p = prompt(&layout, 8000, 4);
        ca.store(&p, payloads(&layout, 8000, 4)).await.unwrap();
        eventually(Duration::from_secs(10), async || {
            cb.lookup(&p).await.unwrap().matched_tokens == 64
        })
        .await;
        let object = proxy
            .manifests
            .lock()
            .first()
            .cloned()
            .expect("A wrote a manifest");

        let refused = b
            .admin()
            .admin_cluster_withdraw(&object)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("403") || refused.contains("not_owner"),
            "{refused}"
        );
        assert_eq!(
            cb.lookup(&p).await.unwrap().matched_tokens,
            64,
            "B's refused delete changed something"
        );
        assert_eq!(cb.stats().await.unwrap()["cluster_deletes_refused"], 1);

        let done = a.admin().admin_cluster_withdraw(&object).await.unwrap();
        assert_eq!(done["withdrawn"], object.as_str(), "{done}");
        eventually(Duration::from_secs(5), async || {
            cb.lookup(&p).await.unwrap().matched_tokens == 0
        })
        .await;
        assert_eq!(
            cb.lookup(&p).await.unwrap().matched_tokens,
            0,
            "B still serves a withdrawn object"
        );
        eventually(Duration::from_secs(10), async || {
            ca.stats().await.unwrap()["cluster_gc_deleted"] > 0
        })
        .await;
        assert_eq!(ca.stats().await.unwrap()["cluster_gc_deleted"], 1);
        let unknown = a
            .admin()
            .admin_cluster_withdraw(&object)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            unknown.contains("404") || unknown.contains("not_advertised"),
            "{unknown}"
        );
        let status = cluster_status(&etcd.url());
        assert_eq!(status["tombstones"], 0, "{status}");
        assert_eq!(status["replicas"].as_array().unwrap().len(), 2, "{status}");
        assert!(status["leader"].is_string(), "{status}");
    });
    assert!(a.stop().success());
    assert!(b.stop().success());
    drop(etcd);
}

/// `/readyz` follows the cluster: a replica whose etcd is down serves (its `/healthz` and
/// its local tiers answer) but is not ready, naming the cluster; one with a live etcd
/// becomes ready once registered and replayed.
#[test]
fn readiness_names_the_cluster_until_the_replica_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
    let dead_etcd = format!("http://127.0.0.1:{}", kvtier_testkit::free_port().unwrap());
    let lost = Server::start(
        &dir.path().join("lost"),
        &[
            "--config",
            &config(dir.path(), "lost", &gateway.endpoint, &dead_etcd),
        ],
    );
    let etcd = EtcdCluster::start(&dir.path().join("etcd"), 1).unwrap();
    let live = Server::start(
        &dir.path().join("live"),
        &[
            "--config",
            &config(dir.path(), "live", &gateway.endpoint, &etcd.url()),
        ],
    );
    let rt = runtime();
    rt.block_on(async {
        let c = lost.client();
        assert_eq!(c.health().await.unwrap().status, "ok");
        let r = c.ready().await.unwrap();
        assert!(!r.ready, "{r:?}");
        assert_eq!(r.checks.get("cluster"), Some(&false), "{r:?}");
        assert_eq!(r.checks.get("ssd"), Some(&true), "{r:?}");
        assert_eq!(r.checks.get("remote"), Some(&true), "{r:?}");
        let c = live.client();
        let ready = eventually(Duration::from_secs(15), async || {
            c.ready().await.is_ok_and(|r| r.ready)
        })
        .await;
        let r = c.ready().await.unwrap();
        assert!(ready, "{r:?}");
        assert_eq!(r.checks.get("cluster"), Some(&true), "{r:?}");
    });
    // Liveness, as a prober sends it: no token, a plain GET.
    let mut s = TcpStream::connect(lost.url.trim_start_matches("http://")).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(lost.stop().success());
    assert!(live.stop().success());
}

/// Issue 39, item 5: `DELETE /v1/layouts/{layout}` on one replica deletes the layout
/// everywhere — the other replica drops its own copies (a block it loaded into RAM
/// included), the GC leader withdraws and deletes every object of the layout in the bucket
/// (through the two-phase GC), and after both replicas are killed and restarted nothing
/// of it comes back; another layout is untouched, and the layout stored again after the
/// delete stays (an old delete is never applied twice).
#[test]
fn a_layout_deleted_on_one_replica_is_gone_from_every_replica_and_the_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdCluster::start(&dir.path().join("etcd"), 1).unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
    let fast = [
        "--set",
        "cluster.gc_grace=2s",
        "--set",
        "cluster.gc_interval=1s",
    ];
    let start = |name: &str| replica(dir.path(), name, &gateway.endpoint, &etcd.url(), &fast);
    let kept_spec = layout_spec("kept", 2);
    let (a, b) = (start("a"), start("b"));
    let rt = runtime();
    let (layout, kept) = rt.block_on(async {
        let (ca, cb) = (a.client(), b.client());
        let layout = shared_layout(&ca, &cb).await;
        let kept = ca.register_layout(&kept_spec).await.unwrap();
        assert_eq!(cb.register_layout(&kept_spec).await.unwrap(), kept);
        ca.store(&prompt(&layout, 100, 2), payloads(&layout, 100, 2))
            .await
            .unwrap();
        cb.store(&prompt(&layout, 200, 2), payloads(&layout, 200, 2))
            .await
            .unwrap();
        ca.store(&prompt(&kept, 300, 2), payloads(&kept, 300, 2))
            .await
            .unwrap();
        for (c, seed, l) in [(&cb, 100, &layout), (&ca, 200, &layout), (&cb, 300, &kept)] {
            assert!(
                eventually(Duration::from_secs(20), async || {
                    c.lookup(&prompt(l, seed, 2)).await.unwrap().matched_tokens == 32
                })
                .await,
                "prompt {seed} did not reach the other replica"
            );
        }
        // B loads A's prompt: a copy in B's own RAM now.
        let hit = cb.lookup(&prompt(&layout, 100, 2)).await.unwrap();
        assert_eq!(
            load_all(&cb, &layout, &hit).await.blocks,
            payloads(&layout, 100, 2)
        );

        // A's own two blocks, and B's two it knows through the bucket.
        assert_eq!(ca.delete_layout(&layout.layout).await.unwrap(), 4);
        let gone = async |c: &kvtier_client::Client| {
            let mut all = 0;
            for seed in [100, 200] {
                all += c
                    .lookup(&prompt(&layout, seed, 2))
                    .await
                    .unwrap()
                    .matched_tokens;
            }
            all == 0
        };
        assert!(
            eventually(Duration::from_secs(20), async || gone(&ca).await
                && gone(&cb).await)
            .await,
            "a replica still serves the deleted layout"
        );
        // Both objects (one per replica) withdrawn and deleted from the bucket.
        let deleted = async || {
            let (sa, sb) = (ca.stats().await.unwrap(), cb.stats().await.unwrap());
            sa["cluster_gc_deleted"] + sb["cluster_gc_deleted"] >= 2
        };
        let cluster_counters = async |c: &kvtier_client::Client| {
            let mut s = c.stats().await.unwrap();
            s.retain(|k, _| k.starts_with("cluster_"));
            s
        };
        assert!(
            eventually(Duration::from_secs(30), deleted).await,
            "the bucket still holds the layout's objects: {:?} {:?}",
            cluster_counters(&ca).await,
            cluster_counters(&cb).await
        );
        let (sa, sb) = (ca.stats().await.unwrap(), cb.stats().await.unwrap());
        assert_eq!(sa["cluster_layout_deletes"], 1, "{sa:?}");
        assert_eq!(
            sa["cluster_deleted_withdrawn"] + sb["cluster_deleted_withdrawn"],
            2,
            "{sa:?} {sb:?}"
        );
        assert!(sb["cluster_layout_deletes_applied"] >= 1, "{sb:?}");
        for c in [&ca, &cb] {
            let hit = c.lookup(&prompt(&kept, 300, 2)).await.unwrap();
            assert_eq!(hit.matched_tokens, 32, "the other layout was touched");
        }
        (layout, kept)
    });
    a.kill9();
    b.kill9();

    // Restarted (both killed), and a fresh replica: nothing of the layout comes back.
    let (a, b, c) = (start("a"), start("b"), start("c"));
    rt.block_on(async {
        let clients = [a.client(), b.client(), c.client()];
        for client in &clients {
            assert_eq!(
                client
                    .register_layout(&layout_spec("cluster", 2))
                    .await
                    .unwrap(),
                layout
            );
            assert_eq!(client.register_layout(&kept_spec).await.unwrap(), kept);
        }
        for client in &clients {
            assert!(
                eventually(Duration::from_secs(20), async || {
                    client
                        .lookup(&prompt(&kept, 300, 2))
                        .await
                        .unwrap()
                        .matched_tokens
                        == 32
                })
                .await,
                "the kept layout did not come back after the restart"
            );
        }
        // Stored again after the delete: kept, across another round of delete markers.
        clients[0]
            .store(&prompt(&layout, 100, 2), payloads(&layout, 100, 2))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        for (i, client) in clients.iter().enumerate() {
            let old = client
                .lookup(&prompt(&layout, 200, 2))
                .await
                .unwrap()
                .matched_tokens;
            assert_eq!(old, 0, "replica {i}: a deleted prompt came back");
        }
        let again = clients[0].lookup(&prompt(&layout, 100, 2)).await.unwrap();
        assert_eq!(again.matched_tokens, 32, "the old delete was applied again");
    });
    for server in [a, b, c] {
        assert!(server.stop().success());
    }
    drop(etcd);
}

/// Issue 39, item 3 (etcd's own authentication): with authentication on in etcd, a
/// replica given the user and password registers and serves the cluster; one with a wrong
/// password or none never registers (and is not ready), and `kvtier cluster status`
/// needs the credentials too.
#[test]
fn with_etcd_authentication_on_only_a_replica_with_the_credentials_joins() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdCluster::start(&dir.path().join("etcd"), 1).unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
    let rt = runtime();
    rt.block_on(async {
        let mut c = kvtier_meta::connect_once(&etcd.endpoints()).await.unwrap();
        c.user_add("root", "etcd-root-secret", None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        c.auth_enable().await.unwrap();
    });
    let user = ["--set", "cluster.etcd_user=root"];
    let start = |name: &str, password: Option<&str>| {
        let set = password.map(|p| format!("cluster.etcd_password={p}"));
        let mut args: Vec<&str> = Vec::new();
        if let Some(set) = &set {
            args.extend_from_slice(&user);
            args.extend_from_slice(&["--set", set.as_str()]);
        }
        replica(dir.path(), name, &gateway.endpoint, &etcd.url(), &args)
    };
    let good = start("a", Some("etcd-root-secret"));
    let wrong = start("b", Some("not-the-password"));
    let none = start("c", None);
    rt.block_on(async {
        let (cg, cw, cn) = (good.client(), wrong.client(), none.client());
        assert!(
            eventually(Duration::from_secs(20), async || cg
                .ready()
                .await
                .is_ok_and(|r| r.ready))
            .await,
            "the replica with the credentials did not join"
        );
        assert!(cg.stats().await.unwrap()["cluster_registrations"] >= 1);
        tokio::time::sleep(Duration::from_secs(3)).await;
        for (name, c) in [("wrong password", &cw), ("no credentials", &cn)] {
            assert_eq!(
                c.stats().await.unwrap()["cluster_registrations"],
                0,
                "{name}: registered"
            );
            let ready = c.ready().await;
            assert!(
                !ready.as_ref().is_ok_and(|r| r.ready),
                "{name}: ready: {ready:?}"
            );
        }
    });
    let status = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kvtier"))
            .args(["cluster", "status", "--json", "--cluster", &etcd.url()])
            .args(["--set", "cluster.name=test"])
            .args(extra)
            .env_remove("KVTIER_CONFIG")
            .output()
            .unwrap()
    };
    let with = status(&[
        "--set",
        "cluster.etcd_user=root",
        "--set",
        "cluster.etcd_password=etcd-root-secret",
    ]);
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&with.stdout).unwrap();
    assert_eq!(listed["replicas"].as_array().unwrap().len(), 1, "{listed}");
    assert!(
        !status(&[]).status.success(),
        "status read etcd without credentials"
    );
    for server in [good, wrong, none] {
        assert!(server.stop().success());
    }
}

#[test]
fn with_etcd_over_tls_only_a_replica_that_trusts_the_members_and_shows_a_known_certificate_joins() {
    let dir = tempfile::tempdir().unwrap();
    let tls = TlsFiles::generate(&dir.path().join("pki")).unwrap();
    let etcd = EtcdCluster::start_tls(&dir.path().join("etcd"), 1, &tls).unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
    let rt = runtime();
    let set = |key: &str, path: &std::path::Path| format!("cluster.{key}={}", path.display());
    let settings = |ca: &std::path::Path, cert: &std::path::Path, key: &std::path::Path| {
        [
            set("etcd_ca", ca),
            set("etcd_cert", cert),
            set("etcd_key", key),
        ]
    };
    let start = |name: &str, sets: &[String; 3]| {
        let mut args: Vec<&str> = Vec::new();
        for s in sets {
            args.extend_from_slice(&["--set", s.as_str()]);
        }
        replica(dir.path(), name, &gateway.endpoint, &etcd.url(), &args)
    };
    let good = settings(&tls.ca, &tls.client_cert, &tls.client_key);
    let trusted = start("a", &good);
    // A certificate of another authority: the members refuse the handshake.
    let stranger = start(
        "b",
        &settings(&tls.ca, &tls.stranger_cert, &tls.stranger_key),
    );
    // A replica that does not trust the members' authority refuses them.
    let doubter = start(
        "c",
        &settings(&tls.stranger_cert, &tls.client_cert, &tls.client_key),
    );
    rt.block_on(async {
        let (ct, cs, cd) = (trusted.client(), stranger.client(), doubter.client());
        assert!(
            eventually(Duration::from_secs(20), async || ct
                .ready()
                .await
                .is_ok_and(|r| r.ready))
            .await,
            "the replica with the authority's certificate did not join"
        );
        assert!(ct.stats().await.unwrap()["cluster_registrations"] >= 1);
        tokio::time::sleep(Duration::from_secs(3)).await;
        for (name, c) in [("foreign certificate", &cs), ("foreign authority", &cd)] {
            assert_eq!(
                c.stats().await.unwrap()["cluster_registrations"],
                0,
                "{name}: registered"
            );
        }
    });
    let status = |extra: &[String]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier"));
        cmd.args(["cluster", "status", "--json", "--cluster", &etcd.url()])
            .args(["--set", "cluster.name=test"])
            .env_remove("KVTIER_CONFIG");
        for s in extra {
            cmd.args(["--set", s.as_str()]);
        }
        cmd.output().unwrap()
    };
    let with = status(&good);
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&with.stdout).unwrap();
    assert_eq!(listed["replicas"].as_array().unwrap().len(), 1, "{listed}");
    assert!(
        !status(&[]).status.success(),
        "status read etcd without TLS"
    );
    for server in [trusted, stranger, doubter] {
        assert!(server.stop().success());
    }
}
