//! Settings → a running engine: RAM, the SSD tier when enabled (recovering what its
//! directory holds, with its maintenance thread), the remote tier when endpoints are set;
//! and the live SSD change of a running node. Every part reads time from the node's one
//! clock, and network tiers run on its one I/O runtime ([`Components`]).

use std::sync::Arc;
use std::time::Duration;

use kvtier_core::arena::ArenaConfig;
use kvtier_core::clock::Clock;
use kvtier_core::poison::Poison;
use kvtier_core::tier::writer::WriterConfig;
use kvtier_core::tier::{RamConfig, ResidencySink, Tier};
use kvtier_core::{Engine, Error, ErrorKind, PersistConfig, Reattached, TierOpener};
use kvtier_ssd::{Durability, RecoveryReport, SsdConfig, SsdTier};
use parking_lot::{Mutex, RwLock};

use crate::components::Components;
use crate::settings::{Settings, SsdSettings};

/// What the default GC grace allows, beyond the remote read deadline, for a withdrawal to
/// reach every replica (watch latency is milliseconds; this covers a replica whose watch
/// is resuming).
const PROPAGATION_ALLOWANCE: Duration = Duration::from_secs(10);

/// The cluster catalog `settings` ask for, running on `runtime`. Settings that cannot
/// work are `Invalid`; etcd is not contacted yet (the catalog retries once started).
fn cluster_catalog(
    settings: &Settings,
    runtime: &kvtier_remote::IoRuntime,
    clock: Arc<dyn Clock>,
) -> Result<Arc<kvtier_meta::ClusterCatalog>, Error> {
    let c = &settings.cluster;
    let endpoints = kvtier_meta::parse_endpoints(&c.etcd)?;
    let replica = c
        .replica
        .clone()
        .unwrap_or_else(|| default_replica(settings.listen.port()));
    let mut config = kvtier_meta::ClusterConfig::new(endpoints, &c.name, &replica);
    config.access = c.etcd_access()?;
    config.signing_key = settings.remote.signing_key()?;
    config.lease_ttl = c.lease_ttl.0;
    config.namespace = c.namespace.clone();
    config.priority = c.priority;
    config.gc_grace = c
        .gc_grace
        .map_or(settings.remote.deadline.0 + PROPAGATION_ALLOWANCE, |g| g.0);
    config.gc_leader = c.gc_leader;
    config.gc_interval = c.gc_interval.0;
    config.orphan_after = c.orphan_after.0;
    config.budgets = c.budgets.iter().map(|(k, v)| (k.clone(), v.0)).collect();
    kvtier_meta::ClusterCatalog::new(config, runtime.handle().clone(), clock)
        .map_err(|e| Error::new(e.kind(), "cluster settings").with_source(e))
}

/// The remote tier's settings, if `settings` name endpoints; `Invalid` when its signing
/// key is not one.
pub fn remote_config(settings: &Settings) -> Result<Option<kvtier_remote::RemoteConfig>, Error> {
    let r = &settings.remote;
    if r.endpoints.is_empty() {
        return Ok(None);
    }
    let mut config = kvtier_remote::RemoteConfig::new(
        r.endpoints
            .iter()
            .map(|url| {
                let mut e = kvtier_remote::Endpoint::new(url.clone(), r.bucket.clone());
                e.region = r.region.clone();
                e.access_key = r.access_key.clone();
                e.secret_key = r.secret_key.clone();
                e
            })
            .collect(),
    );
    config.prefix = r.prefix.clone();
    config.deadline = r.deadline.0;
    config.signing_key = r.signing_key()?;
    config.codec = r.codec_config()?;
    Ok(Some(config))
}

/// The cluster's etcd endpoints and name from `settings` (for tools that talk to etcd
/// without running a replica). `Invalid` without a cluster or with endpoints that do
/// not parse.
pub fn cluster_endpoints(settings: &Settings) -> Result<(Vec<String>, String), Error> {
    if !settings.cluster.enabled() {
        return Err(Error::invalid(
            "no cluster configured: give --cluster etcd://host:port,...",
        ));
    }
    Ok((
        kvtier_meta::parse_endpoints(&settings.cluster.etcd)?,
        settings.cluster.name.clone(),
    ))
}

/// The host name (lower-cased, other characters as `-`) and the listen port.
fn default_replica(port: u16) -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "kvtier".into());
    let host: String = host
        .trim()
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(48)
        .collect();
    format!("{host}-{port}")
}

/// How long a start that fails after the engine is built waits for its queued writes.
const SHUTDOWN_ON_FAILED_START: Duration = Duration::from_secs(30);

/// A running kvtier node: the engine with its tiers, and the settings in force.
pub struct Node {
    /// The engine.
    pub engine: Arc<Engine>,
    /// Settings in force (a live SSD change updates the SSD part).
    pub settings: RwLock<Settings>,
    /// What the SSD tier's recovery found when it was last opened.
    pub recovery: Arc<Mutex<Option<RecoveryReport>>>,
    /// How the run before this one ended, read when the SSD tier was first opened: true
    /// after a clean shutdown, false after a partial flush or a crash (the store holds
    /// data but no shutdown record), `None` on a first start or without an SSD tier.
    pub previous_shutdown_clean: Option<bool>,
    /// The cluster catalog, in cluster mode.
    pub cluster: Option<Arc<kvtier_meta::ClusterCatalog>>,
    /// The KV-event publisher, when `kv_events.endpoint` is set.
    pub kv_events: Option<kvtier_events::KvEventPublisher>,
    /// The clock and runtime every part was given (a reattached SSD tier gets the same).
    components: Components,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// [`Node::open_with`] the system clock and an I/O runtime of the node's own.
    pub fn open(settings: Settings) -> Result<Arc<Self>, Error> {
        Self::open_with(settings, Components::default())
    }

    /// Builds the engine: RAM, the SSD tier when enabled (recovering what its directory
    /// holds), the remote tier when endpoints are set — all reading `components.clock`,
    /// the remote tier running on `components.runtime` (started here, once, if none is
    /// given and a remote tier needs one).
    ///
    /// Errors keep the kind of what failed underneath (see ADR 0012): settings that cannot
    /// work are `Invalid`; a port, thread or runtime that cannot be had, or a remote tier
    /// that cannot be reached, `Unavailable`; an SSD store whose recovery refuses the
    /// directory, `Corrupt` where the store says so.
    /// With `remote.require_at_start`, an endpoint that does not answer a listing within
    /// the remote deadline fails the open (`Unavailable`) before any tier is opened;
    /// without it the node starts degraded (the remote tier misses and counts its
    /// failures until the endpoint answers).
    pub fn open_with(settings: Settings, mut components: Components) -> Result<Arc<Self>, Error> {
        if let Some(config) = remote_config(&settings)?
            && settings.remote.require_at_start
        {
            kvtier_remote::check_reachable(&config, &components.runtime()?).map_err(|e| {
                Error::new(
                    e.kind(),
                    "the remote tier must answer at start (remote.require_at_start)",
                )
                .with_source(e)
            })?;
        }
        // Bound first: a taken port fails the start before any tier is opened.
        let kv_sockets = if settings.kv_events.enabled() {
            let config = settings.kv_events.config()?;
            config.check_access()?;
            Some(
                // `Unavailable` whatever the socket library says (it calls a taken port
                // and an endpoint it cannot parse alike): the address cannot be had now.
                kvtier_events::KvEventPublisher::bind(&config)
                    .map_err(|e| Error::new(ErrorKind::Unavailable, "KV events").with_source(e))?,
            )
        } else {
            None
        };
        let recovery = Arc::new(Mutex::new(None));
        let mut cluster = None;
        let mut applied_deletes = None;
        // Shared with the SSD tier's maintenance thread, which closes the engine if it
        // panics, as the engine's own threads do.
        let poison = Arc::new(Poison::new());
        let mut builder = Engine::builder()
            .poison(poison.clone())
            .ram(RamConfig {
                capacity_bytes: settings.ram.0,
            })
            .arena(ArenaConfig {
                enabled: true,
                prefault: settings.ram_prefault,
                lock: settings.ram_lock,
                shared: settings.shm.enabled,
                huge_pages: settings.shm.huge_pages,
            })
            .max_tokens(settings.max_tokens)
            .clock(components.clock.clone());
        if settings.ssd.enabled {
            let dir = settings.ssd_dir();
            let (persist, open) = ssd_opener(
                &settings.ssd,
                dir,
                components.clock.clone(),
                recovery.clone(),
                poison,
            );
            builder = builder.persistent_tier(persist, open);
        }
        if let Some(config) = remote_config(&settings)? {
            let r = &settings.remote;
            let attach = kvtier_core::engine::RemoteAttach {
                promote_to_ssd: r.promote_to_ssd,
                ..kvtier_core::engine::RemoteAttach::default()
            };
            let runtime = components.runtime()?;
            if settings.cluster.enabled() {
                let c = cluster_catalog(&settings, &runtime, components.clock.clone())?;
                cluster = Some(c.clone());
                // Other replicas' layout deletes, applied here once each.
                let applied = crate::cluster_deletes::AppliedDeletes::open(&settings.data_dir);
                c.on_layout_deleted(applied.hook());
                applied_deletes = Some(applied);
                builder = builder.remote_tier(attach, move |sink| {
                    // Objects learned from etcd: replayed and watched once the tier exists.
                    let tier = Arc::new(kvtier_remote::RemoteTier::open_on(
                        config,
                        runtime,
                        sink,
                        c.clone(),
                    )?);
                    c.start(&tier);
                    Ok(tier)
                });
            } else {
                builder = builder.remote_tier(attach, move |sink| {
                    // One replica on its own: objects learned by listing the bucket at open.
                    let catalog = Arc::new(kvtier_remote::ListCatalog);
                    Ok(Arc::new(kvtier_remote::RemoteTier::open_on(
                        config, runtime, sink, catalog,
                    )?))
                });
            }
        } else if settings.cluster.enabled() {
            return Err(Error::invalid(
                "cluster mode shares the remote tier: it needs remote endpoints (--remote-endpoints, or remote.endpoints)",
            ));
        }
        let engine = Arc::new(builder.build()?);
        if let Some(applied) = &applied_deletes {
            applied.attach(&engine);
        }
        // No shutdown record: a first start if the store held nothing, a crash otherwise.
        let existed = recovery
            .lock()
            .as_ref()
            .is_some_and(|r| r.segments > 0 || r.removed_files > 0 || r.records > 0);
        let previous_shutdown_clean = match engine.previous_shutdown_clean() {
            Some(clean) => Some(clean),
            None if existed => Some(false),
            None => None,
        };
        let kv_events = match kv_sockets {
            Some(sockets) => Some(
                kvtier_events::KvEventPublisher::start(&engine, sockets, components.clock.clone())
                    .map_err(|e| {
                        engine.shutdown(SHUTDOWN_ON_FAILED_START);
                        Error::new(e.kind(), "KV events").with_source(e)
                    })?,
            ),
            None => None,
        };
        Ok(Arc::new(Self {
            previous_shutdown_clean,
            kv_events,
            engine,
            settings: RwLock::new(settings),
            recovery,
            cluster,
            components,
        }))
    }

    /// Every counter of the node by its `/v1/stats` name: the engine's, the SSD recovery
    /// report's (`ssd_recovery_*`), the cluster plane's (`cluster_*`) and the KV-event
    /// publisher's (`kv_events_*`) where they run — the flat view of [`Node::samples`],
    /// the one list `/metrics` renders too. `kvtier serve` and the Python engine both
    /// answer with it.
    pub fn counters(&self) -> std::collections::BTreeMap<String, u64> {
        self.samples().flat()
    }

    /// The clock every part of this node reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.components.clock
    }

    /// Quiesce, drain, close and reopen the SSD tier with `ssd` (or leave it detached
    /// when `ssd.enabled` is false). Blocking: call from a blocking thread. The error is
    /// the engine's, with its kind (a store that refuses to open as damaged is `Corrupt`,
    /// a directory that cannot be used `Unavailable`).
    pub fn reattach_ssd(&self, ssd: SsdSettings) -> Result<Reattached, Error> {
        let (drain, dir, old, old_dir) = {
            let s = self.settings.read();
            (
                s.ssd.drain_timeout.0,
                ssd.dir_under(&s.data_dir),
                s.ssd.clone(),
                s.ssd_dir(),
            )
        };
        let clock = &self.components.clock;
        let poison = self.engine.poison();
        let new = ssd.enabled.then(|| {
            ssd_opener(
                &ssd,
                dir,
                clock.clone(),
                self.recovery.clone(),
                poison.clone(),
            )
        });
        if new.is_none() {
            *self.recovery.lock() = None;
        }
        // If the new tier does not open, the old one (same settings, same directory) is
        // opened again in the same quiesce: a failed change never leaves the server
        // silently without its SSD.
        let restore = old.enabled.then(|| {
            ssd_opener(
                &old,
                old_dir,
                clock.clone(),
                self.recovery.clone(),
                poison.clone(),
            )
        });
        let result = self
            .engine
            .reattach_persistent_or_restore(new, restore, drain);
        // Record what is in force: the new settings if attached; the old ones if they were
        // restored; detached otherwise.
        let mut s = self.settings.write();
        match &result {
            Ok(_) => s.ssd = ssd,
            Err(_) if self.engine.persistent().is_some() => {}
            Err(_) => s.ssd.enabled = false,
        }
        result
    }
}

/// The engine's view of the SSD settings, and the function that opens the tier.
fn ssd_opener(
    ssd: &SsdSettings,
    dir: std::path::PathBuf,
    clock: Arc<dyn Clock>,
    recovery: Arc<Mutex<Option<RecoveryReport>>>,
    poison: Arc<Poison>,
) -> (PersistConfig, TierOpener) {
    let persist = PersistConfig {
        ack: ssd.durability,
        mode: ssd.mode,
        promote_on_hit: ssd.promote_on_hit,
        prefetch: ssd.prefetch,
        writer: WriterConfig {
            queue_len: ssd.queue_len.max(1),
            wait: ssd.writer_wait.0,
            overflow: ssd.overflow,
        },
    };
    let mut config = SsdConfig::new(dir);
    config.capacity_bytes = ssd.capacity.0;
    config.namespace_bytes = ssd.namespace_budget.map(|b| b.0);
    config.ttl = ssd.ttl.0;
    config.min_free_bytes = ssd.min_free.0;
    // Checked when the settings are (`Settings::validate`); a bad value here still fails
    // the open with its message.
    let codec = ssd.codec_config();
    config.store.segment_bytes = ssd.segment_size.0;
    let maintenance_every = ssd.maintenance_every.0;
    // Syncs are the engine's business (a `synced` store waits for a group commit): the
    // store itself never syncs per write.
    config.store.durability = Durability::Written {
        retries: ssd.retries,
    };
    let open: TierOpener = Box::new(move |sink: Arc<dyn ResidencySink>| {
        let mut config = config;
        config.codec = codec?;
        let tier = Arc::new(SsdTier::open(config, clock, sink)?);
        *recovery.lock() = Some(tier.recovery_report().clone());
        let poison = poison.clone();
        let closed = move |reason: String| poison.poison(reason);
        if let Err(e) = SsdTier::spawn_maintenance_with(&tier, maintenance_every, closed) {
            tracing::warn!(error = %e, "cannot start the SSD maintenance thread; budgets are enforced on writes only");
        }
        Ok(tier as Arc<dyn Tier>)
    });
    (persist, open)
}
