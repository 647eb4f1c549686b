//! PutObject, GetObject and HeadObject (by Range or `partNumber`), GetObjectAttributes,
//! DeleteObject and DeleteObjects.

use std::sync::atomic::Ordering;

use http::HeaderMap;
use s3s::dto::{
    DeleteObjectInput, DeleteObjectOutput, DeleteObjectsInput, DeleteObjectsOutput, DeletedObject,
    GetObjectAttributesInput, GetObjectAttributesOutput, GetObjectAttributesParts, GetObjectInput,
    GetObjectOutput, HeadObjectInput, HeadObjectOutput, ObjectAttributes, ObjectPart,
    PutObjectInput, PutObjectOutput, Range, StorageClass, StreamingBlob,
};
use s3s::{S3Error, S3ErrorCode, S3Request, S3Result, s3_error};

use super::input::{
    canned_public_read, check_key, check_md5, check_md5_form, check_metadata, kept_headers,
    read_conditions, stream_into, write_conditions,
};
use super::{Gateway, blocking, etag, s3_err, timestamp};
use crate::store::{Object, ObjectInfo, Precondition, ReadVerdict, StoreError};

/// Content type, metadata and kept headers of an upload, modified at `now_ms` (the
/// store's clock).
pub(super) fn info_from(
    content_type: Option<String>,
    metadata: Option<s3s::dto::Metadata>,
    headers: crate::store::Headers,
    now_ms: u64,
) -> ObjectInfo {
    let mut metadata: Vec<(String, String)> = metadata.unwrap_or_default().into_iter().collect();
    metadata.sort();
    ObjectInfo {
        content_type,
        metadata,
        headers,
        modified_ms: now_ms,
        ..ObjectInfo::default()
    }
}

fn metadata_of(o: &Object) -> Option<s3s::dto::Metadata> {
    (!o.info.metadata.is_empty()).then(|| o.info.metadata.iter().cloned().collect())
}

fn content_type_of(o: &Object) -> Option<s3s::dto::ContentType> {
    o.info.content_type.as_deref().and_then(|c| c.parse().ok())
}

/// The byte range a Range header selects, or 416 exactly as S3 answers. (Malformed and
/// multi-range headers never get here: the listener drops them, or for a signed one the
/// route of `serve/signed_range.rs`, and S3 then sends the whole object.)
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

/// What a GET or HEAD asked for: the byte range, whether the answer is partial (206 with
/// Content-Range), and the part count to report (`x-amz-mp-parts-count`).
struct Selected {
    range: std::ops::Range<u64>,
    partial: bool,
    parts_count: Option<i32>,
}

/// The bytes a `partNumber` selects. A multipart object's part `n` is the `n`-th part
/// it was completed from (its recorded sizes); any other object is one part, so part 1 is
/// the whole object. A part it does not have is 400 `InvalidPart` (what Ceph RGW and
/// s3-tests expect).
fn select_part(object: &Object, number: i32) -> S3Result<Selected> {
    if !(1..=10_000).contains(&number) {
        return Err(s3_error!(
            InvalidArgument,
            "Part number must be an integer between 1 and 10000, inclusive"
        ));
    }
    let sizes = &object.info.part_sizes;
    if sizes.is_empty() {
        if object.info.etag.contains('-') {
            // Completed by a gateway that did not record part sizes yet.
            return Err(s3_error!(
                NotImplemented,
                "the part boundaries of this object were not recorded; GET it by Range"
            ));
        }
        if number != 1 {
            return Err(s3_error!(InvalidPart, "the object has one part"));
        }
        return Ok(Selected {
            range: 0..object.size,
            partial: false,
            parts_count: None,
        });
    }
    let n = number as usize;
    let Some(&size) = sizes.get(n - 1) else {
        return Err(s3_error!(
            InvalidPart,
            "the object has {} parts",
            sizes.len()
        ));
    };
    let start: u64 = sizes[..n - 1].iter().sum();
    let range = start..start + size;
    if range.end > object.size {
        return Err(S3Error::with_message(
            S3ErrorCode::InternalError,
            "recorded part sizes exceed the object",
        ));
    }
    Ok(Selected {
        partial: !range.is_empty(),
        range,
        parts_count: Some(sizes.len() as i32),
    })
}

/// A Range header or a part number (not both, as S3 requires), or the whole object.
fn select_any(object: &Object, range: Option<Range>, part: Option<i32>) -> S3Result<Selected> {
    match (range, part) {
        (Some(_), Some(_)) => Err(s3_error!(
            InvalidRequest,
            "Cannot specify both Range header and partNumber query parameter"
        )),
        (None, Some(n)) => select_part(object, n),
        (range, None) => {
            let (range, partial) = select(range, object.size)?;
            Ok(Selected {
                range,
                partial,
                parts_count: None,
            })
        }
    }
}

/// The object after its read conditions: 412 `PreconditionFailed` or 304.
///
/// An anonymous request (`anonymous`) may read only an object written `public-read`:
/// any other is 403 `AccessDenied`, and so is a missing key unless the bucket is
/// `public-read` (then 404, as S3 answers whoever may list the bucket).
fn conditioned(
    gw: &Gateway,
    bucket: &str,
    key: &str,
    cond: &Precondition,
    anonymous: bool,
) -> S3Result<std::sync::Arc<Object>> {
    check_key(key)?;
    let object = match gw.store.object(bucket, key) {
        Ok(o) => o,
        Err(StoreError::NoSuchKey)
            if anonymous && gw.store.bucket_public_read(bucket) != Some(true) =>
        {
            return Err(access_denied());
        }
        Err(e) => return Err(s3_err(e)),
    };
    if anonymous && !object.info.public_read {
        return Err(access_denied());
    }
    match cond.check_read(&object).map_err(s3_err)? {
        ReadVerdict::Send => Ok(object),
        ReadVerdict::NotModified => {
            let mut e = S3Error::new(S3ErrorCode::NotModified);
            let mut headers = HeaderMap::new();
            if let Ok(v) = format!("\"{}\"", object.info.etag).parse() {
                headers.insert(http::header::ETAG, v);
            }
            e.set_headers(headers);
            Err(e)
        }
    }
}

/// What PutObject and CreateMultipartUpload keep of their input (`$input`, either s3s
/// input type: the same field names, hence a macro) as the object's info: metadata
/// checked, the canned ACL and grants read, the kept headers, stamped now. Evaluates to
/// `ObjectInfo` and returns the error from the enclosing function.
macro_rules! upload_info {
    ($gw:expr, $input:expr) => {{
        check_metadata($input.metadata.as_ref())?;
        let public_read = canned_public_read(
            $input.acl.as_ref().map(|a| a.as_str()),
            &[
                $input.grant_full_control.as_ref(),
                $input.grant_read.as_ref(),
                $input.grant_read_acp.as_ref(),
                $input.grant_write_acp.as_ref(),
            ],
        )?;
        let headers = kept_headers(
            $input.cache_control.take(),
            $input.content_disposition.take(),
            $input.content_encoding.take(),
            $input.content_language.take(),
            $input.expires.as_ref(),
        );
        ObjectInfo {
            public_read,
            ..info_from(
                $input.content_type.take().map(|c| c.to_string()),
                $input.metadata.take(),
                headers,
                $gw.store.now_ms(),
            )
        }
    }};
}
pub(super) use upload_info;

pub(super) async fn put(gw: &Gateway, req: S3Request<PutObjectInput>) -> S3Result<PutObjectOutput> {
    let mut input = req.input;
    check_key(&input.key)?;
    check_md5_form(input.content_md5.as_deref())?;
    let info = upload_info!(gw, input);
    let cond = write_conditions(
        input.if_match.as_ref(),
        input.if_none_match.as_ref(),
        &req.headers,
    )?;
    let Some(len) = input.content_length else {
        return Err(s3_error!(
            MissingContentLength,
            "PUT needs a Content-Length"
        ));
    };
    if len < 0 || len as u64 > gw.store.max_object_bytes() {
        return Err(s3_error!(
            EntityTooLarge,
            "at most {} bytes per object",
            gw.store.max_object_bytes()
        ));
    }
    // A condition that already fails is answered before the body is read.
    let current = match gw.store.object(&input.bucket, &input.key) {
        Ok(o) => Some(o),
        Err(StoreError::NoSuchKey) => None,
        Err(e) => return Err(s3_err(e)),
    };
    cond.check_write(current.as_deref()).map_err(s3_err)?;
    let store = gw.store.clone();
    let (bucket, key) = (input.bucket, input.key);
    let writer = {
        let (store, bucket, key, info) = (store.clone(), bucket.clone(), key.clone(), info.clone());
        blocking(move || store.begin_object(&bucket, &key, len as u64, &info, 32)).await?
    };
    let writer = stream_into(writer, input.body).await?;
    check_md5(input.content_md5.as_deref(), &writer.md5_raw())?;
    let md5 = writer.md5_hex();
    let info = ObjectInfo {
        etag: md5.clone(),
        ..info
    };
    blocking(move || store.finish_object(writer, &bucket, &key, info, &cond)).await?;
    Ok(PutObjectOutput {
        e_tag: Some(etag(&md5)),
        size: Some(len),
        ..PutObjectOutput::default()
    })
}

fn expires_of(o: &Object) -> Option<s3s::dto::Timestamp> {
    o.info.headers.expires_ms.map(|ms| {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
        s3s::dto::Timestamp::from(t)
    })
}

fn content_range(range: &std::ops::Range<u64>, size: u64) -> String {
    format!(
        "bytes {}-{}/{}",
        range.start,
        range.end.saturating_sub(1),
        size
    )
}

/// 403 `AccessDenied`, as S3 words it.
pub fn access_denied() -> S3Error {
    s3_error!(AccessDenied, "Access Denied")
}

/// The headers GET and HEAD answer for the same object and selection, as an s3s output
/// struct of type `$out` (two types with the same field names, hence a macro).
macro_rules! object_headers {
    ($out:ident, $object:expr, $range:expr, $partial:expr, $parts_count:expr) => {{
        let object = &$object;
        let h = &object.info.headers;
        $out {
            content_length: Some(($range.end - $range.start) as i64),
            content_range: $partial.then(|| content_range(&$range, object.size)),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(etag(&object.info.etag)),
            last_modified: Some(timestamp(object.info.modified_ms)),
            content_type: content_type_of(object),
            metadata: metadata_of(object),
            cache_control: h.cache_control.clone(),
            content_disposition: h.content_disposition.clone(),
            content_encoding: h.content_encoding.clone(),
            content_language: h.content_language.clone(),
            expires: expires_of(object),
            parts_count: $parts_count,
            ..$out::default()
        }
    }};
}

pub(super) fn get(
    gw: &Gateway,
    input: GetObjectInput,
    anonymous: bool,
) -> S3Result<GetObjectOutput> {
    let cond = read_conditions(
        input.if_match.as_ref(),
        input.if_none_match.as_ref(),
        input.if_modified_since.as_ref(),
        input.if_unmodified_since.as_ref(),
    );
    let object = conditioned(gw, &input.bucket, &input.key, &cond, anonymous)?;
    let Selected {
        range,
        partial,
        parts_count,
    } = select_any(&object, input.range, input.part_number)?;
    // A page-cache read of a cached prefix takes microseconds: done inline, as a hop to
    // the blocking pool would cost as much as the read itself.
    let bytes = gw
        .store
        .read(&input.bucket, &input.key, &object, range.clone())
        .map_err(s3_err)?;
    let c = &gw.counters;
    c.gets.fetch_add(1, Ordering::Relaxed);
    if partial {
        c.ranged_gets.fetch_add(1, Ordering::Relaxed);
    }
    c.bytes_out.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    Ok(GetObjectOutput {
        body: Some(StreamingBlob::from(s3s::Body::from(bytes))),
        ..object_headers!(GetObjectOutput, object, range, partial, parts_count)
    })
}

pub(super) fn head(
    gw: &Gateway,
    input: HeadObjectInput,
    anonymous: bool,
) -> S3Result<HeadObjectOutput> {
    let cond = read_conditions(
        input.if_match.as_ref(),
        input.if_none_match.as_ref(),
        input.if_modified_since.as_ref(),
        input.if_unmodified_since.as_ref(),
    );
    let object = conditioned(gw, &input.bucket, &input.key, &cond, anonymous)?;
    let Selected {
        range,
        partial,
        parts_count,
    } = select_any(&object, input.range, input.part_number)?;
    Ok(object_headers!(
        HeadObjectOutput,
        object,
        range,
        partial,
        parts_count
    ))
}

/// GetObjectAttributes: ETag, size, storage class (always `STANDARD`) and, for a
/// multipart object, its parts (number and size; paged by `max-parts` and
/// `part-number-marker`). No checksums are kept beyond Content-MD5, so `Checksum` is never
/// answered; nor is `ObjectParts` for an object that is not multipart (as in S3).
pub(super) fn attributes(
    gw: &Gateway,
    input: GetObjectAttributesInput,
) -> S3Result<GetObjectAttributesOutput> {
    check_key(&input.key)?;
    let object = gw.store.object(&input.bucket, &input.key).map_err(s3_err)?;
    // One header may list several attributes, comma-separated (as boto3 sends them).
    let wanted = |name: &str| {
        input
            .object_attributes
            .iter()
            .flat_map(|a| a.as_str().split(','))
            .any(|a| a.trim() == name)
    };
    let sizes = &object.info.part_sizes;
    let object_parts = (wanted(ObjectAttributes::OBJECT_PARTS) && !sizes.is_empty()).then(|| {
        let max = input.max_parts.unwrap_or(1000).clamp(0, 1000);
        let marker = input.part_number_marker.unwrap_or(0).max(0);
        let after = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| (i as i32 + 1, size))
            .filter(|&(n, _)| n > marker);
        let page: Vec<ObjectPart> = after
            .clone()
            .take(max as usize)
            .map(|(n, size)| ObjectPart {
                part_number: Some(n),
                size: Some(size as i64),
                ..ObjectPart::default()
            })
            .collect();
        let truncated = after.count() > page.len();
        GetObjectAttributesParts {
            is_truncated: Some(truncated),
            max_parts: Some(max),
            next_part_number_marker: if truncated {
                page.last().and_then(|p| p.part_number)
            } else {
                None
            },
            part_number_marker: input.part_number_marker,
            parts: Some(page),
            total_parts_count: Some(sizes.len() as i32),
        }
    });
    Ok(GetObjectAttributesOutput {
        e_tag: wanted(ObjectAttributes::ETAG).then(|| etag(&object.info.etag)),
        object_size: wanted(ObjectAttributes::OBJECT_SIZE).then_some(object.size as i64),
        storage_class: wanted(ObjectAttributes::STORAGE_CLASS)
            .then(|| StorageClass::from_static(StorageClass::STANDARD)),
        object_parts,
        last_modified: Some(timestamp(object.info.modified_ms)),
        ..GetObjectAttributesOutput::default()
    })
}

pub(super) async fn delete(
    gw: &Gateway,
    req: S3Request<DeleteObjectInput>,
) -> S3Result<DeleteObjectOutput> {
    check_key(&req.input.key)?;
    let cond = write_conditions(req.input.if_match.as_ref(), None, &req.headers)?;
    // S3 answers a DELETE with If-Match of a missing key with 404 as well.
    let store = gw.store.clone();
    let (bucket, key) = (req.input.bucket, req.input.key);
    blocking(move || store.delete_object(&bucket, &key, &cond)).await?;
    Ok(DeleteObjectOutput::default())
}

pub(super) async fn delete_many(
    gw: &Gateway,
    input: DeleteObjectsInput,
) -> S3Result<DeleteObjectsOutput> {
    if !gw.store.has_bucket(&input.bucket) {
        return Err(s3_err(StoreError::NoSuchBucket));
    }
    if input.delete.objects.len() > 1000 {
        return Err(s3_error!(
            MalformedXML,
            "at most 1,000 keys per DeleteObjects"
        ));
    }
    let quiet = input.delete.quiet.unwrap_or(false);
    let store = gw.store.clone();
    let bucket = input.bucket;
    let keys: Vec<String> = input.delete.objects.into_iter().map(|o| o.key).collect();
    let (deleted, errors) = blocking(move || {
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        for key in keys {
            let outcome = check_key(&key)
                .map_err(|e| {
                    (
                        e.code().as_str().to_owned(),
                        e.message().unwrap_or("").to_owned(),
                    )
                })
                .and_then(|()| {
                    store
                        .delete_object(&bucket, &key, &Precondition::default())
                        .map_err(|e| ("InternalError".to_owned(), e.to_string()))
                });
            match outcome {
                Ok(()) => deleted.push(DeletedObject {
                    key: Some(key),
                    ..DeletedObject::default()
                }),
                Err((code, message)) => errors.push(s3s::dto::Error {
                    code: Some(code),
                    key: Some(key),
                    message: Some(message),
                    ..s3s::dto::Error::default()
                }),
            }
        }
        Ok((deleted, errors))
    })
    .await?;
    Ok(DeleteObjectsOutput {
        deleted: (!quiet).then_some(deleted),
        errors: (!errors.is_empty()).then_some(errors),
        ..DeleteObjectsOutput::default()
    })
}
