//! The segment store: append-only segments of checksummed records, positioned reads, and
//! recovery that salvages every intact record (see `recovery.rs` and `scan.rs`).
//!
//! Writes go to the tail of one active segment, under one mutex. Reads are positioned
//! (`pread`) and take no lock but a short read lock on the segment table. A record becomes
//! visible — its `Loc` is returned to the caller, who publishes it — only after its bytes
//! and its index entry are written and, with [`Durability::Synced`], synced: write, make
//! durable, then publish (seed 004).
//!
//! - **Group commit.** [`SegmentStore::sync_pending`] makes everything appended before it
//!   was called durable; callers that arrive while a sync runs wait for it and then find
//!   their writes covered, or share the next one. Sixteen concurrent durable stores cost
//!   about one `fdatasync` per batch, not sixteen.
//! - **What a sync covers.** A record's own header in the `.seg` is its durable index
//!   entry: recovery finds a record the `.idx` lacks by reading it, so a durable append
//!   syncs the segment's data only. Tombstones live only in the `.idx`, so a durable
//!   tombstone syncs the log.
//! - **Early writeback.** Every finished mebibyte of appends is handed to the disk at once
//!   (`writeback.rs`), so a later sync has little left to wait for.
//! - **Nothing written at open.** The active segment is created by the first append, so a
//!   store on a full disk opens and serves what it holds; appends fail with `NoSpace`
//!   until space returns, then resume.

mod append_stream;
mod buffers;
mod decoding_read;
pub mod direct;
mod group_commit;
mod lock;
mod read;
mod recovery;
mod scan;
mod writeback;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_codec::{CodecConfig, PageCoder};
use kvtier_core::clock::{Clock, ClockExt, SystemClock};
use kvtier_core::{Error, ErrorKind, Result};
use parking_lot::{Mutex, RwLock};

pub use append_stream::Reservation;
pub use lock::{DirLock, io_error};
pub use recovery::{Recovered, RecoveryReport};

use crate::format::{
    Encoding, IndexEntry, RecordHeader, SEGMENT_HEADER_LEN, SegmentHeader, encode_index_entry,
};

/// When an append or tombstone returns — the engine's acknowledgement levels
/// (`kvtier_core::Ack`) as the store sees them. Either way the bytes are in the page cache
/// when it returns, so they survive the process being killed; only `Synced` makes them
/// survive a power loss (or call [`SegmentStore::sync_pending`] for a batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Written (the page cache decides when bytes reach the disk), after up to `retries`
    /// further attempts when a write fails (never for a full disk).
    Written {
        /// Extra attempts after the first.
        retries: u32,
    },
    /// Every append (its record) and tombstone (its log entry) is synced (`fdatasync`,
    /// shared between concurrent callers) before it returns.
    Synced,
}

/// Settings of the segment store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    /// A segment is sealed and a new one started when the next record would pass this
    /// many bytes (default 256 MiB).
    pub segment_bytes: u64,
    /// When a write counts as done (default: written, no retries).
    pub durability: Durability,
    /// log2 of the payload checksum chunk (default 16: 64 KiB).
    pub chunk_log2: u8,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 256 << 20,
            durability: Durability::Written { retries: 0 },
            chunk_log2: 16,
        }
    }
}

/// Where a record lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    /// Segment id.
    pub segment: u64,
    /// Offset of the record in the segment file.
    pub offset: u64,
    /// Bytes of header, tokens and chunk table.
    pub meta_len: u64,
    /// Offset of the payload from the record's start.
    pub payload_offset: u64,
    /// Payload length.
    pub payload_len: u64,
    /// Bytes the record occupies, padding included.
    pub record_len: u64,
    /// How the payload is encoded (`None`: raw).
    pub encoding: Option<Encoding>,
}

impl Loc {
    fn new(segment: u64, offset: u64, h: &RecordHeader) -> Self {
        Self {
            segment,
            offset,
            meta_len: h.meta_len(),
            payload_offset: h.payload_offset(),
            payload_len: h.payload_len,
            record_len: h.record_len(),
            encoding: h.encoding,
        }
    }

    /// Bytes the payload decodes to (its length when raw): what a read returns.
    pub fn decoded_len(&self) -> u64 {
        self.encoding.map_or(self.payload_len, |e| e.decoded_len)
    }

    /// Offset just past the payload: the file must be at least this long.
    pub fn data_end(&self) -> u64 {
        self.offset + self.payload_offset + self.payload_len
    }
}

/// A read that did not return bytes.
#[derive(Debug)]
pub enum ReadFault {
    /// The bytes on disk are not what was written: a miss, and the record must go.
    Corrupt(String),
    /// The read itself failed.
    Io(Error),
}

#[derive(Debug)]
struct Segment {
    id: u64,
    seg: File,
    /// The data file opened for direct writes: only for segments this process created
    /// (the active one), and only where the filesystem supports `O_DIRECT`.
    direct: Option<File>,
    /// `None` when the store is read-only (or the log could not be opened at recovery).
    idx: Mutex<Option<File>>,
}

#[derive(Debug)]
struct Active {
    segment: Arc<Segment>,
    tail: u64,
    /// How far the segment's writeback has been started (see `writeback.rs`).
    kicker: writeback::Kicker,
}

#[derive(Debug)]
struct ActiveSlot {
    /// Created by the first append after open.
    current: Option<Active>,
    next_id: u64,
    /// Where a record written direct is assembled (under the append lock).
    scratch: direct::AlignedScratch,
}

/// Writes not yet synced, for group commit.
#[derive(Debug, Default)]
struct Unsynced {
    /// Segments with record bytes written since their last sync.
    data: BTreeSet<u64>,
    /// Segments with log entries that must be synced (tombstones).
    logs: BTreeSet<u64>,
}

/// See the module docs.
#[derive(Debug)]
pub struct SegmentStore {
    dir: PathBuf,
    config: StoreConfig,
    segments: RwLock<BTreeMap<u64, Arc<Segment>>>,
    active: Mutex<ActiveSlot>,
    buffers: buffers::BufferPool,
    /// Writes counted when they are marked unsynced; `sync_gate` knows how many a
    /// completed sync covered.
    writes: AtomicU64,
    unsynced: Mutex<Unsynced>,
    sync_gate: group_commit::SyncGate,
    /// Records written with `O_DIRECT` (see [`SegmentStore::append_to_sync`]).
    direct_appends: AtomicU64,
    read_only: bool,
    /// Stamps new segments with their creation date.
    clock: Arc<dyn Clock>,
    /// Decodes encoded payloads on reads (and counts what that costs); the tier that
    /// writes them shares its coder ([`SegmentStore::use_coder`]).
    coder: Arc<PageCoder>,
    _lock: Option<DirLock>,
}

fn seg_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:016x}.seg"))
}

fn idx_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:016x}.idx"))
}

impl SegmentStore {
    /// [`SegmentStore::open_with_clock`] with the system clock (tools and tests).
    pub fn open(dir: &Path, config: StoreConfig) -> Result<(Self, Vec<Recovered>, RecoveryReport)> {
        Self::open_with_clock(dir, config, Arc::new(SystemClock::new()))
    }

    /// Opens (creating if needed) the store in `dir`, takes its exclusive lock and
    /// recovers every live record, repairing what recovery found (torn tails, damaged
    /// logs, tombstones older copies lack). Writes nothing else: the active segment is
    /// created by the first append. New segments are stamped with `clock`'s wall time.
    pub fn open_with_clock(
        dir: &Path,
        config: StoreConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<(Self, Vec<Recovered>, RecoveryReport)> {
        if !(9..=30).contains(&config.chunk_log2) || config.segment_bytes < 2 * SEGMENT_HEADER_LEN {
            return Err(Error::invalid(format!(
                "invalid SSD store settings: chunk_log2={} (9..=30), segment_bytes={} (at least 8 KiB)",
                config.chunk_log2, config.segment_bytes
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| io_error(dir, "create directory", e))?;
        let lock = DirLock::acquire(dir)?;
        // How the previous run ended; the record is consumed, so a crash in this run
        // leaves none for the next.
        let shutdown_file = dir.join("SHUTDOWN");
        let previous_clean = std::fs::read_to_string(&shutdown_file)
            .ok()
            .map(|s| s.trim() == "clean");
        let _ = std::fs::remove_file(&shutdown_file);
        let (segments, recovered, mut report, max_seen) =
            recovery::recover(dir, recovery::Mode::Repair)?;
        report.previous_shutdown_clean = previous_clean;
        let store = Self::assemble(dir, config, segments, max_seen, Some(lock), clock);
        if previous_clean != Some(true) {
            // A run that did not end cleanly may have left records in the page cache only
            // (written, not yet synced). A store acknowledged `synced` that finds such a
            // block held must not be answered before it is durable, so the first sync of
            // this run covers every segment recovery kept.
            store.mark_all_unsynced();
        }
        Ok((store, recovered, report))
    }

    /// Opens the store in `dir` without changing anything in it: no lock, no repair, every
    /// file opened read-only, so it works beside a running server (which may be writing:
    /// a record being appended shows as a torn tail). Appends, tombstones and syncs are
    /// refused. `previous_shutdown_clean` reports the shutdown record, left in place.
    pub fn open_read_only(dir: &Path) -> Result<(Self, Vec<Recovered>, RecoveryReport)> {
        if !dir.is_dir() {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("`{}` is not a directory", dir.display()),
            ));
        }
        let previous_clean = std::fs::read_to_string(dir.join("SHUTDOWN"))
            .ok()
            .map(|s| s.trim() == "clean");
        let (segments, recovered, mut report, max_seen) =
            recovery::recover(dir, recovery::Mode::ReadOnly)?;
        report.previous_shutdown_clean = previous_clean;
        // Read-only: no segment is ever created, so no stamp is ever read.
        let clock = Arc::new(SystemClock::new());
        let store = Self::assemble(dir, StoreConfig::default(), segments, max_seen, None, clock);
        Ok((store, recovered, report))
    }

    fn assemble(
        dir: &Path,
        config: StoreConfig,
        segments: BTreeMap<u64, Arc<Segment>>,
        max_seen: u64,
        lock: Option<DirLock>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        // Only a store that holds its directory's lock may write.
        let read_only = lock.is_none();
        Self {
            dir: dir.to_path_buf(),
            config,
            segments: RwLock::new(segments),
            active: Mutex::new(ActiveSlot {
                current: None,
                next_id: max_seen + 1,
                scratch: direct::AlignedScratch::default(),
            }),
            buffers: buffers::BufferPool::default(),
            writes: AtomicU64::new(0),
            unsynced: Mutex::new(Unsynced::default()),
            sync_gate: group_commit::SyncGate::default(),
            direct_appends: AtomicU64::new(0),
            read_only,
            clock,
            coder: Arc::new(PageCoder::new(CodecConfig::default())),
            _lock: lock,
        }
    }

    /// Decodes reads with `coder` (the writing tier's, so its counters see every decode).
    pub fn use_coder(&mut self, coder: Arc<PageCoder>) {
        self.coder = coder;
    }

    fn writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("store `{}` is open read-only", self.dir.display()),
            ));
        }
        Ok(())
    }

    /// Records written with `O_DIRECT` since open.
    pub fn direct_appends(&self) -> u64 {
        self.direct_appends.load(Ordering::Relaxed)
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The settings in force.
    pub fn config(&self) -> StoreConfig {
        self.config
    }

    /// Appends a record (header fields already filled, chunk checksums computed from
    /// `payload`) and its index entry; returns where it lives once it is durable as
    /// configured.
    pub fn append(&self, header: &RecordHeader, payload: &[u8]) -> Result<Loc> {
        self.append_as(header, payload, false)
    }

    /// [`SegmentStore::append`] for a caller that calls [`SegmentStore::sync_pending`]
    /// next: the record is written with `O_DIRECT` where the filesystem allows, which
    /// reaches stable storage sooner than a buffered write when a sync follows at once.
    /// Durability is as configured until that sync.
    pub fn append_to_sync(&self, header: &RecordHeader, payload: &[u8]) -> Result<Loc> {
        self.append_as(header, payload, true)
    }

    fn append_as(&self, header: &RecordHeader, payload: &[u8], to_sync: bool) -> Result<Loc> {
        self.writable()?;
        let meta = header.encode();
        // A direct write holds the append lock until the device has the bytes. When other
        // appends are queued for the lock, that would serialize them behind the device, so
        // a contended append goes buffered: the copies proceed at memory speed and one
        // shared sync (group commit) takes them all to the disk.
        let (mut guard, contended) = match self.active.try_lock() {
            Some(g) => (g, false),
            None => (self.active.lock(), true),
        };
        let slot = &mut *guard;
        let active =
            self.active_with_room(&mut slot.current, &mut slot.next_id, header.record_len())?;
        let seg = active.segment.clone();
        let offset = active.tail;
        let loc = Loc::new(seg.id, offset, header);
        let path = seg_path(&self.dir, seg.id);
        let direct = seg.direct.as_ref().filter(|_| to_sync && !contended);
        let buffered = || -> std::io::Result<bool> {
            seg.seg.write_all_at(&meta, offset)?;
            seg.seg.write_all_at(payload, offset + loc.payload_offset)?;
            Ok(false)
        };
        let wrote_direct = self
            .with_retries(|| match direct {
                Some(file) => {
                    // The whole record, padding included, from one aligned buffer: its
                    // offset and length are whole pages (the format's alignment).
                    let buf = slot.scratch.zeroed(loc.record_len as usize);
                    buf[..meta.len()].copy_from_slice(&meta);
                    let at = loc.payload_offset as usize;
                    buf[at..at + payload.len()].copy_from_slice(payload);
                    match file.write_all_at(buf, offset) {
                        // A filesystem that opened for O_DIRECT but refuses the request.
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => buffered(),
                        other => other.map(|()| true),
                    }
                }
                None => buffered(),
            })
            .map_err(|e| io_error(&path, "write record to", e))?;
        if wrote_direct {
            self.direct_appends.fetch_add(1, Ordering::Relaxed);
        }
        // The tail moves even if the index entry fails: the space is simply dead.
        active.tail = offset + loc.record_len;
        let kick = active.kicker.due(active.tail);
        drop(guard);
        if let Some((from, len)) = kick {
            writeback::start(&seg.seg, from, len);
        }
        self.mark_unsynced(seg.id, true, false);
        // The record describes itself: a failed log entry only costs recovery a read.
        if let Err(e) = self.append_index(
            &seg,
            &IndexEntry::Record {
                offset,
                header: header.clone(),
            },
        ) {
            tracing::warn!(error = %e, "index log entry not written; recovery will read the record instead");
        }
        if self.config.durability == Durability::Synced {
            self.sync_pending()?;
        }
        Ok(loc)
    }

    /// The active segment, after starting a new one if there is none yet or a record of
    /// `record_len` bytes would take it past the segment size.
    fn active_with_room<'a>(
        &self,
        current: &'a mut Option<Active>,
        next_id: &mut u64,
        record_len: u64,
    ) -> Result<&'a mut Active> {
        let full = current.as_ref().is_none_or(|a| {
            a.tail > SEGMENT_HEADER_LEN && a.tail + record_len > self.config.segment_bytes
        });
        if full {
            let id = *next_id;
            // Ids are never reused, not even one whose creation failed.
            *next_id += 1;
            let segment = Arc::new(create_segment(&self.dir, id, self.clock.wall_unix_ms())?);
            self.segments.write().insert(id, segment.clone());
            *current = Some(Active {
                segment,
                tail: SEGMENT_HEADER_LEN,
                kicker: writeback::Kicker::at(SEGMENT_HEADER_LEN),
            });
        }
        current
            .as_mut()
            .ok_or_else(|| Error::new(ErrorKind::Internal, "no active segment"))
    }

    fn mark_unsynced(&self, segment: u64, data: bool, log: bool) {
        let mut u = self.unsynced.lock();
        if data {
            u.data.insert(segment);
        }
        if log {
            u.logs.insert(segment);
        }
        // Counted under the same lock as the sets, so a sync that reads the count also
        // takes every segment the counted writes touched.
        self.writes.fetch_add(1, Ordering::SeqCst);
    }

    /// Marks every segment's data and log as not yet synced (see `open_with_clock`).
    fn mark_all_unsynced(&self) {
        let ids: Vec<u64> = self.segments.read().keys().copied().collect();
        let mut u = self.unsynced.lock();
        u.data.extend(&ids);
        u.logs.extend(&ids);
        self.writes.fetch_add(1, Ordering::SeqCst);
    }

    /// Makes every append (its record) and every tombstone that returned before this call
    /// durable (`fdatasync`). Concurrent callers share syncs (group commit): one waits for
    /// a sync in progress and returns at once if it covered its writes.
    pub fn sync_pending(&self) -> Result<()> {
        self.writable()?;
        let wanted = self.writes.load(Ordering::SeqCst);
        self.sync_gate.sync(Some(wanted), || self.sync_unsynced())
    }

    /// Syncs the segments written since the last sync; returns the write count covered.
    fn sync_unsynced(&self) -> Result<u64> {
        let (upto, data, logs) = {
            let mut u = self.unsynced.lock();
            (
                self.writes.load(Ordering::SeqCst),
                std::mem::take(&mut u.data),
                std::mem::take(&mut u.logs),
            )
        };
        let table: Vec<(u64, Option<Arc<Segment>>)> = {
            let segs = self.segments.read();
            data.iter()
                .chain(&logs)
                .map(|id| (*id, segs.get(id).cloned()))
                .collect()
        };
        let mut result = Ok(upto);
        for (n, (id, seg)) in table.iter().enumerate() {
            // A segment removed since (compaction) needs no sync.
            let Some(seg) = seg else { continue };
            let synced_one = if n < data.len() {
                seg.seg
                    .sync_data()
                    .map_err(|e| io_error(&seg_path(&self.dir, *id), "sync", e))
            } else {
                match seg.idx.lock().as_ref() {
                    Some(idx) => idx
                        .sync_data()
                        .map_err(|e| io_error(&idx_path(&self.dir, *id), "sync", e)),
                    None => Ok(()),
                }
            };
            if let Err(e) = synced_one {
                result = Err(e);
                break;
            }
        }
        if result.is_err() {
            // Not durable: a later sync must cover these segments again.
            let mut u = self.unsynced.lock();
            u.data.extend(data);
            u.logs.extend(logs);
        }
        result
    }

    /// Syncs every segment's data and index log (`fdatasync`), making everything
    /// written so far durable whatever the configured durability.
    pub fn sync(&self) -> Result<()> {
        self.writable()?;
        self.sync_gate.sync(None, || {
            let upto = self.writes.load(Ordering::SeqCst);
            let segments: Vec<Arc<Segment>> = self.segments.read().values().cloned().collect();
            for seg in segments {
                seg.seg
                    .sync_data()
                    .map_err(|e| io_error(&seg_path(&self.dir, seg.id), "sync", e))?;
                if let Some(idx) = seg.idx.lock().as_ref() {
                    idx.sync_data()
                        .map_err(|e| io_error(&idx_path(&self.dir, seg.id), "sync", e))?;
                }
            }
            Ok(upto)
        })
    }

    /// Writes (and syncs) `DIR/SHUTDOWN` with how the engine stopped.
    pub fn record_shutdown(&self, clean: bool) -> Result<()> {
        self.writable()?;
        let path = self.dir.join("SHUTDOWN");
        let tmp = self.dir.join("SHUTDOWN.tmp");
        let text = if clean { "clean\n" } else { "partial\n" };
        std::fs::write(&tmp, text)
            .and_then(|()| File::open(&tmp)?.sync_all())
            .and_then(|()| std::fs::rename(&tmp, &path))
            .and_then(|()| File::open(&self.dir)?.sync_all())
            .map_err(|e| io_error(&path, "write", e))
    }

    /// The id of the segment being appended to, once the first append created it.
    pub fn active_segment(&self) -> Option<u64> {
        self.active.lock().current.as_ref().map(|a| a.segment.id)
    }

    /// Whether the store was opened with [`SegmentStore::open_read_only`].
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The ids of every segment, oldest first.
    pub fn segment_ids(&self) -> Vec<u64> {
        self.segments.read().keys().copied().collect()
    }

    /// The size of segment `id`'s data file.
    pub fn segment_len(&self, id: u64) -> Option<u64> {
        let seg = self.segments.read().get(&id).cloned()?;
        seg.seg.metadata().ok().map(|m| m.len())
    }

    /// Deletes sealed segment `id` (data file and index log). The caller has moved or
    /// given up every live record in it. The active segment is never removed.
    pub fn remove_segment(&self, id: u64) -> Result<()> {
        self.writable()?;
        if Some(id) == self.active_segment() {
            return Err(Error::invalid("the active segment cannot be removed"));
        }
        self.segments.write().remove(&id);
        for path in [seg_path(&self.dir, id), idx_path(&self.dir, id)] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(&path, "remove", e)),
            }
        }
        let _ = sync_dir(&self.dir);
        Ok(())
    }

    /// Marks the record at `loc` (with `key`) dead in its segment's index log. Callers
    /// tombstone the newest copy of a key (the one they serve): recovery then treats every
    /// older copy as dead too.
    pub fn tombstone(&self, loc: &Loc, key: [u8; 32]) -> Result<()> {
        self.writable()?;
        let Some(seg) = self.segments.read().get(&loc.segment).cloned() else {
            return Ok(());
        };
        self.append_index(
            &seg,
            &IndexEntry::Tombstone {
                offset: loc.offset,
                key,
            },
        )?;
        self.mark_unsynced(seg.id, false, true);
        if self.config.durability == Durability::Synced {
            self.sync_pending()?;
        }
        Ok(())
    }

    fn append_index(&self, seg: &Segment, entry: &IndexEntry) -> Result<()> {
        let bytes = encode_index_entry(entry);
        let path = idx_path(&self.dir, seg.id);
        let idx = seg.idx.lock();
        let Some(idx) = idx.as_ref() else {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("index log `{}` is not open for writing", path.display()),
            ));
        };
        self.with_retries(|| {
            let end = idx.metadata()?.len();
            idx.write_all_at(&bytes, end)
        })
        .map_err(|e| io_error(&path, "append index entry to", e))
    }

    fn with_retries<T>(&self, mut op: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
        let retries = match self.config.durability {
            Durability::Written { retries } => retries,
            _ => 0,
        };
        let mut attempt = 0;
        loop {
            match op() {
                Ok(v) => return Ok(v),
                // Disk full will not heal by retrying at once.
                Err(e) if attempt >= retries || e.raw_os_error() == Some(28) => return Err(e),
                Err(_) => attempt += 1,
            }
        }
    }
}

/// Creates segment `id` (header synced, directory entry synced). On failure nothing is
/// left behind.
fn create_segment(dir: &Path, id: u64, created_ms: u64) -> Result<Segment> {
    let path = seg_path(dir, id);
    let ipath = idx_path(dir, id);
    let created = (|| -> Result<Segment> {
        let seg = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io_error(&path, "create segment", e))?;
        let header = SegmentHeader { id, created_ms }.encode();
        seg.write_all_at(&header, 0)
            .and_then(|()| seg.sync_data())
            .map_err(|e| io_error(&path, "write segment header to", e))?;
        let idx = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&ipath)
            .map_err(|e| io_error(&ipath, "create index log", e))?;
        sync_dir(dir).map_err(|e| io_error(dir, "sync directory", e))?;
        Ok(Segment {
            id,
            seg,
            direct: direct::open_direct_write(&path),
            idx: Mutex::new(Some(idx)),
        })
    })();
    if created.is_err() {
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&ipath);
    }
    created
}

/// Syncs a directory, so the names created, renamed or removed in it are durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}
