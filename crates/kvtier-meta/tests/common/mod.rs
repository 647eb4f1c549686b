//! Replicas in one test process: each a real remote tier with a real cluster catalog,
//! against real etcd members (child processes) and `kvtier gateway` serving S3 on a
//! loopback port. "Killing" a replica stops its catalog's tasks without revoking
//! anything, as a crash would: its member lease expires on its own.

#![allow(dead_code, reason = "each test file uses part of this")]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_core::clock::SystemClock;
use kvtier_core::tier::NoSink;
use kvtier_gateway::{Auth, GatewayConfig, RunningGateway};
use kvtier_meta::{ClusterCatalog, ClusterConfig};
use kvtier_remote::{Endpoint, RemoteConfig, RemoteTier};

pub const ACCESS: &str = "kvtier-test";
pub const SECRET: &str = "kvtier-test-secret";
pub const BUCKET: &str = "shared";
pub const CLUSTER: &str = "t";

/// `kvtier gateway` on a fresh directory, with SigV4 and [`BUCKET`].
pub fn gateway(dir: &std::path::Path) -> RunningGateway {
    let mut config = GatewayConfig::new(dir.to_path_buf());
    config.listen = "127.0.0.1:0".parse().expect("addr");
    config.auth = Auth::SigV4 {
        access_key: ACCESS.into(),
        secret_key: SECRET.into(),
    };
    config.durability = kvtier_ssd::Durability::Written { retries: 0 };
    config.create_buckets = vec![BUCKET.into()];
    RunningGateway::start(config).expect("start gateway")
}

/// The remote tier's settings for the bucket at `url`.
pub fn remote(url: &str, deadline: Duration) -> RemoteConfig {
    let mut c = RemoteConfig::new(vec![
        Endpoint::new(url.to_owned(), BUCKET).with_credentials(ACCESS, SECRET),
    ]);
    c.prefix = "kv".into();
    c.deadline = deadline;
    c
}

/// What a test's replicas share: etcd members, `kvtier gateway` and the runtime their
/// catalogs run on, all stopped when dropped (after the replicas, declared later).
pub struct World {
    pub etcd: kvtier_testkit::EtcdCluster,
    pub gateway: RunningGateway,
    /// The gateway's `http://ADDR`.
    pub url: String,
    pub rt: tokio::runtime::Runtime,
    /// Dropped last: the members' and the gateway's data.
    pub dir: tempfile::TempDir,
}

impl World {
    /// `members` etcd members, a gateway with [`BUCKET`], a runtime.
    pub fn start(members: usize) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let etcd =
            kvtier_testkit::EtcdCluster::start(&dir.path().join("etcd"), members).expect("etcd");
        let gateway = gateway(&dir.path().join("s3"));
        let url = format!("http://{}", gateway.addr);
        Self {
            etcd,
            gateway,
            url,
            rt: runtime(),
            dir,
        }
    }

    /// A client of the etcd members.
    pub fn client(&self) -> kvtier_meta::etcd_client::Client {
        self.rt
            .block_on(kvtier_meta::connect_once(&self.etcd.endpoints()))
            .expect("etcd client")
    }

    /// The cluster's status now.
    pub fn status(&self) -> kvtier_meta::status::Status {
        let mut c = self.client();
        self.rt
            .block_on(kvtier_meta::status::status(&mut c, CLUSTER))
            .expect("status")
    }
}

/// One replica: its tier and its catalog.
pub struct Replica {
    pub tier: Arc<RemoteTier>,
    pub catalog: Arc<ClusterCatalog>,
}

impl Replica {
    /// Replica `name` of cluster [`CLUSTER`] on `etcd`, storing through `remote`; `tweak`
    /// adjusts its cluster settings (by default it does not stand for GC leader).
    pub fn start(
        rt: &tokio::runtime::Runtime,
        etcd: Vec<String>,
        name: &str,
        remote: RemoteConfig,
        tweak: impl FnOnce(&mut ClusterConfig),
    ) -> Self {
        let mut config = ClusterConfig::new(etcd, CLUSTER, name);
        config.lease_ttl = Duration::from_secs(2);
        config.leader_ttl = Duration::from_secs(2);
        config.gc_interval = Duration::from_millis(200);
        config.gc_leader = false;
        tweak(&mut config);
        let catalog =
            ClusterCatalog::new(config, rt.handle().clone(), Arc::new(SystemClock::new()))
                .expect("catalog");
        let tier = Arc::new(
            RemoteTier::open_with_catalog(remote, Arc::new(NoSink), catalog.clone()).expect("tier"),
        );
        catalog.start(&tier);
        Self { tier, catalog }
    }

    /// Waits until registered and replayed.
    pub fn ready(&self, rt: &tokio::runtime::Runtime) {
        assert!(rt.block_on(self.catalog.replayed(Duration::from_secs(20))));
        assert!(wait_until(Duration::from_secs(20), || self
            .catalog
            .generation()
            > 0));
    }

    /// A counter of this replica's cluster stats.
    pub fn stat(&self, name: &str) -> u64 {
        self.catalog
            .stats()
            .snapshot()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no counter {name}"))
    }

    /// Stops every background task without a word to etcd, as a crash would.
    pub fn crash(self) {
        self.catalog.stop();
    }
}

/// `len` bytes of recurrent state, different for each seed.
pub fn state_bytes(seed: u8, len: usize) -> bytes::Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8 ^ seed)
        .collect::<Vec<u8>>()
        .into()
}

/// Waits until `f` holds or `timeout` passes; whether it held.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    loop {
        if f() {
            return true;
        }
        if t.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A multi-threaded runtime for the catalogs' tasks.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The manifest names of the runs `replica` knows advertised, with their owners.
pub fn adverts(replica: &Replica) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = replica
        .catalog
        .view()
        .all()
        .into_iter()
        .filter_map(|(_, s)| {
            let run = s.advert.run()?;
            Some((run.object.clone(), run.owner.clone()))
        })
        .collect();
    out.sort();
    out
}

/// Whether `object` is still in the bucket (its manifest reads and checks out).
pub fn in_bucket(tier: &RemoteTier, object: &str) -> bool {
    tier.read_described(&kvtier_remote::ObjectName {
        endpoint: 0,
        manifest: object.to_owned(),
    })
    .is_ok()
}

/// A TCP proxy to `target` that passes responses on at `bytes_per_sec` (requests pass
/// freely): a slow network between one replica and the store.
pub struct Throttle {
    pub url: String,
}

impl Throttle {
    pub fn start(target: &str, bytes_per_sec: usize) -> Self {
        let target = target.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(&target) else {
                    continue;
                };
                let (mut c_read, mut u_write) = (
                    client.try_clone().expect("clone"),
                    upstream.try_clone().expect("clone"),
                );
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_read, &mut u_write);
                    let _ = u_write.shutdown(std::net::Shutdown::Write);
                });
                let (mut u_read, mut c_write) = (upstream, client);
                std::thread::spawn(move || {
                    // 1 KiB at a time, paced.
                    let mut buf = [0u8; 1024];
                    let pause = Duration::from_secs_f64(1024.0 / bytes_per_sec as f64);
                    loop {
                        let n = match u_read.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if c_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        std::thread::sleep(pause);
                    }
                    let _ = c_write.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Self { url }
    }
}

/// Records no replica can use, written under the advertisement prefix by [`flood`].
pub struct Flood {
    /// How many.
    pub records: u64,
    prefix: String,
    endpoints: Vec<String>,
}

impl Flood {
    /// Deletes them.
    pub async fn delete(&self) {
        let mut c = kvtier_meta::connect_once(&self.endpoints).await.unwrap();
        c.delete(
            self.prefix.as_str(),
            Some(kvtier_meta::etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    }
}

/// Writes `count` records of `value` bytes under `objects/NAME/` (8 writers, each record
/// its own revision): at 64 KiB as large as the advertisement of a run of about 1,000
/// blocks, but not advertisements, so every replica refuses them (`records_refused`).
pub fn flood(
    rt: &tokio::runtime::Runtime,
    endpoints: &[String],
    name: &str,
    count: usize,
    value: usize,
) -> Flood {
    let prefix = format!("{}{name}/", kvtier_meta::Keys::new(CLUSTER).objects());
    rt.block_on(async {
        let client = kvtier_meta::connect_once(endpoints).await.unwrap();
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let (mut c, prefix) = (client.clone(), prefix.clone());
                tokio::spawn(async move {
                    for i in (w..count).step_by(8) {
                        c.put(format!("{prefix}{i}"), vec![b'x'; value], None)
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.await.unwrap();
        }
    });
    Flood {
        records: count as u64,
        prefix,
        endpoints: endpoints.to_vec(),
    }
}
