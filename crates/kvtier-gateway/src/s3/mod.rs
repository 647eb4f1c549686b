//! The S3 operations, on top of [`GatewayStore`].
//!
//! Supported: CreateBucket, HeadBucket, DeleteBucket, ListBuckets, PutObject (Content-MD5
//! checked), GetObject and HeadObject (one Range: 206, or 416 `InvalidRange`), DeleteObject,
//! DeleteObjects, ListObjectsV2, and multipart upload (create, upload part, complete,
//! abort, list parts). Everything else answers `NotImplemented` (s3s's default). Request
//! parsing, XML, and SigV4 checks are s3s's.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::StreamExt;
use s3s::dto::{AbortMultipartUploadInput, AbortMultipartUploadOutput, Range};
use s3s::dto::{
    Bucket, CommonPrefix, CompleteMultipartUploadInput, CompleteMultipartUploadOutput,
    CreateBucketInput, CreateBucketOutput, CreateMultipartUploadInput, CreateMultipartUploadOutput,
    DeleteBucketInput, DeleteBucketOutput, DeleteObjectInput, DeleteObjectOutput,
    DeleteObjectsInput, DeleteObjectsOutput, DeletedObject, ETag, GetObjectInput, GetObjectOutput,
    HeadBucketInput, HeadBucketOutput, HeadObjectInput, HeadObjectOutput, ListBucketsInput,
    ListBucketsOutput, ListObjectsV2Input, ListObjectsV2Output, ListPartsInput, ListPartsOutput,
    Part, PutObjectInput, PutObjectOutput, StreamingBlob, Timestamp, UploadPartInput,
    UploadPartOutput,
};
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};

use crate::serve::Counters;
use crate::store::{GatewayStore, ListQuery, Object, ObjectInfo, StoreError, md5_hex};

/// The S3 service: a handle on the store and the request counters.
#[derive(Debug, Clone)]
pub struct Gateway {
    store: Arc<GatewayStore>,
    counters: Arc<Counters>,
}

impl Gateway {
    /// Serves `store`, counting into `counters`.
    pub fn with_counters(store: Arc<GatewayStore>, counters: Arc<Counters>) -> Self {
        Self { store, counters }
    }
}

fn s3_err(e: StoreError) -> S3Error {
    let code = match &e {
        StoreError::NoSuchBucket => S3ErrorCode::NoSuchBucket,
        StoreError::NoSuchKey => S3ErrorCode::NoSuchKey,
        StoreError::BucketExists => S3ErrorCode::BucketAlreadyOwnedByYou,
        StoreError::BucketNotEmpty => S3ErrorCode::BucketNotEmpty,
        StoreError::NoSuchUpload => S3ErrorCode::NoSuchUpload,
        StoreError::InvalidPart(_) => S3ErrorCode::InvalidPart,
        StoreError::InvalidPartOrder => S3ErrorCode::InvalidPartOrder,
        StoreError::EntityTooSmall => S3ErrorCode::EntityTooSmall,
        StoreError::EntityTooLarge(_) => S3ErrorCode::EntityTooLarge,
        StoreError::Corrupt(_) => {
            // The client is told the object is gone; the operator finds the details in
            // the log (the store has dropped the record).
            return S3Error::with_message(
                S3ErrorCode::NoSuchKey,
                "the object failed verification and was dropped",
            );
        }
        StoreError::Io(_) => S3ErrorCode::InternalError,
    };
    S3Error::with_message(code, e.to_string())
}

fn timestamp(ms: u64) -> Timestamp {
    Timestamp::from(UNIX_EPOCH + Duration::from_millis(ms))
}

fn etag(value: &str) -> ETag {
    ETag::Strong(value.to_owned())
}

/// Runs blocking store work (disk writes, fsync) off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> S3Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(s3_err),
        Err(e) => Err(S3Error::internal_error(e)),
    }
}

/// Reads a request body whole, refusing more than `max` bytes or a length other than the
/// declared one.
async fn collect(body: Option<StreamingBlob>, declared: Option<i64>, max: u64) -> S3Result<Bytes> {
    if let Some(n) = declared
        && (n < 0 || n as u64 > max)
    {
        return Err(s3_error!(
            EntityTooLarge,
            "at most {max} bytes per object or part"
        ));
    }
    let Some(mut body) = body else {
        return Ok(Bytes::new());
    };
    let mut buf = Vec::with_capacity(declared.unwrap_or(0).max(0) as usize);
    while let Some(piece) = body.next().await {
        let piece = piece.map_err(|e| s3_error!(IncompleteBody, "reading the body failed: {e}"))?;
        if (buf.len() + piece.len()) as u64 > max {
            return Err(s3_error!(
                EntityTooLarge,
                "at most {max} bytes per object or part"
            ));
        }
        buf.extend_from_slice(&piece);
    }
    if let Some(n) = declared
        && n as usize != buf.len()
    {
        return Err(s3_error!(
            IncompleteBody,
            "the body has {} bytes, Content-Length said {n}",
            buf.len()
        ));
    }
    Ok(Bytes::from(buf))
}

/// Checks a Content-MD5 header (base64 of the MD5) against `md5_hex`.
fn check_md5(header: Option<&str>, md5_hex_value: &str) -> S3Result<()> {
    let Some(header) = header else {
        return Ok(());
    };
    use base64::Engine;
    let Ok(given) = base64::engine::general_purpose::STANDARD.decode(header.trim()) else {
        return Err(s3_error!(InvalidDigest, "Content-MD5 is not base64"));
    };
    if given.len() != 16 {
        return Err(s3_error!(InvalidDigest, "Content-MD5 is not 16 bytes"));
    }
    if kvtier_core::hash::hex(&given) != md5_hex_value {
        return Err(s3_error!(BadDigest, "the body does not match Content-MD5"));
    }
    Ok(())
}

fn info_from(content_type: Option<String>, metadata: Option<s3s::dto::Metadata>) -> ObjectInfo {
    let mut metadata: Vec<(String, String)> = metadata.unwrap_or_default().into_iter().collect();
    metadata.sort();
    ObjectInfo {
        content_type,
        metadata,
        ..ObjectInfo::default()
    }
}

fn metadata_of(o: &Object) -> Option<s3s::dto::Metadata> {
    (!o.info.metadata.is_empty()).then(|| o.info.metadata.iter().cloned().collect())
}

fn content_type_of(o: &Object) -> Option<s3s::dto::ContentType> {
    o.info.content_type.as_deref().and_then(|c| c.parse().ok())
}

/// The byte range a Range header selects, or 416 exactly as S3 answers.
fn select(range: Option<Range>, size: u64) -> S3Result<(std::ops::Range<u64>, bool)> {
    match range {
        None => Ok((0..size, false)),
        Some(r) => {
            let selected = r.check(size).map_err(S3Error::from)?;
            if selected.is_empty() {
                return Err(s3_error!(
                    InvalidRange,
                    "The requested range is not satisfiable"
                ));
            }
            Ok((selected, true))
        }
    }
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let store = self.store.clone();
        let bucket = req.input.bucket;
        let location = format!("/{bucket}");
        blocking(move || store.create_bucket(&bucket)).await?;
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(location),
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        if !self.store.has_bucket(&req.input.bucket) {
            return Err(s3_err(StoreError::NoSuchBucket));
        }
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let store = self.store.clone();
        let bucket = req.input.bucket;
        blocking(move || store.delete_bucket(&bucket)).await?;
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    async fn list_buckets(
        &self,
        _req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let buckets = self
            .store
            .buckets()
            .into_iter()
            .map(|(name, ms)| Bucket {
                name: Some(name),
                creation_date: Some(timestamp(ms)),
                ..Bucket::default()
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            ..ListBucketsOutput::default()
        }))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let input = req.input;
        if !self.store.has_bucket(&input.bucket) {
            return Err(s3_err(StoreError::NoSuchBucket));
        }
        let data = collect(
            input.body,
            input.content_length,
            self.store.max_object_bytes(),
        )
        .await?;
        let md5 = md5_hex(&data);
        check_md5(input.content_md5.as_deref(), &md5)?;
        let info = ObjectInfo {
            etag: md5.clone(),
            modified_ms: std::time::SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            ..info_from(input.content_type.map(|c| c.to_string()), input.metadata)
        };
        let store = self.store.clone();
        let (bucket, key) = (input.bucket, input.key);
        let size = data.len() as i64;
        blocking(move || store.put_object(&bucket, &key, &data, info)).await?;
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(etag(&md5)),
            size: Some(size),
            ..PutObjectOutput::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let input = req.input;
        let object = self
            .store
            .object(&input.bucket, &input.key)
            .map_err(s3_err)?;
        let (range, partial) = select(input.range, object.size)?;
        // A page-cache read of a cached prefix takes microseconds: done inline, as a
        // hop to the blocking pool would cost as much as the read itself.
        let bytes = self
            .store
            .read(&input.bucket, &input.key, &object, range.clone())
            .map_err(s3_err)?;
        self.counters
            .gets
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if partial {
            self.counters
                .ranged_gets
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.counters
            .bytes_out
            .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let content_range = partial.then(|| {
            format!(
                "bytes {}-{}/{}",
                range.start,
                range.end.saturating_sub(1),
                object.size
            )
        });
        Ok(S3Response::new(GetObjectOutput {
            body: Some(StreamingBlob::from(s3s::Body::from(bytes))),
            content_length: Some((range.end - range.start) as i64),
            content_range,
            accept_ranges: Some("bytes".into()),
            e_tag: Some(etag(&object.info.etag)),
            last_modified: Some(timestamp(object.info.modified_ms)),
            content_type: content_type_of(&object),
            metadata: metadata_of(&object),
            ..GetObjectOutput::default()
        }))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let input = req.input;
        let object = self
            .store
            .object(&input.bucket, &input.key)
            .map_err(s3_err)?;
        let (range, partial) = select(input.range, object.size)?;
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some((range.end - range.start) as i64),
            content_range: partial.then(|| {
                format!(
                    "bytes {}-{}/{}",
                    range.start,
                    range.end.saturating_sub(1),
                    object.size
                )
            }),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(etag(&object.info.etag)),
            last_modified: Some(timestamp(object.info.modified_ms)),
            content_type: content_type_of(&object),
            metadata: metadata_of(&object),
            ..HeadObjectOutput::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let store = self.store.clone();
        let (bucket, key) = (req.input.bucket, req.input.key);
        blocking(move || store.delete_object(&bucket, &key)).await?;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let input = req.input;
        if !self.store.has_bucket(&input.bucket) {
            return Err(s3_err(StoreError::NoSuchBucket));
        }
        if input.delete.objects.len() > 1000 {
            return Err(s3_error!(
                MalformedXML,
                "at most 1,000 keys per DeleteObjects"
            ));
        }
        let quiet = input.delete.quiet.unwrap_or(false);
        let store = self.store.clone();
        let bucket = input.bucket;
        let keys: Vec<String> = input.delete.objects.into_iter().map(|o| o.key).collect();
        let (deleted, errors) = blocking(move || {
            let mut deleted = Vec::new();
            let mut errors = Vec::new();
            for key in keys {
                match store.delete_object(&bucket, &key) {
                    Ok(()) => deleted.push(DeletedObject {
                        key: Some(key),
                        ..DeletedObject::default()
                    }),
                    Err(e) => errors.push(s3s::dto::Error {
                        code: Some("InternalError".into()),
                        key: Some(key),
                        message: Some(e.to_string()),
                        ..s3s::dto::Error::default()
                    }),
                }
            }
            Ok((deleted, errors))
        })
        .await?;
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: (!quiet).then_some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..DeleteObjectsOutput::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let input = req.input;
        let max_keys = input.max_keys.unwrap_or(1000);
        if max_keys < 0 {
            return Err(s3_error!(InvalidArgument, "max-keys must not be negative"));
        }
        if let Some(t) = &input.continuation_token
            && crate::store::decode_token(t).is_none()
        {
            return Err(s3_error!(
                InvalidArgument,
                "The continuation token provided is incorrect"
            ));
        }
        let query = ListQuery {
            prefix: input.prefix.clone().unwrap_or_default(),
            delimiter: input.delimiter.clone(),
            max_keys: (max_keys as usize).min(1000),
            continuation: input.continuation_token.clone(),
            start_after: input.start_after.clone(),
        };
        let page = self.store.list(&input.bucket, &query).map_err(s3_err)?;
        let key_count = (page.objects.len() + page.common_prefixes.len()) as i32;
        let contents = page
            .objects
            .iter()
            .map(|(key, o)| s3s::dto::Object {
                key: Some(key.clone()),
                size: Some(o.size as i64),
                e_tag: Some(etag(&o.info.etag)),
                last_modified: Some(timestamp(o.info.modified_ms)),
                ..s3s::dto::Object::default()
            })
            .collect();
        let common_prefixes = page
            .common_prefixes
            .into_iter()
            .map(|p| CommonPrefix { prefix: Some(p) })
            .collect();
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: input.prefix,
            delimiter: input.delimiter,
            max_keys: Some(max_keys),
            key_count: Some(key_count),
            continuation_token: input.continuation_token,
            start_after: input.start_after,
            is_truncated: Some(page.truncated),
            next_continuation_token: page.next_token,
            contents: Some(contents),
            common_prefixes: Some(common_prefixes),
            ..ListObjectsV2Output::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let input = req.input;
        let info = info_from(input.content_type.map(|c| c.to_string()), input.metadata);
        let store = self.store.clone();
        let (bucket, key) = (input.bucket.clone(), input.key.clone());
        let upload_id = blocking(move || store.create_upload(&bucket, &key, info)).await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(upload_id),
            ..CreateMultipartUploadOutput::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let input = req.input;
        if !(1..=10_000).contains(&input.part_number) {
            return Err(s3_error!(
                InvalidArgument,
                "part numbers run from 1 to 10,000"
            ));
        }
        let data = collect(
            input.body,
            input.content_length,
            self.store.max_object_bytes(),
        )
        .await?;
        let md5 = md5_hex(&data);
        check_md5(input.content_md5.as_deref(), &md5)?;
        let store = self.store.clone();
        let (bucket, key, upload_id, number) =
            (input.bucket, input.key, input.upload_id, input.part_number);
        let tag =
            blocking(move || store.upload_part(&upload_id, &bucket, &key, number, &data, md5))
                .await?;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(etag(&tag)),
            ..UploadPartOutput::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let input = req.input;
        let listed: Vec<(i32, String)> = input
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default()
            .into_iter()
            .map(|p| {
                (
                    p.part_number.unwrap_or(0),
                    p.e_tag.map(|t| t.value().to_owned()).unwrap_or_default(),
                )
            })
            .collect();
        let store = self.store.clone();
        let (bucket, key, upload_id) = (input.bucket.clone(), input.key.clone(), input.upload_id);
        let object =
            blocking(move || store.complete_upload(&upload_id, &bucket, &key, &listed)).await?;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket.clone()),
            key: Some(input.key.clone()),
            e_tag: Some(etag(&object.info.etag)),
            location: Some(format!("/{}/{}", input.bucket, input.key)),
            ..CompleteMultipartUploadOutput::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let input = req.input;
        let store = self.store.clone();
        blocking(move || store.abort_upload(&input.upload_id, &input.bucket, &input.key)).await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let input = req.input;
        let max = input.max_parts.unwrap_or(1000).clamp(0, 1000);
        let marker = input.part_number_marker.unwrap_or(0);
        let (parts, truncated) = self
            .store
            .list_parts(
                &input.upload_id,
                &input.bucket,
                &input.key,
                marker,
                max as usize,
            )
            .map_err(s3_err)?;
        let next = parts.last().map(|p| p.number);
        let parts = parts
            .into_iter()
            .map(|p| Part {
                part_number: Some(p.number),
                size: Some(p.size as i64),
                e_tag: Some(etag(&p.etag)),
                last_modified: Some(timestamp(p.modified_ms)),
                ..Part::default()
            })
            .collect();
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            max_parts: Some(max),
            part_number_marker: input.part_number_marker,
            next_part_number_marker: if truncated { next } else { None },
            is_truncated: Some(truncated),
            parts: Some(parts),
            ..ListPartsOutput::default()
        }))
    }
}
