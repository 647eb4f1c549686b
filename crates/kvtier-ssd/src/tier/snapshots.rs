//! Snapshots of the snapshot bucket, kept on the SSD so they survive a restart. They are
//! records of kind 2 whose key is the 32-byte snapshot key; they expire with the same TTL
//! as blocks (on the last access) and are verified on every read like blocks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use kvtier_core::Result;
use kvtier_core::clock::ClockExt;
use kvtier_core::hash::BlockHash;
use kvtier_core::layout::LayoutDigest;
use kvtier_core::snapshot::SnapshotKey;
use kvtier_core::tier::SnapshotStore;

use super::SsdTier;
use crate::format::{Encoding, Kind, RecordHeader, chunk_crcs};
use crate::store::{Loc, ReadFault};

/// A snapshot the tier holds.
#[derive(Debug)]
pub(super) struct HeldSnapshot {
    pub loc: Loc,
    pub layout: LayoutDigest,
    pub last_access: AtomicU64,
}

impl SsdTier {
    fn drop_snapshot(&self, key: &[u8; 32]) {
        if let Err(e) = self.delete_snapshot(key) {
            tracing::warn!(error = %e, "could not write a snapshot tombstone");
        }
    }

    /// Stops serving the snapshot under `key` and writes its tombstone; returns whether
    /// one was held. A failed tombstone is an error: the record would come back at the
    /// next recovery.
    fn delete_snapshot(&self, key: &[u8; 32]) -> Result<bool> {
        let Some(old) = self.snapshots.write().remove(key) else {
            return Ok(false);
        };
        if let Some(live) = self.counters.lock().segment_live.get_mut(&old.loc.segment) {
            *live = live.saturating_sub(old.loc.record_len);
        }
        self.store.tombstone(&old.loc, *key).inspect_err(|_| {
            self.counters.lock().io_errors += 1;
        })?;
        Ok(true)
    }

    /// Drops snapshots not read or stored for longer than `ttl_ns`; returns how many.
    pub(super) fn expire_snapshots(&self, now: u64, ttl_ns: u64) -> u64 {
        let expired: Vec<[u8; 32]> = self
            .snapshots
            .read()
            .iter()
            .filter(|(_, h)| now.saturating_sub(h.last_access.load(Ordering::Relaxed)) > ttl_ns)
            .map(|(k, _)| *k)
            .collect();
        for key in &expired {
            self.drop_snapshot(key);
        }
        expired.len() as u64
    }

    /// Moves the snapshots stored in segment `id` to the active segment (compaction).
    /// Returns how many were moved.
    pub(super) fn relocate_snapshots(&self, id: u64) -> Result<u64> {
        let movers: Vec<([u8; 32], Arc<HeldSnapshot>)> = self
            .snapshots
            .read()
            .iter()
            .filter(|(_, h)| h.loc.segment == id)
            .map(|(k, h)| (*k, h.clone()))
            .collect();
        let mut moved = 0;
        for (key, held) in movers {
            let _claim = self.claims.claim(key);
            // A put may have replaced this copy before the claim: its copy is newer than
            // anything written here, so leave the key alone (a copy written and then
            // tombstoned here would be the newest and delete the key).
            let current = self.snapshots.read().get(&key).cloned();
            if !current.is_some_and(|now| Arc::ptr_eq(&now, &held)) {
                continue;
            }
            match self.store.read(&held.loc, &key, None) {
                Ok(blob) => {
                    if self.write_snapshot(&key, held.layout, &blob, Some(&held))? {
                        moved += 1;
                    }
                }
                Err(ReadFault::Corrupt(_)) => self.drop_snapshot(&key),
                Err(ReadFault::Io(e)) => return Err(e),
            }
        }
        Ok(moved)
    }

    /// Appends a copy of snapshot `key` and serves it from now on; the caller holds the
    /// key's claim. With `replacing` (compaction moving that copy, which the caller saw
    /// served after taking the claim), only if the tier still serves it: the claim kept
    /// every put out, so a copy gone meanwhile was dropped, and the new copy is tombstoned
    /// — as the newest copy, that tombstone keeps the key deleted. Returns whether the new
    /// copy is served.
    fn write_snapshot(
        &self,
        key: &[u8; 32],
        layout: LayoutDigest,
        blob: &Bytes,
        replacing: Option<&Arc<HeldSnapshot>>,
    ) -> Result<bool> {
        let chunk_log2 = self.config.store.chunk_log2;
        // Snapshots are written by the writer and maintenance threads only: encoded as
        // the layout's namespace says (seed 003 §6).
        let encoded = self.coder.encode_state(layout, blob);
        let (stored, encoding) = match &encoded {
            Some(e) => (
                e.frame.as_slice(),
                Some(Encoding {
                    codec: e.codec,
                    decoded_len: blob.len() as u64,
                }),
            ),
            None => (blob.as_ref(), None),
        };
        let header = RecordHeader {
            kind: Kind::Snapshot,
            layout,
            key: *key,
            parent: BlockHash::default(),
            position: 0,
            tokens: Vec::new(),
            extra_tag: None,
            payload_len: stored.len() as u64,
            created_ms: self.clock.wall_unix_ms(),
            chunk_log2,
            chunk_crcs: chunk_crcs(stored, chunk_log2),
            encoding,
        };
        let loc = self.store.append(&header, stored).inspect_err(|_| {
            self.counters.lock().io_errors += 1;
        })?;
        let held = Arc::new(HeldSnapshot {
            loc,
            layout,
            last_access: AtomicU64::new(self.now()),
        });
        let old = {
            let mut map = self.snapshots.write();
            let still =
                replacing.is_none_or(|r| map.get(key).is_some_and(|now| Arc::ptr_eq(now, r)));
            if !still {
                drop(map);
                let _ = self.store.tombstone(&loc, *key);
                return Ok(false);
            }
            map.insert(*key, held)
        };
        let mut c = self.counters.lock();
        *c.segment_live.entry(loc.segment).or_default() += loc.record_len;
        if let Some(old) = old {
            if let Some(live) = c.segment_live.get_mut(&old.loc.segment) {
                *live = live.saturating_sub(old.loc.record_len);
            }
            drop(c);
            // Older than the copy just written (one writer per key), so this tombstone
            // never decides the key.
            let _ = self.store.tombstone(&old.loc, *key);
        }
        Ok(true)
    }
}

impl SnapshotStore for SsdTier {
    fn put_snapshot(&self, key: &SnapshotKey, layout: LayoutDigest, blob: &Bytes) -> Result<()> {
        let _claim = self.claims.claim(key.0);
        self.write_snapshot(&key.0, layout, blob, None).map(|_| ())
    }

    fn contains_snapshot(&self, key: &SnapshotKey) -> bool {
        self.snapshots.read().contains_key(&key.0)
    }

    fn get_snapshot(&self, key: &SnapshotKey) -> Result<Option<Bytes>> {
        let Some(held) = self.snapshots.read().get(&key.0).cloned() else {
            return Ok(None);
        };
        match self.store.read(&held.loc, &key.0, None) {
            Ok(blob) => {
                held.last_access.store(self.now(), Ordering::Relaxed);
                Ok(Some(blob))
            }
            Err(ReadFault::Corrupt(why)) => {
                tracing::warn!(%why, "corrupt snapshot record: dropping it");
                self.counters.lock().evictions.corrupt += 1;
                self.drop_snapshot(&key.0);
                Ok(None)
            }
            Err(ReadFault::Io(e)) => {
                self.counters.lock().io_errors += 1;
                Err(e)
            }
        }
    }

    fn remove_layout_snapshots(&self, layout: LayoutDigest) -> Result<u64> {
        let keys: Vec<[u8; 32]> = self
            .snapshots
            .read()
            .iter()
            .filter(|(_, held)| held.layout == layout)
            .map(|(k, _)| *k)
            .collect();
        let mut removed = 0;
        for key in &keys {
            // Held under the key's claim, as a put is: no write of it is half done.
            let _claim = self.claims.claim(*key);
            removed += u64::from(self.delete_snapshot(key)?);
        }
        Ok(removed)
    }
}
