//! The segment store: append-only segments of checksummed records, positioned reads, and
//! recovery from the per-segment index logs.
//!
//! Writes go to the tail of one active segment, under one mutex (the async writer is the
//! only writer in normal operation). Reads are positioned (`pread`) and take no lock but a
//! short read lock on the segment table. A record becomes visible — its `Loc` is returned
//! to the caller, who publishes it — only after its bytes and its index entry are written
//! and, with [`Durability::Fsync`], synced: write, make durable, then publish (seed 004).

mod buffers;
pub mod direct;
mod lock;
mod read;
mod recovery;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvtier_core::{Error, Result};
use parking_lot::{Mutex, RwLock};

pub use lock::{DirLock, io_error};
pub use recovery::{Recovered, RecoveryReport};

use crate::format::{
    IndexEntry, RecordHeader, SEGMENT_HEADER_LEN, SegmentHeader, encode_index_entry,
};

/// When a write counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// One attempt; the page cache decides when bytes reach the disk.
    BestEffort,
    /// Up to `retries` further attempts when a write fails; no sync.
    Persistent {
        /// Extra attempts after the first.
        retries: u32,
    },
    /// Data and index entry are synced (`fdatasync`) before the write is acknowledged.
    Fsync,
}

/// Settings of the segment store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    /// A segment is sealed and a new one started when the next record would pass this
    /// many bytes (default 256 MiB).
    pub segment_bytes: u64,
    /// When a write counts as done (default best effort).
    pub durability: Durability,
    /// log2 of the payload checksum chunk (default 16: 64 KiB).
    pub chunk_log2: u8,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 256 << 20,
            durability: Durability::BestEffort,
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
        }
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
    idx: Mutex<File>,
}

#[derive(Debug)]
struct Active {
    segment: Arc<Segment>,
    tail: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct SegmentStore {
    dir: PathBuf,
    config: StoreConfig,
    segments: RwLock<BTreeMap<u64, Arc<Segment>>>,
    active: Mutex<Active>,
    buffers: buffers::BufferPool,
    _lock: DirLock,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn seg_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:016x}.seg"))
}

fn idx_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:016x}.idx"))
}

impl SegmentStore {
    /// Opens (creating if needed) the store in `dir`, takes its exclusive lock, recovers
    /// every live record from the index logs, and starts a fresh active segment.
    pub fn open(dir: &Path, config: StoreConfig) -> Result<(Self, Vec<Recovered>, RecoveryReport)> {
        if !(9..=30).contains(&config.chunk_log2) || config.segment_bytes < 2 * SEGMENT_HEADER_LEN {
            return Err(Error::invalid(format!(
                "invalid SSD store settings: chunk_log2={} (9..=30), segment_bytes={} (at least 8 KiB)",
                config.chunk_log2, config.segment_bytes
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| io_error(dir, "create directory", &e))?;
        let lock = DirLock::acquire(dir)?;
        // How the previous run ended; the record is consumed, so a crash in this run
        // leaves none for the next.
        let shutdown_file = dir.join("SHUTDOWN");
        let previous_clean = std::fs::read_to_string(&shutdown_file)
            .ok()
            .map(|s| s.trim() == "clean");
        let _ = std::fs::remove_file(&shutdown_file);
        let (segments, recovered, mut report, max_seen) = recovery::recover(dir)?;
        report.previous_shutdown_clean = previous_clean;
        let next_id = max_seen + 1;
        let active = Arc::new(create_segment(dir, next_id)?);
        let mut table: BTreeMap<u64, Arc<Segment>> = segments;
        table.insert(next_id, active.clone());
        Ok((
            Self {
                dir: dir.to_path_buf(),
                config,
                segments: RwLock::new(table),
                active: Mutex::new(Active {
                    segment: active,
                    tail: SEGMENT_HEADER_LEN,
                }),
                buffers: buffers::BufferPool::default(),
                _lock: lock,
            },
            recovered,
            report,
        ))
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
        let meta = header.encode();
        let mut active = self.active.lock();
        if active.tail > SEGMENT_HEADER_LEN
            && active.tail + header.record_len() > self.config.segment_bytes
        {
            let id = active.segment.id + 1;
            let segment = Arc::new(create_segment(&self.dir, id)?);
            self.segments.write().insert(id, segment.clone());
            *active = Active {
                segment,
                tail: SEGMENT_HEADER_LEN,
            };
        }
        let seg = active.segment.clone();
        let offset = active.tail;
        let loc = Loc::new(seg.id, offset, header);
        let path = seg_path(&self.dir, seg.id);
        self.with_retries(|| {
            seg.seg.write_all_at(&meta, offset)?;
            seg.seg.write_all_at(payload, offset + loc.payload_offset)?;
            if self.config.durability == Durability::Fsync {
                seg.seg.sync_data()?;
            }
            Ok(())
        })
        .map_err(|e| io_error(&path, "write record to", &e))?;
        // The tail moves even if the index entry fails: the space is simply dead.
        active.tail = offset + loc.record_len;
        self.append_index(
            &seg,
            &IndexEntry::Record {
                offset,
                header: header.clone(),
            },
        )?;
        Ok(loc)
    }

    /// Syncs every segment's data and index log (`fdatasync`), making everything
    /// written so far durable whatever the configured durability.
    pub fn sync(&self) -> Result<()> {
        let segments: Vec<Arc<Segment>> = self.segments.read().values().cloned().collect();
        for seg in segments {
            seg.seg
                .sync_data()
                .map_err(|e| io_error(&seg_path(&self.dir, seg.id), "sync", &e))?;
            seg.idx
                .lock()
                .sync_data()
                .map_err(|e| io_error(&idx_path(&self.dir, seg.id), "sync", &e))?;
        }
        Ok(())
    }

    /// Writes (and syncs) `DIR/SHUTDOWN` with how the engine stopped.
    pub fn record_shutdown(&self, clean: bool) -> Result<()> {
        let path = self.dir.join("SHUTDOWN");
        let tmp = self.dir.join("SHUTDOWN.tmp");
        let text = if clean { "clean\n" } else { "partial\n" };
        std::fs::write(&tmp, text)
            .and_then(|()| File::open(&tmp)?.sync_all())
            .and_then(|()| std::fs::rename(&tmp, &path))
            .and_then(|()| File::open(&self.dir)?.sync_all())
            .map_err(|e| io_error(&path, "write", &e))
    }

    /// The id of the segment being appended to.
    pub fn active_segment(&self) -> u64 {
        self.active.lock().segment.id
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
        if id == self.active_segment() {
            return Err(Error::invalid("the active segment cannot be removed"));
        }
        self.segments.write().remove(&id);
        for path in [seg_path(&self.dir, id), idx_path(&self.dir, id)] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(&path, "remove", &e)),
            }
        }
        Ok(())
    }

    /// Marks the record at `loc` (with `key`) dead in its segment's index log.
    pub fn tombstone(&self, loc: &Loc, key: [u8; 32]) -> Result<()> {
        let Some(seg) = self.segments.read().get(&loc.segment).cloned() else {
            return Ok(());
        };
        self.append_index(
            &seg,
            &IndexEntry::Tombstone {
                offset: loc.offset,
                key,
            },
        )
    }

    fn append_index(&self, seg: &Segment, entry: &IndexEntry) -> Result<()> {
        let bytes = encode_index_entry(entry);
        let path = idx_path(&self.dir, seg.id);
        let idx = seg.idx.lock();
        self.with_retries(|| {
            let end = idx.metadata()?.len();
            idx.write_all_at(&bytes, end)?;
            if self.config.durability == Durability::Fsync {
                idx.sync_data()?;
            }
            Ok(())
        })
        .map_err(|e| io_error(&path, "append index entry to", &e))
    }

    fn with_retries(&self, mut op: impl FnMut() -> std::io::Result<()>) -> std::io::Result<()> {
        let retries = match self.config.durability {
            Durability::Persistent { retries } => retries,
            _ => 0,
        };
        let mut attempt = 0;
        loop {
            match op() {
                Ok(()) => return Ok(()),
                // Disk full will not heal by retrying at once.
                Err(e) if attempt >= retries || e.raw_os_error() == Some(28) => return Err(e),
                Err(_) => attempt += 1,
            }
        }
    }
}

fn create_segment(dir: &Path, id: u64) -> Result<Segment> {
    let path = seg_path(dir, id);
    let seg = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| io_error(&path, "create segment", &e))?;
    let header = SegmentHeader {
        id,
        created_ms: now_ms(),
    }
    .encode();
    seg.write_all_at(&header, 0)
        .and_then(|()| seg.sync_data())
        .map_err(|e| io_error(&path, "write segment header to", &e))?;
    let ipath = idx_path(dir, id);
    let idx = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&ipath)
        .map_err(|e| io_error(&ipath, "create index log", &e))?;
    Ok(Segment {
        id,
        seg,
        idx: Mutex::new(idx),
    })
}
