//! [`RemoteTier`]: kvtier's tier on S3-compatible object storage (object_store's S3
//! client), with the object layout of [`crate::object`].
//!
//! - **Hits are one GET.** The tier keeps, in memory, which run object and which slot of
//!   it holds each block; [`Tier::get_run`](kvtier_core::tier::Tier::get_run) serves
//!   consecutive blocks of one object with one ranged GET and checks each block's CRC-32C
//!   from the manifest.
//! - **Misses, never errors.** A 404 is a miss and forgets every block of that object
//!   (reported to the sink); 5xx, resets and timeouts are retried with backoff inside
//!   [`RemoteConfig::deadline`], then the call is a miss. A load never waits past the
//!   deadline, whatever the endpoint does.
//! - **Writes** (through the engine's write-behind queue) group consecutive blocks of a
//!   chain into one object; when the run's parent is already in an object that starts at
//!   the chain's root, the new object repeats those bytes first (read with one GET), so
//!   the longer prefix is again one range from offset 0. The manifest goes last.
//! - **Codecs** (ADR 0021): with [`RemoteConfig::codec`] set, the writer thread encodes
//!   each page where it shrinks and the manifest says so; hits decode on the loading
//!   thread (several blocks at once); a write a caller waits on stays raw.
//! - **Objects learned elsewhere** come through a [`Catalog`]: at open it names objects
//!   (by default [`ListCatalog`]: every manifest listed under the prefix) and the tier
//!   adopts each after checking its manifest against the object's name
//!   ([`RemoteTier::adopt`]); [`RemoteTier::forget`] and [`RemoteTier::delete`] take
//!   objects back. The catalog hears of every object the tier writes or deletes.
//! - **Runtime**: requests run on an [`IoRuntime`] lent by the assembly (one per node),
//!   never on the caller's; the tier holds a clone, so the runtime outlives it.
//!
//! The tier in files of one concept each: this one holds its state, how it opens and
//! what the rest of the crate reads of it; `registry.rs` the objects it knows (listing,
//! adoption, checks, forgetting, deleting); `write.rs` the write path (runs into objects);
//! `serve.rs` the `Tier` implementation (hits, misses, stats). The S3 client and the
//! blocking bridge to its runtime are in `crate::s3`.

mod delete;
mod registry;
mod serve;
mod write;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_codec::PageCoder;
use kvtier_core::hash::BlockHash;
use kvtier_core::snapshot::SnapshotKey;
use kvtier_core::tier::ResidencySink;
use kvtier_core::{Error, Result};
use object_store::ObjectStore;
use parking_lot::RwLock;

use crate::catalog::{Catalog, ListCatalog};
use crate::config::RemoteConfig;
use crate::direct::DirectReader;
use crate::object::RunObject;
use crate::placement::{Placement, Target};
use crate::recv::RecvPool;
use crate::runtime::IoRuntime;
use crate::s3::{Fetch, build_store, call_within};
use crate::state::StateName;

/// Where a block is: an object and its slot in it.
#[derive(Debug, Clone)]
struct Slot {
    object: Arc<RunObject>,
    index: usize,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    stores: AtomicU64,
    dedup_skips: AtomicU64,
    io_errors: AtomicU64,
    removed_explicit: AtomicU64,
    removed_corrupt: AtomicU64,
    gets: AtomicU64,
    puts: AtomicU64,
    /// Objects known from a record whose manifest did not match it (or was not a chain).
    record_mismatches: AtomicU64,
    /// Manifests read to check an object known from a record.
    manifest_checks: AtomicU64,
    /// Manifests, blocks and state objects refused because they were not signed with the
    /// tier's signing key.
    unsigned: AtomicU64,
}

/// See the module docs.
pub struct RemoteTier {
    config: RemoteConfig,
    stores: Vec<Arc<dyn ObjectStore>>,
    /// Direct readers of the endpoints that allow them, by endpoint (`direct.rs`).
    direct: Vec<Option<DirectReader>>,
    placement: Placement,
    /// Lent by the assembly; this clone keeps it running as long as the tier exists.
    runtime: IoRuntime,
    blocks: RwLock<HashMap<BlockHash, Slot>>,
    /// Every object adopted or written, by data name: what `forget` and `check` find
    /// objects by (blocks may have moved on to longer objects since).
    objects: RwLock<HashMap<String, Arc<RunObject>>>,
    sink: Arc<dyn ResidencySink>,
    catalog: Arc<dyn Catalog>,
    counters: Counters,
    /// Receive buffers of ranged GETs, reused.
    recv: Arc<RecvPool>,
    /// The state objects the tier serves, by snapshot key (`state.rs`).
    states: RwLock<HashMap<SnapshotKey, Arc<StateName>>>,
    /// How pages and states are encoded and decoded (ADR 0021).
    coder: PageCoder,
}

impl std::fmt::Debug for RemoteTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTier")
            .field("endpoints", &self.placement.targets())
            .field("prefix", &self.config.prefix)
            .finish_non_exhaustive()
    }
}

impl RemoteTier {
    /// Connects to the endpoints (no request is made for that), then lists the manifests
    /// under the prefix and reports the blocks they hold to `sink` ([`ListCatalog`]), on a
    /// runtime of the tier's own (two threads): for tests and tools that build one tier by
    /// hand. A node lends its runtime instead ([`RemoteTier::open_on`]). An endpoint that
    /// does not answer within the deadline is logged and skipped: the tier starts with
    /// what it could list.
    pub fn open(config: RemoteConfig, sink: Arc<dyn ResidencySink>) -> Result<Self> {
        Self::open_with_catalog(config, sink, Arc::new(ListCatalog))
    }
    /// [`RemoteTier::open`], learning of objects from `catalog` instead of a listing: the
    /// tier adopts each object the catalog names at open (checking its manifest) and tells
    /// it of every object it writes or deletes.
    pub fn open_with_catalog(
        config: RemoteConfig,
        sink: Arc<dyn ResidencySink>,
        catalog: Arc<dyn Catalog>,
    ) -> Result<Self> {
        Self::open_on(config, IoRuntime::new("kvtier-remote", 2)?, sink, catalog)
    }
    /// [`RemoteTier::open_with_catalog`] with requests running on `runtime`, lent by the
    /// assembly; the tier keeps it alive while it exists.
    pub fn open_on(
        config: RemoteConfig,
        runtime: IoRuntime,
        sink: Arc<dyn ResidencySink>,
        catalog: Arc<dyn Catalog>,
    ) -> Result<Self> {
        if config.endpoints.is_empty() {
            return Err(Error::invalid(
                "the remote tier needs at least one endpoint",
            ));
        }
        if config.prefix.is_empty() || config.prefix.contains("..") {
            return Err(Error::invalid(
                "the remote tier's prefix must be a plain non-empty name",
            ));
        }
        config
            .codec
            .validate()
            .map_err(|e| Error::invalid(format!("invalid remote codec settings: {e}")))?;
        let coder = PageCoder::new(config.codec.clone());
        let mut stores: Vec<Arc<dyn ObjectStore>> = Vec::new();
        for e in &config.endpoints {
            stores.push(Arc::new(build_store(e, &config)?));
        }
        let direct = config
            .endpoints
            .iter()
            .map(|e| DirectReader::for_endpoint(e, &config))
            .collect();
        let placement = Placement::new(config.endpoints.iter().map(|e| Target::new(e.id())));
        let tier = Self {
            config,
            stores,
            direct,
            placement,
            runtime,
            blocks: RwLock::new(HashMap::new()),
            objects: RwLock::new(HashMap::new()),
            sink,
            catalog,
            counters: Counters::default(),
            recv: Arc::default(),
            states: RwLock::new(HashMap::new()),
            coder,
        };
        tier.recover();
        Ok(tier)
    }
    /// Runs `fut` on the tier's runtime and waits at most the deadline (plus a margin for
    /// the runtime's own scheduling); safe to call from any thread, async or not.
    pub(crate) fn call<T: Send + 'static>(
        &self,
        fut: impl Future<Output = object_store::Result<T>> + Send + 'static,
    ) -> Fetch<T> {
        call_within(&self.runtime, self.config.deadline, fut)
    }
    pub(crate) fn target_of(&self, data_name: &str) -> usize {
        let chosen = self.placement.pick(data_name.as_bytes());
        self.placement
            .targets()
            .iter()
            .position(|t| Some(t) == chosen)
            .unwrap_or(0)
    }
    /// The settings.
    pub(crate) fn config(&self) -> &RemoteConfig {
        &self.config
    }
    /// How many endpoints the tier writes to and reads from.
    pub(crate) fn endpoints(&self) -> usize {
        self.stores.len()
    }
    /// The client of endpoint `index`.
    pub(crate) fn store(&self, index: usize) -> Arc<dyn ObjectStore> {
        self.stores[index].clone()
    }
    /// The state objects served, by key.
    pub(crate) fn states(&self) -> &RwLock<HashMap<SnapshotKey, Arc<StateName>>> {
        &self.states
    }
    /// The tier's coder (state objects encode and decode through it too).
    pub(crate) fn coder(&self) -> &PageCoder {
        &self.coder
    }
    /// The direct reader of endpoint `index`, if it may read object `name` (`direct.rs`).
    pub(crate) fn direct_for(&self, index: usize, name: &str) -> Option<&DirectReader> {
        self.direct.get(index)?.as_ref().filter(|d| d.reads(name))
    }
    /// Reads answered by direct readers so far (the rest went through object_store).
    pub fn direct_reads(&self) -> u64 {
        self.direct
            .iter()
            .flatten()
            .map(DirectReader::answered)
            .sum()
    }
    /// Receive buffers of GETs, reused.
    pub(crate) fn recv_pool(&self) -> &Arc<RecvPool> {
        &self.recv
    }
    /// The catalog the tier reports its writes to.
    pub(crate) fn catalog(&self) -> &Arc<dyn Catalog> {
        &self.catalog
    }
    pub(crate) fn count_put(&self) {
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn count_get(&self) {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn count_io_error(&self) {
        self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn count_unsigned(&self) {
        self.counters.unsigned.fetch_add(1, Ordering::Relaxed);
    }
    /// The cluster's signing key, if the tier has one.
    pub fn signing_key(&self) -> Option<&crate::SigningKey> {
        self.config.signing_key.as_ref()
    }
    pub(crate) fn count_corrupt(&self) {
        self.counters
            .removed_corrupt
            .fetch_add(1, Ordering::Relaxed);
    }
    /// Objects known from records whose manifest did not match (see
    /// [`RemoteTier::adopt_described`]), and manifests read to check such objects.
    pub fn record_checks(&self) -> (u64, u64) {
        (
            self.counters.record_mismatches.load(Ordering::Relaxed),
            self.counters.manifest_checks.load(Ordering::Relaxed),
        )
    }
    /// The id of endpoint `index` (`url/bucket`), as records name endpoints.
    pub fn endpoint_id(&self, index: usize) -> Option<String> {
        self.config.endpoints.get(index).map(|e| e.id())
    }
    /// The index of the endpoint with id `id` (`url/bucket`) — or, when no endpoint has
    /// that id, of the one endpoint with the same bucket: replicas may reach one bucket
    /// through different addresses (a proxy, another host name).
    pub fn endpoint_index(&self, id: &str) -> Option<usize> {
        let endpoints = &self.config.endpoints;
        if let Some(i) = endpoints.iter().position(|e| e.has_id(id)) {
            return Some(i);
        }
        let bucket = id.rsplit('/').next()?;
        let mut same = endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| e.bucket == bucket);
        match (same.next(), same.next()) {
            (Some((i, _)), None) => Some(i),
            _ => None,
        }
    }
    /// Remote requests made so far: `(ranged GETs of data, PUTs of objects)`.
    pub fn requests(&self) -> (u64, u64) {
        (
            self.counters.gets.load(Ordering::Relaxed),
            self.counters.puts.load(Ordering::Relaxed),
        )
    }
}
