//! [`RemoteTier`]: kvtier's tier on S3-compatible object storage (object_store's S3
//! client), with the object layout of [`crate::object`].
//!
//! - **Hits are one GET.** The tier keeps, in memory, which run object and which slot of
//!   it holds each block; [`Tier::get_run`] serves consecutive blocks of one object with one
//!   ranged GET and checks each block's CRC-32C from the manifest.
//! - **Misses, never errors.** A 404 is a miss and forgets every block of that object
//!   (reported to the sink); 5xx, resets and timeouts are retried with backoff inside
//!   [`RemoteConfig::deadline`], then the call is a miss. A load never waits past the
//!   deadline, whatever the endpoint does.
//! - **Writes** (through the engine's write-behind queue) group consecutive blocks of a
//!   chain into one object; when the run's parent is already in an object that starts at
//!   the chain's root, the new object repeats those bytes first (read with one GET), so
//!   the longer prefix is again one range from offset 0. The manifest goes last.
//! - **Objects learned elsewhere** come through a [`Catalog`]: at open it names objects
//!   (by default [`ListCatalog`]: every manifest listed under the prefix) and the tier
//!   adopts each after checking its manifest against the object's name
//!   ([`RemoteTier::adopt`]); [`RemoteTier::forget`] and [`RemoteTier::delete`] take
//!   objects back. The catalog hears of every object the tier writes or deletes.
//! - **Runtime**: requests run on an [`IoRuntime`] lent by the assembly (one per node),
//!   never on the caller's; the tier holds a clone, so the runtime outlives it.

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use kvtier_core::hash::BlockHash;
use kvtier_core::snapshot::SnapshotKey;
use kvtier_core::stats::TierStats;
use kvtier_core::tier::{
    BlockMeta, PutOutcome, RemovalCause, ResidencySink, SnapshotStore, Tier, TierKind,
};
use kvtier_core::{Error, ErrorKind, Result};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
};
use parking_lot::RwLock;
use sha2::{Digest, Sha256};

use crate::catalog::{Adopted, Catalog, ListCatalog, Listed, ObjectInfo, ObjectName};
use crate::config::RemoteConfig;
use crate::direct::DirectReader;
use crate::object::{Manifest, RunObject, crc, data_of, manifest_of, names};
use crate::placement::{Placement, Target};
use crate::recv::RecvPool;
use crate::runtime::IoRuntime;
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
}

impl std::fmt::Debug for RemoteTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTier")
            .field("endpoints", &self.placement.targets())
            .field("prefix", &self.config.prefix)
            .finish_non_exhaustive()
    }
}

/// What one remote call came to.
pub(crate) enum Fetch<T> {
    Got(T),
    /// 404: the object is gone.
    Gone,
    /// Failed after retries, or the deadline passed.
    Failed(CallError),
}

impl<T> Fetch<T> {
    /// The answer, changed by `f` if there is one.
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Fetch<U> {
        match self {
            Self::Got(v) => Fetch::Got(f(v)),
            Self::Gone => Fetch::Gone,
            Self::Failed(e) => Fetch::Failed(e),
        }
    }
}

/// Why a remote call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// The object store answered with an error (after its retries).
    #[error(transparent)]
    Store(object_store::Error),
    /// A direct read failed (after its retries).
    #[error(transparent)]
    Direct(crate::direct::DirectError),
    /// No answer within the deadline.
    #[error("no answer within {0:?}")]
    Deadline(Duration),
}

/// Why writing a run failed.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error("empty run")]
    EmptyRun,
    #[error("cannot encode the manifest")]
    Manifest(#[source] serde_json::Error),
    #[error("the bucket does not exist")]
    NoBucket,
    #[error(transparent)]
    Call(CallError),
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
        let deadline = self.config.deadline;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.runtime.handle().spawn(async move {
            let out = match tokio::time::timeout(deadline, fut).await {
                Ok(Ok(v)) => Fetch::Got(v),
                Ok(Err(object_store::Error::NotFound { .. })) => Fetch::Gone,
                Ok(Err(e)) => Fetch::Failed(CallError::Store(e)),
                Err(_) => Fetch::Failed(CallError::Deadline(deadline)),
            };
            let _ = tx.send(out);
        });
        rx.recv_timeout(deadline + Duration::from_millis(250))
            .unwrap_or_else(|_| Fetch::Failed(CallError::Deadline(deadline)))
    }

    pub(crate) fn target_of(&self, data_name: &str) -> usize {
        let chosen = self.placement.pick(data_name.as_bytes());
        self.placement
            .targets()
            .iter()
            .position(|t| Some(t) == chosen)
            .unwrap_or(0)
    }

    /// Adopts every object the catalog names at open.
    fn recover(&self) {
        let names = self.catalog.at_open(self);
        let (mut objects, mut refused) = (0usize, 0usize);
        for name in &names {
            match self.adopt(name) {
                Adopted::Blocks(_) => objects += 1,
                Adopted::Refused(why) => {
                    refused += 1;
                    tracing::warn!(manifest = %name.manifest, reason = %why, "remote tier: not adopting an object");
                }
                Adopted::Unreachable(why) => {
                    tracing::warn!(manifest = %name.manifest, reason = %why, "remote tier: cannot read a manifest; starting without it");
                }
            }
        }
        // State objects are few and self-describing: listed, not read, at every open
        // (in cluster mode too, so a state whose advertisement was lost is still found).
        let states = self.list_states();
        for state in &states {
            self.adopt_state(state);
        }
        tracing::info!(
            objects,
            refused,
            blocks = self.blocks.read().len(),
            states = states.len(),
            "remote tier recovered"
        );
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

    /// Receive buffers of GETs, reused.
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

    pub(crate) fn count_corrupt(&self) {
        self.counters
            .removed_corrupt
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Every manifest under the prefix, on every endpoint (what [`ListCatalog`] names). An
    /// endpoint that cannot be listed within the deadline is logged and skipped.
    pub fn list_manifests(&self) -> Vec<ObjectName> {
        self.list_objects()
            .into_iter()
            .filter(|o| o.name.ends_with(".kvm"))
            .map(|o| ObjectName {
                endpoint: o.endpoint,
                manifest: o.name,
            })
            .collect()
    }

    /// Every object under the prefix (manifests, data and anything else), on every
    /// endpoint, with when it was written. An endpoint that cannot be listed within the
    /// deadline is logged and skipped.
    pub fn list_objects(&self) -> Vec<Listed> {
        self.list_under(&self.config.prefix)
    }

    /// Every object under `prefix` on every endpoint (see [`RemoteTier::list_objects`]).
    pub(crate) fn list_under(&self, prefix: &str) -> Vec<Listed> {
        let mut found = Vec::new();
        for (t, store) in self.stores.iter().enumerate() {
            let store = store.clone();
            let prefix = Path::from(prefix);
            let listed = self.call(async move {
                let mut names = Vec::new();
                let mut list = store.list(Some(&prefix));
                while let Some(meta) = list.next().await {
                    let meta = meta?;
                    names.push(Listed {
                        endpoint: t,
                        name: meta.location.to_string(),
                        modified_ms: meta.last_modified.timestamp_millis().max(0) as u64,
                        size: meta.size,
                    });
                }
                Ok(names)
            });
            match listed {
                Fetch::Got(names) => found.extend(names),
                Fetch::Gone => {}
                Fetch::Failed(e) => {
                    tracing::warn!(endpoint = %self.placement.targets()[t].id, error = %e, "remote tier: cannot list objects; going on without them");
                    self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        found
    }

    /// Reads `name`'s manifest and describes the object if the manifest checks out (the
    /// same checks as [`RemoteTier::adopt`]), without serving it: what a repair tool
    /// advertises.
    pub fn read_described(&self, name: &ObjectName) -> std::result::Result<ObjectInfo, String> {
        let store = self
            .stores
            .get(name.endpoint)
            .cloned()
            .ok_or_else(|| format!("endpoint {} is not one of the tier's", name.endpoint))?;
        let path = Path::from(name.manifest.as_str());
        let bytes = match self.call(async move { store.get(&path).await?.bytes().await }) {
            Fetch::Got(b) => b,
            Fetch::Gone => return Err("the manifest is gone".into()),
            Fetch::Failed(e) => return Err(e.to_string()),
        };
        let object = checked_manifest(&bytes, name, &self.config.prefix)?;
        Ok(object.info(name.manifest.clone(), Sha256::digest(&bytes).into()))
    }

    /// Reads `name`'s manifest and, if it describes exactly the object its name says (a
    /// chain of blocks under this tier's prefix whose first and last hashes name it, with
    /// a checksum per block), makes its blocks servable. A block already held in a shorter
    /// object moves to this one (the longer run from the root is read with one GET).
    pub fn adopt(&self, name: &ObjectName) -> Adopted {
        let Some(store) = self.stores.get(name.endpoint).cloned() else {
            return Adopted::Refused(format!(
                "endpoint {} is not one of the tier's {}",
                name.endpoint,
                self.stores.len()
            ));
        };
        let path = Path::from(name.manifest.as_str());
        let bytes = match self.call(async move { store.get(&path).await?.bytes().await }) {
            Fetch::Got(b) => b,
            Fetch::Gone => return Adopted::Unreachable("the manifest is gone".into()),
            Fetch::Failed(e) => {
                self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
                // A value for the catalog to log or retry, not an error: its text.
                return Adopted::Unreachable(e.to_string());
            }
        };
        let object = match checked_manifest(&bytes, name, &self.config.prefix) {
            Ok(o) => o,
            Err(why) => return Adopted::Refused(why),
        };
        Adopted::Blocks(self.index_object(object))
    }

    /// Makes `object`'s blocks servable (a block already held in a shorter object moves
    /// to this one) and registers it by name; returns how many blocks were new.
    fn index_object(&self, object: Arc<RunObject>) -> usize {
        let known = self.objects.read().get(&object.data_name).cloned();
        if let Some(known) = known.filter(|k| k.target == object.target) {
            // Known already: adopting it again changes nothing, except that a checked
            // manifest completes an object known from a record only.
            if known.pending.is_some() && object.pending.is_none() {
                let _ = self.replace_object(&known, &object);
            }
            return 0;
        }
        self.objects
            .write()
            .insert(object.data_name.clone(), object.clone());
        let mut blocks = self.blocks.write();
        let mut new: Vec<&BlockMeta> = Vec::new();
        for (i, m) in object.metas.iter().enumerate() {
            // Prefer the object holding the longer run from the root.
            let held = blocks.get(&m.hash);
            if held.is_none_or(|s| s.object.metas.len() < object.metas.len()) {
                if held.is_none() {
                    new.push(m);
                }
                blocks.insert(
                    m.hash,
                    Slot {
                        object: object.clone(),
                        index: i,
                    },
                );
            }
        }
        self.sink.inserted_many(TierKind::Remote, &new);
        new.len()
    }

    /// Adopts an object a cluster record describes, without reading anything: the record
    /// must name an object under this tier's prefix whose name matches its layout and its
    /// first and last hashes, and a chain that hangs off the layout's root when it starts
    /// at position 0. Its blocks are indexed by hash (their tokens are not known yet);
    /// the manifest is read and checked against the record — digest, chain, hashes —
    /// before any byte of the object is served ([`RemoteTier::check`], or the first load).
    pub fn adopt_described(&self, info: &ObjectInfo) -> Adopted {
        let name = &info.name;
        if name.endpoint >= self.stores.len() {
            return Adopted::Refused(format!(
                "endpoint {} is not one of the tier's {}",
                name.endpoint,
                self.stores.len()
            ));
        }
        let (Some(first), Some(last)) = (info.blocks.first(), info.blocks.last()) else {
            return Adopted::Refused("the record names no blocks".into());
        };
        if info.block_bytes == 0 {
            return Adopted::Refused("the record's blocks are empty".into());
        }
        if info
            .first_position
            .checked_add(info.blocks.len() as u32)
            .is_none()
        {
            return Adopted::Refused("the record's chain positions overflow".into());
        }
        if info.first_position == 0 && info.first_parent != BlockHash::from(info.layout) {
            return Adopted::Refused(
                "a chain from position 0 must hang off the layout's root".into(),
            );
        }
        let stem = crate::object::stem(&self.config.prefix, &info.layout, first, last, None);
        let writer = name
            .manifest
            .strip_prefix(stem.as_str())
            .and_then(|rest| rest.strip_suffix(".kvm"));
        let named_right = match writer {
            Some("") => true,
            Some(rest) => rest
                .strip_prefix(".w.")
                .is_some_and(crate::object::valid_writer_tag),
            None => false,
        };
        if !named_right {
            return Adopted::Refused(format!(
                "`{}` is not the name of this run under prefix `{}`",
                name.manifest, self.config.prefix
            ));
        }
        let Some(data_name) = data_of(&name.manifest) else {
            return Adopted::Refused("not a manifest name".into());
        };
        if let Some(known) = self.objects.read().get(&data_name)
            && known.target == name.endpoint
        {
            return Adopted::Blocks(0);
        }
        let mut parent = info.first_parent;
        let metas = info
            .blocks
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let m =
                    BlockMeta::described(info.layout, *h, parent, info.first_position + i as u32);
                parent = *h;
                m
            })
            .collect();
        let object = Arc::new(RunObject {
            target: name.endpoint,
            data_name,
            metas,
            crcs: Vec::new(),
            block_bytes: info.block_bytes,
            pending: Some(info.manifest_digest),
        });
        Adopted::Blocks(self.index_object(object))
    }

    /// Whether the tier serves `name` already, its manifest checked (it wrote the object,
    /// or adopted and checked it): a record naming it again changes nothing.
    pub fn serves(&self, name: &ObjectName) -> bool {
        data_of(&name.manifest)
            .and_then(|d| {
                self.objects
                    .read()
                    .get(&d)
                    .map(|o| o.target == name.endpoint && o.pending.is_none())
            })
            .unwrap_or(false)
    }

    /// Reads and checks the manifest of `name` if it is known from a record only, so its
    /// first load is one GET; true when the object is (now) servable. A manifest that
    /// does not match its record drops the object (counted); one that cannot be read in
    /// time leaves it for the next try.
    pub fn check(&self, name: &ObjectName) -> bool {
        let Some(data_name) = data_of(&name.manifest) else {
            return false;
        };
        let Some(object) = self.objects.read().get(&data_name).cloned() else {
            return false;
        };
        self.checked(&object).is_some()
    }

    /// `object` itself when its manifest was checked, else the checked object that now
    /// stands for it (its blocks re-indexed with their tokens), or `None`.
    fn checked(&self, object: &Arc<RunObject>) -> Option<Arc<RunObject>> {
        let Some(digest) = object.pending else {
            return Some(object.clone());
        };
        // Another caller may have checked it meanwhile.
        if let Some(now) = self.objects.read().get(&object.data_name)
            && now.pending.is_none()
        {
            return Some(now.clone());
        }
        let store = self.stores[object.target].clone();
        let manifest_name = manifest_of(&object.data_name)?;
        let path = Path::from(manifest_name.as_str());
        self.counters
            .manifest_checks
            .fetch_add(1, Ordering::Relaxed);
        let bytes = match self.call(async move { store.get(&path).await?.bytes().await }) {
            Fetch::Got(b) => b,
            Fetch::Gone => {
                tracing::info!(object = %object.data_name, "an advertised object's manifest is gone; forgetting it");
                self.forget_object(object, RemovalCause::Explicit);
                return None;
            }
            Fetch::Failed(e) => {
                self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(object = %object.data_name, error = %e, "cannot read an advertised object's manifest; a miss");
                return None;
            }
        };
        let name = ObjectName {
            endpoint: object.target,
            manifest: manifest_name,
        };
        let verdict = if <[u8; 32]>::from(Sha256::digest(&bytes)) != digest {
            Err("its manifest is not the one the record names (digest)".to_string())
        } else {
            checked_manifest(&bytes, &name, &self.config.prefix).and_then(|full| {
                let same = full.block_bytes == object.block_bytes
                    && full.metas.len() == object.metas.len()
                    && full
                        .metas
                        .iter()
                        .zip(&object.metas)
                        .all(|(a, b)| a.same_place(b));
                if same {
                    Ok(full)
                } else {
                    Err("its manifest describes other blocks than the record".to_string())
                }
            })
        };
        match verdict {
            Ok(full) => Some(self.replace_object(object, &full)),
            Err(why) => {
                self.counters
                    .record_mismatches
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(object = %object.data_name, reason = %why, "an advertised object does not match its record; never serving it");
                self.forget_object(object, RemovalCause::Corrupt);
                let mut objects = self.objects.write();
                if objects
                    .get(&object.data_name)
                    .is_some_and(|now| Arc::ptr_eq(now, object))
                {
                    objects.remove(&object.data_name);
                }
                None
            }
        }
    }

    /// Puts `full` (the checked object) wherever `known` (the same object, known from a
    /// record only) stands, and tells the index the blocks' tokens. Returns the object
    /// that now stands for it: `full`, or the one another caller checked first.
    fn replace_object(&self, known: &Arc<RunObject>, full: &Arc<RunObject>) -> Arc<RunObject> {
        {
            let mut objects = self.objects.write();
            if let Some(now) = objects.get(&full.data_name)
                && !Arc::ptr_eq(now, known)
            {
                // Checked (or forgotten and adopted again) meanwhile: that one stands.
                return now.clone();
            }
            objects.insert(full.data_name.clone(), full.clone());
        }
        let mut blocks = self.blocks.write();
        for m in &full.metas {
            if let Some(slot) = blocks.get_mut(&m.hash)
                && Arc::ptr_eq(&slot.object, known)
            {
                slot.object = full.clone();
            }
        }
        drop(blocks);
        let metas: Vec<&BlockMeta> = full.metas.iter().collect();
        self.sink.inserted_many(TierKind::Remote, &metas);
        full.clone()
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

    /// Stops serving from `name` (a catalog learned it is withdrawn): every block held in
    /// that object is forgotten (reported to the sink as removed on request); the object
    /// itself is left in the store. Returns how many blocks were forgotten.
    pub fn forget(&self, name: &ObjectName) -> usize {
        let Some(data_name) = data_of(&name.manifest) else {
            return 0;
        };
        let Some(object) = self.objects.write().remove(&data_name) else {
            return 0;
        };
        if object.target != name.endpoint {
            self.objects.write().insert(data_name, object);
            return 0;
        }
        self.forget_object(&object, RemovalCause::Explicit)
    }

    /// Deletes `name` from the store — the manifest first, so no reader adopts an object
    /// whose data is going — then its data, forgets its blocks and tells the catalog.
    /// Objects are shared: only the replica that owns an object should delete it (the
    /// catalog's rule). An object already gone counts as deleted. Returns how many blocks
    /// were forgotten; an error says what could not be deleted.
    pub fn delete(&self, name: &ObjectName) -> Result<usize> {
        let store = self.stores.get(name.endpoint).cloned().ok_or_else(|| {
            Error::invalid(format!(
                "endpoint {} is not one of the tier's {}",
                name.endpoint,
                self.stores.len()
            ))
        })?;
        let data_name = data_of(&name.manifest)
            .ok_or_else(|| Error::invalid(format!("`{}` is not a manifest name", name.manifest)))?;
        for object in [name.manifest.clone(), data_name] {
            let store = store.clone();
            let path = Path::from(object.as_str());
            match self.call(async move { store.delete(&path).await }) {
                Fetch::Got(()) | Fetch::Gone => {}
                Fetch::Failed(e) => {
                    self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
                    // Without its manifest nobody adopts the object: forget it either way.
                    let forgotten = self.forget(name);
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "cannot delete remote object `{object}` ({forgotten} blocks forgotten)"
                        ),
                    )
                    .with_source(e));
                }
            }
        }
        let forgotten = self.forget(name);
        self.catalog.deleted(name);
        Ok(forgotten)
    }

    /// Forgets every block that points at `object` (it is gone, corrupt or withdrawn);
    /// returns how many.
    fn forget_object(&self, object: &Arc<RunObject>, cause: RemovalCause) -> usize {
        let mut forgotten = 0;
        let mut blocks = self.blocks.write();
        for m in &object.metas {
            if blocks
                .get(&m.hash)
                .is_some_and(|s| Arc::ptr_eq(&s.object, object))
            {
                blocks.remove(&m.hash);
                self.sink.removed(TierKind::Remote, m, cause, None);
                let c = match cause {
                    RemovalCause::Corrupt => &self.counters.removed_corrupt,
                    _ => &self.counters.removed_explicit,
                };
                c.fetch_add(1, Ordering::Relaxed);
                forgotten += 1;
            }
        }
        forgotten
    }

    /// One ranged GET of slots `range` of `object`, each block verified.
    fn fetch(&self, object: &Arc<RunObject>, range: Range<usize>) -> Option<Vec<Bytes>> {
        // An object known from a record is served only once its manifest checked out.
        let object = &self.checked(object)?;
        let b = object.block_bytes;
        let bytes_range = range.start as u64 * b..range.end as u64 * b;
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        let want = bytes_range.end - bytes_range.start;
        let read = match self.direct_for(object.target, &object.data_name) {
            Some(direct) => direct
                .get(&object.data_name, Some(bytes_range), want, None, &self.recv)
                .map(|got| self.recv.freeze(got.body)),
            None => {
                let store = self.stores[object.target].clone();
                let path = Path::from(object.data_name.as_str());
                let pool = self.recv.clone();
                self.call(async move {
                    let options = GetOptions::new().with_range(Some(bytes_range));
                    let mut body = store.get_opts(&path, options).await?.into_stream();
                    // Into a reused buffer (see `recv.rs`); a body longer or shorter than
                    // asked for is caught by the length check below.
                    let mut buf = pool.take(want as usize);
                    while let Some(chunk) = body.next().await {
                        buf.extend_from_slice(&chunk?);
                    }
                    Ok(pool.freeze(buf))
                })
            }
        };
        match read {
            Fetch::Got(bytes) => {
                if bytes.len() as u64 != (range.end - range.start) as u64 * b {
                    tracing::error!(object = %object.data_name, "remote object shorter than its manifest; dropping it");
                    self.forget_object(object, RemovalCause::Corrupt);
                    return None;
                }
                let mut out = Vec::with_capacity(range.len());
                for (k, slot) in range.enumerate() {
                    let block = bytes.slice(k * b as usize..(k + 1) * b as usize);
                    if crc(&block) != object.crcs[slot] {
                        tracing::error!(object = %object.data_name, slot, "remote block failed its checksum; dropping the object");
                        self.forget_object(object, RemovalCause::Corrupt);
                        return None;
                    }
                    out.push(block);
                }
                Some(out)
            }
            Fetch::Gone => {
                tracing::info!(object = %object.data_name, "remote object is gone; forgetting its blocks");
                self.forget_object(object, RemovalCause::Explicit);
                None
            }
            Fetch::Failed(e) => {
                self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(object = %object.data_name, error = %e, "remote read failed; a miss");
                None
            }
        }
    }

    /// The payloads of the run that ends with `parent` from the chain's root, if one
    /// object holds it from position 0 and it can be read in time.
    fn ancestors(&self, parent: &BlockHash) -> Option<(Vec<BlockMeta>, Vec<u32>, Vec<Bytes>)> {
        let slot = self.blocks.read().get(parent).cloned()?;
        if slot.object.metas.first()?.position != 0 {
            return None;
        }
        let blocks = self.fetch(&slot.object, 0..slot.index + 1)?;
        Some((
            slot.object.metas[..=slot.index].to_vec(),
            slot.object.crcs[..=slot.index].to_vec(),
            blocks,
        ))
    }

    /// Writes one run (consecutive blocks of one chain) as one object, its ancestors first
    /// when they can be had.
    fn write_run(&self, run: &[(BlockMeta, Bytes)]) -> std::result::Result<(), WriteError> {
        let (first, _) = run.first().ok_or(WriteError::EmptyRun)?;
        let block_bytes = run[0].1.len() as u64;
        let (mut metas, mut crcs, mut payloads) = if first.position > 0 {
            self.ancestors(&first.parent).unwrap_or_default()
        } else {
            Default::default()
        };
        if payloads.iter().any(|p| p.len() as u64 != block_bytes) {
            (metas, crcs, payloads) = Default::default();
        }
        for (m, p) in run {
            metas.push(m.clone());
            crcs.push(crc(p));
            payloads.push(p.clone());
        }
        let writer = self
            .catalog
            .writer_tag()
            .filter(|t| crate::object::valid_writer_tag(t));
        let (data_name, manifest_name) =
            names(&self.config.prefix, &metas, writer.as_deref()).ok_or(WriteError::EmptyRun)?;
        let manifest =
            Manifest::of(&metas, &crcs, block_bytes, writer).ok_or(WriteError::EmptyRun)?;
        let manifest = serde_json::to_vec(&manifest).map_err(WriteError::Manifest)?;
        let manifest_digest: [u8; 32] = Sha256::digest(&manifest).into();
        let mut data = BytesMut::with_capacity(payloads.len() * block_bytes as usize);
        for p in &payloads {
            data.extend_from_slice(p);
        }
        let target = self.target_of(&data_name);
        let store = self.stores[target].clone();
        let (dpath, mpath) = (
            Path::from(data_name.as_str()),
            Path::from(manifest_name.as_str()),
        );
        let data = data.freeze();
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        // Data first, manifest last: the manifest is the commit point.
        match self.call(async move {
            store.put(&dpath, PutPayload::from_bytes(data)).await?;
            store.put(&mpath, PutPayload::from(manifest)).await?;
            Ok(())
        }) {
            Fetch::Got(()) => {}
            Fetch::Gone => return Err(WriteError::NoBucket),
            Fetch::Failed(e) => return Err(WriteError::Call(e)),
        }
        let object = Arc::new(RunObject {
            target,
            data_name,
            metas,
            crcs,
            block_bytes,
            pending: None,
        });
        self.objects
            .write()
            .insert(object.data_name.clone(), object.clone());
        let mut blocks = self.blocks.write();
        for (i, m) in object.metas.iter().enumerate() {
            let new = !blocks.contains_key(&m.hash);
            blocks.insert(
                m.hash,
                Slot {
                    object: object.clone(),
                    index: i,
                },
            );
            if new {
                self.sink.inserted(TierKind::Remote, m);
            }
        }
        drop(blocks);
        self.catalog
            .wrote(&object.info(manifest_name, manifest_digest));
        Ok(())
    }

    /// Remote requests made so far: `(ranged GETs of data, PUTs of objects)`.
    pub fn requests(&self) -> (u64, u64) {
        (
            self.counters.gets.load(Ordering::Relaxed),
            self.counters.puts.load(Ordering::Relaxed),
        )
    }
}

fn build_store(
    e: &crate::config::Endpoint,
    config: &RemoteConfig,
) -> Result<object_store::aws::AmazonS3> {
    let mut b = AmazonS3Builder::from_env()
        .with_endpoint(e.url.trim_end_matches('/'))
        .with_bucket_name(&e.bucket)
        .with_region(&e.region)
        .with_virtual_hosted_style_request(false)
        .with_skip_signature(e.unsigned)
        .with_retry(RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(20),
                max_backoff: config.deadline / 4,
                base: 2.0,
            },
            max_retries: config.retries,
            retry_timeout: config.deadline,
        })
        .with_client_options(
            // Client options replace the builder's: allow_http must be set here.
            ClientOptions::new()
                .with_allow_http(e.url.starts_with("http://"))
                .with_timeout(config.deadline)
                .with_connect_timeout(config.deadline.min(Duration::from_secs(1))),
        );
    if let Some(k) = &e.access_key {
        b = b.with_access_key_id(k);
    }
    if let Some(s) = &e.secret_key {
        b = b.with_secret_access_key(s);
    }
    b.build()
        .map_err(|err| Error::invalid(format!("remote endpoint {}", e.id())).with_source(err))
}

/// The object `bytes` (the manifest read from `name`) describes, if it is exactly the
/// object its name says: a chain of blocks of one size whose names under `prefix` are
/// `name`. A manifest copied under another name, or naming another prefix, describes
/// blocks the tier must not serve from that object.
fn checked_manifest(
    bytes: &[u8],
    name: &ObjectName,
    prefix: &str,
) -> std::result::Result<Arc<RunObject>, String> {
    let manifest: Manifest =
        serde_json::from_slice(bytes).map_err(|e| format!("the manifest is not JSON: {e}"))?;
    let metas = manifest
        .metas()
        .ok_or("the manifest does not describe a chain of blocks")?;
    if manifest.block_bytes == 0 {
        return Err("the manifest's blocks are empty".into());
    }
    if let Some(w) = &manifest.writer
        && !crate::object::valid_writer_tag(w)
    {
        return Err("the manifest's writer tag is not a plain name".into());
    }
    let (data_name, manifest_name) =
        names(prefix, &metas, manifest.writer.as_deref()).ok_or("the manifest has no blocks")?;
    if manifest_name != name.manifest {
        return Err(format!(
            "the manifest describes `{manifest_name}`, not the object it is stored as"
        ));
    }
    Ok(Arc::new(RunObject {
        target: name.endpoint,
        data_name,
        crcs: manifest.blocks.iter().map(|b| b.crc32c).collect(),
        metas,
        block_bytes: manifest.block_bytes,
        pending: None,
    }))
}

/// Splits `items` into runs: consecutive blocks of one chain (each the parent of the
/// next, same layout and size), at most `max` blocks each.
fn runs(items: &[(BlockMeta, Bytes)], max: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=items.len() {
        let cut = i == items.len()
            || i - start >= max
            || items[i].0.parent != items[i - 1].0.hash
            || items[i].0.layout != items[i - 1].0.layout
            || items[i].1.len() != items[i - 1].1.len();
        if cut {
            out.push(start..i);
            start = i;
        }
    }
    out
}

impl Tier for RemoteTier {
    fn kind(&self) -> TierKind {
        TierKind::Remote
    }

    fn put(&self, meta: &BlockMeta, payload: Bytes) -> Result<PutOutcome> {
        self.put_many(&[(meta.clone(), payload)])
            .pop()
            .unwrap_or(Ok(PutOutcome::Duplicate))
    }

    fn put_many(&self, items: &[(BlockMeta, Bytes)]) -> Vec<Result<PutOutcome>> {
        let mut out: Vec<Result<PutOutcome>> = Vec::with_capacity(items.len());
        for run in runs(items, self.config.max_run_blocks.max(1)) {
            let slice = &items[run.clone()];
            // Already held blocks at the run's start are refreshed, not rewritten.
            let held = {
                let blocks = self.blocks.read();
                slice
                    .iter()
                    .take_while(|(m, _)| blocks.contains_key(&m.hash))
                    .count()
            };
            for _ in 0..held {
                self.counters.dedup_skips.fetch_add(1, Ordering::Relaxed);
                out.push(Ok(PutOutcome::Duplicate));
            }
            let rest = &slice[held..];
            if rest.is_empty() {
                continue;
            }
            match self.write_run(rest) {
                Ok(()) => {
                    self.counters
                        .stores
                        .fetch_add(rest.len() as u64, Ordering::Relaxed);
                    out.extend(rest.iter().map(|_| Ok(PutOutcome::Stored)));
                }
                Err(e) => {
                    self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
                    // One cause, shared by the error of every block the run carried.
                    let err = Error::new(
                        ErrorKind::Unavailable,
                        format!("remote write of {} blocks failed", rest.len()),
                    )
                    .with_source(e);
                    out.extend(rest.iter().map(|_| Err(err.clone())));
                }
            }
        }
        out
    }

    fn get(&self, hash: &BlockHash) -> Result<Option<Bytes>> {
        Ok(self.get_run(std::slice::from_ref(hash))?.pop())
    }

    fn get_run(&self, hashes: &[BlockHash]) -> Result<Vec<Bytes>> {
        let mut out: Vec<Bytes> = Vec::with_capacity(hashes.len());
        while out.len() < hashes.len() {
            let rest = &hashes[out.len()..];
            let Some(slot) = self.blocks.read().get(&rest[0]).cloned() else {
                break;
            };
            // How far the asked-for run continues in this object.
            let n = rest
                .iter()
                .zip(&slot.object.metas[slot.index..])
                .take_while(|(h, m)| **h == m.hash)
                .count();
            match self.fetch(&slot.object, slot.index..slot.index + n) {
                Some(blocks) => out.extend(blocks),
                None => break,
            }
        }
        self.counters
            .hits
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        if out.len() < hashes.len() {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
        }
        Ok(out)
    }

    fn get_range(&self, hash: &BlockHash, range: Range<u64>) -> Result<Option<Bytes>> {
        let Some(slot) = self.blocks.read().get(hash).cloned() else {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        if range.start >= range.end || range.end > slot.object.block_bytes {
            return Err(Error::invalid(format!(
                "byte range {}..{} is empty or past the end of a {}-byte payload",
                range.start, range.end, slot.object.block_bytes
            )));
        }
        // The whole block is read so its checksum can be verified.
        Ok(self
            .get(hash)?
            .map(|b| b.slice(range.start as usize..range.end as usize)))
    }

    fn contains(&self, hash: &BlockHash) -> bool {
        self.blocks.read().contains_key(hash)
    }

    fn remove(&self, hash: &BlockHash) -> Result<bool> {
        // Objects are shared and immutable: removing a block forgets it here; deleting
        // objects is their owner's job (the cluster metadata issue).
        let Some(slot) = self.blocks.write().remove(hash) else {
            return Ok(false);
        };
        self.counters
            .removed_explicit
            .fetch_add(1, Ordering::Relaxed);
        self.sink.removed(
            TierKind::Remote,
            &slot.object.metas[slot.index],
            RemovalCause::Explicit,
            None,
        );
        Ok(true)
    }

    fn snapshots(&self) -> Option<&dyn SnapshotStore> {
        Some(self)
    }

    fn stats(&self) -> TierStats {
        let blocks = self.blocks.read();
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = TierStats {
            hits: g(&self.counters.hits),
            misses: g(&self.counters.misses),
            stores: g(&self.counters.stores),
            dedup_skips: g(&self.counters.dedup_skips),
            io_errors: g(&self.counters.io_errors),
            resident_blocks: blocks.len() as u64,
            resident_bytes: blocks.values().map(|s| s.object.block_bytes).sum(),
            capacity_bytes: u64::MAX,
            ..TierStats::default()
        };
        s.evictions.explicit = g(&self.counters.removed_explicit);
        s.evictions.corrupt = g(&self.counters.removed_corrupt);
        s
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn meta(hash: u8, parent: u8) -> (BlockMeta, Bytes) {
        (
            BlockMeta {
                layout: kvtier_core::layout::LayoutDigest([7; 16]),
                hash: BlockHash([hash; 16]),
                parent: BlockHash([parent; 16]),
                position: 0,
                tokens: Arc::from(&[1u32][..]),
                extra_tag: None,
            },
            Bytes::from_static(b"abcd"),
        )
    }

    #[test]
    fn runs_cut_where_the_chain_breaks_or_grows_too_long() {
        let items = vec![meta(1, 0), meta(2, 1), meta(3, 2), meta(9, 8), meta(10, 9)];
        assert_eq!(runs(&items, 100), vec![0..3, 3..5]);
        assert_eq!(runs(&items, 2), vec![0..2, 2..3, 3..5]);
        assert!(runs(&[], 4).is_empty());
    }
}
