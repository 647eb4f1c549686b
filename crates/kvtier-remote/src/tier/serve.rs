//! The [`Tier`] implementation: hits as one ranged GET of consecutive blocks, each
//! checked against its manifest CRC and decoded where it is encoded; a 404 forgets the
//! object; stats.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use kvtier_core::hash::BlockHash;
use kvtier_core::layout::LayoutDigest;
use kvtier_core::stats::TierStats;
use kvtier_core::tier::{
    BlockMeta, PutOutcome, RemovalCause, RunRead, ShortRead, SnapshotStore, Tier, TierKind,
};
use kvtier_core::{Error, ErrorKind, Result};
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore};

use kvtier_codec::{DecodeError, Resident};

use crate::object::{RunObject, crc};
use crate::s3::Fetch;

use super::RemoteTier;
use super::write::runs;

impl RemoteTier {
    /// One ranged GET of slots `range` of `object`, each block verified and decoded; or
    /// why it delivered nothing (a failed read is a miss: the tier never fails a load).
    pub(super) fn fetch(
        &self,
        object: &Arc<RunObject>,
        range: Range<usize>,
    ) -> std::result::Result<Vec<Bytes>, ShortRead> {
        let (object, stored) = self.fetch_stored(object, range.clone())?;
        if !object.spans.any_encoded() {
            return Ok(stored);
        }
        self.decoded(&object, range.start, stored).map_err(|e| {
            tracing::error!(object = %object.data_name, error = %e, "a remote block's frame did not decode to its own bytes; dropping the object");
            self.forget_object(&object, RemovalCause::Corrupt);
            ShortRead::Corrupt
        })
    }

    /// The payloads of blocks `first..` of `object` from their stored bytes `stored`
    /// (checked already): raw ones as they are, encoded ones decoded — several at once
    /// on the coder's threads — into one buffer.
    fn decoded(
        &self,
        object: &RunObject,
        first: usize,
        stored: Vec<Bytes>,
    ) -> std::result::Result<Vec<Bytes>, DecodeError> {
        let b = usize::try_from(object.block_bytes).map_err(|_| DecodeError::Truncated)?;
        let encoded: Vec<usize> = (0..stored.len())
            .filter(|k| object.spans.encoded(first + k).is_some())
            .collect();
        let mut out = BytesMut::zeroed(encoded.len() * b);
        let frames = encoded
            .iter()
            .zip(out.chunks_mut(b))
            .filter_map(|(&k, dst)| {
                let e = object.spans.encoded(first + k)?;
                Some((e.codec, &stored[k][..], dst))
            })
            .collect();
        self.coder.decode_frames(frames)?;
        let out = out.freeze();
        let mut next = encoded.iter().enumerate().peekable();
        Ok(stored
            .into_iter()
            .enumerate()
            .map(|(k, raw)| match next.next_if(|(_, e)| **e == k) {
                Some((n, _)) => out.slice(n * b..(n + 1) * b),
                None => raw,
            })
            .collect())
    }

    /// One ranged GET of slots `range` of `object`, each block's stored bytes checked
    /// against its CRC-32C (or, with a signing key, its tag) and returned as stored, with
    /// the object as checked (one known from a record is replaced by the object its
    /// manifest describes); or why it delivered nothing.
    pub(super) fn fetch_stored(
        &self,
        object: &Arc<RunObject>,
        range: Range<usize>,
    ) -> std::result::Result<(Arc<RunObject>, Vec<Bytes>), ShortRead> {
        // An object known from a record is served only once its manifest checked out.
        let object = self.checked(object)?;
        let bytes_range = object.spans.range(range.clone());
        let base = bytes_range.start;
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
                if bytes.len() as u64 != want {
                    tracing::error!(object = %object.data_name, "remote object shorter than its manifest; dropping it");
                    self.forget_object(&object, RemovalCause::Corrupt);
                    return Err(ShortRead::Corrupt);
                }
                let mut out = Vec::with_capacity(range.len());
                for slot in range {
                    let at = object.spans.range(slot..slot + 1);
                    let block = bytes.slice((at.start - base) as usize..(at.end - base) as usize);
                    // With a key the tag is the check (the CRC alone is forgeable); an
                    // object without tags was never indexed under a key.
                    let holds = match (self.signing_key(), object.tags.get(slot)) {
                        (Some(key), Some(tag)) => key.block_tag_holds(&block, tag),
                        (Some(_), None) => false,
                        (None, _) => crc(&block) == object.crcs[slot],
                    };
                    if !holds {
                        if self.signing_key().is_some() {
                            self.count_unsigned();
                        }
                        tracing::error!(object = %object.data_name, slot, "remote block failed its checksum or signature; dropping the object");
                        self.forget_object(&object, RemovalCause::Corrupt);
                        return Err(ShortRead::Corrupt);
                    }
                    out.push(block);
                }
                Ok((object, out))
            }
            Fetch::Gone => {
                tracing::info!(object = %object.data_name, "remote object is gone; forgetting its blocks");
                self.forget_object(&object, RemovalCause::Explicit);
                Err(ShortRead::NotHeld)
            }
            Fetch::Failed(e) => {
                self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(object = %object.data_name, error = %e, "remote read failed; a miss");
                Err(e.short_read())
            }
        }
    }

    /// Writes `items` as runs, encoding their pages when `encode` (a writer thread) and
    /// keeping them raw when not (a caller waits on it).
    fn put_runs(&self, items: &[(BlockMeta, Bytes)], encode: bool) -> Vec<Result<PutOutcome>> {
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
            match self.write_run(rest, encode) {
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
        self.put_runs(items, true)
    }

    fn put_for_caller(&self, meta: &BlockMeta, payload: Bytes) -> Result<PutOutcome> {
        self.put_runs(&[(meta.clone(), payload)], false)
            .pop()
            .unwrap_or(Ok(PutOutcome::Duplicate))
    }

    fn layout_registered(&self, layout: &kvtier_core::layout::Layout) {
        self.coder.learn(layout);
    }

    fn get(&self, hash: &BlockHash) -> Result<Option<Bytes>> {
        Ok(self.get_run(std::slice::from_ref(hash))?.pop())
    }

    fn get_run(&self, hashes: &[BlockHash]) -> Result<Vec<Bytes>> {
        Ok(self.read_run(hashes)?.blocks)
    }

    fn read_run(&self, hashes: &[BlockHash]) -> Result<RunRead> {
        let mut out = RunRead {
            blocks: Vec::with_capacity(hashes.len()),
            short: None,
        };
        while out.blocks.len() < hashes.len() {
            let rest = &hashes[out.blocks.len()..];
            let Some(slot) = self.blocks.read().get(&rest[0]).cloned() else {
                out.short = Some(ShortRead::NotHeld);
                break;
            };
            // How far the asked-for run continues in this object.
            let n = rest
                .iter()
                .zip(&slot.object.metas[slot.index..])
                .take_while(|(h, m)| **h == m.hash)
                .count();
            match self.fetch(&slot.object, slot.index..slot.index + n) {
                Ok(blocks) => out.blocks.extend(blocks),
                Err(short) => {
                    out.short = Some(short);
                    break;
                }
            }
        }
        self.counters
            .hits
            .fetch_add(out.blocks.len() as u64, Ordering::Relaxed);
        if out.short.is_some() {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
        }
        Ok(out)
    }

    fn get_range(&self, hash: &BlockHash, range: Range<u64>) -> Result<Option<Bytes>> {
        Ok(self.read_range(hash, range)?.ok())
    }

    fn read_range(
        &self,
        hash: &BlockHash,
        range: Range<u64>,
    ) -> Result<std::result::Result<Bytes, ShortRead>> {
        let Some(slot) = self.blocks.read().get(hash).cloned() else {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return Ok(Err(ShortRead::NotHeld));
        };
        if range.start >= range.end || range.end > slot.object.block_bytes {
            return Err(Error::invalid(format!(
                "byte range {}..{} is empty or past the end of a {}-byte payload",
                range.start, range.end, slot.object.block_bytes
            )));
        }
        // The whole block is read so its checksum can be verified.
        let read = self.read_run(std::slice::from_ref(hash))?;
        Ok(match read.blocks.into_iter().next() {
            Some(b) => Ok(b.slice(range.start as usize..range.end as usize)),
            None => Err(read.short.unwrap_or(ShortRead::NotHeld)),
        })
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

    fn remove_layout(&self, layout: LayoutDigest) -> Result<u64> {
        if self.deletes_directly() {
            // Both are tried; the first failure is reported (a retry finishes the job).
            let objects = self.delete_layout_objects(layout);
            let states = self.delete_layout_states(layout);
            return Ok(objects? + states?);
        }
        // A cluster's objects are advertised: its GC withdraws and deletes them once the
        // delete is recorded (their blocks are forgotten here one by one already).
        self.catalog.delete_layout(layout)?;
        Ok(0)
    }

    fn snapshots(&self) -> Option<&dyn SnapshotStore> {
        Some(self)
    }

    fn stats(&self) -> TierStats {
        let blocks = self.blocks.read();
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // Stored bytes of the blocks held, and how many of them are encoded, per codec.
        let mut stored = 0u64;
        let mut resident = Resident::default();
        for slot in blocks.values() {
            let o = &slot.object;
            match o.spans.encoded(slot.index) {
                Some(e) => {
                    stored += e.bytes;
                    resident.add(e.codec, e.bytes, o.block_bytes);
                }
                None => stored += o.block_bytes,
            }
        }
        let mut s = TierStats {
            hits: g(&self.counters.hits),
            misses: g(&self.counters.misses),
            stores: g(&self.counters.stores),
            dedup_skips: g(&self.counters.dedup_skips),
            io_errors: g(&self.counters.io_errors),
            resident_blocks: blocks.len() as u64,
            resident_bytes: stored,
            capacity_bytes: u64::MAX,
            codec: resident.fill(self.coder.stats()),
            ..TierStats::default()
        };
        s.evictions.explicit = g(&self.counters.removed_explicit);
        s.evictions.corrupt = g(&self.counters.removed_corrupt);
        s.refused_unsigned = g(&self.counters.unsigned);
        s
    }
}
