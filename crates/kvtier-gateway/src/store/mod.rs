//! The gateway's storage: buckets, objects and multipart parts as records of kvtier's
//! segment store (`kvtier-ssd`), with an ordered index in memory.
//!
//! - **Visibility.** A PUT appends one record (data, description, per-chunk CRC-32C) and
//!   its index-log entry, synced with [`Durability::Synced`] (the default), and only then
//!   enters the in-memory index. A crash at any point before leaves either nothing or a
//!   torn tail that recovery cuts off: never a partially readable object.
//! - **Reads.** The index keeps each record's location and checksum table, so a ranged
//!   GET is one positioned read of the chunks the range touches, each verified.
//! - **Order.** Appends and index updates happen under one lock, so the index always
//!   agrees with what recovery would rebuild (the newest record of a key wins).
//! - **Deletes** write a deletion marker record with the object's record key (so it is
//!   the newest record of that key and recovery keeps it instead of any older copy), then
//!   tombstone the deleted record, then the marker (its work is done once the deleted
//!   record's tombstone is on disk).
//! - **Every record that stops being current gets a tombstone**: an overwritten object or
//!   part, a deleted one, its marker, a completed upload's parts, a copy moved by
//!   compaction. So a record that no index entry points at is dead on disk too, and
//!   removing a segment that holds none can never bring an older copy back.
//! - **Compaction** (`compact.rs`) moves the live records out of sealed segments that are
//!   mostly dead and deletes those segments.
//! - **Writes stream** (`write.rs`): a PUT's body goes into its reserved place in the
//!   segment as it arrives, with bounded memory, and is published when complete.

mod compact;
mod entry;
mod list;
mod multipart;
mod rebuild;
mod write;

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use bytes::Bytes;
use kvtier_core::clock::{Clock, ClockExt, SystemClock};
use kvtier_core::hash::{BlockHash, hex};
use kvtier_core::layout::LayoutDigest;
use kvtier_ssd::format::{Kind, RecordHeader, chunk_crcs};
use kvtier_ssd::store::{Loc, ReadFault};
use kvtier_ssd::{SegmentStore, StoreConfig};
use parking_lot::{Mutex, RwLock};

pub use compact::Compacted;
pub use entry::{Entry, Headers, ObjectInfo};
pub use list::{ListPage, ListQuery, decode_token};
pub use multipart::{Completed, UploadView};
pub use write::{EtagMatch, Precondition, ReadVerdict, RecordWriter};

/// Why a store operation did not happen; each maps to one S3 error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The bucket does not exist.
    NoSuchBucket,
    /// The object does not exist.
    NoSuchKey,
    /// The bucket exists already.
    BucketExists,
    /// The bucket still holds objects.
    BucketNotEmpty,
    /// No such multipart upload (for this bucket and key).
    NoSuchUpload,
    /// A listed part is missing or its ETag does not match.
    InvalidPart(String),
    /// Parts are not listed in ascending order.
    InvalidPartOrder,
    /// A part other than the last is smaller than the S3 minimum (5 MiB).
    EntityTooSmall,
    /// The object is larger than a segment can hold.
    EntityTooLarge(u64),
    /// The stored bytes failed verification (the record is dropped from the index).
    Corrupt(String),
    /// A condition of the request (`If-Match`, `If-None-Match`, ...) does not hold.
    PreconditionFailed,
    /// The request body is not what its headers promised (shorter or longer).
    IncompleteBody(String),
    /// The disk failed.
    Io(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::NoSuchBucket => f.write_str("the bucket does not exist"),
            StoreError::NoSuchKey => f.write_str("the key does not exist"),
            StoreError::BucketExists => f.write_str("the bucket exists already"),
            StoreError::BucketNotEmpty => f.write_str("the bucket is not empty"),
            StoreError::NoSuchUpload => f.write_str("no such multipart upload"),
            StoreError::InvalidPart(m) => write!(f, "invalid part: {m}"),
            StoreError::InvalidPartOrder => f.write_str("parts must be listed in ascending order"),
            StoreError::EntityTooSmall => {
                f.write_str("every part but the last must be at least 5 MiB")
            }
            StoreError::EntityTooLarge(max) => {
                write!(f, "objects and parts may be at most {max} bytes here")
            }
            StoreError::Corrupt(m) => write!(f, "stored bytes failed verification: {m}"),
            StoreError::PreconditionFailed => {
                f.write_str("at least one of the preconditions you specified did not hold")
            }
            StoreError::IncompleteBody(m) => write!(f, "incomplete body: {m}"),
            StoreError::Io(m) => write!(f, "storage failed: {m}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<kvtier_core::Error> for StoreError {
    fn from(e: kvtier_core::Error) -> Self {
        StoreError::Io(e.to_string())
    }
}

/// Result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// The smallest part S3 accepts, except for the last part of an upload.
pub const MIN_PART_BYTES: u64 = 5 << 20;

/// Where a record lives and the header (with its checksum table) it was written with.
#[derive(Debug, Clone)]
struct Rec {
    loc: Loc,
    header: Arc<RecordHeader>,
}

/// An object in the index.
#[derive(Debug)]
pub struct Object {
    rec: Rec,
    /// Bytes of the object.
    pub size: u64,
    /// ETag, content type, metadata, time.
    pub info: ObjectInfo,
}

#[derive(Debug)]
struct Bucket {
    rec: Rec,
    /// Where the bucket's first record was written: objects and uploads placed before it
    /// belong to an earlier bucket of the same name (the record itself may have been moved
    /// by compaction since).
    since: (u64, u64),
    created_ms: u64,
    /// Created with the canned ACL `public-read`.
    public_read: bool,
    /// The `LocationConstraint` it was created with.
    location: Option<String>,
    objects: BTreeMap<String, Arc<Object>>,
}

/// A part of a multipart upload.
#[derive(Debug, Clone)]
pub struct PartView {
    /// Its number.
    pub number: i32,
    /// Its size.
    pub size: u64,
    /// MD5 of its bytes, hex.
    pub etag: String,
    /// When it was written.
    pub modified_ms: u64,
}

#[derive(Debug)]
struct Part {
    rec: Rec,
    view: PartView,
}

#[derive(Debug)]
struct Upload {
    rec: Rec,
    bucket: String,
    key: String,
    info: ObjectInfo,
    parts: BTreeMap<i32, Part>,
}

#[derive(Debug, Default)]
struct Index {
    buckets: BTreeMap<String, Bucket>,
    uploads: HashMap<String, Upload>,
    /// Completed upload id -> (bucket, key) of the object it became (while that object
    /// is the current one), so a retried completion answers 200 as S3 does.
    completed: HashMap<String, (String, String)>,
}

/// What opening found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Opened {
    /// Buckets recovered.
    pub buckets: u64,
    /// Objects recovered.
    pub objects: u64,
    /// Multipart uploads in progress recovered.
    pub uploads: u64,
    /// Records dropped: unreadable descriptions, objects of missing buckets, parts of
    /// missing uploads, objects of an earlier bucket of the same name, records of
    /// other kinds.
    pub dropped: u64,
    /// Deletion markers found (objects and buckets that stay deleted).
    pub markers: u64,
    /// Of `dropped`, records whose description could not be read: compaction stays off
    /// until a restart reads them (their bucket's record may be among them).
    pub unreadable: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct GatewayStore {
    segs: SegmentStore,
    chunk_log2: u8,
    max_object: u64,
    index: RwLock<Index>,
    /// Held across append + index update, so both happen in the same order.
    publish: Mutex<()>,
    /// Why compaction may not remove segments now (a tombstone that failed to write, or
    /// records unreadable at open), if it may not.
    compaction_blocked: Mutex<Option<String>>,
    /// Segments compaction emptied, removed on its next pass (a read that began before the
    /// move may still be reading the old copy).
    emptied: Mutex<Vec<u64>>,
    upload_seq: AtomicU64,
    /// Wall time for records' stamps and objects' `Last-Modified`.
    clock: Arc<dyn Clock>,
}

fn fault(e: ReadFault) -> StoreError {
    match e {
        ReadFault::Corrupt(m) => StoreError::Corrupt(m),
        ReadFault::Io(e) => StoreError::Io(e.to_string()),
    }
}

impl GatewayStore {
    /// [`GatewayStore::open_with_clock`] with the system clock.
    pub fn open(dir: &Path, config: StoreConfig) -> StoreResult<(Self, Opened)> {
        Self::open_with_clock(dir, config, Arc::new(SystemClock::new()))
    }

    /// Opens (creating if needed) the store in `dir`, taking its directory lock, and
    /// rebuilds the index from the records that recovery keeps. Records and objects are
    /// stamped with `clock`'s wall time.
    pub fn open_with_clock(
        dir: &Path,
        config: StoreConfig,
        clock: Arc<dyn Clock>,
    ) -> StoreResult<(Self, Opened)> {
        let (segs, recovered, _report) = SegmentStore::open_with_clock(dir, config, clock.clone())?;
        // One record must fit in a segment (with its header and padding).
        let max_object = config.segment_bytes.saturating_sub(1 << 20).min(1 << 31);
        let store = Self {
            segs,
            chunk_log2: config.chunk_log2,
            max_object,
            index: RwLock::new(Index::default()),
            publish: Mutex::new(()),
            compaction_blocked: Mutex::new(None),
            emptied: Mutex::new(Vec::new()),
            upload_seq: AtomicU64::new(0),
            clock,
        };
        let opened = rebuild::rebuild(&store, recovered);
        if opened.unreadable > 0 {
            store.block_compaction(format!(
                "{} records could not be read at open",
                opened.unreadable
            ));
        }
        Ok((store, opened))
    }

    /// Reads a record's description from the end of its payload.
    fn describe(&self, rec: &Rec) -> Option<(Entry, u64)> {
        let len = rec.loc.payload_len;
        let mut want = len.min(4096);
        loop {
            if want == 0 {
                return None;
            }
            let tail = self
                .segs
                .read_known(&rec.loc, &rec.header, len - want..len)
                .ok()?;
            match Entry::from_tail(&tail, len) {
                Ok(found) => return found,
                Err(needed) if needed > want && needed <= len => want = needed,
                Err(_) => return None,
            }
        }
    }

    /// Now, in milliseconds since the Unix epoch, on the store's clock: the stamp of
    /// what is written now.
    pub fn now_ms(&self) -> u64 {
        self.clock.wall_unix_ms()
    }

    /// The largest object (or part) accepted.
    pub fn max_object_bytes(&self) -> u64 {
        self.max_object
    }

    /// Bytes of the store's segment files that no current record occupies: deleted and
    /// overwritten records, markers, segment headers, space abandoned by failed writes.
    pub fn dead_bytes(&self) -> u64 {
        let on_disk: u64 = self
            .segs
            .segment_ids()
            .into_iter()
            .filter_map(|id| self.segs.segment_len(id))
            .sum();
        on_disk.saturating_sub(self.live_bytes())
    }

    /// Bytes of the records the index points at.
    pub fn live_bytes(&self) -> u64 {
        compact::live_records(&self.index.read())
            .iter()
            .map(|(_, rec)| rec.loc.record_len)
            .sum()
    }

    fn write(&self, entry: &Entry, data: &[u8]) -> StoreResult<Rec> {
        self.write_at(entry, data, self.now_ms())
    }

    /// [`Self::write`] stamped `created_ms` (a moved record keeps its stamp).
    fn write_at(&self, entry: &Entry, data: &[u8], created_ms: u64) -> StoreResult<Rec> {
        if data.len() as u64 > self.max_object {
            return Err(StoreError::EntityTooLarge(self.max_object));
        }
        let payload = entry.payload(data);
        let header = RecordHeader {
            kind: Kind::Object,
            layout: LayoutDigest([0; 16]),
            key: entry.record_key(),
            parent: BlockHash([0; 16]),
            position: 0,
            tokens: Vec::new(),
            extra_tag: None,
            payload_len: payload.len() as u64,
            created_ms,
            chunk_log2: self.chunk_log2,
            chunk_crcs: chunk_crcs(&payload, self.chunk_log2),
            encoding: None,
        };
        let loc = self.segs.append(&header, &payload)?;
        Ok(Rec {
            loc,
            header: Arc::new(header),
        })
    }

    /// Tombstones a record that is no longer current. If that fails, compaction stops
    /// removing segments until a restart (whose recovery writes the tombstones older
    /// copies lack): without it, removing the segment of a newer copy could bring this one
    /// back.
    fn kill(&self, rec: &Rec) -> StoreResult<()> {
        self.segs.tombstone(&rec.loc, rec.header.key).map_err(|e| {
            self.block_compaction(format!("a tombstone could not be written: {e}"));
            StoreError::from(e)
        })
    }

    /// [`Self::kill`] for a record whose tombstone is tidiness, not correctness of what
    /// is served now: a failure is logged (and blocks compaction), not returned.
    fn kill_quietly(&self, rec: &Rec, what: &str) {
        if let Err(e) = self.kill(rec) {
            tracing::warn!(error = %e, "could not tombstone {what}");
        }
    }

    fn block_compaction(&self, why: String) {
        tracing::warn!(%why, "gateway compaction is off until the next start");
        self.compaction_blocked.lock().get_or_insert(why);
    }

    /// Creates `bucket` (private).
    pub fn create_bucket(&self, bucket: &str) -> StoreResult<()> {
        self.create_bucket_with(bucket, false, None)
    }

    /// Creates `bucket`, `public_read` if it was asked for with that canned ACL, recording
    /// the `location` constraint it was created with (GetBucketLocation returns it).
    pub fn create_bucket_with(
        &self,
        bucket: &str,
        public_read: bool,
        location: Option<String>,
    ) -> StoreResult<()> {
        let _p = self.publish.lock();
        if self.index.read().buckets.contains_key(bucket) {
            return Err(StoreError::BucketExists);
        }
        let rec = self.write(
            &Entry::Bucket {
                bucket: bucket.to_owned(),
                public_read,
                location: location.clone(),
                since: None,
            },
            &[],
        )?;
        let created_ms = rec.header.created_ms;
        self.index.write().buckets.insert(
            bucket.to_owned(),
            Bucket {
                since: rebuild::place(&rec),
                rec,
                created_ms,
                public_read,
                location,
                objects: BTreeMap::new(),
            },
        );
        Ok(())
    }

    /// Deletes an empty bucket.
    pub fn delete_bucket(&self, bucket: &str) -> StoreResult<()> {
        let _p = self.publish.lock();
        let rec = {
            let index = self.index.read();
            let b = index.buckets.get(bucket).ok_or(StoreError::NoSuchBucket)?;
            if !b.objects.is_empty() {
                return Err(StoreError::BucketNotEmpty);
            }
            b.rec.clone()
        };
        let marker = self.write(
            &Entry::BucketDeleted {
                bucket: bucket.to_owned(),
            },
            &[],
        )?;
        self.kill(&rec)?;
        self.kill_quietly(&marker, "a bucket's deletion marker");
        let uploads: Vec<Upload> = {
            let mut index = self.index.write();
            index.buckets.remove(bucket);
            let ids: Vec<String> = index
                .uploads
                .iter()
                .filter(|(_, u)| u.bucket == bucket)
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter()
                .filter_map(|id| index.uploads.remove(id))
                .collect()
        };
        for u in &uploads {
            self.forget_upload(u);
        }
        Ok(())
    }

    /// The location constraint `bucket` was created with (`Some(None)`: none); `None` if
    /// it does not exist.
    pub fn bucket_location(&self, bucket: &str) -> Option<Option<String>> {
        self.index
            .read()
            .buckets
            .get(bucket)
            .map(|b| b.location.clone())
    }

    /// Whether `bucket` was created `public-read`; `None` if it does not exist.
    pub fn bucket_public_read(&self, bucket: &str) -> Option<bool> {
        self.index.read().buckets.get(bucket).map(|b| b.public_read)
    }

    /// Whether `bucket` exists.
    pub fn has_bucket(&self, bucket: &str) -> bool {
        self.index.read().buckets.contains_key(bucket)
    }

    /// Every bucket with its creation time (ms), by name.
    pub fn buckets(&self) -> Vec<(String, u64)> {
        self.index
            .read()
            .buckets
            .iter()
            .map(|(n, b)| (n.clone(), b.created_ms))
            .collect()
    }

    /// The object at `bucket/key`.
    pub fn object(&self, bucket: &str, key: &str) -> StoreResult<Arc<Object>> {
        let index = self.index.read();
        let b = index.buckets.get(bucket).ok_or(StoreError::NoSuchBucket)?;
        b.objects.get(key).cloned().ok_or(StoreError::NoSuchKey)
    }

    /// Bytes `range` of `object`, verified (one positioned read). A corrupt record is
    /// dropped from the index and reported as [`StoreError::Corrupt`].
    pub fn read(
        &self,
        bucket: &str,
        key: &str,
        object: &Object,
        range: Range<u64>,
    ) -> StoreResult<Bytes> {
        if range.start >= range.end {
            return Ok(Bytes::new());
        }
        if range.end > object.size {
            return Err(StoreError::Io(format!(
                "range {}..{} past the end of a {}-byte object",
                range.start, range.end, object.size
            )));
        }
        match self
            .segs
            .read_known(&object.rec.loc, &object.rec.header, range)
        {
            Ok(b) => Ok(b),
            Err(ReadFault::Corrupt(m)) => {
                tracing::error!(bucket, key, error = %m, "stored object failed verification; dropping it");
                let _p = self.publish.lock();
                let mut index = self.index.write();
                if let Some(b) = index.buckets.get_mut(bucket)
                    && b.objects
                        .get(key)
                        .is_some_and(|o| o.rec.loc == object.rec.loc)
                {
                    b.objects.remove(key);
                }
                Err(StoreError::Corrupt(m))
            }
            Err(e) => Err(fault(e)),
        }
    }

    /// Deletes `bucket/key` if `condition` holds for it; deleting a missing key
    /// succeeds (as in S3). A deletion marker is written first (durable like a PUT), so
    /// no older copy of the object can come back after a restart; then the deleted
    /// record is tombstoned.
    pub fn delete_object(
        &self,
        bucket: &str,
        key: &str,
        condition: &Precondition,
    ) -> StoreResult<()> {
        let _p = self.publish.lock();
        let current = {
            let index = self.index.read();
            let b = index.buckets.get(bucket).ok_or(StoreError::NoSuchBucket)?;
            b.objects.get(key).cloned()
        };
        condition.check_write(current.as_deref())?;
        let Some(current) = current else {
            return Ok(());
        };
        let marker = self.write(
            &Entry::Deleted {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
            },
            &[],
        )?;
        let mut index = self.index.write();
        if let Some(id) = &current.info.upload_id {
            index.completed.remove(id);
        }
        if let Some(b) = index.buckets.get_mut(bucket) {
            b.objects.remove(key);
        }
        drop(index);
        self.kill(&current.rec)?;
        self.kill_quietly(&marker, "an object's deletion marker");
        Ok(())
    }

    /// One page of a listing.
    pub fn list(&self, bucket: &str, query: &ListQuery) -> StoreResult<ListPage> {
        let index = self.index.read();
        let b = index.buckets.get(bucket).ok_or(StoreError::NoSuchBucket)?;
        Ok(list::page(&b.objects, query))
    }
}

/// MD5 of `data`, lower-case hex.
pub fn md5_hex(data: &[u8]) -> String {
    use md5::Digest;
    hex(&md5::Md5::digest(data))
}
