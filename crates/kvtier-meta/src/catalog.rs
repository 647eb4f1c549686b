//! [`ClusterCatalog`]: the remote tier's catalog in cluster mode.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use kvtier_core::clock::{Clock, ClockExt};
use kvtier_core::layout::LayoutDigest;
use kvtier_remote::{Catalog, ObjectInfo, ObjectName, RemoteTier, StateName};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::config::{ClusterConfig, EtcdAccess};
use crate::deletes::{self, OnLayoutDeleted};
use crate::follow::{Applied, Follower};
use crate::gc::{self, Authority, Reason, Withdrawal};
use crate::keys::Keys;
use crate::leader::Leader;
use crate::member::Membership;
use crate::publish::{Publisher, Wrote};
use crate::record::{LayoutDeleted, Tombstone};
use crate::signed::RecordSigning;
use crate::states::{StatePublisher, Written};
use crate::stats::{ClusterStats, bump};
use crate::view::View;

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
    queue: mpsc::Sender<Wrote>,
    /// Taken by `start`.
    pending: parking_lot::Mutex<Option<mpsc::Receiver<Wrote>>>,
    /// State objects written, to advertise.
    state_queue: mpsc::Sender<Written>,
    /// Taken by `start`.
    state_pending: parking_lot::Mutex<Option<mpsc::Receiver<Written>>>,
    sequence: AtomicU64,
    replayed: Arc<tokio::sync::Notify>,
    ready: Arc<std::sync::atomic::AtomicBool>,
    /// True once the state follower's first full read was applied.
    states_ready: Arc<std::sync::atomic::AtomicBool>,
    slow_consumer: Duration,
    /// A test hook: while true, the follower applies no watch response (a stalled
    /// consumer: etcd's buffers for it fill and etcd parks its watcher).
    hold: tokio::sync::watch::Sender<bool>,
    view: Arc<View>,
    /// The etcd client, once connected.
    client: Arc<tokio::sync::OnceCell<Client>>,
    /// The background tasks, aborted when the catalog is dropped or stopped.
    tasks: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The tier, once started (withdrawn objects are deleted through it).
    tier: parking_lot::Mutex<Weak<RemoteTier>>,
    /// What this replica does with a layout's delete marker (given by the assembly).
    on_deleted: parking_lot::Mutex<Option<OnLayoutDeleted>>,
}

impl Drop for ClusterCatalog {
    fn drop(&mut self) {
        self.stop();
    }
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
    /// Nothing is contacted yet, so an unreachable etcd is no error here (the catalog
    /// retries once started); settings that cannot work are `Invalid`.
    pub fn new(
        config: ClusterConfig,
        runtime: Handle,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Self>, kvtier_core::Error> {
        config.check()?;
        let stats = Arc::new(ClusterStats::default());
        let signing = RecordSigning::new(config.signing_key.clone(), stats.records_forged.clone());
        let keys = Keys::signed(&config.name, signing);
        let member = Arc::new(Membership::new(
            &config.replica,
            keys.clone(),
            config.lease_ttl,
            stats.clone(),
        ));
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let (state_tx, state_rx) = mpsc::channel(config.queue.max(1));
        // Sequence numbers start at the wall clock's microseconds, so a restarted replica
        // (its generation bumped anyway) never repeats a name.
        let start = clock.wall_unix_ms().saturating_mul(1000);
        let slow_consumer = std::env::var("KVTIER_TEST_WATCH_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis)
            .unwrap_or_default()
            .max(config.watch_delay);
        Ok(Arc::new(Self {
            config,
            keys,
            runtime,
            clock,
            member,
            stats,
            queue: tx,
            pending: parking_lot::Mutex::new(Some(rx)),
            state_queue: state_tx,
            state_pending: parking_lot::Mutex::new(Some(state_rx)),
            sequence: AtomicU64::new(start),
            replayed: Arc::new(tokio::sync::Notify::new()),
            ready: Arc::default(),
            states_ready: Arc::default(),
            slow_consumer,
            hold: tokio::sync::watch::Sender::new(false),
            view: Arc::new(View::default()),
            client: Arc::new(tokio::sync::OnceCell::new()),
            tasks: parking_lot::Mutex::new(Vec::new()),
            tier: parking_lot::Mutex::new(Weak::new()),
            on_deleted: parking_lot::Mutex::new(None),
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

    /// Whether this replica follows the cluster now: registered (its lease alive, so it
    /// may publish) and both followers past their first full read (so its index holds
    /// what the cluster advertised). What `kvtier serve`'s `/readyz` reports for the
    /// cluster.
    pub fn following(&self) -> bool {
        self.member.identity().is_some()
            && self.ready.load(Ordering::SeqCst)
            && self.states_ready.load(Ordering::SeqCst)
    }

    /// The advertisements this replica knows (the GC leader's view).
    pub fn view(&self) -> &Arc<View> {
        &self.view
    }

    /// A test hook: `true` stalls the watch consumer (no response is applied, so etcd's
    /// buffers fill and it parks this replica's watcher as slow) until `false`.
    #[doc(hidden)]
    pub fn hold_watch(&self, held: bool) {
        self.hold.send_replace(held);
    }

    /// The settings.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// Gives what this replica does with a layout's delete marker — drop the layout from
    /// its own tiers, once per marker (`crate::deletes`). Set before [`Self::start`];
    /// without it markers are not followed.
    pub fn on_layout_deleted(&self, hook: OnLayoutDeleted) {
        *self.on_deleted.lock() = Some(hook);
    }

    /// Records that `layout` is deleted everywhere (its delete marker): the GC leader
    /// withdraws its objects, every replica drops its copies. `Unavailable` when etcd
    /// did not take it within 5 s.
    pub fn delete_layout_everywhere(&self, layout: LayoutDigest) -> kvtier_core::Result<()> {
        let unavailable = |why: String| {
            kvtier_core::Error::new(
                kvtier_core::ErrorKind::Unavailable,
                format!("cannot record the layout's delete in the cluster: {why}"),
            )
        };
        let marker = LayoutDeleted {
            v: crate::record::RECORD_VERSION,
            by: self.config.replica.clone(),
            at_ms: self.clock.wall_unix_ms(),
        };
        let key = self.keys.deleted(&layout);
        let value = self.keys.seal(&key, &marker);
        let client = self.connected();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.runtime.spawn(async move {
            let put = async move { client.await.put(key, value, None).await };
            let _ = tx.send(tokio::time::timeout(Duration::from_secs(5), put).await);
        });
        match rx.recv_timeout(Duration::from_secs(6)) {
            Ok(Ok(Ok(_))) => {
                bump(&self.stats.layout_deletes);
                Ok(())
            }
            Ok(Ok(Err(e))) => Err(unavailable(e.to_string())),
            Ok(Err(_)) | Err(_) => Err(unavailable("etcd did not answer within 5 s".into())),
        }
    }

    /// Starts the work for `tier`: registration and lease renewal, the follower (replay,
    /// then watch), the publisher and, if this replica stands for it, the GC leader's
    /// campaign. Returns at once; everything retries while etcd is unreachable, and the
    /// local tiers serve meanwhile. Calling it twice does nothing.
    pub fn start(&self, tier: &Arc<RemoteTier>) {
        let (Some(rx), Some(state_rx)) =
            (self.pending.lock().take(), self.state_pending.lock().take())
        else {
            return;
        };
        let weak: Weak<RemoteTier> = Arc::downgrade(tier);
        let weak_tier = weak.clone();
        *self.tier.lock() = weak.clone();
        let clock = self.clock.clone();
        let wall_ms: Arc<dyn Fn() -> u64 + Send + Sync> = Arc::new(move || clock.wall_unix_ms());
        let (reindex_tx, reindex_rx) = mpsc::unbounded_channel();
        let follower = Follower {
            reindex: reindex_rx,
            tier: weak.clone(),
            prefix: self.keys.objects(),
            keys: self.keys.clone(),
            stats: self.stats.clone(),
            wall_ms: wall_ms.clone(),
            slow_consumer: self.slow_consumer,
            hold: self.hold.subscribe(),
            applied: Applied::default(),
            replayed: self.replayed.clone(),
            ready: self.ready.clone(),
            view: self.view.clone(),
            states: false,
        };
        // State advertisements have a follower of their own (another prefix, another
        // watch) writing into the same view, so the GC weighs runs and states together;
        // its replay is not part of `replayed`, and nothing re-indexes states.
        let (_, no_reindex) = mpsc::unbounded_channel();
        let state_follower = Follower {
            reindex: no_reindex,
            tier: weak.clone(),
            prefix: self.keys.states(),
            keys: self.keys.clone(),
            stats: self.stats.clone(),
            wall_ms: wall_ms.clone(),
            slow_consumer: self.slow_consumer,
            hold: self.hold.subscribe(),
            applied: Applied::default(),
            replayed: Arc::new(tokio::sync::Notify::new()),
            ready: self.states_ready.clone(),
            view: self.view.clone(),
            states: true,
        };
        let state_publisher = StatePublisher {
            tier: weak.clone(),
            member: self.member.clone(),
            stats: self.stats.clone(),
            namespace: self.config.namespace.clone(),
            priority: self.config.priority,
        };
        let publisher = Publisher {
            tier: weak.clone(),
            member: self.member.clone(),
            stats: self.stats.clone(),
            namespace: self.config.namespace.clone(),
            priority: self.config.priority,
            reindex: reindex_tx,
        };
        let leader = self.config.gc_leader.then(|| Leader {
            tier: weak.clone(),
            member: self.member.clone(),
            view: self.view.clone(),
            stats: self.stats.clone(),
            config: self.config.clone(),
            wall_ms: wall_ms.clone(),
            ready: [self.ready.clone(), self.states_ready.clone()],
        });
        let mut tasks = self.tasks.lock();
        let (member, clock) = (self.member.clone(), self.clock.clone());
        let client = self.connected();
        tasks.push(self.runtime.spawn(async move {
            // Register, keep the lease, register again when it is lost.
            let mut c = client.await;
            while weak.strong_count() > 0 {
                match member.register(&mut c, clock.wall_unix_ms()).await {
                    Ok(id) => member.keep(&mut c, id).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot register in the cluster; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        }));
        let client = self.connected();
        tasks.push(
            self.runtime
                .spawn(async move { publisher.run(rx, client.await).await }),
        );
        let client = self.connected();
        tasks.push(
            self.runtime
                .spawn(async move { follower.run(client.await).await }),
        );
        let client = self.connected();
        tasks.push(
            self.runtime
                .spawn(async move { state_follower.run(client.await).await }),
        );
        let client = self.connected();
        tasks.push(
            self.runtime
                .spawn(async move { state_publisher.run(state_rx, client.await).await }),
        );
        if let Some(leader) = leader {
            let client = self.connected();
            tasks.push(
                self.runtime
                    .spawn(async move { leader.run(client.await).await }),
            );
        }
        if let Some(hook) = self.on_deleted.lock().clone() {
            let (client, keys, tier, stats) = (
                self.connected(),
                self.keys.clone(),
                weak_tier.clone(),
                self.stats.clone(),
            );
            tasks.push(self.runtime.spawn(async move {
                deletes::follow(client.await, keys, tier, hook, stats).await;
            }));
        }
    }

    /// Stops every background task (the member lease then expires on its own, as if the
    /// replica had died; its objects stay advertised).
    pub fn stop(&self) {
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
    }

    /// The etcd client, once some task connected it.
    fn connected(&self) -> impl std::future::Future<Output = Client> + Send + 'static {
        let (cell, endpoints, access) = (
            self.client.clone(),
            self.config.endpoints.clone(),
            self.config.access.clone(),
        );
        async move {
            cell.get_or_init(|| connect(&endpoints, &access))
                .await
                .clone()
        }
    }

    /// Deletes this replica's object `manifest` from the shared tier, in two phases: the
    /// advertisement is withdrawn now (every replica stops starting reads of it) and the
    /// object deleted after the grace window. Only the owner may: another replica's
    /// object answers [`Withdrawal::NotOwner`] and nothing changes.
    pub async fn withdraw(&self, manifest: &str) -> Result<Withdrawal, String> {
        let key = self
            .keys
            .object_of_manifest(manifest)
            .ok_or_else(|| format!("`{manifest}` is not a run object's manifest name"))?;
        let mut client = tokio::time::timeout(Duration::from_secs(5), self.connected())
            .await
            .map_err(|_| "etcd is not reachable".to_string())?;
        let id = self
            .member
            .identity()
            .ok_or("this replica is not registered in the cluster (etcd unreachable?)")?;
        let Some(seen) = gc::read_advert(&mut client, &self.keys, &key)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(Withdrawal::Unknown);
        };
        if seen.advert.object() != manifest {
            return Ok(Withdrawal::Unknown);
        }
        let now = self.clock.wall_unix_ms();
        let outcome = gc::withdraw(
            &mut client,
            &self.member,
            &Authority::Owner(id),
            &key,
            &seen,
            Reason::Owner,
            now,
        )
        .await
        .map_err(|e| e.to_string())?;
        match &outcome {
            Withdrawal::Withdrawn(t) => {
                bump(&self.stats.gc_tombstones);
                self.finish_later(key, t);
            }
            Withdrawal::NotOwner(owner) => {
                bump(&self.stats.deletes_refused);
                tracing::warn!(object = manifest, owner = %owner, "refused to delete another replica's object");
            }
            Withdrawal::Fenced => {
                bump(&self.stats.fenced);
                self.member.lost(id);
            }
            Withdrawal::Unknown | Withdrawal::Changed => {}
        }
        Ok(outcome)
    }

    /// After the grace window, deletes the object `ours` withdrew under advertisement
    /// `key` (the GC leader does it otherwise).
    fn finish_later(&self, key: String, ours: &Tombstone) {
        let Some(tombstone_key) = self.keys.tombstone_of(&key) else {
            return;
        };
        let (grace, stats, tier) = (
            self.config.gc_grace,
            self.stats.clone(),
            self.tier.lock().clone(),
        );
        let client = self.connected();
        let keys = self.keys.clone();
        let (object, at_ms) = (ours.of.object().to_owned(), ours.at_ms);
        let mut tasks = self.tasks.lock();
        tasks.retain(|t| !t.is_finished());
        tasks.push(self.runtime.spawn(async move {
            tokio::time::sleep(grace).await;
            let mut client = client.await;
            let Some(tier) = tier.upgrade() else { return };
            // Only this withdrawal's tombstone: the run may have been advertised and
            // withdrawn again since, under a tombstone whose grace is its own.
            if let Ok(Some((t, revision))) = gc::read_tombstone(&mut client, &keys, &tombstone_key).await
                && t.of.object() == object
                && t.at_ms == at_ms
                && let Err(why) =
                    gc::finish(&mut client, &tier, &stats, &tombstone_key, &t, revision).await
            {
                tracing::warn!(object = %t.of.object(), reason = %why, "cannot delete a withdrawn object yet; the GC leader retries");
            }
        }));
    }

    /// Waits until the first full read was applied, at most `limit`; true if it was.
    pub async fn replayed(&self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.replayed.notified();
                if self.ready.load(Ordering::SeqCst) {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }
}

/// A client for `endpoints`, retrying until etcd answers (the client itself reconnects
/// afterwards).
async fn connect(endpoints: &[String], access: &EtcdAccess) -> Client {
    loop {
        match connect_once_as(endpoints, access).await {
            Ok(c) => return c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach etcd; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// One attempt to connect to `endpoints`, with the timeouts every cluster call uses (a
/// request answers within 5 s or fails; a dead connection is noticed within 4 s).
pub async fn connect_once(endpoints: &[String]) -> Result<Client, etcd_client::Error> {
    connect_once_as(endpoints, &EtcdAccess::default()).await
}

/// [`connect_once`] over TLS and as a user, as `access` says.
pub async fn connect_once_as(
    endpoints: &[String],
    access: &EtcdAccess,
) -> Result<Client, etcd_client::Error> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
        .with_keep_alive_while_idle(true);
    if let Some(auth) = &access.auth {
        // etcd's tokens expire (5 minutes by default): a replica lives longer.
        options = options
            .with_user(auth.user.clone(), auth.password.clone())
            .with_auto_token_refresh(true);
    }
    let mut endpoints = endpoints.to_vec();
    if let Some(tls) = &access.tls {
        let mut config = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&tls.ca));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(etcd_client::Identity::from_pem(cert, key));
        }
        options = options.with_tls(config);
        // The endpoints are parsed as `http://host:port`; TLS is the same address.
        for e in &mut endpoints {
            if let Some(rest) = e.strip_prefix("http://") {
                *e = format!("https://{rest}");
            }
        }
    }
    Client::connect(endpoints, Some(options)).await
}

impl Catalog for ClusterCatalog {
    fn delete_layout(&self, layout: LayoutDigest) -> kvtier_core::Result<()> {
        self.delete_layout_everywhere(layout)
    }

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
            .try_send((Box::new(object.clone()), self.clock.wall_unix_ms()))
            .is_err()
        {
            bump(&self.stats.publish_dropped);
        }
    }

    fn wrote_state(&self, state: &StateName, bytes: u64) {
        if self
            .state_queue
            .try_send((state.clone(), bytes, self.clock.wall_unix_ms()))
            .is_err()
        {
            // Not advertised: other replicas find it at their next start (state
            // objects are listed at every open).
            bump(&self.stats.publish_dropped);
        }
    }

    fn deletes_directly(&self) -> bool {
        // Advertised objects are deleted by their owner or the GC leader, in two phases.
        false
    }

    fn deleted(&self, _object: &ObjectName) {
        // Deleting an advertised object is a two-phase protocol (withdraw with a
        // tombstone, grace, delete) run by its owner or the GC leader, not a callback; a
        // delete that reaches here is of an object never advertised.
    }
}
