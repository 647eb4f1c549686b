//! The objects the tier knows: what the catalog names at open, listings, adoption after
//! the manifest checks out against the object's name, checks of objects known from a
//! record, forgetting and deleting.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::StreamExt;
use kvtier_core::hash::BlockHash;
use kvtier_core::tier::{BlockMeta, RemovalCause, ShortRead, TierKind};
use kvtier_core::{Error, ErrorKind, Result};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};

use crate::catalog::{Adopted, Listed, ObjectInfo, ObjectName};
use crate::object::{Manifest, RunObject, Spans, data_of, manifest_of, names};
use crate::s3::Fetch;
use crate::sign::SigningKey;

use super::{RemoteTier, Slot};

impl RemoteTier {
    /// Adopts every object the catalog names at open.
    pub(super) fn recover(&self) {
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
        let object = self.manifest_object(&bytes, name)?;
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
        let object = match self.manifest_object(&bytes, name) {
            Ok(o) => o,
            Err(why) => return Adopted::Refused(why),
        };
        Adopted::Blocks(self.index_object(object))
    }
    /// Makes `object`'s blocks servable (a block already held in a shorter object moves
    /// to this one) and registers it by name; returns how many blocks were new.
    pub(super) fn index_object(&self, object: Arc<RunObject>) -> usize {
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
            tags: Vec::new(),
            block_bytes: info.block_bytes,
            spans: Spans::default(),
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
        self.checked(&object).is_ok()
    }
    /// `object` itself when its manifest was checked, else the checked object that now
    /// stands for it (its blocks re-indexed with their tokens), or why it cannot be served
    /// (its manifest gone, unreadable, or not the one its record names).
    pub(super) fn checked(
        &self,
        object: &Arc<RunObject>,
    ) -> std::result::Result<Arc<RunObject>, ShortRead> {
        let Some(digest) = object.pending else {
            return Ok(object.clone());
        };
        // Another caller may have checked it meanwhile.
        if let Some(now) = self.objects.read().get(&object.data_name)
            && now.pending.is_none()
        {
            return Ok(now.clone());
        }
        let store = self.stores[object.target].clone();
        let manifest_name = manifest_of(&object.data_name).ok_or(ShortRead::Corrupt)?;
        let path = Path::from(manifest_name.as_str());
        self.counters
            .manifest_checks
            .fetch_add(1, Ordering::Relaxed);
        let bytes = match self.call(async move { store.get(&path).await?.bytes().await }) {
            Fetch::Got(b) => b,
            Fetch::Gone => {
                tracing::info!(object = %object.data_name, "an advertised object's manifest is gone; forgetting it");
                self.forget_object(object, RemovalCause::Explicit);
                return Err(ShortRead::NotHeld);
            }
            Fetch::Failed(e) => {
                self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(object = %object.data_name, error = %e, "cannot read an advertised object's manifest; a miss");
                return Err(e.short_read());
            }
        };
        let name = ObjectName {
            endpoint: object.target,
            manifest: manifest_name,
        };
        let verdict = if <[u8; 32]>::from(Sha256::digest(&bytes)) != digest {
            Err("its manifest is not the one the record names (digest)".to_string())
        } else {
            self.manifest_object(&bytes, &name).and_then(|full| {
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
            Ok(full) => Ok(self.replace_object(object, &full)),
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
                Err(ShortRead::Corrupt)
            }
        }
    }
    /// Puts `full` (the checked object) wherever `known` (the same object, known from a
    /// record only) stands, and tells the index the blocks' tokens. Returns the object
    /// that now stands for it: `full`, or the one another caller checked first.
    pub(super) fn replace_object(
        &self,
        known: &Arc<RunObject>,
        full: &Arc<RunObject>,
    ) -> Arc<RunObject> {
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
    pub(super) fn forget_object(&self, object: &Arc<RunObject>, cause: RemovalCause) -> usize {
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
}

/// Why a manifest is not served.
enum Refusal {
    /// The tier has a signing key and the manifest is not sealed with it.
    Unsigned,
    /// It is not a manifest of the object it is stored as.
    Malformed(String),
}

impl From<&str> for Refusal {
    fn from(why: &str) -> Self {
        Self::Malformed(why.into())
    }
}

impl From<String> for Refusal {
    fn from(why: String) -> Self {
        Self::Malformed(why)
    }
}

impl RemoteTier {
    /// The object `bytes` (the manifest read from `name`) describes, or why it is not
    /// served; a manifest refused for its signature is counted.
    fn manifest_object(
        &self,
        bytes: &[u8],
        name: &ObjectName,
    ) -> std::result::Result<Arc<RunObject>, String> {
        let key = self.config.signing_key.as_ref();
        checked_manifest(bytes, name, &self.config.prefix, key).map_err(|why| match why {
            Refusal::Unsigned => {
                self.count_unsigned();
                "the manifest is not signed with this cluster's key".into()
            }
            Refusal::Malformed(why) => why,
        })
    }
}

/// The object `bytes` (the manifest read from `name`) describes, if it is exactly the
/// object its name says: a chain of blocks of one size whose names under `prefix` are
/// `name` — and, with a signing key, a manifest sealed with it whose every block has a
/// tag. A manifest copied under another name, or naming another prefix, describes
/// blocks the tier must not serve from that object.
fn checked_manifest(
    bytes: &[u8],
    name: &ObjectName,
    prefix: &str,
    key: Option<&SigningKey>,
) -> std::result::Result<Arc<RunObject>, Refusal> {
    let manifest: Manifest =
        serde_json::from_slice(bytes).map_err(|e| format!("the manifest is not JSON: {e}"))?;
    // The seal first: nothing an unsigned manifest says is worth parsing further.
    let tags = match key {
        Some(key) => manifest.sealed_tags(key).ok_or(Refusal::Unsigned)?,
        None => Vec::new(),
    };
    let metas = manifest
        .metas()
        .ok_or("the manifest does not describe a chain of blocks")?;
    if manifest.block_bytes == 0 {
        return Err("the manifest's blocks are empty".into());
    }
    let spans = manifest
        .spans()
        .ok_or("the manifest's block encodings are not ones its version may have")?;
    if let Some(w) = &manifest.writer
        && !crate::object::valid_writer_tag(w)
    {
        return Err("the manifest's writer tag is not a plain name".into());
    }
    let (data_name, manifest_name) =
        names(prefix, &metas, manifest.writer.as_deref()).ok_or("the manifest has no blocks")?;
    if manifest_name != name.manifest {
        return Err(Refusal::Malformed(format!(
            "the manifest describes `{manifest_name}`, not the object it is stored as"
        )));
    }
    Ok(Arc::new(RunObject {
        target: name.endpoint,
        data_name,
        crcs: manifest.blocks.iter().map(|b| b.crc32c).collect(),
        tags,
        metas,
        block_bytes: manifest.block_bytes,
        spans,
        pending: None,
    }))
}
