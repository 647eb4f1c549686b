//! [`SsdTier`]: the segment store behind kvtier-core's [`Tier`] trait.
//!
//! The tier keeps an in-memory map of what it holds (block hash → location and metadata),
//! so lookups never touch the disk: at open it is rebuilt from the index logs and every
//! recovered block is reported to the engine's prefix index through the sink.
//!
//! Guards (seed 002): storing a block already held refreshes it without a rewrite; a block
//! whose hash is held with other contents is a collision — the hash is quarantined for a
//! while, counted and logged; every read verifies the record header and the checksums of
//! the chunks it returns, and a mismatch is a miss — the record is dropped, tombstoned,
//! quarantined and counted, and its bytes are never returned.

mod capacity;
mod claims;
mod compact;
mod pipeline;
mod snapshots;

pub use capacity::Enforced;
pub use compact::Compacted;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::BuildHasherDefault;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use kvtier_core::clock::{Clock, ClockExt};
use kvtier_core::hash::BlockHash;
use kvtier_core::layout::LayoutDigest;
use kvtier_core::stats::{Evictions, TierStats};
use kvtier_core::tier::{
    BlockMeta, PutOutcome, RejectReason, RemovalCause, ResidencySink, RunRead, ShortRead, Tier,
    TierKind,
};
use kvtier_core::{Error, PassThroughHasher, Result};
use parking_lot::{Mutex, RwLock};

use kvtier_codec::{CodecConfig, Encoded, PageCoder, Resident};

use crate::format::{Encoding, Kind, RecordHeader, chunk_crcs};
use crate::store::{Loc, ReadFault, RecoveryReport, SegmentStore, StoreConfig};

/// Where the bytes a block record stores come from.
enum Coding {
    /// The page as given: a write a caller waits for.
    Raw,
    /// The page through the codec, encoded by the write itself (on the writer's or the
    /// maintenance thread, with the coder's helpers).
    Encode,
    /// Encoded ahead by [`Tier::put_many`]'s helpers; `None`: stored raw (the page did
    /// not shrink).
    Ahead(Option<Encoded>),
}

/// Settings of the SSD tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SsdConfig {
    /// The store directory (created if missing; one process at a time).
    pub dir: PathBuf,
    /// Segment size, durability and checksum chunk size.
    pub store: StoreConfig,
    /// How long a hash stays quarantined after a collision or a corrupt read
    /// (default 1 hour).
    pub quarantine: Duration,
    /// Payload bytes the whole store may hold (default 64 GiB).
    pub capacity_bytes: u64,
    /// Payload bytes one namespace (LayoutKey) may hold unless overridden
    /// (default: no separate limit, only the store's capacity).
    pub namespace_bytes: Option<u64>,
    /// Per-namespace budgets that replace `namespace_bytes` for those layouts.
    pub namespace_overrides: BTreeMap<LayoutDigest, u64>,
    /// A block not read or stored for this long is dropped (default 7 days).
    pub ttl: Duration,
    /// Stop admitting blocks while the filesystem has less than this many bytes free
    /// (default 1 GiB; 0 turns the check off); what is stored keeps being served.
    pub min_free_bytes: u64,
    /// How pages are encoded on their way down (default: raw; ADR 0021). Pages are
    /// encoded on the tier's writer and maintenance threads only: a store acknowledged
    /// `written` or `synced` writes raw on its caller's thread, and compaction encodes
    /// such a record when it moves it.
    pub codec: CodecConfig,
}

impl SsdConfig {
    /// Default settings for a store in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            store: StoreConfig::default(),
            quarantine: Duration::from_secs(3600),
            capacity_bytes: 64 << 30,
            namespace_bytes: None,
            namespace_overrides: BTreeMap::new(),
            ttl: Duration::from_secs(7 * 24 * 3600),
            min_free_bytes: 1 << 30,
            codec: CodecConfig::default(),
        }
    }
}

#[derive(Debug)]
struct Held {
    loc: Loc,
    meta: BlockMeta,
    /// Last store or read, on the tier's time line ([`SsdTier::now`]).
    last_access: AtomicU64,
}

#[derive(Debug, Default)]
struct Counters {
    stores: u64,
    dedup_skips: u64,
    rejected_collision: u64,
    rejected_quarantined: u64,
    rejected_no_space: u64,
    rejected_low_disk: u64,
    io_errors: u64,
    evictions: Evictions,
    resident_bytes: u64,
    /// Payload bytes held per namespace.
    namespace_bytes: HashMap<LayoutDigest, u64>,
    /// Bytes of live records per segment (record length, padding included).
    segment_live: HashMap<u64, u64>,
    /// Segments reclaimed by compaction, and records moved out of them.
    segments_reclaimed: u64,
    records_relocated: u64,
    /// Bytes of the blocks held encoded, per codec.
    codec: Resident,
}

impl Counters {
    /// Counts block record `loc` of `layout` as held.
    fn hold(&mut self, layout: LayoutDigest, loc: &Loc) {
        self.resident_bytes += loc.payload_len;
        *self.namespace_bytes.entry(layout).or_default() += loc.payload_len;
        *self.segment_live.entry(loc.segment).or_default() += loc.record_len;
        if let Some(e) = loc.encoding {
            self.codec.add(e.codec, loc.payload_len, e.decoded_len);
        }
    }

    /// Counts block record `loc` of `layout` as gone.
    fn release(&mut self, layout: LayoutDigest, loc: &Loc) {
        self.resident_bytes = self.resident_bytes.saturating_sub(loc.payload_len);
        if let Some(b) = self.namespace_bytes.get_mut(&layout) {
            *b = b.saturating_sub(loc.payload_len);
        }
        if let Some(live) = self.segment_live.get_mut(&loc.segment) {
            *live = live.saturating_sub(loc.record_len);
        }
        if let Some(e) = loc.encoding {
            self.codec.remove(e.codec, loc.payload_len, e.decoded_len);
        }
    }
}

/// See the module docs.
pub struct SsdTier {
    store: SegmentStore,
    blocks: RwLock<HashMap<BlockHash, Arc<Held>, BuildHasherDefault<PassThroughHasher>>>,
    snapshots: RwLock<HashMap<[u8; 32], Arc<snapshots::HeldSnapshot>>>,
    /// Keys being written: one writer per key at a time (see `claims.rs`).
    claims: claims::Claims,
    quarantine: Mutex<HashMap<BlockHash, u64>>,
    counters: Mutex<Counters>,
    hits: AtomicU64,
    misses: AtomicU64,
    config: SsdConfig,
    clock: Arc<dyn Clock>,
    /// Added to the clock's monotonic reading to give the tier's time line, so that the
    /// ages of the records recovered at open fit on it (see [`SsdTier::open`]).
    shift: u64,
    sink: Arc<dyn ResidencySink>,
    recovery: RecoveryReport,
    /// Encodes pages on their way down; the store decodes with it.
    coder: Arc<PageCoder>,
}

impl fmt::Debug for SsdTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SsdTier")
            .field("dir", &self.config.dir)
            .finish_non_exhaustive()
    }
}

fn key_of(hash: &BlockHash) -> [u8; 32] {
    let mut k = [0u8; 32];
    k[..16].copy_from_slice(&hash.0);
    k
}

/// How long ago (nanoseconds) a record stamped `created_ms` was written, at wall time
/// `wall_now_ms`; 0 for a stamp in the future (the wall clock went back). Ages past the
/// TTL are cut to just past it: such a record expires at the next pass whatever its age,
/// and a short cut keeps the tier's time line near the clock's.
fn recovered_age(wall_now_ms: u64, created_ms: u64, ttl_ns: u64) -> u64 {
    wall_now_ms
        .saturating_sub(created_ms)
        .saturating_mul(1_000_000)
        .min(ttl_ns.saturating_add(1))
}

impl SsdTier {
    /// Opens the store, recovers what it holds and reports every recovered block to
    /// `sink` (the engine's prefix index). Time comes from `clock`: its monotonic reading
    /// for TTL, LRU order and quarantine, its wall reading for the records' creation
    /// stamps.
    ///
    /// Across a restart a record's last access is not known; its creation stamp is the
    /// best lower bound, so it counts as last accessed that long ago. The monotonic clock
    /// may have started just now, too recently to hold such an age, so the tier runs its
    /// own time line ahead of the clock by the largest recovered age (capped just past the
    /// TTL): a block stored six days before a restart with a seven-day TTL expires one day
    /// after it, not seven.
    pub fn open(
        config: SsdConfig,
        clock: Arc<dyn Clock>,
        sink: Arc<dyn ResidencySink>,
    ) -> Result<Self> {
        config
            .codec
            .validate()
            .map_err(|e| Error::invalid(format!("invalid SSD codec settings: {e}")))?;
        let (mut store, recovered, recovery) =
            SegmentStore::open_with_clock(&config.dir, config.store, clock.clone())?;
        let coder = Arc::new(PageCoder::new(config.codec.clone()));
        store.use_coder(coder.clone());
        let mut blocks: HashMap<BlockHash, Arc<Held>, BuildHasherDefault<PassThroughHasher>> =
            HashMap::with_capacity_and_hasher(recovered.len(), BuildHasherDefault::default());
        let mut counters = Counters::default();
        let ttl_ns = u64::try_from(config.ttl.as_nanos()).unwrap_or(u64::MAX);
        let wall_now = clock.wall_unix_ms();
        let age = |created_ms| recovered_age(wall_now, created_ms, ttl_ns);
        let shift = recovered
            .iter()
            .map(|r| age(r.header.created_ms))
            .max()
            .unwrap_or(0);
        let now = clock.now_nanos().saturating_add(shift);
        let mut snapshot_map = HashMap::new();
        for mut r in recovered {
            if r.header.kind == Kind::Object {
                // A gateway's directory: not blocks, never served as such.
                tracing::warn!(dir = %config.dir.display(), "skipping a kvtier gateway record in an SSD tier directory");
                continue;
            }
            if r.header.kind == Kind::Snapshot {
                *counters.segment_live.entry(r.loc.segment).or_default() += r.loc.record_len;
                snapshot_map.insert(
                    r.header.key,
                    Arc::new(snapshots::HeldSnapshot {
                        loc: r.loc,
                        layout: r.header.layout,
                        last_access: AtomicU64::new(now.saturating_sub(age(r.header.created_ms))),
                    }),
                );
                continue;
            }
            let meta = BlockMeta {
                layout: r.header.layout,
                hash: r.header.block_hash(),
                parent: r.header.parent,
                position: r.header.position,
                tokens: Arc::from(std::mem::take(&mut r.header.tokens)),
                extra_tag: r.header.extra_tag,
            };
            counters.hold(meta.layout, &r.loc);
            // The creation stamp stands in for the last access (see above).
            blocks.insert(
                meta.hash,
                Arc::new(Held {
                    loc: r.loc,
                    meta,
                    last_access: AtomicU64::new(now.saturating_sub(age(r.header.created_ms))),
                }),
            );
        }
        let metas: Vec<&BlockMeta> = blocks.values().map(|h| &h.meta).collect();
        sink.inserted_many(TierKind::Ssd, &metas);
        drop(metas);
        tracing::info!(
            dir = %config.dir.display(),
            records = recovery.records,
            dropped_missing = recovery.dropped_missing,
            torn_index_bytes = recovery.torn_index_bytes,
            rescanned = recovery.rescanned_segments,
            elapsed_ms = recovery.elapsed.as_millis() as u64,
            "SSD tier recovered"
        );
        Ok(Self {
            store,
            blocks: RwLock::new(blocks),
            snapshots: RwLock::new(snapshot_map),
            claims: claims::Claims::default(),
            quarantine: Mutex::new(HashMap::new()),
            counters: Mutex::new(counters),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            config,
            clock,
            shift,
            sink,
            recovery,
            coder,
        })
    }

    /// Now on the tier's time line: the clock's monotonic reading, shifted so that every
    /// recovered age fits (see [`SsdTier::open`]). TTL, LRU order and quarantine all read
    /// it.
    fn now(&self) -> u64 {
        self.clock.now_nanos().saturating_add(self.shift)
    }

    /// Whether writing `len` more bytes would leave less than the free-space watermark on
    /// the store's filesystem. An unreadable filesystem status does not stop admission
    /// (the write itself will report a full disk).
    fn disk_nearly_full(&self, len: u64) -> bool {
        if self.config.min_free_bytes == 0 {
            return false;
        }
        match rustix::fs::statvfs(self.store.dir()) {
            Ok(st) => {
                st.f_bavail.saturating_mul(st.f_frsize)
                    < self.config.min_free_bytes.saturating_add(len)
            }
            Err(_) => false,
        }
    }

    /// Blocks refused because the filesystem was below the free-space watermark.
    pub fn rejected_low_disk(&self) -> u64 {
        self.counters.lock().rejected_low_disk
    }

    /// Makes everything stored so far durable (`fdatasync` of every segment and log).
    pub fn sync(&self) -> Result<()> {
        self.store.sync()
    }

    /// What recovery found when the tier was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Blocks written with `O_DIRECT` since open (durable stores, see
    /// [`Tier::put_to_sync`]).
    pub fn direct_writes(&self) -> u64 {
        self.store.direct_appends()
    }

    /// Whether `hash` is quarantined now.
    pub fn is_quarantined(&self, hash: &BlockHash) -> bool {
        let now = self.now();
        let mut q = self.quarantine.lock();
        match q.get(hash) {
            Some(&until) if until > now => true,
            Some(_) => {
                q.remove(hash);
                false
            }
            None => false,
        }
    }

    fn quarantine(&self, hash: BlockHash) {
        let until = self
            .now()
            .saturating_add(u64::try_from(self.config.quarantine.as_nanos()).unwrap_or(u64::MAX));
        self.quarantine.lock().insert(hash, until);
    }

    /// Drops a held block: out of the map, tombstoned on disk, reported to the sink.
    fn drop_block(&self, hash: &BlockHash, cause: RemovalCause) -> Result<bool> {
        self.drop_if(hash, None, cause)
    }

    /// Like [`SsdTier::drop_block`], but only if the map still holds `expected` (when
    /// given): a record that compaction moved meanwhile is not the one that failed.
    fn drop_if(
        &self,
        hash: &BlockHash,
        expected: Option<&Arc<Held>>,
        cause: RemovalCause,
    ) -> Result<bool> {
        let held = {
            let mut blocks = self.blocks.write();
            match (blocks.get(hash), expected) {
                (None, _) => return Ok(false),
                (Some(now), Some(exp)) if !Arc::ptr_eq(now, exp) => return Ok(false),
                _ => {}
            }
            match blocks.remove(hash) {
                Some(h) => h,
                None => return Ok(false),
            }
        };
        {
            let mut c = self.counters.lock();
            c.release(held.meta.layout, &held.loc);
            match cause {
                RemovalCause::Budget => c.evictions.budget += 1,
                RemovalCause::Ttl => c.evictions.ttl += 1,
                RemovalCause::Explicit => c.evictions.explicit += 1,
                _ => c.evictions.corrupt += 1,
            }
        }
        self.sink.removed(TierKind::Ssd, &held.meta, cause, None);
        if let Err(e) = self.store.tombstone(&held.loc, key_of(hash)) {
            // The record stays on disk; recovery will find it again, verify it on read,
            // and the next removal retries the tombstone.
            self.counters.lock().io_errors += 1;
            tracing::warn!(block = %hash, error = %e, "could not write a tombstone");
        }
        Ok(true)
    }

    /// Writes a block record (durable as configured) and returns where it lives.
    /// [`Tier::put`]; with `to_sync`, for a caller that syncs right after; `coding` says
    /// whether the page goes through the codec (on a writer thread, never a waiting
    /// caller's).
    fn put_as(
        &self,
        meta: &BlockMeta,
        payload: Bytes,
        to_sync: bool,
        coding: Coding,
    ) -> Result<PutOutcome> {
        if self.is_quarantined(&meta.hash) {
            self.counters.lock().rejected_quarantined += 1;
            return Ok(PutOutcome::Rejected(RejectReason::Quarantined));
        }
        let key = key_of(&meta.hash);
        // Another write of this block (the write-behind queue's, a durable store's, a
        // compaction's) finishes first; then the block is held — a duplicate, and the
        // record that writer published is on disk when this returns — or it is not, and
        // this writes it. Never two copies written side by side (see `claims.rs`).
        let _claim = self.claims.claim(key);
        if let Some(held) = self.blocks.read().get(&meta.hash).cloned() {
            if held.meta == *meta && held.loc.decoded_len() == payload.len() as u64 {
                held.last_access.store(self.now(), Ordering::Relaxed);
                self.counters.lock().dedup_skips += 1;
                return Ok(PutOutcome::Duplicate);
            }
            tracing::warn!(
                block = %meta.hash,
                held_tokens = held.meta.tokens.len(),
                new_tokens = meta.tokens.len(),
                held_len = held.loc.decoded_len(),
                new_len = payload.len(),
                "hash collision: one hash, two different blocks; quarantining the hash"
            );
            self.quarantine(meta.hash);
            self.counters.lock().rejected_collision += 1;
            return Ok(PutOutcome::Rejected(RejectReason::Collision));
        }
        if self.disk_nearly_full(payload.len() as u64) {
            let mut c = self.counters.lock();
            c.rejected_low_disk += 1;
            c.rejected_no_space += 1;
            return Ok(PutOutcome::Rejected(RejectReason::NoSpace));
        }
        if !self.make_room(meta.layout, payload.len() as u64)? {
            return Ok(PutOutcome::Rejected(RejectReason::NoSpace));
        }
        let loc = match self.write_record(meta, &payload, to_sync, coding) {
            Ok(loc) => loc,
            Err(e) => {
                self.counters.lock().io_errors += 1;
                tracing::warn!(block = %meta.hash, error = %e, "SSD write failed");
                return Err(e);
            }
        };
        let held = Arc::new(Held {
            loc,
            meta: meta.clone(),
            last_access: AtomicU64::new(self.now()),
        });
        // The claim kept every other writer of this key out, so the map cannot hold it.
        let mut blocks = self.blocks.write();
        blocks.insert(meta.hash, held);
        {
            let mut c = self.counters.lock();
            c.stores += 1;
            c.hold(meta.layout, &loc);
        }
        // Published under the map lock, so a concurrent removal reports after this.
        self.sink.inserted(TierKind::Ssd, meta);
        Ok(PutOutcome::Stored)
    }

    fn write_record(
        &self,
        meta: &BlockMeta,
        payload: &[u8],
        to_sync: bool,
        coding: Coding,
    ) -> Result<Loc> {
        let chunk_log2 = self.config.store.chunk_log2;
        let encoded = match coding {
            Coding::Raw => None,
            Coding::Encode => self.coder.encode_block(meta.layout, payload),
            Coding::Ahead(encoded) => encoded,
        };
        let (stored, encoding) = match &encoded {
            Some(e) => (
                e.frame.as_slice(),
                Some(Encoding {
                    codec: e.codec,
                    decoded_len: payload.len() as u64,
                }),
            ),
            None => (payload, None),
        };
        let header = RecordHeader {
            kind: Kind::Block,
            layout: meta.layout,
            key: key_of(&meta.hash),
            parent: meta.parent,
            position: meta.position,
            tokens: meta.tokens.to_vec(),
            extra_tag: meta.extra_tag,
            payload_len: stored.len() as u64,
            created_ms: self.clock.wall_unix_ms(),
            chunk_log2,
            chunk_crcs: chunk_crcs(stored, chunk_log2),
            encoding,
        };
        if to_sync {
            self.store.append_to_sync(&header, stored)
        } else {
            self.store.append(&header, stored)
        }
    }

    /// The block's bytes (`range` of them, or all), or why there are none: not held, or
    /// held but failing verification (dropped and quarantined here).
    fn read(
        &self,
        hash: &BlockHash,
        range: Option<Range<u64>>,
    ) -> Result<std::result::Result<Bytes, ShortRead>> {
        let Some(held) = self.blocks.read().get(hash).cloned() else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return Ok(Err(ShortRead::NotHeld));
        };
        match self.store.read(&held.loc, &key_of(hash), range.clone()) {
            Ok(bytes) => {
                held.last_access.store(self.now(), Ordering::Relaxed);
                self.hits.fetch_add(1, Ordering::Relaxed);
                Ok(Ok(bytes))
            }
            Err(ReadFault::Corrupt(why)) => {
                if self
                    .blocks
                    .read()
                    .get(hash)
                    .is_some_and(|now| !Arc::ptr_eq(now, &held))
                {
                    // Compaction moved the record while we read its old copy: read again.
                    return self.read(hash, range);
                }
                tracing::warn!(block = %hash, %why, "corrupt record: dropping and quarantining it");
                self.misses.fetch_add(1, Ordering::Relaxed);
                self.quarantine(*hash);
                self.drop_if(hash, Some(&held), RemovalCause::Corrupt)?;
                Ok(Err(ShortRead::Corrupt))
            }
            Err(ReadFault::Io(e)) => {
                if e.kind() != kvtier_core::ErrorKind::Invalid {
                    self.counters.lock().io_errors += 1;
                }
                Err(e)
            }
        }
    }
}

impl Tier for SsdTier {
    fn kind(&self) -> TierKind {
        TierKind::Ssd
    }

    fn make_durable(&self) -> Result<()> {
        self.store.sync_pending()
    }

    fn put(&self, meta: &BlockMeta, payload: Bytes) -> Result<PutOutcome> {
        self.put_as(meta, payload, false, Coding::Encode)
    }

    fn put_many(&self, items: &[(BlockMeta, Bytes)]) -> Vec<Result<PutOutcome>> {
        self.put_pipelined(items)
    }

    fn takes_batches(&self) -> bool {
        true
    }

    fn put_for_caller(&self, meta: &BlockMeta, payload: Bytes) -> Result<PutOutcome> {
        self.put_as(meta, payload, false, Coding::Raw)
    }

    fn put_to_sync(&self, meta: &BlockMeta, payload: Bytes) -> Result<PutOutcome> {
        self.put_as(meta, payload, true, Coding::Raw)
    }

    fn layout_registered(&self, layout: &kvtier_core::layout::Layout) {
        self.coder.learn(layout);
    }
    fn get(&self, hash: &BlockHash) -> Result<Option<Bytes>> {
        Ok(self.read(hash, None)?.ok())
    }

    fn read_run(&self, hashes: &[BlockHash]) -> Result<RunRead> {
        let mut out = RunRead::default();
        for hash in hashes {
            match self.read(hash, None)? {
                Ok(bytes) => out.blocks.push(bytes),
                Err(short) => {
                    out.short = Some(short);
                    break;
                }
            }
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
        let Some(len) = self.blocks.read().get(hash).map(|h| h.loc.decoded_len()) else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return Ok(Err(ShortRead::NotHeld));
        };
        if range.start >= range.end || range.end > len {
            return Err(Error::invalid(format!(
                "byte range {}..{} is empty or past the end of block `{hash}` ({len} bytes)",
                range.start, range.end
            )));
        }
        self.read(hash, Some(range))
    }

    fn contains(&self, hash: &BlockHash) -> bool {
        self.blocks.read().contains_key(hash)
    }

    fn remove(&self, hash: &BlockHash) -> Result<bool> {
        self.drop_block(hash, RemovalCause::Explicit)
    }

    fn snapshots(&self) -> Option<&dyn kvtier_core::tier::SnapshotStore> {
        Some(self)
    }

    fn record_shutdown(&self, clean: bool) -> Result<()> {
        self.store.sync()?;
        self.store.record_shutdown(clean)
    }

    fn previous_shutdown_clean(&self) -> Option<bool> {
        self.recovery.previous_shutdown_clean
    }

    fn stats(&self) -> TierStats {
        let blocks = self.blocks.read();
        let c = self.counters.lock();
        TierStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            stores: c.stores,
            dedup_skips: c.dedup_skips,
            rejected_collision: c.rejected_collision,
            rejected_quarantined: c.rejected_quarantined,
            io_errors: c.io_errors,
            evictions: c.evictions,
            resident_blocks: blocks.len() as u64,
            resident_bytes: c.resident_bytes,
            capacity_bytes: self.config.capacity_bytes,
            rejected_no_space: c.rejected_no_space,
            relocated: c.records_relocated,
            codec: c.codec.fill(self.coder.stats()),
            ..TierStats::default()
        }
    }
}
