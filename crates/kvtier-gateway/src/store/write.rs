//! Writing objects and parts with bounded memory, and publishing them under conditions.
//!
//! A record's payload is `data ‖ description ‖ length` (see `entry.rs`). The data length
//! is known when a write begins (Content-Length), and so is the description's length: it
//! holds the ETag, whose length is fixed (32 hex digits, or `hex-N` for multipart), so the
//! description is measured with a placeholder ETag of that length. The record's place is
//! then reserved in the segment ([`kvtier_ssd::Reservation`]) and the body written into
//! it as it arrives, MD5 computed on the way. Sealing writes the real description and
//! syncs the data outside every lock; publishing takes the publish lock only to check the
//! request's conditions against the current object, commit the index entry and update
//! the index: a 1 GiB write never holds it while bytes move.

use std::sync::Arc;

use kvtier_core::hash::BlockHash;
use kvtier_core::layout::LayoutDigest;
use kvtier_ssd::Durability;
use kvtier_ssd::format::{Kind, RecordHeader};
use kvtier_ssd::store::Reservation;
use md5::Digest;

use super::rebuild::place;
use super::{Entry, GatewayStore, Object, ObjectInfo, Rec, StoreError, StoreResult};

/// An `If-Match` / `If-None-Match` value: `*` or a list of ETags (without quotes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtagMatch {
    /// `*`: any current object.
    Any,
    /// These ETags.
    Tags(Vec<String>),
}

impl EtagMatch {
    fn matches(&self, etag: &str) -> bool {
        match self {
            EtagMatch::Any => true,
            EtagMatch::Tags(tags) => tags.iter().any(|t| t == etag),
        }
    }
}

/// The conditions of a request, evaluated as S3 evaluates them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Precondition {
    /// `If-Match`.
    pub if_match: Option<EtagMatch>,
    /// `If-None-Match`.
    pub if_none_match: Option<EtagMatch>,
    /// `If-Modified-Since`, seconds since the Unix epoch (GET and HEAD only).
    pub if_modified_since: Option<i64>,
    /// `If-Unmodified-Since`, seconds since the Unix epoch.
    pub if_unmodified_since: Option<i64>,
}

/// What a read's conditions decided when the object exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadVerdict {
    /// Send the object.
    Send,
    /// 304 Not Modified.
    NotModified,
}

fn modified_secs(o: &Object) -> i64 {
    (o.info.modified_ms / 1000) as i64
}

impl Precondition {
    /// GET and HEAD (RFC 7232 as S3 applies it): a failed `If-Match` is 412 and then
    /// `If-Unmodified-Since` is ignored; without `If-Match`, a failed
    /// `If-Unmodified-Since` is 412. Then a matching `If-None-Match` is 304 and
    /// `If-Modified-Since` is ignored; without `If-None-Match`, an object not modified
    /// since `If-Modified-Since` is 304.
    pub fn check_read(&self, o: &Object) -> StoreResult<ReadVerdict> {
        let secs = modified_secs(o);
        match &self.if_match {
            Some(m) if !m.matches(&o.info.etag) => return Err(StoreError::PreconditionFailed),
            Some(_) => {}
            None => {
                if self.if_unmodified_since.is_some_and(|t| secs > t) {
                    return Err(StoreError::PreconditionFailed);
                }
            }
        }
        match &self.if_none_match {
            Some(m) if m.matches(&o.info.etag) => Ok(ReadVerdict::NotModified),
            Some(_) => Ok(ReadVerdict::Send),
            None if self.if_modified_since.is_some_and(|t| secs <= t) => {
                Ok(ReadVerdict::NotModified)
            }
            None => Ok(ReadVerdict::Send),
        }
    }

    /// PUT, CompleteMultipartUpload and DELETE against the current object (`None`:
    /// missing): `If-None-Match` that matches it (`*`: any) is 412; `If-Match` without
    /// a current object is 404 `NoSuchKey`, not matching it 412; a current object
    /// modified after `If-Unmodified-Since` is 412.
    pub fn check_write(&self, current: Option<&Object>) -> StoreResult<()> {
        if let (Some(m), Some(o)) = (&self.if_none_match, current)
            && m.matches(&o.info.etag)
        {
            return Err(StoreError::PreconditionFailed);
        }
        match (&self.if_match, current) {
            (Some(_), None) => return Err(StoreError::NoSuchKey),
            (Some(m), Some(o)) if !m.matches(&o.info.etag) => {
                return Err(StoreError::PreconditionFailed);
            }
            _ => {}
        }
        if let (Some(t), Some(o)) = (self.if_unmodified_since, current)
            && modified_secs(o) > t
        {
            return Err(StoreError::PreconditionFailed);
        }
        Ok(())
    }
}

/// A record being written: its reserved place, and the MD5 of the data so far.
#[derive(Debug)]
pub struct RecordWriter {
    res: Reservation,
    md5: md5::Md5,
    data_len: u64,
    written: u64,
    trailer_len: usize,
}

impl RecordWriter {
    /// Appends body bytes; refuses more than the declared length.
    pub fn write(&mut self, bytes: &[u8]) -> StoreResult<()> {
        if self.written + bytes.len() as u64 > self.data_len {
            return Err(StoreError::IncompleteBody(format!(
                "more than the {} bytes declared",
                self.data_len
            )));
        }
        self.res.write(bytes)?;
        self.md5.update(bytes);
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// The MD5 of the data written so far, hex.
    pub fn md5_hex(&self) -> String {
        kvtier_core::hash::hex(&self.md5.clone().finalize())
    }

    /// The MD5 of the data written so far.
    pub fn md5_raw(&self) -> [u8; 16] {
        self.md5.clone().finalize().into()
    }

    /// Data bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }
}

/// A placeholder ETag of `len` characters, to measure a description before the ETag is
/// known.
pub(super) fn placeholder(len: usize) -> String {
    "0".repeat(len)
}

impl GatewayStore {
    /// Reserves the place of a record holding `data_len` bytes of data described by
    /// `measure` (an entry whose description has the final length).
    pub(super) fn begin(&self, measure: &Entry, data_len: u64) -> StoreResult<RecordWriter> {
        if data_len > self.max_object {
            return Err(StoreError::EntityTooLarge(self.max_object));
        }
        let trailer_len = measure.trailer().len();
        let res = self.segs.reserve(data_len + trailer_len as u64, 0)?;
        Ok(RecordWriter {
            res,
            md5: md5::Md5::new(),
            data_len,
            written: 0,
            trailer_len,
        })
    }

    /// Writes `entry`'s description after the data and syncs the data (as configured),
    /// holding no lock.
    pub(super) fn seal(&self, w: &mut RecordWriter, entry: &Entry) -> StoreResult<()> {
        if w.written != w.data_len {
            return Err(StoreError::IncompleteBody(format!(
                "{} of the {} bytes declared",
                w.written, w.data_len
            )));
        }
        let trailer = entry.trailer();
        if trailer.len() != w.trailer_len {
            return Err(StoreError::Io(format!(
                "the description changed length ({} -> {} bytes)",
                w.trailer_len,
                trailer.len()
            )));
        }
        w.res.write(&trailer)?;
        if self.segs.config().durability == Durability::Synced {
            w.res.sync_data()?;
        }
        Ok(())
    }

    /// Commits a sealed record (its index entry); the caller holds the publish lock.
    pub(super) fn commit(&self, w: RecordWriter, entry: &Entry) -> StoreResult<Rec> {
        self.commit_at(w, entry, self.now_ms())
    }

    /// [`Self::commit`] stamped `created_ms` (a moved record keeps its stamp).
    pub(super) fn commit_at(
        &self,
        w: RecordWriter,
        entry: &Entry,
        created_ms: u64,
    ) -> StoreResult<Rec> {
        let header = RecordHeader {
            kind: Kind::Object,
            layout: LayoutDigest([0; 16]),
            key: entry.record_key(),
            parent: BlockHash([0; 16]),
            position: 0,
            tokens: Vec::new(),
            extra_tag: None,
            payload_len: 0,
            created_ms,
            chunk_log2: self.chunk_log2,
            chunk_crcs: Vec::new(),
            encoding: None,
        };
        let (loc, header) = self.segs.commit(w.res, header)?;
        Ok(Rec {
            loc,
            header: Arc::new(header),
        })
    }

    /// Starts writing object `bucket/key` of `data_len` bytes whose ETag will have
    /// `etag_len` characters. The bucket must exist.
    pub fn begin_object(
        &self,
        bucket: &str,
        key: &str,
        data_len: u64,
        info: &ObjectInfo,
        etag_len: usize,
    ) -> StoreResult<RecordWriter> {
        if !self.has_bucket(bucket) {
            return Err(StoreError::NoSuchBucket);
        }
        let measure = Entry::Object {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            info: ObjectInfo {
                etag: placeholder(etag_len),
                ..info.clone()
            },
        };
        self.begin(&measure, data_len)
    }

    /// Completes an object write: seals it, then, under the publish lock, checks that
    /// the bucket is the one the write began in and that `condition` holds for the
    /// current object, commits, and makes it the current object.
    pub fn finish_object(
        &self,
        mut w: RecordWriter,
        bucket: &str,
        key: &str,
        info: ObjectInfo,
        condition: &Precondition,
    ) -> StoreResult<Arc<Object>> {
        let entry = Entry::Object {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            info,
        };
        self.seal(&mut w, &entry)?;
        let size = w.data_len;
        let _p = self.publish.lock();
        let (bucket_place, current) = {
            let index = self.index.read();
            let b = index.buckets.get(bucket).ok_or(StoreError::NoSuchBucket)?;
            (b.since, b.objects.get(key).cloned())
        };
        condition.check_write(current.as_deref())?;
        let rec = self.commit(w, &entry)?;
        if place(&rec) < bucket_place {
            // The bucket was deleted and created again while the body arrived.
            self.kill_quietly(&rec, "an object of a deleted bucket");
            return Err(StoreError::NoSuchBucket);
        }
        let Entry::Object { info, .. } = entry else {
            return Err(StoreError::Io("unreachable entry kind".into()));
        };
        let object = Arc::new(Object { rec, size, info });
        let mut index = self.index.write();
        if let Some(id) = &object.info.upload_id {
            index
                .completed
                .insert(id.clone(), (bucket.to_owned(), key.to_owned()));
        }
        let b = index
            .buckets
            .get_mut(bucket)
            .ok_or(StoreError::NoSuchBucket)?;
        let old = b.objects.insert(key.to_owned(), object.clone());
        if let Some(id) = old.as_ref().and_then(|o| o.info.upload_id.as_ref()) {
            index.completed.remove(id);
        }
        drop(index);
        if let Some(old) = old {
            // Superseded: recovery keeps the newest record of the key; the old one is
            // tombstoned so that no segment removal can bring it back.
            self.kill_quietly(&old.rec, "an overwritten object");
        }
        Ok(object)
    }

    /// Stores `data` as `bucket/key` (replacing what was there) in one call.
    pub fn put_object(
        &self,
        bucket: &str,
        key: &str,
        data: &[u8],
        info: ObjectInfo,
    ) -> StoreResult<Arc<Object>> {
        let mut w = self.begin_object(bucket, key, data.len() as u64, &info, 32)?;
        w.write(data)?;
        let info = ObjectInfo {
            etag: w.md5_hex(),
            ..info
        };
        self.finish_object(w, bucket, key, info, &Precondition::default())
    }
}
