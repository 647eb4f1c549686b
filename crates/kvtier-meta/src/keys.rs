//! Where each record lives in etcd, under one cluster root (`kvtier/<cluster>/`).
//!
//! | key | value | leased |
//! | --- | --- | --- |
//! | `ROOT/objects/LAYOUT/FIRST-LAST` | an [`crate::record::Advert`] | no: an object outlives its writer |
//! | `ROOT/tombstones/LAYOUT/FIRST-LAST` | a [`crate::record::Tombstone`] | no |
//! | `ROOT/members/REPLICA` | a [`crate::record::Member`] | yes: liveness only |
//! | `ROOT/generations/REPLICA` | the replica's generation, decimal | no |
//! | `ROOT/states/LAYOUT/KEY` | a [`crate::record::StateAdvert`] | no: a state object outlives its writer |
//! | `ROOT/tombstones/states/LAYOUT/KEY` | a [`crate::record::Tombstone`] of a state object | no |
//! | `ROOT/deleted/LAYOUT` | a [`crate::record::LayoutDeleted`]: everything of the layout advertised before it goes | no |
//!
//! A run (layout, first and last block) has at most one record: the object key names the
//! run, not the object, so the publish transaction can require that no other replica
//! advertised the same run first.

use kvtier_core::hash::BlockHash;
use kvtier_core::layout::LayoutDigest;

use crate::signed::{RecordSigning, Unreadable};

/// The keys of one cluster, and how the records under them are signed.
#[derive(Debug, Clone)]
pub struct Keys {
    root: String,
    signing: RecordSigning,
}

impl Keys {
    /// The keys under `kvtier/<cluster>/`, records unsigned.
    pub fn new(cluster: &str) -> Self {
        Self::signed(cluster, RecordSigning::default())
    }

    /// The keys under `kvtier/<cluster>/`, records signed and checked by `signing`.
    pub fn signed(cluster: &str, signing: RecordSigning) -> Self {
        Self {
            root: format!("kvtier/{cluster}/"),
            signing,
        }
    }

    /// The value to store `record` under `key` ([`RecordSigning::seal`]).
    pub fn seal<T: serde::Serialize>(&self, key: &str, record: &T) -> String {
        self.signing.seal(key, record)
    }

    /// The record stored as `value` under `key`, if readable and signed as this cluster
    /// requires ([`RecordSigning::open`]).
    pub fn open<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
        value: &[u8],
    ) -> Result<T, Unreadable> {
        self.signing.open(key, value)
    }

    /// The cluster's root, `kvtier/<cluster>/`.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The GC leader's election.
    pub fn election(&self) -> String {
        format!("{}gc-leader", self.root)
    }

    /// The advertisement key of the run a manifest name (`…/LAYOUT/FIRST-LAST[.w.TAG].kvm`)
    /// belongs to, if it is one.
    pub fn object_of_manifest(&self, manifest: &str) -> Option<String> {
        let mut parts = manifest.rsplit('/');
        let file = parts.next()?;
        let layout = parts.next()?;
        let run = file.strip_suffix(".kvm")?.split('.').next()?;
        let (first, last) = run.split_once('-')?;
        let hex32 = |s: &str| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit());
        (hex32(layout) && hex32(first) && hex32(last))
            .then(|| format!("{}{layout}/{first}-{last}", self.objects()))
    }

    /// Prefix of every advertisement.
    pub fn objects(&self) -> String {
        format!("{}objects/", self.root)
    }

    /// Prefix of every tombstone.
    pub fn tombstones(&self) -> String {
        format!("{}tombstones/", self.root)
    }

    /// Prefix of every state advertisement.
    pub fn states(&self) -> String {
        format!("{}states/", self.root)
    }

    /// The advertisement of the state object under snapshot key `key`.
    pub fn state(&self, layout: &LayoutDigest, key: &kvtier_core::snapshot::SnapshotKey) -> String {
        format!(
            "{}{}/{}",
            self.states(),
            layout.to_hex(),
            kvtier_core::hash::hex(&key.0)
        )
    }

    /// Prefix of every layout-delete marker.
    pub fn deletes(&self) -> String {
        format!("{}deleted/", self.root)
    }

    /// The delete marker of `layout`.
    pub fn deleted(&self, layout: &LayoutDigest) -> String {
        format!("{}{}", self.deletes(), layout.to_hex())
    }

    /// The prefixes of `layout`'s run and state advertisements.
    pub fn of_layout(&self, layout: &str) -> [String; 2] {
        [
            format!("{}{layout}/", self.objects()),
            format!("{}{layout}/", self.states()),
        ]
    }

    /// Prefix of every member key.
    pub fn members(&self) -> String {
        format!("{}members/", self.root)
    }

    /// Prefix of every generation counter.
    pub fn generations(&self) -> String {
        format!("{}generations/", self.root)
    }

    fn run(layout: &LayoutDigest, first: &BlockHash, last: &BlockHash) -> String {
        format!("{}/{}-{}", layout.to_hex(), first.to_hex(), last.to_hex())
    }

    /// The advertisement of a run.
    pub fn object(&self, layout: &LayoutDigest, first: &BlockHash, last: &BlockHash) -> String {
        format!("{}{}", self.objects(), Self::run(layout, first, last))
    }

    /// The tombstone of a run.
    pub fn tombstone(&self, layout: &LayoutDigest, first: &BlockHash, last: &BlockHash) -> String {
        format!("{}{}", self.tombstones(), Self::run(layout, first, last))
    }

    /// The advertisement and tombstone keys of `object`'s run, if it names blocks.
    pub fn of_object(&self, object: &kvtier_remote::ObjectInfo) -> Option<(String, String)> {
        let (first, last) = (object.blocks.first()?, object.blocks.last()?);
        Some((
            self.object(&object.layout, first, last),
            self.tombstone(&object.layout, first, last),
        ))
    }

    /// The tombstone key that goes with an advertisement key, of a run or a state object.
    /// A state's sits under `tombstones/states/`: no layout digest is spelled `states`,
    /// so it never meets a run's.
    pub fn tombstone_of(&self, advert_key: &str) -> Option<String> {
        if let Some(run) = advert_key.strip_prefix(&self.objects()) {
            return Some(format!("{}{run}", self.tombstones()));
        }
        advert_key
            .strip_prefix(&self.states())
            .map(|state| format!("{}states/{state}", self.tombstones()))
    }

    /// A replica's member key.
    pub fn member(&self, replica: &str) -> String {
        format!("{}{replica}", self.members())
    }

    /// A replica's generation counter.
    pub fn generation(&self, replica: &str) -> String {
        format!("{}{replica}", self.generations())
    }
}

/// The first key after every key that starts with `prefix` (etcd's range end for a prefix).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_has_one_object_key_and_one_tombstone_key() {
        let k = Keys::new("c1");
        let (l, f, t) = (
            LayoutDigest([1; 16]),
            BlockHash([2; 16]),
            BlockHash([3; 16]),
        );
        let object = k.object(&l, &f, &t);
        assert!(object.starts_with("kvtier/c1/objects/01010101"));
        assert_eq!(k.tombstone_of(&object), Some(k.tombstone(&l, &f, &t)));
        assert_eq!(k.tombstone_of("kvtier/c2/objects/x"), None);
        let key = kvtier_core::snapshot::SnapshotKey([4; 32]);
        let state = k.state(&l, &key);
        let state_tombstone = k.tombstone_of(&state).unwrap_or_default();
        assert!(state_tombstone.starts_with(&format!("{}states/01010101", k.tombstones())));
        assert!(state_tombstone.ends_with(&"04".repeat(32)));
        assert_eq!(prefix_end("a/b/"), b"a/b0".to_vec());
        let manifest = format!(
            "kv/{}/{}-{}.w.a.1.7.kvm",
            "01".repeat(16),
            "02".repeat(16),
            "03".repeat(16)
        );
        assert_eq!(k.object_of_manifest(&manifest), Some(object));
        assert_eq!(k.object_of_manifest("kv/x/y-z.kvm"), None);
        assert_eq!(
            k.object_of_manifest(&manifest.replace(".kvm", ".kvo")),
            None
        );
    }
}
