//! The records kept in etcd (docs/cluster.md, "Records"), JSON with a version field.
//!
//! Applying a record twice changes nothing (an advertisement of an object already known
//! adopts nothing new; a withdrawal of an unknown object forgets nothing), so replay after
//! a restart, a resync after compaction and a watch that resumes over events already seen
//! are all safe.

use kvtier_core::hash::BlockHash;
use kvtier_core::layout::LayoutDigest;
use kvtier_core::snapshot::SnapshotKey;
use kvtier_remote::{ObjectInfo, ObjectName, RemoteTier, StateName};
use serde::{Deserialize, Serialize};

/// Record format version.
pub const RECORD_VERSION: u32 = 1;

/// How a budget treats an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Deleted oldest first when its namespace is over budget.
    #[default]
    Normal,
    /// Never deleted by a budget (system prompts and other shared prefixes); its owner may
    /// still delete it.
    Pinned,
}

impl std::str::FromStr for Priority {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "normal" => Ok(Self::Normal),
            "pinned" => Ok(Self::Pinned),
            other => Err(format!("unknown priority `{other}` (normal, pinned)")),
        }
    }
}

/// One run object, advertised: what a replica needs to index it without reading it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advert {
    /// [`RECORD_VERSION`].
    pub v: u32,
    /// The object's manifest name (the data object is the same name with `.kvo`).
    pub object: String,
    /// The endpoint holding it, by id (`url/bucket`).
    pub endpoint: String,
    /// Layout digest, hex.
    pub layout: String,
    /// Chain position of the first block.
    pub first_position: u32,
    /// Parent of the first block, hex (the layout's root at position 0).
    pub first_parent: String,
    /// The blocks' hashes in chain order, hex.
    pub blocks: Vec<String>,
    /// Bytes per block.
    pub block_bytes: u64,
    /// SHA-256 of the manifest, hex: readers check the manifest against it before serving.
    pub manifest_sha256: String,
    /// The replica that wrote the object (the only one that may delete it while alive).
    pub owner: String,
    /// The owner's generation when it advertised.
    pub generation: u64,
    /// Budget class.
    #[serde(default)]
    pub priority: Priority,
    /// Budget namespace.
    pub namespace: String,
    /// When it was advertised, Unix milliseconds (advertise lag, age for budgets).
    pub ts_ms: u64,
}

/// Either kind of advertisement, as the GC weighs them: owner, namespace, priority, age
/// and size mean the same for both, so one budget and one orphan rule cover runs and
/// states together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Advertised {
    /// A run object's advertisement (under `ROOT/objects/`).
    #[serde(rename = "advert")]
    Run(Advert),
    /// A state object's advertisement (under `ROOT/states/`).
    #[serde(rename = "state")]
    State(StateAdvert),
}

impl Advertised {
    /// The object's name.
    pub fn object(&self) -> &str {
        match self {
            Self::Run(a) => &a.object,
            Self::State(s) => &s.object,
        }
    }

    /// The endpoint holding it, by id.
    pub fn endpoint(&self) -> &str {
        match self {
            Self::Run(a) => &a.endpoint,
            Self::State(s) => &s.endpoint,
        }
    }

    /// The replica that wrote it.
    pub fn owner(&self) -> &str {
        match self {
            Self::Run(a) => &a.owner,
            Self::State(s) => &s.owner,
        }
    }

    /// Its budget namespace.
    pub fn namespace(&self) -> &str {
        match self {
            Self::Run(a) => &a.namespace,
            Self::State(s) => &s.namespace,
        }
    }

    /// Its budget class.
    pub fn priority(&self) -> Priority {
        match self {
            Self::Run(a) => a.priority,
            Self::State(s) => s.priority,
        }
    }

    /// When it was advertised, Unix milliseconds.
    pub fn ts_ms(&self) -> u64 {
        match self {
            Self::Run(a) => a.ts_ms,
            Self::State(s) => s.ts_ms,
        }
    }

    /// Bytes of data the object holds.
    pub fn bytes(&self) -> u64 {
        match self {
            Self::Run(a) => a.bytes(),
            Self::State(s) => s.bytes,
        }
    }

    /// The run advertisement, if it is one.
    pub fn run(&self) -> Option<&Advert> {
        match self {
            Self::Run(a) => Some(a),
            Self::State(_) => None,
        }
    }
}

/// An object being deleted: written in the same transaction that withdraws its
/// advertisement; the object is deleted after the grace window, then the tombstone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// [`RECORD_VERSION`].
    pub v: u32,
    /// The withdrawn advertisement, under the field naming its kind (`advert` for a run,
    /// as version-1 tombstones always were; `state` for a state object).
    #[serde(flatten)]
    pub of: Advertised,
    /// Who withdrew it (the owner, or the GC leader for an absent owner).
    pub by: String,
    /// Their generation.
    pub generation: u64,
    /// When, Unix milliseconds: the delete is due after the grace window.
    pub at_ms: u64,
    /// Why: `owner`, `orphan`, `budget`.
    pub reason: String,
}

/// A layout deleted (`DELETE /v1/layouts/{layout}` on some replica): every run and state
/// object of the layout advertised before this record (a lower `mod_revision`) is
/// withdrawn by the GC leader and deleted after the grace window, and every replica drops
/// the layout's blocks and states from its own tiers once. Kept [`DELETE_MARKER_TTL`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutDeleted {
    /// [`RECORD_VERSION`].
    pub v: u32,
    /// Who asked.
    pub by: String,
    /// When, Unix milliseconds.
    pub at_ms: u64,
}

/// How long a delete marker is kept: a replica away longer than this misses it (its own
/// copies of the layout on its SSD outlive the delete; the SSD's default TTL is as long).
pub const DELETE_MARKER_TTL: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// One state object (a snapshot or checkpoint of recurrent state), advertised: what a
/// replica needs to serve it without listing the bucket. The object verifies itself on
/// every read (its header names the key and layout and carries the checksums), so the
/// record only points.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateAdvert {
    /// [`RECORD_VERSION`].
    pub v: u32,
    /// The object's name (`PREFIX/state/LAYOUT/KEY.kvs`).
    pub object: String,
    /// The endpoint holding it, by id (`url/bucket`).
    pub endpoint: String,
    /// Layout digest, hex.
    pub layout: String,
    /// The snapshot key, hex.
    pub key: String,
    /// Bytes of state.
    pub bytes: u64,
    /// The replica that wrote it.
    pub owner: String,
    /// The owner's generation when it advertised.
    pub generation: u64,
    /// Budget class (records written before states had one are normal).
    #[serde(default)]
    pub priority: Priority,
    /// Budget namespace (records written before states had one are in `default`).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// When it was advertised, Unix milliseconds.
    pub ts_ms: u64,
}

/// The owner written into records of objects whose writer is unknown (`kvtier cluster
/// reconcile` finds them): no replica may take that id (`ClusterConfig::check`), so its
/// member key never exists and the GC leader reclaims them as orphans after
/// `orphan_after`.
pub const UNOWNED: &str = "unowned";

/// The namespace of a replica that names none.
pub const DEFAULT_NAMESPACE: &str = "default";

fn default_namespace() -> String {
    DEFAULT_NAMESPACE.into()
}

impl StateAdvert {
    /// The advertisement of state object `state` (`bytes` of state), held at `endpoint`,
    /// written by `owner` under `generation`; normal priority until the caller says.
    pub fn of(
        state: &StateName,
        endpoint: String,
        bytes: u64,
        owner: &str,
        generation: u64,
        namespace: &str,
        ts_ms: u64,
    ) -> Self {
        Self {
            v: RECORD_VERSION,
            object: state.name.clone(),
            endpoint,
            layout: state.layout.to_hex(),
            key: kvtier_core::hash::hex(&state.key.0),
            bytes,
            owner: owner.to_string(),
            generation,
            priority: Priority::Normal,
            namespace: namespace.to_string(),
            ts_ms,
        }
    }

    /// What `tier` serves for this record, or why it cannot: a malformed field, an unknown
    /// version or endpoint.
    pub fn describe(&self, tier: &RemoteTier) -> Result<StateName, String> {
        let endpoint = readable(self.v, &self.endpoint, tier)?;
        let layout = LayoutDigest(hex16(&self.layout).ok_or("bad layout digest")?);
        let key: [u8; 32] = hex_bytes(&self.key)
            .and_then(|b| b.try_into().ok())
            .ok_or("bad snapshot key")?;
        Ok(StateName {
            endpoint,
            name: self.object.clone(),
            layout,
            key: SnapshotKey(key),
        })
    }
}

/// A live replica (the member key is leased: it vanishes when the replica stops renewing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// [`RECORD_VERSION`].
    pub v: u32,
    /// The replica's id.
    pub replica: String,
    /// Its generation (bumped on every registration).
    pub generation: u64,
    /// When it registered, Unix milliseconds.
    pub since_ms: u64,
}

/// The index in `tier` of a record's endpoint, if this build reads the record's version
/// and the endpoint is one of the tier's.
fn readable(version: u32, endpoint: &str, tier: &RemoteTier) -> Result<usize, String> {
    if version != RECORD_VERSION {
        return Err(format!(
            "record version {version} (this build reads {RECORD_VERSION})"
        ));
    }
    tier.endpoint_index(endpoint)
        .ok_or_else(|| format!("endpoint `{endpoint}` is not one of this replica's"))
}

fn hex16(s: &str) -> Option<[u8; 16]> {
    let bytes = hex_bytes(s)?;
    bytes.try_into().ok()
}

fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Advert {
    /// The advertisement of an object the tier wrote.
    pub fn of(
        info: &ObjectInfo,
        endpoint: String,
        owner: &str,
        generation: u64,
        namespace: &str,
        ts_ms: u64,
    ) -> Self {
        Self {
            v: RECORD_VERSION,
            object: info.name.manifest.clone(),
            endpoint,
            layout: info.layout.to_hex(),
            first_position: info.first_position,
            first_parent: info.first_parent.to_hex(),
            blocks: info.blocks.iter().map(BlockHash::to_hex).collect(),
            block_bytes: info.block_bytes,
            manifest_sha256: kvtier_core::hash::hex(&info.manifest_digest),
            owner: owner.to_string(),
            generation,
            priority: Priority::Normal,
            namespace: namespace.to_string(),
            ts_ms,
        }
    }

    /// The object it describes, for `tier` (whose endpoint list decides the index), or why
    /// it cannot be one: a malformed field, an unknown version or endpoint.
    pub fn describe(&self, tier: &RemoteTier) -> Result<ObjectInfo, String> {
        let endpoint = readable(self.v, &self.endpoint, tier)?;
        let layout = LayoutDigest(hex16(&self.layout).ok_or("bad layout digest")?);
        let first_parent = BlockHash(hex16(&self.first_parent).ok_or("bad parent hash")?);
        let blocks = self
            .blocks
            .iter()
            .map(|h| hex16(h).map(BlockHash))
            .collect::<Option<Vec<_>>>()
            .ok_or("bad block hash")?;
        let manifest_digest: [u8; 32] = hex_bytes(&self.manifest_sha256)
            .and_then(|b| b.try_into().ok())
            .ok_or("bad manifest digest")?;
        Ok(ObjectInfo {
            name: ObjectName {
                endpoint,
                manifest: self.object.clone(),
            },
            layout,
            first_position: self.first_position,
            first_parent,
            blocks,
            block_bytes: self.block_bytes,
            manifest_digest,
        })
    }

    /// The run's first and last block and its layout, if the hex fields parse.
    pub fn run(&self) -> Option<(LayoutDigest, BlockHash, BlockHash)> {
        Some((
            LayoutDigest(hex16(&self.layout)?),
            BlockHash(hex16(self.blocks.first()?)?),
            BlockHash(hex16(self.blocks.last()?)?),
        ))
    }

    /// Bytes of data the object holds.
    pub fn bytes(&self) -> u64 {
        self.block_bytes.saturating_mul(self.blocks.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> ObjectInfo {
        ObjectInfo {
            name: ObjectName {
                endpoint: 0,
                manifest: "kv/x.kvm".into(),
            },
            layout: LayoutDigest([7; 16]),
            first_position: 0,
            first_parent: BlockHash([7; 16]),
            blocks: vec![BlockHash([1; 16]), BlockHash([2; 16])],
            block_bytes: 4096,
            manifest_digest: [9; 32],
        }
    }

    #[test]
    fn an_advert_round_trips_through_json_and_names_its_run() {
        let a = Advert::of(&info(), "http://h/b".into(), "a", 3, "default", 5);
        let text = serde_json::to_string(&a).unwrap_or_default();
        let back: Advert = serde_json::from_str(&text).unwrap_or_else(|_| a.clone());
        assert_eq!(back, a);
        assert!(text.contains("\"priority\":\"normal\""));
        let (l, f, t) = back.run().unwrap_or_default();
        assert_eq!((l.0, f.0, t.0), ([7; 16], [1; 16], [2; 16]));
        assert_eq!(back.bytes(), 8192);
    }

    #[test]
    fn a_tombstone_names_its_kind_and_version_one_records_still_read() {
        let run = Advert::of(&info(), "http://h/b".into(), "a", 3, "default", 5);
        let tombstone = |of| Tombstone {
            v: RECORD_VERSION,
            of,
            by: "gc".into(),
            generation: 2,
            at_ms: 9,
            reason: "budget".into(),
        };
        // A run's tombstone is written as version-1 builds wrote it: the advert under
        // `advert`, beside the other fields.
        let t = tombstone(Advertised::Run(run.clone()));
        let text = serde_json::to_string(&t).unwrap_or_default();
        let old: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(old["advert"]["object"], "kv/x.kvm");
        assert_eq!(old["reason"], "budget");
        assert_eq!(serde_json::from_str::<Tombstone>(&text).ok(), Some(t));

        // A state advertisement written before states had a namespace and a priority.
        let v1 = r#"{"v":1,"object":"kv/state/aa/bb.kvs","endpoint":"http://h/b",
            "layout":"07070707070707070707070707070707","key":"01","bytes":10,
            "owner":"a","generation":1,"ts_ms":4}"#;
        let state: StateAdvert = serde_json::from_str(v1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (state.namespace.as_str(), state.priority),
            ("default", Priority::Normal)
        );
        let t = tombstone(Advertised::State(state));
        let text = serde_json::to_string(&t).unwrap_or_default();
        assert!(text.contains("\"state\":{") && !text.contains("\"advert\""));
        let back: Tombstone = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back.of.object(), "kv/state/aa/bb.kvs");
        assert_eq!((back.of.bytes(), back.of.owner()), (10, "a"));
        assert!(back.of.run().is_none());
        // Neither kind: not a tombstone.
        assert!(
            serde_json::from_str::<Tombstone>(
                r#"{"v":1,"by":"x","generation":1,"at_ms":0,"reason":"owner"}"#
            )
            .is_err()
        );
    }

    #[test]
    fn malformed_hex_is_refused() {
        assert_eq!(hex16("zz"), None);
        assert_eq!(hex16(&"0".repeat(31)), None);
        assert_eq!(hex_bytes("0a0b"), Some(vec![10, 11]));
    }
}
