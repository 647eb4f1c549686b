//! What this replica knows of the cluster's advertisements, of runs and of state objects
//! (each under its own key), as the followers applied them: owner, namespace, priority,
//! age, size and the revision each was last written at. The GC leader decides from this view instead of reading every record on every sweep; every
//! action it takes is a transaction that compares the record's revision, so a view that
//! is behind costs a refused transaction, never a wrong delete.

use std::collections::HashMap;

use parking_lot::RwLock;

use crate::record::Advertised;

/// One advertisement (of a run or a state object), as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The record, as written.
    pub advert: Advertised,
    /// Its `mod_revision` in etcd.
    pub revision: i64,
}

/// The advertisements this replica knows, by key. Each record is boxed: the map grows by
/// doubling, and a rehash then moves a pointer per record, not the record.
#[derive(Debug, Default)]
pub struct View {
    records: RwLock<HashMap<Vec<u8>, Box<Seen>>>,
}

impl View {
    pub(crate) fn put(&self, key: &[u8], advert: Advertised, revision: i64) {
        self.records
            .write()
            .insert(key.to_vec(), Box::new(Seen { advert, revision }));
    }

    pub(crate) fn remove(&self, key: &[u8]) {
        self.records.write().remove(key);
    }

    /// Of the keys under `prefix`, keeps only those `keep` says yes to (after a full read
    /// of that prefix; the other follower's records are left alone).
    pub(crate) fn retain_under(&self, prefix: &[u8], keep: impl Fn(&[u8]) -> bool) {
        self.records
            .write()
            .retain(|k, _| !k.starts_with(prefix) || keep(k));
    }

    /// How many advertisements are known.
    pub fn len(&self) -> usize {
        self.records.read().len()
    }

    /// Whether none is known.
    pub fn is_empty(&self) -> bool {
        self.records.read().is_empty()
    }

    /// The record under `key`.
    pub fn get(&self, key: &[u8]) -> Option<Seen> {
        self.records.read().get(key).map(|s| Seen::clone(s))
    }

    /// The records `keep` says yes to (key, summary), copied out of the view.
    pub fn select(&self, keep: impl Fn(&[u8], &Seen) -> bool) -> Vec<(Vec<u8>, Seen)> {
        self.records
            .read()
            .iter()
            .filter(|(k, v)| keep(k, v))
            .map(|(k, v)| (k.clone(), Seen::clone(v)))
            .collect()
    }

    /// The bytes of the records `count` says yes to, without copying any.
    pub fn bytes(&self, count: impl Fn(&[u8], &Seen) -> bool) -> u64 {
        self.records
            .read()
            .iter()
            .filter(|(k, v)| count(k, v))
            .map(|(_, v)| v.advert.bytes())
            .sum()
    }

    /// Every record (key, summary).
    pub fn all(&self) -> Vec<(Vec<u8>, Seen)> {
        self.records
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), Seen::clone(v)))
            .collect()
    }
}
