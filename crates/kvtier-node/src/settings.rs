//! `kvtier serve` settings: defaults, then a TOML file, then environment variables and
//! flags (a flag and its variable are one clap argument; the flag wins).
//!
//! Every setting has a flag; `kvtier serve --help` lists them with their defaults and
//! `--print-config` prints the effective settings as TOML (tokens redacted), which reads
//! back as a configuration file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kvtier_core::engine::RemoteAttach;
use kvtier_core::tier::writer::Overflow;
use kvtier_core::{Ack, Error, ErrorKind, PersistConfig, PersistMode};
use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, HumanDuration};

// The tier settings use the engine's own types (`PersistMode`, `Ack`, `Overflow`): their
// names in files and flags come from the engine (`FromStr`, `Display`, serde), so there is
// one definition of each.

/// The SSD tier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SsdSettings {
    /// Attach the SSD tier at start.
    pub enabled: bool,
    /// Store directory (default: `ssd` under the data directory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// Payload bytes the store may hold.
    pub capacity: ByteSize,
    /// Payload bytes one layout may hold (default: only the store's capacity).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace_budget: Option<ByteSize>,
    /// Blocks unread for this long are dropped.
    pub ttl: HumanDuration,
    /// When blocks reach the SSD: `write_through` (every new block) or `evict_only` (what
    /// RAM evicts).
    pub mode: PersistMode,
    /// What a store's answer promises: `queued`, `written` (survives a kill) or `synced`
    /// (survives a power loss).
    /// (`best_effort`, `persistent` and `fsync`, the names before issue 12, are read as
    /// `queued`, `written` and `synced`).
    pub durability: Ack,
    /// Extra attempts when an SSD write fails (not when the disk is full).
    pub retries: u32,
    /// Stop admitting while the filesystem has less free space (0 = off).
    pub min_free: ByteSize,
    /// Promote SSD hits into RAM.
    pub promote_on_hit: bool,
    /// Read SSD-only blocks right after a lookup finds them.
    pub prefetch: bool,
    /// Blocks the write queue holds.
    pub queue_len: usize,
    /// How long a store may wait for room in the queue.
    pub writer_wait: HumanDuration,
    /// What a full queue does after the wait: `sync_write` (write on the caller's thread)
    /// or `drop` (counted).
    pub overflow: Overflow,
    /// How long shutdown and reattach wait for the queue to drain.
    pub drain_timeout: HumanDuration,
    /// Size at which a segment file is sealed and the next one started.
    pub segment_size: ByteSize,
    /// How often expiry, budgets and compaction run.
    pub maintenance_every: HumanDuration,
}

impl SsdSettings {
    /// The store directory: `dir`, or `ssd` under the data directory.
    pub fn dir_under(&self, data_dir: &std::path::Path) -> PathBuf {
        self.dir.clone().unwrap_or_else(|| data_dir.join("ssd"))
    }
}

impl Default for SsdSettings {
    /// The engine's defaults for how it uses the tier (one place: `PersistConfig`), and
    /// the server's for the store itself.
    fn default() -> Self {
        let engine = PersistConfig::default();
        Self {
            enabled: true,
            dir: None,
            capacity: ByteSize(64 << 30),
            namespace_budget: None,
            ttl: HumanDuration(Duration::from_secs(7 * 86_400)),
            mode: engine.mode,
            durability: engine.ack,
            retries: 3,
            min_free: ByteSize(1 << 30),
            promote_on_hit: engine.promote_on_hit,
            prefetch: engine.prefetch,
            queue_len: engine.writer.queue_len,
            writer_wait: HumanDuration(engine.writer.wait),
            overflow: engine.writer.overflow,
            drain_timeout: HumanDuration(Duration::from_secs(30)),
            segment_size: ByteSize(256 << 20),
            maintenance_every: HumanDuration(Duration::from_secs(10)),
        }
    }
}

/// The shared remote tier (S3-compatible object storage; off unless an endpoint is set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteSettings {
    /// Endpoint URLs (`http://host:port`, `https://s3.REGION.amazonaws.com`); several
    /// spread objects by rendezvous hashing. Empty: no remote tier.
    pub endpoints: Vec<String>,
    /// The bucket on every endpoint.
    pub bucket: String,
    /// Name prefix of kvtier's objects.
    pub prefix: String,
    /// Region for SigV4.
    pub region: String,
    /// Access key (default: `AWS_ACCESS_KEY_ID` from the environment).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_key: Option<String>,
    /// Secret key (default: `AWS_SECRET_ACCESS_KEY` from the environment).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_key: Option<String>,
    /// Longest a remote call may take, retries included; past it, a miss.
    pub deadline: HumanDuration,
    /// Also queue remote hits for the SSD tier.
    pub promote_to_ssd: bool,
}

impl Default for RemoteSettings {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            bucket: "kvtier".into(),
            prefix: "kv".into(),
            region: "us-east-1".into(),
            access_key: None,
            secret_key: None,
            deadline: HumanDuration(Duration::from_secs(2)),
            promote_to_ssd: RemoteAttach::default().promote_to_ssd,
        }
    }
}

/// Cluster mode: the remote tier's objects shared with every replica through etcd
/// (docs/cluster.md). Off unless `etcd` is set; needs a remote tier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSettings {
    /// etcd endpoints: `etcd://host:port,host:port`. Empty: one replica on its own.
    pub etcd: String,
    /// The cluster's name (every key lives under `kvtier/<name>/`).
    pub name: String,
    /// This replica's id, stable across its restarts (ownership of objects follows it);
    /// default: the host name and the listen port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// How long after its last lease renewal a silent replica counts as gone.
    pub lease_ttl: HumanDuration,
    /// Namespace of this replica's objects (budgets are per namespace).
    pub namespace: String,
    /// Priority of this replica's objects: `normal`, or `pinned` (no budget deletes them;
    /// for a replica that stores shared prefixes such as system prompts).
    pub priority: kvtier_meta::Priority,
    /// How long a withdrawn object stays before it is deleted; default: 10 s plus the
    /// remote read deadline (longer than a withdrawal takes to reach every replica plus
    /// the longest read that may have started before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gc_grace: Option<HumanDuration>,
    /// Whether this replica stands for GC leader.
    pub gc_leader: bool,
    /// How often the GC leader sweeps.
    pub gc_interval: HumanDuration,
    /// How long an owner must have been gone before its objects are reclaimed.
    pub orphan_after: HumanDuration,
    /// Byte budget of the shared tier per namespace (`[cluster.budgets]`, e.g.
    /// `default = "500GB"`); a namespace without one is unbounded.
    pub budgets: BTreeMap<String, ByteSize>,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            etcd: String::new(),
            name: "default".into(),
            replica: None,
            lease_ttl: HumanDuration(Duration::from_secs(10)),
            namespace: "default".into(),
            priority: kvtier_meta::Priority::Normal,
            gc_grace: None,
            gc_leader: true,
            gc_interval: HumanDuration(Duration::from_secs(5)),
            orphan_after: HumanDuration(Duration::from_secs(3600)),
            budgets: BTreeMap::new(),
        }
    }
}

impl ClusterSettings {
    /// Whether cluster mode is on.
    pub fn enabled(&self) -> bool {
        !self.etcd.trim().is_empty()
    }
}

/// KV events for routers, in vLLM's ZeroMQ wire format (docs/kv-events.md). Off unless
/// `endpoint` is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsSettings {
    /// The PUB socket's ZeroMQ endpoint, e.g. `tcp://*:5557` (port 0: any free port).
    /// Empty: no events.
    pub endpoint: String,
    /// Connect to `endpoint` (a router's bound SUB socket) instead of binding it.
    pub connect: bool,
    /// The replay socket's endpoint (a ROUTER, always bound); none: no replay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_endpoint: Option<String>,
    /// The topic frame of every message.
    pub topic: String,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// The PUB socket's high-water mark, in messages per subscriber.
    pub hwm: u32,
    /// Residency events queued for the publisher; when it falls further behind it
    /// re-lists everything instead.
    pub queue_len: usize,
}

impl Default for KvEventsSettings {
    /// The publisher's defaults (one place: `KvEventsConfig`), events off.
    fn default() -> Self {
        let c = kvtier_events::KvEventsConfig::default();
        Self {
            endpoint: String::new(),
            connect: c.connect,
            replay_endpoint: c.replay_endpoint,
            topic: c.topic,
            buffer_steps: c.buffer_steps,
            hwm: u32::try_from(c.hwm).unwrap_or(0),
            queue_len: c.queue_len,
        }
    }
}

impl KvEventsSettings {
    /// Whether events are published.
    pub fn enabled(&self) -> bool {
        !self.endpoint.trim().is_empty()
    }

    /// The publisher's configuration.
    pub fn config(&self) -> kvtier_events::KvEventsConfig {
        kvtier_events::KvEventsConfig {
            endpoint: self.endpoint.trim().to_string(),
            connect: self.connect,
            replay_endpoint: self.replay_endpoint.clone(),
            topic: self.topic.clone(),
            buffer_steps: self.buffer_steps,
            hwm: i32::try_from(self.hwm).unwrap_or(i32::MAX),
            queue_len: self.queue_len,
        }
    }
}

/// Bearer tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// Token the admin endpoints require (without one they are disabled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<String>,
    /// Token the data endpoints require (default: none required).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_token: Option<String>,
    /// Listen on a non-loopback address without tokens.
    pub allow_insecure_listen: bool,
}

/// Everything `kvtier serve` can be told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Address to listen on (port 0: any free port, printed at start).
    pub listen: SocketAddr,
    /// Data directory (the SSD store lives under it).
    pub data_dir: PathBuf,
    /// RAM tier capacity (blocks and snapshots share it).
    pub ram: ByteSize,
    /// Longest prompt accepted, in tokens.
    pub max_tokens: usize,
    /// Largest request body accepted.
    pub max_body: ByteSize,
    /// Threads answering requests; 0 picks half the cores, at least one. Engine work that
    /// may block (SSD reads and writes) runs on a separate blocking pool.
    pub workers: usize,
    /// How long shutdown waits for requests in flight.
    pub shutdown_timeout: HumanDuration,
    /// Connections open at once; at the cap a new connection closes the longest-idle one,
    /// or is closed itself when every connection has a request in progress. Lowered at
    /// start (and logged) if the open-file limit, raised to the hard limit, leaves room
    /// for fewer (`kvtier_listen::fds`).
    pub max_connections: usize,
    /// A request head must be complete this long after its first byte.
    pub header_timeout: HumanDuration,
    /// A request body must have arrived whole this long after its head (else 408).
    pub body_timeout: HumanDuration,
    /// A connection with no request in progress is closed after this long.
    pub idle_timeout: HumanDuration,
    /// The SSD tier.
    pub ssd: SsdSettings,
    /// The remote tier.
    pub remote: RemoteSettings,
    /// Cluster mode.
    pub cluster: ClusterSettings,
    /// KV events for routers.
    pub kv_events: KvEventsSettings,
    /// Tokens.
    pub auth: AuthSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7700)),
            data_dir: PathBuf::from("kvtier-data"),
            ram: ByteSize(4 << 30),
            max_tokens: kvtier_core::DEFAULT_MAX_TOKENS,
            max_body: ByteSize(1 << 30),
            workers: 0,
            shutdown_timeout: HumanDuration(Duration::from_secs(30)),
            max_connections: 1024,
            header_timeout: HumanDuration(Duration::from_secs(10)),
            body_timeout: HumanDuration(Duration::from_secs(60)),
            idle_timeout: HumanDuration(Duration::from_secs(60)),
            ssd: SsdSettings::default(),
            remote: RemoteSettings::default(),
            cluster: ClusterSettings::default(),
            kv_events: KvEventsSettings::default(),
            auth: AuthSettings::default(),
        }
    }
}

impl Settings {
    /// The settings a TOML file gives (missing keys take their defaults): what
    /// `kvtier serve --config` and the Python package's `config_file` read.
    ///
    /// A file that does not parse is `Invalid`. A file that cannot be read is `Invalid`
    /// when the path itself is wrong (missing, not a file, not permitted: the same call
    /// fails the same way), and `Unavailable` for any other I/O failure (a device or
    /// network file system that may answer later).
    pub fn from_file(path: &std::path::Path) -> Result<Settings, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            let kind = match e.kind() {
                std::io::ErrorKind::NotFound
                | std::io::ErrorKind::PermissionDenied
                | std::io::ErrorKind::IsADirectory
                | std::io::ErrorKind::InvalidData => ErrorKind::Invalid,
                _ => ErrorKind::Unavailable,
            };
            Error::new(kind, format!("cannot read {}", path.display())).with_source(e)
        })?;
        toml::from_str(&text).map_err(|e| Error::invalid(path.display().to_string()).with_source(e))
    }

    /// The SSD store directory.
    pub fn ssd_dir(&self) -> PathBuf {
        self.ssd.dir_under(&self.data_dir)
    }

    /// Request threads to run: `workers`, or half the cores (at least one) when 0. Half,
    /// because lookups are short and memory-only: on a small machine one request thread
    /// avoids cross-thread wakeups and leaves the other cores to the blocking pool and to
    /// the inference engine itself (measured in ADR 0007).
    pub fn worker_threads(&self) -> usize {
        if self.workers > 0 {
            return self.workers;
        }
        std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
    }

    /// The settings as TOML, tokens replaced by `<redacted>`.
    pub fn to_toml_redacted(&self) -> Result<String, Error> {
        let mut shown = self.clone();
        for t in [
            &mut shown.auth.admin_token,
            &mut shown.auth.data_token,
            &mut shown.remote.secret_key,
        ] {
            if t.is_some() {
                *t = Some("<redacted>".into());
            }
        }
        toml::to_string(&shown).map_err(|e| {
            Error::new(ErrorKind::Internal, "cannot print the settings as TOML").with_source(e)
        })
    }

    /// Refuses settings the server must not run with (`Invalid`).
    pub fn validate(&self) -> Result<(), Error> {
        let open = !self.listen.ip().is_loopback();
        let tokens = self.auth.admin_token.is_some() && self.auth.data_token.is_some();
        if open && !tokens && !self.auth.allow_insecure_listen {
            return Err(Error::invalid(format!(
                "refusing to listen on {} (not a loopback address) without an admin token \
                 and a data token: set --admin-token and --data-token, or pass \
                 --allow-insecure-listen to accept anyone who can reach the port",
                self.listen
            )));
        }
        for (name, t) in [
            ("admin token", &self.auth.admin_token),
            ("data token", &self.auth.data_token),
        ] {
            if t.as_deref().is_some_and(|t| t.len() < 16) {
                return Err(Error::invalid(format!(
                    "the {name} must be at least 16 characters"
                )));
            }
        }
        if self.ram.0 == 0 {
            return Err(Error::invalid("ram must be larger than 0"));
        }
        if self.ssd.segment_size.0 < 8 << 10 {
            return Err(Error::invalid("ssd.segment_size must be at least 8KiB"));
        }
        if self.ssd.maintenance_every.0.is_zero() {
            return Err(Error::invalid(
                "ssd.maintenance_every must be longer than 0",
            ));
        }
        if self.max_body.0 < 1024 {
            return Err(Error::invalid("max_body must be at least 1KiB"));
        }
        if self.max_connections == 0 {
            return Err(Error::invalid("max_connections must be at least 1"));
        }
        if self.kv_events.enabled() {
            if self.kv_events.buffer_steps == 0 {
                return Err(Error::invalid("kv_events.buffer_steps must be at least 1"));
            }
            if self.kv_events.queue_len == 0 {
                return Err(Error::invalid("kv_events.queue_len must be at least 1"));
            }
        } else if self.kv_events.replay_endpoint.is_some() {
            return Err(Error::invalid(
                "kv_events.replay_endpoint needs kv_events.endpoint",
            ));
        }
        for (name, d) in [
            ("header_timeout", self.header_timeout),
            ("body_timeout", self.body_timeout),
            ("idle_timeout", self.idle_timeout),
        ] {
            if d.0.is_zero() {
                return Err(Error::invalid(format!("{name} must be longer than 0")));
            }
        }
        Ok(())
    }
}

/// `NAMESPACE=SIZE`.
fn parse_budget(text: &str) -> Result<(String, ByteSize), String> {
    let (namespace, size) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` is not NAMESPACE=SIZE"))?;
    Ok((namespace.trim().to_owned(), size.trim().parse()?))
}

/// `kvtier serve` arguments. Each overrides the configuration file; unset ones keep
/// the file's value, or the default shown.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML configuration file (keys as printed by --print-config).
    #[arg(long, env = "KVTIER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Any setting by its dotted path, as in the settings file: `--set ssd.capacity=200GB`
    /// (repeatable; applied after every other flag). `KVTIER__SSD__CAPACITY=200GB` in the
    /// environment does the same, before the flags.
    #[arg(long = "set", value_name = "KEY.PATH=VALUE", value_parser = crate::overrides::parse_assignment)]
    pub set: Vec<(String, String)>,
    /// Address to listen on; port 0 picks a free port [default: 127.0.0.1:7700].
    #[arg(long, env = "KVTIER_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Data directory [default: kvtier-data].
    #[arg(long, env = "KVTIER_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// RAM tier capacity [default: 4GiB].
    #[arg(long, env = "KVTIER_RAM", value_name = "SIZE")]
    pub ram: Option<ByteSize>,
    /// Longest prompt accepted, in tokens [default: 1048576].
    #[arg(long, env = "KVTIER_MAX_TOKENS", value_name = "N")]
    pub max_tokens: Option<usize>,
    /// Largest request body accepted [default: 1GiB].
    #[arg(long, env = "KVTIER_MAX_BODY", value_name = "SIZE")]
    pub max_body: Option<ByteSize>,
    /// Threads answering requests; 0 = half the cores, at least one [default: 0].
    #[arg(long, env = "KVTIER_WORKERS", value_name = "N")]
    pub workers: Option<usize>,
    /// How long shutdown waits for requests in flight [default: 30s].
    #[arg(long, env = "KVTIER_SHUTDOWN_TIMEOUT", value_name = "DURATION")]
    pub shutdown_timeout: Option<HumanDuration>,
    /// Connections open at once; at the cap the longest-idle one is closed; lowered at
    /// start if the open-file limit (raised to the hard limit) leaves room for fewer
    /// [default: 1024].
    #[arg(long, env = "KVTIER_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<usize>,
    /// A request head must be complete this long after its first byte [default: 10s].
    #[arg(long, env = "KVTIER_HEADER_TIMEOUT", value_name = "DURATION")]
    pub header_timeout: Option<HumanDuration>,
    /// A request body must arrive whole this long after its head [default: 60s].
    #[arg(long, env = "KVTIER_BODY_TIMEOUT", value_name = "DURATION")]
    pub body_timeout: Option<HumanDuration>,
    /// A connection with no request in progress is closed after this long [default: 60s].
    #[arg(long, env = "KVTIER_IDLE_TIMEOUT", value_name = "DURATION")]
    pub idle_timeout: Option<HumanDuration>,
    /// Attach the SSD tier at start [default: true].
    #[arg(long, env = "KVTIER_SSD_ENABLED", value_name = "BOOL")]
    pub ssd_enabled: Option<bool>,
    /// SSD store directory [default: DATA_DIR/ssd].
    #[arg(long, env = "KVTIER_SSD_DIR", value_name = "DIR")]
    pub ssd_dir: Option<PathBuf>,
    /// SSD capacity [default: 64GiB].
    #[arg(long, env = "KVTIER_SSD_CAPACITY", value_name = "SIZE")]
    pub ssd_capacity: Option<ByteSize>,
    /// SSD bytes one layout may hold [default: only the capacity].
    #[arg(long, env = "KVTIER_SSD_NAMESPACE_BUDGET", value_name = "SIZE")]
    pub ssd_namespace_budget: Option<ByteSize>,
    /// SSD blocks unread for this long are dropped [default: 7d].
    #[arg(long, env = "KVTIER_SSD_TTL", value_name = "DURATION")]
    pub ssd_ttl: Option<HumanDuration>,
    /// When blocks reach the SSD [default: write_through].
    #[arg(long, env = "KVTIER_SSD_MODE", value_name = "MODE")]
    pub ssd_mode: Option<PersistMode>,
    /// What a store's answer promises: queued, written (survives a kill) or synced
    /// (survives a power loss) [default: queued].
    #[arg(long, env = "KVTIER_SSD_DURABILITY", value_name = "D")]
    pub ssd_durability: Option<Ack>,
    /// Extra attempts when an SSD write fails [default: 3].
    #[arg(long, env = "KVTIER_SSD_RETRIES", value_name = "N")]
    pub ssd_retries: Option<u32>,
    /// Stop SSD admission below this much free space, 0 = off [default: 1GiB].
    #[arg(long, env = "KVTIER_SSD_MIN_FREE", value_name = "SIZE")]
    pub ssd_min_free: Option<ByteSize>,
    /// Promote SSD hits into RAM [default: true].
    #[arg(long, env = "KVTIER_SSD_PROMOTE_ON_HIT", value_name = "BOOL")]
    pub ssd_promote_on_hit: Option<bool>,
    /// Read SSD-only blocks right after a lookup [default: true].
    #[arg(long, env = "KVTIER_SSD_PREFETCH", value_name = "BOOL")]
    pub ssd_prefetch: Option<bool>,
    /// Blocks the SSD write queue holds [default: 512].
    #[arg(long, env = "KVTIER_SSD_QUEUE_LEN", value_name = "N")]
    pub ssd_queue_len: Option<usize>,
    /// How long a store waits for room in the queue [default: 50ms].
    #[arg(long, env = "KVTIER_SSD_WRITER_WAIT", value_name = "DURATION")]
    pub ssd_writer_wait: Option<HumanDuration>,
    /// What a full queue does after the wait [default: sync_write].
    #[arg(long, env = "KVTIER_SSD_OVERFLOW", value_name = "O")]
    pub ssd_overflow: Option<Overflow>,
    /// How long shutdown and reattach wait for the SSD queue [default: 30s].
    #[arg(long, env = "KVTIER_SSD_DRAIN_TIMEOUT", value_name = "DURATION")]
    pub ssd_drain_timeout: Option<HumanDuration>,
    /// Size at which an SSD segment is sealed (at least 8KiB) [default: 256MiB].
    #[arg(long, env = "KVTIER_SSD_SEGMENT_SIZE", value_name = "BYTES")]
    pub ssd_segment_size: Option<ByteSize>,
    /// How often SSD expiry, budgets and compaction run [default: 10s].
    #[arg(long, env = "KVTIER_SSD_MAINTENANCE_EVERY", value_name = "DURATION")]
    pub ssd_maintenance_every: Option<HumanDuration>,
    /// Remote tier endpoint URLs, comma-separated [default: none, no remote tier].
    #[arg(
        long,
        env = "KVTIER_REMOTE_ENDPOINTS",
        value_name = "URLS",
        value_delimiter = ','
    )]
    pub remote_endpoints: Option<Vec<String>>,
    /// Remote tier bucket [default: kvtier].
    #[arg(long, env = "KVTIER_REMOTE_BUCKET", value_name = "NAME")]
    pub remote_bucket: Option<String>,
    /// Remote tier object name prefix [default: kv].
    #[arg(long, env = "KVTIER_REMOTE_PREFIX", value_name = "NAME")]
    pub remote_prefix: Option<String>,
    /// Longest a remote call may take before it is a miss [default: 2s].
    #[arg(long, env = "KVTIER_REMOTE_DEADLINE", value_name = "DURATION")]
    pub remote_deadline: Option<HumanDuration>,
    /// Region for SigV4 [default: us-east-1].
    #[arg(long, env = "KVTIER_REMOTE_REGION", value_name = "NAME")]
    pub remote_region: Option<String>,
    /// Access key for the remote endpoints [default: AWS_ACCESS_KEY_ID from the environment].
    #[arg(long, env = "KVTIER_REMOTE_ACCESS_KEY", value_name = "KEY")]
    pub remote_access_key: Option<String>,
    /// Secret key for the remote endpoints [default: AWS_SECRET_ACCESS_KEY from the environment].
    #[arg(
        long,
        env = "KVTIER_REMOTE_SECRET_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub remote_secret_key: Option<String>,
    /// Also queue remote hits for the SSD tier [default: true].
    #[arg(long, env = "KVTIER_REMOTE_PROMOTE_TO_SSD", value_name = "BOOL")]
    pub remote_promote_to_ssd: Option<bool>,
    /// Cluster mode: etcd endpoints, `etcd://host:port,host:port` (needs a remote tier)
    /// [default: none, one replica on its own].
    #[arg(
        long,
        visible_alias = "cluster",
        env = "KVTIER_CLUSTER",
        value_name = "ETCD_URL"
    )]
    pub cluster_etcd: Option<String>,
    /// The cluster's name [default: default].
    #[arg(long, env = "KVTIER_CLUSTER_NAME", value_name = "NAME")]
    pub cluster_name: Option<String>,
    /// This replica's id, stable across restarts [default: host name and listen port].
    #[arg(long, env = "KVTIER_CLUSTER_REPLICA", value_name = "ID")]
    pub cluster_replica: Option<String>,
    /// How long after its last renewal a silent replica counts as gone [default: 10s].
    #[arg(long, env = "KVTIER_CLUSTER_LEASE_TTL", value_name = "DURATION")]
    pub cluster_lease_ttl: Option<HumanDuration>,
    /// Namespace of this replica's objects [default: default].
    #[arg(long, env = "KVTIER_CLUSTER_NAMESPACE", value_name = "NAME")]
    pub cluster_namespace: Option<String>,
    /// Priority of this replica's objects: normal, or pinned (never deleted by a budget)
    /// [default: normal].
    #[arg(long, env = "KVTIER_CLUSTER_PRIORITY", value_name = "PRIORITY")]
    pub cluster_priority: Option<kvtier_meta::Priority>,
    /// How long a withdrawn object stays before it is deleted [default: 10s plus the
    /// remote deadline].
    #[arg(long, env = "KVTIER_CLUSTER_GC_GRACE", value_name = "DURATION")]
    pub cluster_gc_grace: Option<HumanDuration>,
    /// Stand for GC leader [default: true].
    #[arg(long, env = "KVTIER_CLUSTER_GC_LEADER", value_name = "BOOL")]
    pub cluster_gc_leader: Option<bool>,
    /// How often the GC leader sweeps [default: 5s].
    #[arg(long, env = "KVTIER_CLUSTER_GC_INTERVAL", value_name = "DURATION")]
    pub cluster_gc_interval: Option<HumanDuration>,
    /// How long an owner must have been gone before the leader reclaims its objects
    /// [default: 1h].
    #[arg(long, env = "KVTIER_CLUSTER_ORPHAN_AFTER", value_name = "DURATION")]
    pub cluster_orphan_after: Option<HumanDuration>,
    /// A namespace's byte budget in the shared tier, `NAMESPACE=SIZE`; repeat for more
    /// [default: none, unbounded].
    #[arg(long, value_name = "NAMESPACE=SIZE", value_parser = parse_budget)]
    pub cluster_budget: Vec<(String, ByteSize)>,
    /// ZeroMQ endpoint KV events are published on, e.g. tcp://*:5557 [default: none, no
    /// events].
    #[arg(long, env = "KVTIER_KV_EVENTS_ENDPOINT", value_name = "ENDPOINT")]
    pub kv_events_endpoint: Option<String>,
    /// Connect the KV-event socket to the endpoint instead of binding it [default: false].
    #[arg(long, env = "KVTIER_KV_EVENTS_CONNECT", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub kv_events_connect: Option<bool>,
    /// ZeroMQ endpoint of the KV-event replay socket [default: none, no replay].
    #[arg(
        long,
        env = "KVTIER_KV_EVENTS_REPLAY_ENDPOINT",
        value_name = "ENDPOINT"
    )]
    pub kv_events_replay_endpoint: Option<String>,
    /// Topic frame of KV-event messages [default: empty].
    #[arg(long, env = "KVTIER_KV_EVENTS_TOPIC", value_name = "TOPIC")]
    pub kv_events_topic: Option<String>,
    /// KV-event batches kept for replay [default: 10000].
    #[arg(long, env = "KVTIER_KV_EVENTS_BUFFER_STEPS", value_name = "N")]
    pub kv_events_buffer_steps: Option<usize>,
    /// High-water mark of the KV-event socket, messages per subscriber [default: 100000].
    #[arg(long, env = "KVTIER_KV_EVENTS_HWM", value_name = "N")]
    pub kv_events_hwm: Option<u32>,
    /// Residency events queued for the KV-event publisher [default: 65536].
    #[arg(long, env = "KVTIER_KV_EVENTS_QUEUE_LEN", value_name = "N")]
    pub kv_events_queue_len: Option<usize>,
    /// Bearer token for the admin endpoints; without one they are disabled.
    #[arg(
        long,
        env = "KVTIER_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// Bearer token the data endpoints require [default: none].
    #[arg(
        long,
        env = "KVTIER_DATA_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub data_token: Option<String>,
    /// Allow a non-loopback listen address without tokens [default: false].
    #[arg(long, env = "KVTIER_ALLOW_INSECURE_LISTEN", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub allow_insecure_listen: Option<bool>,
}

impl ServeArgs {
    /// Defaults, then the file, then these arguments.
    pub fn settings(&self) -> Result<Settings, Error> {
        let file = match &self.config {
            Some(path) => Settings::from_file(path)?,
            None => Settings::default(),
        };
        // File, then the environment's `KVTIER__A__B` overrides, then the named flags,
        // then `--set` (see `crate::overrides`).
        let mut s = crate::overrides::apply(&file, &crate::overrides::from_env(std::env::vars()))?;
        fn set<T: Clone>(slot: &mut T, v: &Option<T>) {
            if let Some(v) = v {
                *slot = v.clone();
            }
        }
        set(&mut s.listen, &self.listen);
        set(&mut s.remote.endpoints, &self.remote_endpoints);
        set(&mut s.remote.bucket, &self.remote_bucket);
        set(&mut s.remote.prefix, &self.remote_prefix);
        set(&mut s.remote.deadline, &self.remote_deadline);
        set(&mut s.remote.region, &self.remote_region);
        set(&mut s.remote.promote_to_ssd, &self.remote_promote_to_ssd);
        if self.remote_access_key.is_some() {
            s.remote.access_key = self.remote_access_key.clone();
        }
        if self.remote_secret_key.is_some() {
            s.remote.secret_key = self.remote_secret_key.clone();
        }
        set(&mut s.cluster.etcd, &self.cluster_etcd);
        set(&mut s.cluster.name, &self.cluster_name);
        if self.cluster_replica.is_some() {
            s.cluster.replica = self.cluster_replica.clone();
        }
        set(&mut s.cluster.lease_ttl, &self.cluster_lease_ttl);
        set(&mut s.cluster.namespace, &self.cluster_namespace);
        set(&mut s.cluster.priority, &self.cluster_priority);
        if self.cluster_gc_grace.is_some() {
            s.cluster.gc_grace = self.cluster_gc_grace;
        }
        set(&mut s.cluster.gc_leader, &self.cluster_gc_leader);
        set(&mut s.cluster.gc_interval, &self.cluster_gc_interval);
        set(&mut s.cluster.orphan_after, &self.cluster_orphan_after);
        for (namespace, size) in &self.cluster_budget {
            s.cluster.budgets.insert(namespace.clone(), *size);
        }
        set(&mut s.kv_events.endpoint, &self.kv_events_endpoint);
        set(&mut s.kv_events.connect, &self.kv_events_connect);
        if self.kv_events_replay_endpoint.is_some() {
            s.kv_events.replay_endpoint = self.kv_events_replay_endpoint.clone();
        }
        set(&mut s.kv_events.topic, &self.kv_events_topic);
        set(&mut s.kv_events.buffer_steps, &self.kv_events_buffer_steps);
        set(&mut s.kv_events.hwm, &self.kv_events_hwm);
        set(&mut s.kv_events.queue_len, &self.kv_events_queue_len);
        set(&mut s.data_dir, &self.data_dir);
        set(&mut s.ram, &self.ram);
        set(&mut s.max_tokens, &self.max_tokens);
        set(&mut s.max_body, &self.max_body);
        set(&mut s.workers, &self.workers);
        set(&mut s.shutdown_timeout, &self.shutdown_timeout);
        set(&mut s.max_connections, &self.max_connections);
        set(&mut s.header_timeout, &self.header_timeout);
        set(&mut s.body_timeout, &self.body_timeout);
        set(&mut s.idle_timeout, &self.idle_timeout);
        let ssd = &mut s.ssd;
        set(&mut ssd.enabled, &self.ssd_enabled);
        if self.ssd_dir.is_some() {
            ssd.dir = self.ssd_dir.clone();
        }
        set(&mut ssd.capacity, &self.ssd_capacity);
        if self.ssd_namespace_budget.is_some() {
            ssd.namespace_budget = self.ssd_namespace_budget;
        }
        set(&mut ssd.ttl, &self.ssd_ttl);
        set(&mut ssd.mode, &self.ssd_mode);
        set(&mut ssd.durability, &self.ssd_durability);
        set(&mut ssd.retries, &self.ssd_retries);
        set(&mut ssd.min_free, &self.ssd_min_free);
        set(&mut ssd.promote_on_hit, &self.ssd_promote_on_hit);
        set(&mut ssd.prefetch, &self.ssd_prefetch);
        set(&mut ssd.queue_len, &self.ssd_queue_len);
        set(&mut ssd.writer_wait, &self.ssd_writer_wait);
        set(&mut ssd.overflow, &self.ssd_overflow);
        set(&mut ssd.drain_timeout, &self.ssd_drain_timeout);
        set(&mut ssd.segment_size, &self.ssd_segment_size);
        set(&mut ssd.maintenance_every, &self.ssd_maintenance_every);
        if self.admin_token.is_some() {
            s.auth.admin_token = self.admin_token.clone();
        }
        if self.data_token.is_some() {
            s.auth.data_token = self.data_token.clone();
        }
        set(
            &mut s.auth.allow_insecure_listen,
            &self.allow_insecure_listen,
        );
        let s = crate::overrides::apply(&s, &self.set)?;
        s.validate()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn printed_settings_read_back_the_same() {
        let mut s = Settings::default();
        s.ssd.namespace_budget = Some(ByteSize(3 << 30));
        s.ssd.mode = PersistMode::EvictOnly;
        let text = s.to_toml_redacted().unwrap();
        let back: Settings = toml::from_str(&text).unwrap();
        assert_eq!(back, s);
        assert!(text.contains("capacity = \"64GiB\""), "{text}");
        assert!(text.contains("ttl = \"7d\""), "{text}");
    }

    #[test]
    fn the_file_is_read_and_flags_win() {
        let dir = std::env::temp_dir().join(format!("kvtier-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("kvtier.toml");
        std::fs::write(
            &file,
            "ram = \"2GiB\"\n[ssd]\ncapacity = \"10GB\"\nttl = \"1h\"\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(file.clone()),
            ssd_ttl: Some("2h".parse().unwrap()),
            ..ServeArgs::default()
        };
        let s = args.settings().unwrap();
        assert_eq!(s.ram, ByteSize(2 << 30));
        assert_eq!(s.ssd.capacity, ByteSize(10_000_000_000));
        assert_eq!(s.ssd.ttl.0, Duration::from_secs(7200));
        std::fs::write(&file, "rma = \"2GiB\"\n").unwrap();
        let err = args.settings().unwrap_err();
        assert!(err.to_string().contains("rma"), "{err}");
        assert_eq!(err.kind(), kvtier_core::ErrorKind::Invalid);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_open_address_needs_tokens_or_the_explicit_flag() {
        let mut s = Settings {
            listen: "0.0.0.0:7700".parse().unwrap(),
            ..Settings::default()
        };
        assert!(
            s.validate()
                .unwrap_err()
                .message()
                .contains("--allow-insecure-listen")
        );
        s.auth.admin_token = Some("a".repeat(20));
        s.auth.data_token = Some("d".repeat(20));
        s.validate().unwrap();
        s.auth = AuthSettings {
            allow_insecure_listen: true,
            ..AuthSettings::default()
        };
        s.validate().unwrap();
    }
}
