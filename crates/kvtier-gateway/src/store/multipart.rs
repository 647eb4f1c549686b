//! Multipart uploads: the upload and each part are records of their own; completing
//! streams the parts (each verified) into one new object record, holding the publish
//! lock only to check conditions, commit and swap the index entry.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use kvtier_core::hash::hex;

use super::write::{Precondition, RecordWriter, placeholder};
use super::{
    Entry, GatewayStore, Index, MIN_PART_BYTES, Object, ObjectInfo, Part, PartView, StoreError,
    StoreResult, Upload, fault, md5_hex,
};

/// Bytes of a part read (and verified) per step while completing.
const COPY_STEP: u64 = 4 << 20;

/// A multipart upload in progress, as ListMultipartUploads shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadView {
    /// The key the upload will become.
    pub key: String,
    /// Its id.
    pub upload_id: String,
    /// When it was created, milliseconds since the Unix epoch.
    pub initiated_ms: u64,
}

/// What a completion produced: the object, or (a retry) the object an earlier
/// completion of the same upload produced.
#[derive(Debug)]
pub enum Completed {
    /// Completed now.
    Now(Arc<Object>),
    /// Completed before; this is the object it became (still current).
    Before(Arc<Object>),
}

impl GatewayStore {
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
        // Entropy, not a time stamp: the system's clock, so that ids stay unique across
        // restarts even under a mock clock that starts at the same time every run.
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

    /// Starts writing part `number` (`data_len` bytes) of an upload.
    pub fn begin_part(
        &self,
        upload_id: &str,
        bucket: &str,
        key: &str,
        number: i32,
        data_len: u64,
    ) -> StoreResult<RecordWriter> {
        Self::check_upload(&self.index.read(), upload_id, bucket, key)?;
        let measure = Entry::Part {
            upload_id: upload_id.to_owned(),
            part_number: number,
            etag: placeholder(32),
        };
        self.begin(&measure, data_len)
    }

    /// Completes a part write (replacing an earlier part of that number); returns its
    /// ETag.
    pub fn finish_part(
        &self,
        mut w: RecordWriter,
        upload_id: &str,
        number: i32,
    ) -> StoreResult<String> {
        let md5 = w.md5_hex();
        let entry = Entry::Part {
            upload_id: upload_id.to_owned(),
            part_number: number,
            etag: md5.clone(),
        };
        self.seal(&mut w, &entry)?;
        let size = w.written();
        let _p = self.publish.lock();
        if !self.index.read().uploads.contains_key(upload_id) {
            return Err(StoreError::NoSuchUpload);
        }
        let rec = self.commit(w, &entry)?;
        let view = PartView {
            number,
            size,
            etag: md5.clone(),
            modified_ms: rec.header.created_ms,
        };
        let mut index = self.index.write();
        let upload = index
            .uploads
            .get_mut(upload_id)
            .ok_or(StoreError::NoSuchUpload)?;
        let old = upload.parts.insert(number, Part { rec, view });
        drop(index);
        if let Some(old) = old {
            self.kill_quietly(&old.rec, "an overwritten upload part");
        }
        Ok(md5)
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

    /// Multipart uploads in progress in `bucket` whose key starts with `prefix`, ordered
    /// by key and then by initiation, after (`key_marker`, `upload_id_marker`): with an
    /// upload id marker naming an upload of `key_marker`, the uploads that follow it;
    /// otherwise those whose key is greater than `key_marker`.
    pub fn list_uploads(
        &self,
        bucket: &str,
        prefix: &str,
        key_marker: &str,
        upload_id_marker: &str,
    ) -> StoreResult<Vec<UploadView>> {
        let index = self.index.read();
        if !index.buckets.contains_key(bucket) {
            return Err(StoreError::NoSuchBucket);
        }
        let mut all: Vec<UploadView> = index
            .uploads
            .iter()
            .filter(|(_, u)| u.bucket == bucket && u.key.starts_with(prefix))
            .map(|(id, u)| UploadView {
                key: u.key.clone(),
                upload_id: id.clone(),
                initiated_ms: u.info.modified_ms,
            })
            .collect();
        all.sort_by(|a, b| {
            (&a.key, a.initiated_ms, &a.upload_id).cmp(&(&b.key, b.initiated_ms, &b.upload_id))
        });
        let after = all
            .iter()
            .position(|u| {
                !upload_id_marker.is_empty()
                    && u.key == key_marker
                    && u.upload_id == upload_id_marker
            })
            .map(|i| i + 1);
        let from = match after {
            Some(i) => i,
            None => all.partition_point(|u| u.key.as_str() <= key_marker),
        };
        all.drain(..from);
        Ok(all)
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

    pub(super) fn forget_upload(&self, upload: &Upload) {
        for part in upload.parts.values() {
            self.kill_quietly(&part.rec, "an upload part");
        }
        self.kill_quietly(&upload.rec, "an upload");
    }

    /// Assembles the listed parts (ascending numbers, matching ETags) into the object,
    /// if `condition` holds for the current object when it is published. A completion
    /// retried after it succeeded answers with the object it made, as S3 does.
    pub fn complete_upload(
        &self,
        upload_id: &str,
        bucket: &str,
        key: &str,
        listed: &[(i32, String)],
        condition: &Precondition,
    ) -> StoreResult<Completed> {
        let (parts, info) = {
            let index = self.index.read();
            if !index.uploads.contains_key(upload_id) {
                return match index.completed.get(upload_id) {
                    Some((b, k)) if b == bucket && k == key => {
                        drop(index);
                        self.object(bucket, key).map(Completed::Before)
                    }
                    _ => Err(StoreError::NoSuchUpload),
                };
            }
            Self::check_upload(&index, upload_id, bucket, key)?;
            let upload = index
                .uploads
                .get(upload_id)
                .ok_or(StoreError::NoSuchUpload)?;
            if listed.is_empty() {
                return Err(StoreError::InvalidPart("no parts listed".into()));
            }
            let mut parts = Vec::with_capacity(listed.len());
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
                parts.push((part.rec.clone(), part.view.clone()));
            }
            (parts, upload.info.clone())
        };
        // Fail early on a condition that already fails; it is checked again at publish.
        condition.check_write(self.object(bucket, key).ok().as_deref())?;
        let total: u64 = parts.iter().map(|(_, v)| v.size).sum();
        let mut md5s = Vec::with_capacity(16 * parts.len());
        for (_, view) in &parts {
            md5s.extend_from_slice(&unhex(&view.etag));
        }
        let etag = format!("{}-{}", md5_hex(&md5s), parts.len());
        let info = ObjectInfo {
            etag: etag.clone(),
            modified_ms: self.now_ms(),
            upload_id: Some(upload_id.to_owned()),
            part_sizes: parts.iter().map(|(_, v)| v.size).collect(),
            ..info
        };
        let mut w = self.begin_object(bucket, key, total, &info, etag.len())?;
        for (rec, view) in &parts {
            let mut at = 0;
            while at < view.size {
                let end = (at + COPY_STEP).min(view.size);
                let bytes = self
                    .segs
                    .read_known(&rec.loc, &rec.header, at..end)
                    .map_err(fault)?;
                w.write(&bytes)?;
                at = end;
            }
        }
        let object = self.finish_object(w, bucket, key, info, condition)?;
        let upload = self.index.write().uploads.remove(upload_id);
        if let Some(upload) = upload {
            self.forget_upload(&upload);
        }
        Ok(Completed::Now(object))
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}
