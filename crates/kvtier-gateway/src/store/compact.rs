//! Compaction: the gateway reclaims the space of deleted and overwritten objects by whole
//! segments, online.
//!
//! A pass looks at every sealed segment (never the active one). One whose current
//! records — those the index points at — fill less than `below` of it has them moved:
//! each is copied to the tail of the store (streamed in bounded pieces, outside every
//! lock), then, under the publish lock and only if it is still the current record of its
//! key, committed — its index entry appended after every earlier write of that key, so it
//! is the newest copy recovery will find — and swapped into the index; the old copy is
//! then tombstoned. A segment left with no current record is removed on the *next* pass,
//! after the store is synced, so a read that began on an old copy has a pass interval to
//! finish.
//!
//! **Crash safety** (kill -9 at any point): before a copy is committed the old one is the
//! current record and the copy an unindexed tail that recovery ignores; after, the copy is
//! the newest record of its key and wins. A segment is removed only when nothing current
//! is in it, and every record that stopped being current was tombstoned when it stopped
//! (`GatewayStore::kill`), so removing it brings no older copy back. If a tombstone could
//! not be written, or records were unreadable at open, removal stops until the next start
//! (`compaction_blocked`), whose recovery restores that invariant.
//!
//! **Bounded I/O**: a pass moves at most `budget` bytes (the gateway passes one
//! segment's size); what is left waits for the next pass.

use std::collections::BTreeMap;
use std::ops::Range;

use kvtier_ssd::format::SEGMENT_HEADER_LEN;

use super::{Entry, GatewayStore, Index, Object, Rec, StoreResult};

/// Bytes copied per step when a record is moved.
const COPY_STEP: u64 = 4 << 20;

/// What a compaction pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compacted {
    /// Segments removed (emptied by the previous pass).
    pub segments_removed: u64,
    /// Bytes of those segments' files.
    pub bytes_reclaimed: u64,
    /// Records moved out of mostly-dead segments.
    pub records_moved: u64,
    /// Their bytes.
    pub bytes_moved: u64,
    /// Why segments were not removed, if they were not.
    pub blocked: Option<String>,
}

/// What became of a record compaction tried to move.
enum Moved {
    /// Copied to the tail (its bytes there) and current there.
    To(u64),
    /// No longer current (overwritten or deleted meanwhile): nothing to move.
    Gone,
    /// Could not be read: left in place, so its segment stays.
    Left,
}

/// Which current record a [`Rec`] is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Holder {
    Bucket(String),
    Object(String, String),
    Upload(String),
    Part(String, i32),
}

/// Every current record, with what holds it.
pub(super) fn live_records(index: &Index) -> Vec<(Holder, Rec)> {
    let mut out = Vec::new();
    for (name, b) in &index.buckets {
        out.push((Holder::Bucket(name.clone()), b.rec.clone()));
        for (key, o) in &b.objects {
            out.push((Holder::Object(name.clone(), key.clone()), o.rec.clone()));
        }
    }
    for (id, u) in &index.uploads {
        out.push((Holder::Upload(id.clone()), u.rec.clone()));
        for (n, p) in &u.parts {
            out.push((Holder::Part(id.clone(), *n), p.rec.clone()));
        }
    }
    out
}

impl GatewayStore {
    /// One compaction pass: removes the segments the previous pass emptied, then moves
    /// the current records out of every sealed segment whose current records fill less
    /// than `below` of it, at most `budget` bytes of them.
    pub fn compact(&self, below: f64, budget: u64) -> StoreResult<Compacted> {
        let mut done = Compacted::default();
        if let Some(why) = self.compaction_blocked.lock().clone() {
            done.blocked = Some(why);
            return Ok(done);
        }
        self.remove_emptied(&mut done)?;
        let mut by_segment: BTreeMap<u64, Vec<(Holder, Rec)>> = BTreeMap::new();
        for (holder, rec) in live_records(&self.index.read()) {
            by_segment
                .entry(rec.loc.segment)
                .or_default()
                .push((holder, rec));
        }
        let active = self.segs.active_segment();
        let pending: Vec<u64> = self.emptied.lock().clone();
        for id in self.segs.segment_ids() {
            if Some(id) == active || pending.contains(&id) {
                continue;
            }
            let Some(len) = self.segs.segment_len(id) else {
                continue;
            };
            let movers = by_segment.remove(&id).unwrap_or_default();
            let live: u64 = movers.iter().map(|(_, r)| r.loc.record_len).sum();
            let capacity = len.saturating_sub(SEGMENT_HEADER_LEN).max(1);
            if live as f64 >= below * capacity as f64 {
                continue;
            }
            if done.bytes_moved + live > budget && done.bytes_moved > 0 {
                break; // the rest next pass
            }
            // Nothing becomes current in a sealed segment (every write commits at the
            // tail), so it is empty once no record was left in it.
            let mut emptied = true;
            for (holder, rec) in movers {
                match self.relocate(&holder, &rec)? {
                    Moved::To(bytes) => {
                        done.records_moved += 1;
                        done.bytes_moved += bytes;
                    }
                    Moved::Gone => {}
                    Moved::Left => emptied = false,
                }
            }
            if emptied {
                self.emptied.lock().push(id);
            }
        }
        Ok(done)
    }

    /// Removes the segments emptied by the previous pass that are still empty, after
    /// syncing the store (the tombstones and moved copies are on disk before the old
    /// copies go).
    fn remove_emptied(&self, done: &mut Compacted) -> StoreResult<()> {
        let ready = std::mem::take(&mut *self.emptied.lock());
        if ready.is_empty() {
            return Ok(());
        }
        self.segs.sync()?;
        // Checked once more before anything is deleted: a segment still holding a current
        // record is kept (it is looked at again next pass).
        let holding: std::collections::HashSet<u64> = live_records(&self.index.read())
            .iter()
            .map(|(_, r)| r.loc.segment)
            .collect();
        for id in ready {
            if holding.contains(&id) {
                continue;
            }
            let bytes = self.segs.segment_len(id).unwrap_or(0);
            self.segs.remove_segment(id)?;
            done.segments_removed += 1;
            done.bytes_reclaimed += bytes;
        }
        Ok(())
    }

    /// Moves the current record `old` of `holder` to the tail.
    fn relocate(&self, holder: &Holder, old: &Rec) -> StoreResult<Moved> {
        let Some((entry, data_len)) = self.describe(old) else {
            // Unreadable now: left where it is, so its segment stays.
            tracing::warn!(
                segment = old.loc.segment,
                "compaction could not read a record's description; leaving it"
            );
            return Ok(Moved::Left);
        };
        let entry = match (entry, holder) {
            // A moved bucket record names the place of the bucket's first one.
            (
                Entry::Bucket {
                    bucket,
                    public_read,
                    location,
                    ..
                },
                Holder::Bucket(_),
            ) => {
                let since = self.index.read().buckets.get(&bucket).map(|b| b.since);
                Entry::Bucket {
                    bucket,
                    public_read,
                    location,
                    since,
                }
            }
            (e, _) => e,
        };
        let created_ms = old.header.created_ms;
        // Bucket and upload records carry no data: small, written under the lock.
        if matches!(holder, Holder::Bucket(_) | Holder::Upload(_)) {
            let _p = self.publish.lock();
            if !self.is_current(holder, old) {
                return Ok(Moved::Gone);
            }
            let rec = self.write_at(&entry, &[], created_ms)?;
            return Ok(self.settle(holder, old, rec));
        }
        let mut w = self.begin(&entry, data_len)?;
        let mut at = 0;
        while at < data_len {
            let range: Range<u64> = at..(at + COPY_STEP).min(data_len);
            let bytes = match self.segs.read_known(&old.loc, &old.header, range.clone()) {
                Ok(b) => b,
                Err(e) => {
                    // Damaged or unreadable: not moved; a GET of it finds the damage and
                    // drops it, and its segment stays until then.
                    tracing::warn!(error = ?e, segment = old.loc.segment, "compaction could not read a record; leaving it");
                    return Ok(Moved::Left);
                }
            };
            w.write(&bytes)?;
            at = range.end;
        }
        self.seal(&mut w, &entry)?;
        let _p = self.publish.lock();
        if !self.is_current(holder, old) {
            return Ok(Moved::Gone); // the unpublished copy is abandoned, never indexed
        }
        let rec = self.commit_at(w, &entry, created_ms)?;
        Ok(self.settle(holder, old, rec))
    }

    /// Puts the committed copy `rec` in `old`'s place and tombstones `old`; if `holder`
    /// went away meanwhile (an upload completed without the publish lock), the copy is
    /// tombstoned instead.
    fn settle(&self, holder: &Holder, old: &Rec, rec: Rec) -> Moved {
        let bytes = rec.loc.record_len;
        if self.swap(holder, rec.clone()) {
            self.kill_quietly(old, "a record compaction moved");
            Moved::To(bytes)
        } else {
            self.kill_quietly(&rec, "a copy whose record went away");
            Moved::Gone
        }
    }

    /// Whether `rec` is still the current record of `holder`.
    fn is_current(&self, holder: &Holder, rec: &Rec) -> bool {
        let index = self.index.read();
        let now = match holder {
            Holder::Bucket(b) => index.buckets.get(b).map(|b| b.rec.loc),
            Holder::Object(b, k) => index
                .buckets
                .get(b)
                .and_then(|b| b.objects.get(k))
                .map(|o| o.rec.loc),
            Holder::Upload(id) => index.uploads.get(id).map(|u| u.rec.loc),
            Holder::Part(id, n) => index
                .uploads
                .get(id)
                .and_then(|u| u.parts.get(n))
                .map(|p| p.rec.loc),
        };
        now == Some(rec.loc)
    }

    /// Points `holder` at its moved record (the caller holds the publish lock and has
    /// checked it is current); false if `holder` is gone.
    fn swap(&self, holder: &Holder, rec: Rec) -> bool {
        let mut index = self.index.write();
        match holder {
            Holder::Bucket(b) => index.buckets.get_mut(b).map(|b| b.rec = rec).is_some(),
            Holder::Object(b, k) => index
                .buckets
                .get_mut(b)
                .and_then(|b| b.objects.get_mut(k))
                .map(|o| {
                    *o = std::sync::Arc::new(Object {
                        rec,
                        size: o.size,
                        info: o.info.clone(),
                    });
                })
                .is_some(),
            Holder::Upload(id) => index.uploads.get_mut(id).map(|u| u.rec = rec).is_some(),
            Holder::Part(id, n) => index
                .uploads
                .get_mut(id)
                .and_then(|u| u.parts.get_mut(n))
                .map(|p| p.rec = rec)
                .is_some(),
        }
    }
}
