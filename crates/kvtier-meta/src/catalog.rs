//! [`ClusterCatalog`]: the remote tier's catalog in cluster mode.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use kvtier_core::clock::{Clock, ClockExt};
use kvtier_remote::{Catalog, ObjectInfo, ObjectName, RemoteTier};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::config::ClusterConfig;
use crate::follow::{Applied, Follower};
use crate::keys::Keys;
use crate::member::Membership;
use crate::publish::Publisher;
use crate::stats::{ClusterStats, bump};

/// The remote tier's catalog in cluster mode: objects are learned from etcd
/// advertisements (replayed at start, then watched) and this replica's writes are
/// advertised write-behind. Built with [`ClusterCatalog::new`] before the tier, started
/// with [`ClusterCatalog::start`] once the tier exists.
pub struct ClusterCatalog {
    config: ClusterConfig,
    keys: Keys,
    runtime: Handle,
    clock: Arc<dyn Clock>,
    member: Arc<Membership>,
    stats: Arc<ClusterStats>,
    queue: mpsc::Sender<(ObjectInfo, u64)>,
    /// Taken by `start`.
    pending: parking_lot::Mutex<Option<mpsc::Receiver<(ObjectInfo, u64)>>>,
    sequence: AtomicU64,
    replayed: Arc<tokio::sync::Notify>,
    slow_consumer: Duration,
}

impl std::fmt::Debug for ClusterCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCatalog")
            .field("cluster", &self.config.name)
            .field("replica", &self.config.replica)
            .finish_non_exhaustive()
    }
}

impl ClusterCatalog {
    /// A catalog for `config`, its work to run on `runtime`, reading time from `clock`.
    /// Nothing is contacted yet.
    pub fn new(
        config: ClusterConfig,
        runtime: Handle,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Self>, String> {
        config.check()?;
        let keys = Keys::new(&config.name);
        let stats = Arc::new(ClusterStats::default());
        let member = Arc::new(Membership::new(
            &config.replica,
            keys.clone(),
            config.lease_ttl,
            stats.clone(),
        ));
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        // Sequence numbers start at the wall clock's microseconds, so a restarted replica
        // (its generation bumped anyway) never repeats a name.
        let start = clock.wall_unix_ms().saturating_mul(1000);
        let slow_consumer = std::env::var("KVTIER_TEST_WATCH_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis)
            .unwrap_or_default();
        Ok(Arc::new(Self {
            config,
            keys,
            runtime,
            clock,
            member,
            stats,
            queue: tx,
            pending: parking_lot::Mutex::new(Some(rx)),
            sequence: AtomicU64::new(start),
            replayed: Arc::new(tokio::sync::Notify::new()),
            slow_consumer,
        }))
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<ClusterStats> {
        &self.stats
    }

    /// This replica's current generation (0 while not registered).
    pub fn generation(&self) -> u64 {
        self.member.identity().map_or(0, |i| i.generation)
    }

    /// Starts the work for `tier`: registration and lease renewal, the follower (replay,
    /// then watch) and the publisher. Returns at once; everything retries while etcd is
    /// unreachable, and the local tiers serve meanwhile. Calling it twice does nothing.
    pub fn start(&self, tier: &Arc<RemoteTier>) {
        let Some(rx) = self.pending.lock().take() else {
            return;
        };
        let weak: Weak<RemoteTier> = Arc::downgrade(tier);
        let endpoints = self.config.endpoints.clone();
        let member = self.member.clone();
        let clock = self.clock.clone();
        let clock2 = self.clock.clone();
        let follower = Follower {
            tier: weak.clone(),
            prefix: self.keys.objects(),
            stats: self.stats.clone(),
            wall_ms: Arc::new(move || clock2.wall_unix_ms()),
            slow_consumer: self.slow_consumer,
            applied: Applied::default(),
            replayed: self.replayed.clone(),
        };
        let publisher = Publisher {
            rx,
            tier: weak.clone(),
            member: self.member.clone(),
            stats: self.stats.clone(),
            namespace: self.config.namespace.clone(),
        };
        self.runtime.spawn(async move {
            let client = connect(&endpoints).await;
            let mut c = client.clone();
            let weak_membership = weak.clone();
            tokio::spawn(async move {
                // Register, keep the lease, register again when it is lost.
                while weak_membership.strong_count() > 0 {
                    match member.register(&mut c, clock.wall_unix_ms()).await {
                        Ok(id) => member.keep(&mut c, id).await,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot register in the cluster; retrying");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                }
            });
            tokio::spawn(publisher.run(client.clone()));
            follower.run(client).await;
        });
    }

    /// Waits until the first full read was applied, at most `limit`; true if it was.
    pub async fn replayed(&self, limit: Duration) -> bool {
        if self.stats.replay_ms.load(Ordering::Relaxed) > 0
            || self.stats.replay_records.load(Ordering::Relaxed) > 0
        {
            return true;
        }
        tokio::time::timeout(limit, self.replayed.notified())
            .await
            .is_ok()
    }
}

/// A client for `endpoints`, retrying until etcd answers (the client itself reconnects
/// afterwards).
async fn connect(endpoints: &[String]) -> Client {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
        .with_keep_alive_while_idle(true);
    loop {
        match Client::connect(endpoints, Some(options.clone())).await {
            Ok(c) => return c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach etcd; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

impl Catalog for ClusterCatalog {
    fn at_open(&self, _tier: &RemoteTier) -> Vec<ObjectName> {
        // Objects come from the replay that `start` runs in the background: a replica
        // serves its local tiers at once and the shared ones as they are read.
        Vec::new()
    }

    fn writer_tag(&self) -> Option<String> {
        let seq = self.sequence.fetch_add(1, Ordering::Relaxed);
        Some(format!(
            "{}.{}.{seq}",
            self.config.replica,
            self.generation()
        ))
    }

    fn wrote(&self, object: &ObjectInfo) {
        if self
            .queue
            .try_send((object.clone(), self.clock.wall_unix_ms()))
            .is_err()
        {
            bump(&self.stats.publish_dropped);
        }
    }

    fn deleted(&self, _object: &ObjectName) {
        // Deleting an advertised object is a two-phase protocol (withdraw with a
        // tombstone, grace, delete) run by its owner or the GC leader, not a callback; a
        // delete that reaches here is of an object never advertised.
    }
}
