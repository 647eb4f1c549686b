//! The gateway's storage: buckets, objects and multipart parts as records of kvtier's
//! segment store (`kvtier-ssd`), with an ordered index in memory.
//!
//! - **Visibility.** A PUT appends one record (data, description, per-chunk CRC-32C) and
//!   its index-log entry, synced with [`Durability::Fsync`] (the default), and only then
//!   enters the in-memory index. A crash at any point before leaves either nothing or a
//!   torn tail that recovery cuts off: never a partially readable object.
//! - **Reads.** The index keeps each record's location and checksum table, so a ranged
//!   GET is one positioned read of the chunks the range touches, each verified.
//! - **Order.** Appends and index updates happen under one lock, so the index always
//!   agrees with what recovery would rebuild (the newest record of a key wins).
//! - **Deletes** write a tombstone before the entry leaves the index. Space of deleted
//!   and overwritten objects is not reclaimed yet (no compaction): `dead_bytes` counts it.

mod entry;
mod list;

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use kvtier_core::hash::{BlockHash, hex};
use kvtier_core::layout::LayoutDigest;
use kvtier_ssd::format::{Kind, RecordHeader, chunk_crcs};
use kvtier_ssd::store::{Loc, ReadFault};
use kvtier_ssd::{SegmentStore, StoreConfig};
use parking_lot::{Mutex, RwLock};

pub use entry::{Entry, ObjectInfo};
pub use list::{ListPage, ListQuery, decode_token};

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
    created_ms: u64,
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
    /// missing uploads, records of other kinds.
    pub dropped: u64,
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
    dead_bytes: AtomicU64,
    upload_seq: AtomicU64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn fault(e: ReadFault) -> StoreError {
    match e {
        ReadFault::Corrupt(m) => StoreError::Corrupt(m),
        ReadFault::Io(e) => StoreError::Io(e.to_string()),
    }
}

impl GatewayStore {
    /// Opens (creating if needed) the store in `dir`, taking its directory lock, and
    /// rebuilds the index from the records that recovery keeps.
    pub fn open(dir: &Path, config: StoreConfig) -> StoreResult<(Self, Opened)> {
        let (segs, recovered, _report) = SegmentStore::open(dir, config)?;
        // One record must fit in a segment (with its header and padding).
        let max_object = config.segment_bytes.saturating_sub(1 << 20).min(1 << 31);
        let store = Self {
            segs,
            chunk_log2: config.chunk_log2,
            max_object,
            index: RwLock::new(Index::default()),
            publish: Mutex::new(()),
            dead_bytes: AtomicU64::new(0),
            upload_seq: AtomicU64::new(0),
        };
        let mut opened = Opened::default();
        let mut described = Vec::with_capacity(recovered.len());
        for r in recovered {
            let rec = Rec {
                loc: r.loc,
                header: Arc::new(r.header),
            };
            if rec.header.kind != Kind::Object {
                opened.dropped += 1;
                continue;
            }
            match store.describe(&rec) {
                Some((entry, size)) => described.push((rec, entry, size)),
                None => opened.dropped += 1,
            }
        }
        // Buckets, then what lives in them, then parts of the uploads.
        described.sort_by_key(|(_, e, _)| match e {
            Entry::Bucket { .. } => 0,
            Entry::Object { .. } | Entry::Upload { .. } => 1,
            Entry::Part { .. } => 2,
        });
        let mut index = Index::default();
        for (rec, entry, size) in described {
            match entry {
                Entry::Bucket { bucket } => {
                    opened.buckets += 1;
                    let created_ms = rec.header.created_ms;
                    index.buckets.insert(
                        bucket,
                        Bucket {
                            rec,
                            created_ms,
                            objects: BTreeMap::new(),
                        },
                    );
                }
                Entry::Object { bucket, key, info } => match index.buckets.get_mut(&bucket) {
                    Some(b) => {
                        opened.objects += 1;
                        b.objects.insert(key, Arc::new(Object { rec, size, info }));
                    }
                    None => opened.dropped += 1,
                },
                Entry::Upload {
                    bucket,
                    key,
                    upload_id,
                    info,
                } => {
                    opened.uploads += 1;
                    index.uploads.insert(
                        upload_id,
                        Upload {
                            rec,
                            bucket,
                            key,
                            info,
                            parts: BTreeMap::new(),
                        },
                    );
                }
                Entry::Part {
                    upload_id,
                    part_number,
                    etag,
                } => match index.uploads.get_mut(&upload_id) {
                    Some(u) => {
                        let view = PartView {
                            number: part_number,
                            size,
                            etag,
                            modified_ms: rec.header.created_ms,
                        };
                        u.parts.insert(part_number, Part { rec, view });
                    }
                    None => opened.dropped += 1,
                },
            }
        }
        *store.index.write() = index;
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

    /// The largest object (or part) accepted.
    pub fn max_object_bytes(&self) -> u64 {
        self.max_object
    }

    /// Bytes of deleted or overwritten records still on disk.
    pub fn dead_bytes(&self) -> u64 {
        self.dead_bytes.load(Ordering::Relaxed)
    }

    fn write(&self, entry: &Entry, data: &[u8]) -> StoreResult<Rec> {
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
            created_ms: now_ms(),
            chunk_log2: self.chunk_log2,
            chunk_crcs: chunk_crcs(&payload, self.chunk_log2),
        };
        let loc = self.segs.append(&header, &payload)?;
        Ok(Rec {
            loc,
            header: Arc::new(header),
        })
    }

    fn kill(&self, rec: &Rec) -> StoreResult<()> {
        self.segs.tombstone(&rec.loc, rec.header.key)?;
        self.dead_bytes
            .fetch_add(rec.loc.record_len, Ordering::Relaxed);
        Ok(())
    }

    /// Creates `bucket`.
    pub fn create_bucket(&self, bucket: &str) -> StoreResult<()> {
        let _p = self.publish.lock();
        if self.index.read().buckets.contains_key(bucket) {
            return Err(StoreError::BucketExists);
        }
        let rec = self.write(
            &Entry::Bucket {
                bucket: bucket.to_owned(),
            },
            &[],
        )?;
        let created_ms = rec.header.created_ms;
        self.index.write().buckets.insert(
            bucket.to_owned(),
            Bucket {
                rec,
                created_ms,
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
        self.kill(&rec)?;
        self.index.write().buckets.remove(bucket);
        Ok(())
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

    /// Stores `data` as `bucket/key` (replacing what was there) and returns it.
    pub fn put_object(
        &self,
        bucket: &str,
        key: &str,
        data: &[u8],
        info: ObjectInfo,
    ) -> StoreResult<Arc<Object>> {
        let _p = self.publish.lock();
        if !self.has_bucket(bucket) {
            return Err(StoreError::NoSuchBucket);
        }
        let entry = Entry::Object {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            info,
        };
        let rec = self.write(&entry, data)?;
        let Entry::Object { info, .. } = entry else {
            return Err(StoreError::Io("unreachable entry kind".into()));
        };
        let object = Arc::new(Object {
            rec,
            size: data.len() as u64,
            info,
        });
        self.publish_object(bucket, key, object.clone())?;
        Ok(object)
    }

    fn publish_object(&self, bucket: &str, key: &str, object: Arc<Object>) -> StoreResult<()> {
        let mut index = self.index.write();
        let b = index
            .buckets
            .get_mut(bucket)
            .ok_or(StoreError::NoSuchBucket)?;
        if let Some(old) = b.objects.insert(key.to_owned(), object) {
            // Superseded: recovery keeps the newest record of the key; the old one's
            // space is dead.
            self.dead_bytes
                .fetch_add(old.rec.loc.record_len, Ordering::Relaxed);
        }
        Ok(())
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

    /// Deletes `bucket/key`; deleting a missing key succeeds (as in S3).
    pub fn delete_object(&self, bucket: &str, key: &str) -> StoreResult<()> {
        let _p = self.publish.lock();
        let rec = {
            let index = self.index.read();
            let b = index.buckets.get(bucket).ok_or(StoreError::NoSuchBucket)?;
            match b.objects.get(key) {
                Some(o) => o.rec.clone(),
                None => return Ok(()),
            }
        };
        self.kill(&rec)?;
        if let Some(b) = self.index.write().buckets.get_mut(bucket) {
            b.objects.remove(key);
        }
        Ok(())
    }

    /// One page of a listing.
    pub fn list(&self, bucket: &str, query: &ListQuery) -> StoreResult<ListPage> {
        let index = self.index.read();
        let b = index.buckets.get(bucket).ok_or(StoreError::NoSuchBucket)?;
        Ok(list::page(&b.objects, query))
    }

    /// Starts a multipart upload; returns its id.
    pub fn create_upload(&self, bucket: &str, key: &str, info: ObjectInfo) -> StoreResult<String> {
        let _p = self.publish.lock();
        if !self.has_bucket(bucket) {
            return Err(StoreError::NoSuchBucket);
        }
        let upload_id = self.new_upload_id(bucket, key);
        let entry = Entry::Upload {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            upload_id: upload_id.clone(),
            info: info.clone(),
        };
        let rec = self.write(&entry, &[])?;
        self.index.write().uploads.insert(
            upload_id.clone(),
            Upload {
                rec,
                bucket: bucket.to_owned(),
                key: key.to_owned(),
                info,
                parts: BTreeMap::new(),
            },
        );
        Ok(upload_id)
    }

    fn new_upload_id(&self, bucket: &str, key: &str) -> String {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(bucket.as_bytes());
        h.update([0]);
        h.update(key.as_bytes());
        h.update(
            self.upload_seq
                .fetch_add(1, Ordering::Relaxed)
                .to_le_bytes(),
        );
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        h.update(nanos.to_le_bytes());
        h.update(std::process::id().to_le_bytes());
        let digest: [u8; 32] = h.finalize().into();
        hex(&digest[..16])
    }

    fn check_upload(index: &Index, upload_id: &str, bucket: &str, key: &str) -> StoreResult<()> {
        match index.uploads.get(upload_id) {
            Some(u) if u.bucket == bucket && u.key == key => Ok(()),
            _ => Err(StoreError::NoSuchUpload),
        }
    }

    /// Stores part `number` of an upload (replacing an earlier one); returns its ETag.
    pub fn upload_part(
        &self,
        upload_id: &str,
        bucket: &str,
        key: &str,
        number: i32,
        data: &[u8],
        md5_hex: String,
    ) -> StoreResult<String> {
        let _p = self.publish.lock();
        Self::check_upload(&self.index.read(), upload_id, bucket, key)?;
        let entry = Entry::Part {
            upload_id: upload_id.to_owned(),
            part_number: number,
            etag: md5_hex.clone(),
        };
        let rec = self.write(&entry, data)?;
        let view = PartView {
            number,
            size: data.len() as u64,
            etag: md5_hex.clone(),
            modified_ms: rec.header.created_ms,
        };
        let mut index = self.index.write();
        let upload = index
            .uploads
            .get_mut(upload_id)
            .ok_or(StoreError::NoSuchUpload)?;
        if let Some(old) = upload.parts.insert(number, Part { rec, view }) {
            self.dead_bytes
                .fetch_add(old.rec.loc.record_len, Ordering::Relaxed);
        }
        Ok(md5_hex)
    }

    /// The parts of an upload after `marker`, at most `max`; and whether more follow.
    pub fn list_parts(
        &self,
        upload_id: &str,
        bucket: &str,
        key: &str,
        marker: i32,
        max: usize,
    ) -> StoreResult<(Vec<PartView>, bool)> {
        let index = self.index.read();
        Self::check_upload(&index, upload_id, bucket, key)?;
        let upload = index
            .uploads
            .get(upload_id)
            .ok_or(StoreError::NoSuchUpload)?;
        let mut after = upload
            .parts
            .range(marker.saturating_add(1)..)
            .map(|(_, p)| p.view.clone());
        let page: Vec<PartView> = after.by_ref().take(max).collect();
        Ok((page, after.next().is_some()))
    }

    /// Drops an upload and its parts.
    pub fn abort_upload(&self, upload_id: &str, bucket: &str, key: &str) -> StoreResult<()> {
        let _p = self.publish.lock();
        Self::check_upload(&self.index.read(), upload_id, bucket, key)?;
        let Some(upload) = self.index.write().uploads.remove(upload_id) else {
            return Err(StoreError::NoSuchUpload);
        };
        self.forget_upload(&upload);
        Ok(())
    }

    fn forget_upload(&self, upload: &Upload) {
        for part in upload.parts.values() {
            if let Err(e) = self.kill(&part.rec) {
                tracing::warn!(error = %e, "could not tombstone an upload part");
            }
        }
        if let Err(e) = self.kill(&upload.rec) {
            tracing::warn!(error = %e, "could not tombstone an upload");
        }
    }

    /// Assembles the listed parts (ascending numbers, matching ETags) into the object.
    pub fn complete_upload(
        &self,
        upload_id: &str,
        bucket: &str,
        key: &str,
        listed: &[(i32, String)],
    ) -> StoreResult<Arc<Object>> {
        let _p = self.publish.lock();
        let (recs, info) = {
            let index = self.index.read();
            Self::check_upload(&index, upload_id, bucket, key)?;
            let upload = index
                .uploads
                .get(upload_id)
                .ok_or(StoreError::NoSuchUpload)?;
            if listed.is_empty() {
                return Err(StoreError::InvalidPart("no parts listed".into()));
            }
            let mut recs = Vec::with_capacity(listed.len());
            let mut last = 0;
            for (i, (number, etag)) in listed.iter().enumerate() {
                if *number <= last {
                    return Err(StoreError::InvalidPartOrder);
                }
                last = *number;
                let part = upload
                    .parts
                    .get(number)
                    .filter(|p| p.view.etag == etag.trim_matches('"'))
                    .ok_or_else(|| StoreError::InvalidPart(format!("part {number}")))?;
                if i + 1 < listed.len() && part.view.size < MIN_PART_BYTES {
                    return Err(StoreError::EntityTooSmall);
                }
                recs.push((part.rec.clone(), part.view.clone()));
            }
            (recs, upload.info.clone())
        };
        let total: u64 = recs.iter().map(|(_, v)| v.size).sum();
        if total > self.max_object {
            return Err(StoreError::EntityTooLarge(self.max_object));
        }
        let mut data = Vec::with_capacity(total as usize);
        let mut md5s = Vec::with_capacity(16 * recs.len());
        for (rec, view) in &recs {
            if view.size > 0 {
                data.extend_from_slice(
                    &self
                        .segs
                        .read_known(&rec.loc, &rec.header, 0..view.size)
                        .map_err(fault)?,
                );
            }
            md5s.extend_from_slice(&unhex(&view.etag));
        }
        let etag = format!("{}-{}", md5_hex(&md5s), recs.len());
        let info = ObjectInfo {
            etag,
            modified_ms: now_ms(),
            ..info
        };
        let entry = Entry::Object {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            info: info.clone(),
        };
        let rec = self.write(&entry, &data)?;
        let object = Arc::new(Object {
            rec,
            size: total,
            info,
        });
        self.publish_object(bucket, key, object.clone())?;
        if let Some(upload) = self.index.write().uploads.remove(upload_id) {
            self.forget_upload(&upload);
        }
        Ok(object)
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// MD5 of `data`, lower-case hex.
pub fn md5_hex(data: &[u8]) -> String {
    use md5::Digest;
    hex(&md5::Md5::digest(data))
}
