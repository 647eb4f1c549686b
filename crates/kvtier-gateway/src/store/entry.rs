//! What a gateway record holds, described at the end of its own payload.
//!
//! ```text
//! payload = data bytes ‖ description (JSON) ‖ description length (u32, little-endian)
//! ```
//!
//! The data comes first so that object byte `i` is payload byte `i`: a ranged GET reads
//! exactly the checksum chunks the range touches, aligned as the store aligns them. The
//! description (which bucket and key, ETag, content type, user metadata, time) is read
//! once per record when the gateway opens, and kept in memory.

use serde::{Deserialize, Serialize};

/// The kinds of gateway record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Entry {
    /// A bucket exists (no data).
    Bucket {
        /// Its name.
        bucket: String,
        /// Created with the canned ACL `public-read` (absent in older records: private).
        #[serde(default, skip_serializing_if = "is_false")]
        public_read: bool,
        /// The `LocationConstraint` it was created with (absent: none, us-east-1).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        location: Option<String>,
        /// Where the bucket's first record was written, `[segment, offset]`, when this one
        /// is a copy moved by compaction (absent: this record is the first). Objects
        /// written before that place belong to an earlier bucket of the same name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since: Option<(u64, u64)>,
    },
    /// An object: the data is the object's bytes.
    Object {
        /// Bucket name.
        bucket: String,
        /// Object key.
        key: String,
        /// Common fields.
        #[serde(flatten)]
        info: ObjectInfo,
    },
    /// A multipart upload was created (no data).
    Upload {
        /// Bucket name.
        bucket: String,
        /// Object key the upload will become.
        key: String,
        /// The upload id handed to the client.
        upload_id: String,
        /// Content type and metadata of the object-to-be.
        #[serde(flatten)]
        info: ObjectInfo,
    },
    /// `bucket/key` was deleted: shares the object's record key, so recovery (newest
    /// record of a key wins) keeps this marker instead of any older copy of the object.
    Deleted {
        /// Bucket name.
        bucket: String,
        /// Object key.
        key: String,
    },
    /// The bucket was deleted: shares the bucket's record key (see `Deleted`).
    BucketDeleted {
        /// Its name.
        bucket: String,
    },
    /// One part of a multipart upload: the data is the part's bytes.
    Part {
        /// The upload it belongs to.
        upload_id: String,
        /// Its number (1..=10,000).
        part_number: i32,
        /// MD5 of the part, hex.
        etag: String,
    },
}

/// Fields every object (and upload) carries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectInfo {
    /// The ETag without quotes: the MD5 of the bytes, hex (multipart: MD5 of the parts'
    /// MD5s, `-N`).
    #[serde(default)]
    pub etag: String,
    /// Content type given at upload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// User metadata (`x-amz-meta-*`), sorted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metadata: Vec<(String, String)>,
    /// When it was written, milliseconds since the Unix epoch.
    #[serde(default)]
    pub modified_ms: u64,
    /// `Cache-Control`, `Content-Disposition`, `Content-Encoding`, `Content-Language`
    /// and `Expires` as given at upload, returned as given.
    #[serde(default, skip_serializing_if = "Headers::is_empty")]
    pub headers: Headers,
    /// The multipart upload this object completed, so that a retried completion can be
    /// answered like the first one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_id: Option<String>,
    /// A completed multipart object's part sizes, in part order (part `n` is bytes
    /// `sum(sizes[..n-1])..sum(sizes[..n])`), for GET and HEAD with `partNumber` and
    /// GetObjectAttributes. Empty for a single PUT, and for multipart objects completed
    /// before the field existed (their descriptions simply lack it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub part_sizes: Vec<u64>,
    /// Written with the canned ACL `public-read`: anonymous GET and HEAD may read it
    /// (absent in older records: private).
    #[serde(default, skip_serializing_if = "is_false")]
    pub public_read: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Response headers an object keeps (S3 returns them on GET and HEAD).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headers {
    /// `Cache-Control`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    /// `Content-Disposition`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    /// `Content-Encoding` (without `aws-chunked`, which only describes the upload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    /// `Content-Language`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    /// `Expires`, milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<i64>,
}

impl Headers {
    /// Whether none is set.
    pub fn is_empty(&self) -> bool {
        *self == Headers::default()
    }
}

impl Entry {
    /// The 32-byte record key: SHA-256 of a kind tag and the names that identify the entry,
    /// each length-prefixed, so distinct entries never share a key by construction.
    pub fn record_key(&self) -> [u8; 32] {
        match self {
            Entry::Bucket { bucket, .. } => key_of(b'B', &[bucket.as_bytes()]),
            Entry::Object { bucket, key, .. } | Entry::Deleted { bucket, key } => {
                key_of(b'O', &[bucket.as_bytes(), key.as_bytes()])
            }
            Entry::BucketDeleted { bucket } => key_of(b'B', &[bucket.as_bytes()]),
            Entry::Upload { upload_id, .. } => key_of(b'U', &[upload_id.as_bytes()]),
            Entry::Part {
                upload_id,
                part_number,
                ..
            } => key_of(b'P', &[upload_id.as_bytes(), &part_number.to_le_bytes()]),
        }
    }

    /// The description that ends a payload: the JSON, then its length (u32, LE).
    pub fn trailer(&self) -> Vec<u8> {
        // Serialising these plain structs cannot fail; an empty description would be
        // refused when read back, never misread.
        let mut desc = serde_json::to_vec(self).unwrap_or_default();
        let len = desc.len() as u32;
        desc.extend_from_slice(&len.to_le_bytes());
        desc
    }

    /// The whole record payload: `data`, then this description and its length.
    pub fn payload(&self, data: &[u8]) -> Vec<u8> {
        let desc = serde_json::to_vec(self).unwrap_or_default();
        let mut out = Vec::with_capacity(data.len() + desc.len() + 4);
        out.extend_from_slice(data);
        out.extend_from_slice(&desc);
        out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        out
    }

    /// Splits the tail of a payload: given the payload's last bytes (`tail`, at most the
    /// whole payload) and the payload length, returns the description and the data length,
    /// or `Err(n)` when `tail` is too short and the last `n` bytes are needed.
    pub fn from_tail(tail: &[u8], payload_len: u64) -> Result<Option<(Entry, u64)>, u64> {
        let Some(len_at) = tail.len().checked_sub(4) else {
            return Ok(None);
        };
        let mut word = [0u8; 4];
        word.copy_from_slice(&tail[len_at..]);
        let desc_len = u32::from_le_bytes(word) as u64;
        let needed = desc_len + 4;
        if needed > payload_len {
            return Ok(None);
        }
        if needed > tail.len() as u64 {
            return Err(needed);
        }
        let desc = &tail[tail.len() - needed as usize..len_at];
        Ok(serde_json::from_slice(desc)
            .ok()
            .map(|e| (e, payload_len - needed)))
    }
}

fn key_of(tag: u8, parts: &[&[u8]]) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"kvtier-gateway\0");
    h.update([tag]);
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]
    use super::*;

    #[test]
    fn a_payload_splits_back_into_its_description_and_data() {
        let e = Entry::Object {
            bucket: "b".into(),
            key: "k/1".into(),
            info: ObjectInfo {
                etag: "abc".into(),
                content_type: Some("text/plain".into()),
                metadata: vec![("a".into(), "1".into())],
                modified_ms: 7,
                ..ObjectInfo::default()
            },
        };
        let p = e.payload(b"hello");
        let (back, data_len) = Entry::from_tail(&p, p.len() as u64).unwrap().unwrap();
        assert_eq!(back, e);
        assert_eq!(&p[..data_len as usize], b"hello");
        // A short tail asks for exactly the bytes it lacks.
        assert_eq!(
            Entry::from_tail(&p[p.len() - 6..], p.len() as u64),
            Err(p.len() as u64 - 5)
        );
        // A garbage length is no entry, not a panic.
        assert_eq!(Entry::from_tail(&[0xff; 8], 8), Ok(None));
    }

    #[test]
    fn descriptions_without_part_sizes_still_read_and_with_them_round_trip() {
        // As written before part sizes were recorded.
        let old = br#"{"t":"object","bucket":"b","key":"k","etag":"abc-2","modified_ms":5,"upload_id":"u"}"#;
        let Entry::Object { info, .. } = serde_json::from_slice::<Entry>(old).unwrap() else {
            panic!("not an object");
        };
        assert!(info.part_sizes.is_empty() && info.etag == "abc-2");
        let e = Entry::Object {
            bucket: "b".into(),
            key: "k".into(),
            info: ObjectInfo {
                etag: "abc-2".into(),
                part_sizes: vec![5 << 20, 7],
                ..ObjectInfo::default()
            },
        };
        let p = e.payload(b"");
        assert_eq!(Entry::from_tail(&p, p.len() as u64), Ok(Some((e, 0))));
    }

    #[test]
    fn keys_of_different_entries_differ() {
        let a = Entry::Bucket {
            bucket: "ab".into(),
            public_read: false,
            location: None,
            since: None,
        }
        .record_key();
        let b = Entry::Object {
            bucket: "a".into(),
            key: "b".into(),
            info: ObjectInfo::default(),
        }
        .record_key();
        assert_ne!(a, b);
        // A deletion marker replaces exactly the object (or bucket) it names.
        let o = Entry::Object {
            bucket: "a".into(),
            key: "b".into(),
            info: ObjectInfo::default(),
        };
        let d = Entry::Deleted {
            bucket: "a".into(),
            key: "b".into(),
        };
        assert_eq!(o.record_key(), d.record_key());
        let bd = Entry::BucketDeleted {
            bucket: "ab".into(),
        };
        assert_eq!(bd.record_key(), a);
        // The trailer is what `payload` appends.
        assert!(o.payload(b"xy").ends_with(&o.trailer()));
    }
}
