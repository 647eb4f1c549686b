//! `kvtier serve`'s settings, each defined once here with its default: serde reads them
//! from a TOML file and the Python package's dict, `crate::overrides` sets any of them by
//! its dotted path (`--set`, `KVTIER__…`), and `crate::args` is the command line (a few
//! named flags). `--print-config` prints the effective settings as TOML (tokens
//! redacted), which reads back as a configuration file.
//!
//! An unset optional setting (`None`) is left out of the TOML, which has no way to write
//! one; so no `skip_serializing_if` is needed for the file, and JSON (what
//! `overrides::paths` lists) still names it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kvtier_codec::{Codec, CodecConfig};
use kvtier_core::engine::RemoteAttach;
use kvtier_core::layout::LayoutDigest;
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
    pub dir: Option<PathBuf>,
    /// Payload bytes the store may hold.
    pub capacity: ByteSize,
    /// Payload bytes one layout may hold (default: only the store's capacity).
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
    /// How pages are written to the SSD: `raw` or `lossless` (byte planes, each
    /// Huffman-coded; ADR 0021). Each record says how it was written, so this may change
    /// between runs.
    pub codec: Codec,
    /// Codecs of particular namespaces: layout digest (32 hex digits) → codec.
    pub namespace_codecs: BTreeMap<String, Codec>,
}

/// The codec settings of tier `section` (`ssd`, `remote`) as the tier takes them; an
/// error names a bad digest or codec.
fn codec_config(
    section: &str,
    codec: Codec,
    namespace_codecs: &BTreeMap<String, Codec>,
) -> Result<CodecConfig, Error> {
    let mut namespaces = BTreeMap::new();
    for (hex, codec) in namespace_codecs {
        let digest = LayoutDigest::from_hex(hex).ok_or_else(|| {
            Error::invalid(format!(
                "{section}.namespace_codecs: `{hex}` is not a layout digest (32 hex digits)"
            ))
        })?;
        namespaces.insert(digest, *codec);
    }
    let config = CodecConfig {
        default: codec,
        namespaces,
    };
    config
        .validate()
        .map_err(|e| Error::invalid(format!("{section}.codec: {e}")))?;
    Ok(config)
}

impl SsdSettings {
    /// The codec settings as the tier takes them; an error names a bad digest or codec.
    pub fn codec_config(&self) -> Result<CodecConfig, Error> {
        codec_config("ssd", self.codec, &self.namespace_codecs)
    }

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
            codec: CodecConfig::default().default,
            namespace_codecs: BTreeMap::new(),
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
    pub access_key: Option<String>,
    /// Secret key (default: `AWS_SECRET_ACCESS_KEY` from the environment).
    pub secret_key: Option<String>,
    /// Longest a remote call may take, retries included; past it, a miss.
    pub deadline: HumanDuration,
    /// Also queue remote hits for the SSD tier.
    pub promote_to_ssd: bool,
    /// The cluster's signing key, 64 hex digits (printed as `<redacted>`; `kvtier keys`
    /// makes one): every object written is signed with it and only objects and cluster
    /// records signed with it are served. Every replica sharing the bucket needs the same
    /// key. Unset: objects are checked for damage (CRC-32C), not for forgery.
    pub signing_key: Option<String>,
    /// Refuse to start (`Unavailable`) when an endpoint does not list its bucket within
    /// `deadline` (no answer, a refused connection, an error answer). Off: the node starts
    /// degraded instead — RAM and SSD serve; remote calls miss within the deadline and
    /// count as failures until the endpoint answers.
    pub require_at_start: bool,
    /// How pages and states are written to the bucket: `raw` or `lossless` (ADR 0021).
    /// Each manifest and state object says how it was written, so this may change
    /// between runs and differ between replicas (a build without codecs misses on
    /// encoded objects, never misreads them).
    pub codec: Codec,
    /// Codecs of particular namespaces: layout digest (32 hex digits) → codec.
    pub namespace_codecs: BTreeMap<String, Codec>,
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
            signing_key: None,
            deadline: HumanDuration(Duration::from_secs(2)),
            promote_to_ssd: RemoteAttach::default().promote_to_ssd,
            require_at_start: false,
            codec: CodecConfig::default().default,
            namespace_codecs: BTreeMap::new(),
        }
    }
}

impl RemoteSettings {
    /// The codec settings as the tier takes them; an error names a bad digest or codec.
    pub fn codec_config(&self) -> Result<CodecConfig, Error> {
        codec_config("remote", self.codec, &self.namespace_codecs)
    }

    /// The signing key, if one is set; `Invalid` when it is not 64 hex digits.
    pub fn signing_key(&self) -> Result<Option<kvtier_remote::SigningKey>, Error> {
        self.signing_key
            .as_deref()
            .map(|hex| {
                kvtier_remote::SigningKey::from_hex(hex)
                    .map_err(|why| Error::invalid(format!("remote.signing_key: {why}")))
            })
            .transpose()
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
    /// The etcd user, when etcd's authentication is on (with `etcd_password`).
    pub etcd_user: Option<String>,
    /// Its password (printed as `<redacted>`).
    pub etcd_password: Option<String>,
    /// TLS to etcd: the PEM file of the authority whose certificates the members must
    /// show. Set: the endpoints are reached over TLS only.
    pub etcd_ca: Option<PathBuf>,
    /// The replica's client certificate (PEM), for members that require one
    /// (`--client-cert-auth`); with `etcd_key`, and only with `etcd_ca`.
    pub etcd_cert: Option<PathBuf>,
    /// Its key (PEM).
    pub etcd_key: Option<PathBuf>,
}

impl ClusterSettings {
    /// etcd's credentials, if set (both or neither: [`Settings::validate`]).
    pub fn etcd_auth(&self) -> Option<kvtier_meta::EtcdAuth> {
        Some(kvtier_meta::EtcdAuth {
            user: self.etcd_user.clone()?,
            password: self.etcd_password.clone()?,
        })
    }

    /// How to reach etcd: TLS with the files named (read now) and the credentials.
    /// `Invalid` when a file cannot be read or the settings do not go together.
    pub fn etcd_access(&self) -> Result<kvtier_meta::EtcdAccess, Error> {
        let read = |key: &str, path: &PathBuf| {
            std::fs::read(path).map_err(|e| {
                Error::invalid(format!(
                    "cluster.{key}: cannot read {}: {e}",
                    path.display()
                ))
            })
        };
        let identity = match (&self.etcd_cert, &self.etcd_key) {
            (Some(cert), Some(key)) => Some((read("etcd_cert", cert)?, read("etcd_key", key)?)),
            (None, None) => None,
            _ => {
                return Err(Error::invalid(
                    "cluster.etcd_cert and cluster.etcd_key go together",
                ));
            }
        };
        let tls = match (&self.etcd_ca, identity) {
            (Some(ca), identity) => Some(kvtier_meta::EtcdTls {
                ca: read("etcd_ca", ca)?,
                identity,
            }),
            (None, None) => None,
            (None, Some(_)) => {
                return Err(Error::invalid(
                    "cluster.etcd_cert needs cluster.etcd_ca (the authority the members' \
                     certificates are checked against)",
                ));
            }
        };
        Ok(kvtier_meta::EtcdAccess {
            auth: self.etcd_auth(),
            tls,
        })
    }
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
            etcd_user: None,
            etcd_password: None,
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
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
    /// The PUB socket's ZeroMQ endpoint, e.g. `tcp://127.0.0.1:5557` (port 0: any free
    /// port); beyond this host (`tcp://*:5557`) only with CURVE. Empty: no events.
    pub endpoint: String,
    /// Connect to `endpoint` (a router's bound SUB socket) instead of binding it.
    pub connect: bool,
    /// The replay socket's endpoint (a ROUTER, always bound); none: no replay.
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
    /// The sockets' CURVE secret key (Z85, 40 characters; `kvtier keys` makes a pair):
    /// with it both sockets encrypt, only `curve_clients` may connect, and the endpoints
    /// may reach beyond this host. Without it: plaintext, on this host only.
    pub curve_secret_key: Option<String>,
    /// Public keys (Z85) of the clients allowed to subscribe and ask for replays.
    pub curve_clients: Vec<String>,
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
            curve_secret_key: None,
            curve_clients: Vec::new(),
        }
    }
}

impl KvEventsSettings {
    /// Whether events are published.
    pub fn enabled(&self) -> bool {
        !self.endpoint.trim().is_empty()
    }

    /// The publisher's configuration; `Invalid` for a key that is not 40 characters of
    /// Z85, or client keys without a secret key.
    pub fn config(&self) -> Result<kvtier_events::KvEventsConfig, Error> {
        let key = |what: &str, text: &str| {
            kvtier_events::zmq::z85_decode_key(text.trim()).ok_or_else(|| {
                Error::invalid(format!(
                    "kv_events.{what}: not a CURVE key (40 characters of Z85)"
                ))
            })
        };
        let curve = match &self.curve_secret_key {
            None if self.curve_clients.is_empty() => None,
            None => {
                return Err(Error::invalid(
                    "kv_events.curve_clients needs kv_events.curve_secret_key",
                ));
            }
            Some(secret) => Some(kvtier_events::CurveConfig {
                secret_key: key("curve_secret_key", secret)?,
                clients: self
                    .curve_clients
                    .iter()
                    .map(|c| key("curve_clients", c))
                    .collect::<Result<_, _>>()?,
            }),
        };
        Ok(kvtier_events::KvEventsConfig {
            endpoint: self.endpoint.trim().to_string(),
            connect: self.connect,
            replay_endpoint: self.replay_endpoint.clone(),
            topic: self.topic.clone(),
            buffer_steps: self.buffer_steps,
            hwm: i32::try_from(self.hwm).unwrap_or(i32::MAX),
            queue_len: self.queue_len,
            curve,
        })
    }
}

/// The shared arena: the RAM tier in shared memory that local clients map, and the Unix
/// socket they reach it through (docs/adr/0019-shared-arena.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShmSettings {
    /// Back the RAM tier with shared memory and listen on `socket` (default false).
    pub enabled: bool,
    /// The Unix socket local clients connect to (default: `kvtier.sock` in `data_dir`).
    pub socket: Option<PathBuf>,
    /// Who may connect: the socket file's permission bits (default `0o600`, the server's
    /// user only). Whoever connects can read every block in the arena.
    pub socket_mode: u32,
    /// Staging memory per client, where its stores are written before the server copies
    /// them into the arena (whole 2 MiB units; default 256 MiB).
    pub staging: ByteSize,
    /// How long a reserved store waits for its commit before its room is freed.
    pub reserve_ttl: HumanDuration,
    /// Clients connected at once; one more is refused.
    pub max_clients: usize,
    /// Bytes of blocks one client may hold leased at once (0: half of `ram`). A leased
    /// block's slot stays taken while the lease lasts, even once the block is evicted.
    pub max_leased: ByteSize,
    /// Take the shared arena's pages from the kernel's huge-page pool (`vm.nr_hugepages`
    /// must hold `ram` plus 64 MiB; the start fails, saying so, if it does not). Clients
    /// then read blocks out of 2 MiB pages instead of 4 KiB ones (default false).
    pub huge_pages: bool,
}

impl Default for ShmSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            socket: None,
            socket_mode: 0o600,
            staging: ByteSize(256 << 20),
            reserve_ttl: HumanDuration(Duration::from_secs(30)),
            max_clients: 32,
            max_leased: ByteSize(0),
            huge_pages: false,
        }
    }
}

/// Bearer tokens, each with its scope: the admin token the admin endpoints; the data
/// token every tenant's data; a tenant token only the layouts of its tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// Token the admin endpoints require (without one they are disabled).
    pub admin_token: Option<String>,
    /// Token of the data endpoints for every tenant (default: none required, unless
    /// tenant tokens are set).
    pub data_token: Option<String>,
    /// Tokens scoped to one tenant each, by tenant name (`[auth.tenants.NAME]`): such a
    /// token reaches only its tenant's layouts, and a layout registered with it gets the
    /// tenant's salt, a salt the request gives nested under it (docs/API.md, "Tokens").
    pub tenants: BTreeMap<String, TenantToken>,
    /// Listen on a non-loopback address without tokens.
    pub allow_insecure_listen: bool,
}

impl AuthSettings {
    /// Whether the data endpoints require a token: the data token or a tenant's.
    pub fn data_guarded(&self) -> bool {
        self.data_token.is_some() || !self.tenants.is_empty()
    }
}

/// One tenant's scoped token (`[auth.tenants.NAME]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantToken {
    /// The bearer token (at least 16 characters, distinct from every other token).
    pub token: String,
    /// The tenant salt, hex: every layout this token reaches carries it (alone or with a
    /// caller's salt nested under it); no two tenants' salts begin with one another.
    pub salt: String,
}

impl TenantToken {
    /// The salt's bytes, or why it is not a salt.
    pub fn salt_bytes(&self) -> Result<Vec<u8>, String> {
        let s = self.salt.as_bytes();
        if s.is_empty() || !s.len().is_multiple_of(2) {
            return Err(format!("`{}` is not hex of at least one byte", self.salt));
        }
        s.chunks(2)
            .map(|d| {
                std::str::from_utf8(d)
                    .ok()
                    .and_then(|d| u8::from_str_radix(d, 16).ok())
                    .ok_or_else(|| format!("`{}` is not hex", self.salt))
            })
            .collect()
    }
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
    /// Touch all of the RAM tier's arena at start, so that no store ever waits for the
    /// kernel to fill fresh memory (it costs the whole `ram` in resident memory at once,
    /// and about a second per 4 GiB to start). Off, each page is filled by the first block
    /// that lands on it and reused from then on (docs/adr/0018-arena.md).
    pub ram_prefault: bool,
    /// Lock the RAM tier's arena in memory (`mlock`): never swapped out, as DMA to a GPU
    /// wants. Needs a locked-memory limit (`ulimit -l`) as large as `ram`; the start
    /// fails if it is lower.
    pub ram_lock: bool,
    /// Longest prompt accepted, in tokens.
    pub max_tokens: usize,
    /// Largest request body accepted.
    pub max_body: ByteSize,
    /// Largest JSON request body (lookups, loads, layouts, batches of lookups) and JSON
    /// head of an upload: JSON is parsed whole, so it gets a limit of its own, well below
    /// `max_body` (which block payloads need). The default holds a `max_tokens` prompt as a
    /// JSON array many times over.
    pub max_json: ByteSize,
    /// Threads answering requests; 0 picks half the cores, at least one. Engine work that
    /// may block (SSD reads and writes) runs on a separate blocking pool.
    pub workers: usize,
    /// The threads that read store bodies (as many as `workers`, beside them) run under
    /// the kernel's idle policy (Linux `SCHED_IDLE`): a lookup never waits for the CPU
    /// behind a store's copy, and a CPU busy only with a copy counts as free when the
    /// kernel places a woken lookup thread. The store takes the cycles left over — all
    /// of them where cores are free, a sliver where every core is busy with other work.
    /// False: they run at `store_nice` instead (docs/adr/0017-the-edge.md).
    pub store_idle: bool,
    /// With `store_idle = false`, the CPU priority (`nice`, 0 to 19) of the threads that
    /// read store bodies. Above 0, the store takes a smaller share of a CPU it competes
    /// for; 0 keeps them at the request threads' priority.
    pub store_nice: i32,
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
    /// The shared arena for local clients.
    pub shm: ShmSettings,
    /// Tokens.
    pub auth: AuthSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7700)),
            data_dir: PathBuf::from("kvtier-data"),
            ram: ByteSize(4 << 30),
            ram_prefault: false,
            ram_lock: false,
            max_tokens: kvtier_core::DEFAULT_MAX_TOKENS,
            max_body: ByteSize(1 << 30),
            max_json: ByteSize(64 << 20),
            workers: 0,
            store_idle: true,
            store_nice: 19,
            shutdown_timeout: HumanDuration(Duration::from_secs(30)),
            max_connections: 1024,
            header_timeout: HumanDuration(Duration::from_secs(10)),
            body_timeout: HumanDuration(Duration::from_secs(60)),
            idle_timeout: HumanDuration(Duration::from_secs(60)),
            ssd: SsdSettings::default(),
            remote: RemoteSettings::default(),
            cluster: ClusterSettings::default(),
            kv_events: KvEventsSettings::default(),
            shm: ShmSettings::default(),
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

    /// The shared arena's socket: `shm.socket`, or `kvtier.sock` in `data_dir`.
    pub fn shm_socket(&self) -> PathBuf {
        self.shm
            .socket
            .clone()
            .unwrap_or_else(|| self.data_dir.join("kvtier.sock"))
    }

    /// Bytes one shared-arena client may hold leased: `shm.max_leased`, or half of `ram`.
    pub fn shm_max_leased(&self) -> u64 {
        match self.shm.max_leased.0 {
            0 => self.ram.0 / 2,
            n => n,
        }
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
            &mut shown.remote.signing_key,
            &mut shown.kv_events.curve_secret_key,
            &mut shown.cluster.etcd_password,
        ] {
            if t.is_some() {
                *t = Some("<redacted>".into());
            }
        }
        for tenant in shown.auth.tenants.values_mut() {
            tenant.token = "<redacted>".into();
        }
        toml::to_string(&shown).map_err(|e| {
            Error::new(ErrorKind::Internal, "cannot print the settings as TOML").with_source(e)
        })
    }

    /// Every token long enough and different from every other (a token names one scope),
    /// every tenant's salt hex and its own.
    fn check_tokens(&self) -> Result<(), Error> {
        let a = &self.auth;
        let mut tokens: Vec<(String, &str)> = [
            ("the admin token".to_string(), &a.admin_token),
            ("the data token".to_string(), &a.data_token),
        ]
        .into_iter()
        .filter_map(|(name, t)| t.as_deref().map(|t| (name, t)))
        .collect();
        let mut salts: Vec<(Vec<u8>, &str)> = Vec::new();
        for (name, tenant) in &a.tenants {
            tokens.push((format!("tenant {name}'s token"), &tenant.token));
            let salt = tenant
                .salt_bytes()
                .map_err(|e| Error::invalid(format!("auth.tenants.{name}.salt: {e}")))?;
            // A tenant reaches its salt and salts nested under it (`salt/…`): no tenant's
            // salt may begin with another's.
            if let Some((_, other)) = salts
                .iter()
                .find(|(s, _)| s.starts_with(&salt) || salt.starts_with(s))
            {
                return Err(Error::invalid(format!(
                    "tenants {other} and {name} have salts one of which begins with the \
                     other: each tenant's layouts must be its own"
                )));
            }
            salts.push((salt, name));
        }
        for (i, (name, t)) in tokens.iter().enumerate() {
            if t.len() < 16 {
                return Err(Error::invalid(format!(
                    "{name} must be at least 16 characters"
                )));
            }
            if let Some((other, _)) = tokens[..i].iter().find(|(_, u)| u == t) {
                return Err(Error::invalid(format!(
                    "{other} and {name} are the same: a token names one scope"
                )));
            }
        }
        Ok(())
    }

    /// Refuses settings the server must not run with (`Invalid`).
    pub fn validate(&self) -> Result<(), Error> {
        let open = !self.listen.ip().is_loopback();
        let tokens = self.auth.admin_token.is_some() && self.auth.data_guarded();
        if open && !tokens && !self.auth.allow_insecure_listen {
            return Err(Error::invalid(format!(
                "refusing to listen on {} (not a loopback address) without an admin token \
                 and a data token: set --admin-token and --data-token, or pass \
                 --allow-insecure-listen to accept anyone who can reach the port",
                self.listen
            )));
        }
        self.check_tokens()?;
        if self.ram.0 == 0 {
            return Err(Error::invalid("ram must be larger than 0"));
        }
        if !(0..=19).contains(&self.store_nice) {
            return Err(Error::invalid(format!(
                "store_nice must be 0 to 19 (a lower priority than the request threads, or the \
                 same), not {}",
                self.store_nice
            )));
        }
        if self.ssd.segment_size.0 < 8 << 10 {
            return Err(Error::invalid("ssd.segment_size must be at least 8KiB"));
        }
        if self.ssd.maintenance_every.0.is_zero() {
            return Err(Error::invalid(
                "ssd.maintenance_every must be longer than 0",
            ));
        }
        self.ssd.codec_config()?;
        if self.max_body.0 < 1024 {
            return Err(Error::invalid("max_body must be at least 1KiB"));
        }
        if self.max_json.0 < 1024 {
            return Err(Error::invalid("max_json must be at least 1KiB"));
        }
        if self.max_connections == 0 {
            return Err(Error::invalid("max_connections must be at least 1"));
        }
        if self.shm.enabled {
            if self.shm.staging.0 == 0 || !self.shm.staging.0.is_multiple_of(2 << 20) {
                return Err(Error::invalid(format!(
                    "shm.staging is {} bytes; it must be a positive multiple of 2 MiB",
                    self.shm.staging.0
                )));
            }
            if self.shm.max_clients == 0 {
                return Err(Error::invalid("shm.max_clients must be at least 1"));
            }
            if self.shm.socket_mode > 0o777 {
                return Err(Error::invalid(format!(
                    "shm.socket_mode {:o} is not a permission mode (0o000 to 0o777)",
                    self.shm.socket_mode
                )));
            }
            if self.shm.reserve_ttl.0.is_zero() {
                return Err(Error::invalid("shm.reserve_ttl must be longer than zero"));
            }
        }
        if self.kv_events.enabled() {
            // Plaintext events stay on this host; the keys are well formed.
            self.kv_events.config()?.check_access()?;
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
        self.remote.signing_key()?;
        self.remote.codec_config()?;
        if self.cluster.enabled() {
            self.cluster.etcd_access()?;
        }
        if self.cluster.etcd_user.is_some() != self.cluster.etcd_password.is_some() {
            return Err(Error::invalid(
                "cluster.etcd_user and cluster.etcd_password go together",
            ));
        }
        // A withdrawn object is deleted after the grace: a shorter grace than the remote
        // read deadline could delete it under a read that started before the withdrawal.
        if let Some(grace) = self.cluster.gc_grace
            && grace.0 < self.remote.deadline.0
        {
            return Err(Error::invalid(format!(
                "cluster.gc_grace ({grace}) must be at least remote.deadline ({}): a read \
                 that started before an object was withdrawn may run that long, and the \
                 object must outlive it",
                self.remote.deadline
            )));
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
        // An unset setting is left out, and reads back unset.
        assert!(!text.contains("admin_token"), "{text}");
        assert_eq!(back.auth.admin_token, None);
    }

    #[test]
    fn the_ssd_codec_reads_by_name_per_namespace_too_and_a_lossy_or_unknown_one_is_refused() {
        let digest = "00112233445566778899aabbccddeeff";
        let text = format!(
            "[ssd]\ncodec = \"lossless\"\n[ssd.namespace_codecs]\n\"{digest}\" = \"raw\"\n"
        );
        let s: Settings = toml::from_str(&text).unwrap();
        s.validate().unwrap();
        let config = s.ssd.codec_config().unwrap();
        assert_eq!(config.default, Codec::Lossless);
        let d = LayoutDigest::from_hex(digest).unwrap();
        assert_eq!(config.namespaces.get(&d), Some(&Codec::Raw));
        let back: Settings = toml::from_str(&s.to_toml_redacted().unwrap()).unwrap();
        assert_eq!(back, s);
        assert!(toml::from_str::<Settings>("[ssd]\ncodec = \"zstd\"\n").is_err());
        let mut bad = Settings::default();
        bad.ssd.codec = Codec::Fp8E4M3;
        assert!(bad.validate().unwrap_err().to_string().contains("lossy"));
        let mut bad = Settings::default();
        bad.ssd
            .namespace_codecs
            .insert("xyz".into(), Codec::Lossless);
        assert!(bad.validate().unwrap_err().to_string().contains("xyz"));
        assert_eq!(Settings::default().ssd.codec, Codec::Raw);
    }

    #[test]
    fn the_remote_codec_reads_like_the_ssd_one_and_names_its_section_when_refused() {
        let digest = "00112233445566778899aabbccddeeff";
        let text = format!(
            "[remote]\ncodec = \"lossless\"\n[remote.namespace_codecs]\n\"{digest}\" = \"raw\"\n"
        );
        let s: Settings = toml::from_str(&text).unwrap();
        s.validate().unwrap();
        let config = s.remote.codec_config().unwrap();
        assert_eq!(config.default, Codec::Lossless);
        let d = LayoutDigest::from_hex(digest).unwrap();
        assert_eq!(config.namespaces.get(&d), Some(&Codec::Raw));
        // The SSD's setting is its own.
        assert_eq!(s.ssd.codec, Codec::Raw);
        let mut bad = Settings::default();
        bad.remote.codec = Codec::Fp8E4M3;
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("remote.codec") && e.contains("lossy"), "{e}");
        let mut bad = Settings::default();
        bad.remote.namespace_codecs.insert("xyz".into(), Codec::Raw);
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("remote.namespace_codecs"), "{e}");
        assert_eq!(Settings::default().remote.codec, Codec::Raw);
    }

    #[test]
    fn tenant_tokens_and_the_curve_key_are_redacted_when_the_settings_are_printed() {
        let mut s = Settings::default();
        s.auth.tenants.insert(
            "acme".into(),
            TenantToken {
                token: "acme-secret-token-0001".into(),
                salt: "ac01".into(),
            },
        );
        s.kv_events.endpoint = "tcp://127.0.0.1:0".into();
        s.kv_events.curve_secret_key = Some("R2QG^qS$!VZM?:U0olh&}X]]IoH*gH!q7DDIrx*)".into());
        s.validate().unwrap();
        let text = s.to_toml_redacted().unwrap();
        assert!(!text.contains("acme-secret-token-0001"), "{text}");
        assert!(!text.contains("R2QG^qS"), "{text}");
        assert!(text.contains("[auth.tenants.acme]"), "{text}");
        assert!(text.contains("salt = \"ac01\""), "{text}");
    }

    #[test]
    fn a_signing_key_is_checked_at_start_and_never_printed() {
        let mut s = Settings::default();
        let key = "0123456789abcdef".repeat(4);
        s.remote.signing_key = Some(key.clone());
        s.validate().unwrap();
        assert!(s.remote.signing_key().unwrap().is_some());
        let text = s.to_toml_redacted().unwrap();
        assert!(!text.contains(&key), "{text}");
        assert!(text.contains("signing_key = \"<redacted>\""), "{text}");
        for bad in ["", "abc", &"zz".repeat(32), &format!("{key}00")] {
            s.remote.signing_key = Some(bad.to_string());
            let e = s.validate().unwrap_err();
            assert!(e.message().contains("remote.signing_key"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_gc_grace_shorter_than_the_remote_read_deadline_is_refused() {
        let mut s = Settings::default();
        s.remote.deadline = HumanDuration(Duration::from_secs(2));
        for refused in [Duration::ZERO, Duration::from_millis(1999)] {
            s.cluster.gc_grace = Some(HumanDuration(refused));
            let e = s.validate().unwrap_err();
            assert!(e.message().contains("cluster.gc_grace"), "{e}");
        }
        for accepted in [Duration::from_secs(2), Duration::from_secs(30)] {
            s.cluster.gc_grace = Some(HumanDuration(accepted));
            s.validate().unwrap();
        }
        s.cluster.gc_grace = None; // the default: the deadline plus an allowance
        s.validate().unwrap();
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
