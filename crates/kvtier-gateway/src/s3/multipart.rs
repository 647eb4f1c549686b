//! CreateMultipartUpload, UploadPart, CompleteMultipartUpload, ListParts and
//! ListMultipartUploads.

use s3s::dto::{
    CommonPrefix, CompleteMultipartUploadInput, CompleteMultipartUploadOutput,
    CreateMultipartUploadInput, CreateMultipartUploadOutput, Initiator, ListMultipartUploadsInput,
    ListMultipartUploadsOutput, ListPartsInput, ListPartsOutput, MultipartUpload, Part,
    StorageClass, UploadPartInput, UploadPartOutput,
};
use s3s::{S3Request, S3Result, s3_error};

use super::input::{
    canned_public_read, check_key, check_md5, check_md5_form, check_metadata, kept_headers,
    stream_into, write_conditions,
};
use super::list::{Names, owner};
use super::object::{info_from, upload_info};
use super::{Gateway, blocking, etag, s3_err, timestamp};
use crate::store::{Completed, ObjectInfo};

pub(super) async fn create(
    gw: &Gateway,
    mut input: CreateMultipartUploadInput,
) -> S3Result<CreateMultipartUploadOutput> {
    check_key(&input.key)?;
    let info = upload_info!(gw, input);
    let store = gw.store.clone();
    let (bucket, key) = (input.bucket.clone(), input.key.clone());
    let upload_id = blocking(move || store.create_upload(&bucket, &key, info)).await?;
    Ok(CreateMultipartUploadOutput {
        bucket: Some(input.bucket),
        key: Some(input.key),
        upload_id: Some(upload_id),
        ..CreateMultipartUploadOutput::default()
    })
}

pub(super) async fn upload_part(
    gw: &Gateway,
    input: UploadPartInput,
) -> S3Result<UploadPartOutput> {
    if !(1..=10_000).contains(&input.part_number) {
        return Err(s3_error!(
            InvalidArgument,
            "part numbers run from 1 to 10,000"
        ));
    }
    check_md5_form(input.content_md5.as_deref())?;
    let Some(len) = input.content_length else {
        return Err(s3_error!(
            MissingContentLength,
            "a part needs a Content-Length"
        ));
    };
    if len < 0 || len as u64 > gw.store.max_object_bytes() {
        return Err(s3_error!(
            EntityTooLarge,
            "at most {} bytes per part",
            gw.store.max_object_bytes()
        ));
    }
    let store = gw.store.clone();
    let (bucket, key, upload_id, number) =
        (input.bucket, input.key, input.upload_id, input.part_number);
    let writer = {
        let (store, bucket, key, upload_id) = (
            store.clone(),
            bucket.clone(),
            key.clone(),
            upload_id.clone(),
        );
        blocking(move || store.begin_part(&upload_id, &bucket, &key, number, len as u64)).await?
    };
    let writer = stream_into(writer, input.body).await?;
    check_md5(input.content_md5.as_deref(), &writer.md5_raw())?;
    let tag = blocking(move || store.finish_part(writer, &upload_id, number)).await?;
    Ok(UploadPartOutput {
        e_tag: Some(etag(&tag)),
        ..UploadPartOutput::default()
    })
}

pub(super) async fn complete(
    gw: &Gateway,
    req: S3Request<CompleteMultipartUploadInput>,
) -> S3Result<CompleteMultipartUploadOutput> {
    let input = req.input;
    let cond = write_conditions(
        input.if_match.as_ref(),
        input.if_none_match.as_ref(),
        &req.headers,
    )?;
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
    let store = gw.store.clone();
    let (bucket, key, upload_id) = (input.bucket.clone(), input.key.clone(), input.upload_id);
    let done =
        blocking(move || store.complete_upload(&upload_id, &bucket, &key, &listed, &cond)).await?;
    let object = match done {
        Completed::Now(o) | Completed::Before(o) => o,
    };
    Ok(CompleteMultipartUploadOutput {
        bucket: Some(input.bucket.clone()),
        key: Some(input.key.clone()),
        e_tag: Some(etag(&object.info.etag)),
        location: Some(format!("/{}/{}", input.bucket, input.key)),
        ..CompleteMultipartUploadOutput::default()
    })
}

pub(super) fn list_parts(gw: &Gateway, input: ListPartsInput) -> S3Result<ListPartsOutput> {
    let max = input.max_parts.unwrap_or(1000).clamp(0, 1000);
    let marker = input.part_number_marker.unwrap_or(0);
    let (parts, truncated) = gw
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
    Ok(ListPartsOutput {
        bucket: Some(input.bucket),
        key: Some(input.key),
        upload_id: Some(input.upload_id),
        max_parts: Some(max),
        part_number_marker: input.part_number_marker,
        next_part_number_marker: if truncated { next } else { None },
        is_truncated: Some(truncated),
        parts: Some(parts),
        ..ListPartsOutput::default()
    })
}

/// ListMultipartUploads: the uploads in progress, by key then initiation, with `prefix`,
/// `delimiter` (keys rolled up into common prefixes), `key-marker` / `upload-id-marker`,
/// `max-uploads` (at most 1,000) and `encoding-type=url`.
pub(super) fn list_uploads(
    gw: &Gateway,
    input: ListMultipartUploadsInput,
) -> S3Result<ListMultipartUploadsOutput> {
    let names = Names::of(input.encoding_type.as_ref())?;
    let max = input.max_uploads.unwrap_or(1000);
    if max < 0 {
        return Err(s3_error!(
            InvalidArgument,
            "max-uploads must not be negative"
        ));
    }
    let max = max.min(1000) as usize;
    let prefix = input.prefix.clone().unwrap_or_default();
    let delimiter = input.delimiter.clone().filter(|d| !d.is_empty());
    let key_marker = input.key_marker.clone().unwrap_or_default();
    let id_marker = input.upload_id_marker.clone().unwrap_or_default();
    let found = gw
        .store
        .list_uploads(&input.bucket, &prefix, &key_marker, &id_marker)
        .map_err(s3_err)?;
    // A key marker that is a rolled-up prefix (the last entry of a previous page) skips
    // every key under it.
    let skip_under = delimiter
        .as_deref()
        .filter(|d| key_marker.ends_with(d) && id_marker.is_empty())
        .map(|_| key_marker.clone());
    let mut uploads = Vec::new();
    let mut prefixes: Vec<String> = Vec::new();
    let mut last: Option<(String, Option<String>)> = None;
    let mut truncated = false;
    for u in found {
        if skip_under.as_deref().is_some_and(|p| u.key.starts_with(p)) {
            continue;
        }
        let rolled = delimiter.as_deref().and_then(|d| {
            let rest = &u.key[prefix.len()..];
            rest.find(d)
                .map(|i| format!("{prefix}{}", &rest[..i + d.len()]))
        });
        if let Some(p) = &rolled
            && prefixes.last() == Some(p)
        {
            continue;
        }
        if uploads.len() + prefixes.len() == max {
            truncated = true;
            break;
        }
        match rolled {
            Some(p) => {
                last = Some((p.clone(), None));
                prefixes.push(p);
            }
            None => {
                last = Some((u.key.clone(), Some(u.upload_id.clone())));
                uploads.push(MultipartUpload {
                    key: Some(names.name(&u.key)),
                    upload_id: Some(u.upload_id),
                    initiated: Some(timestamp(u.initiated_ms)),
                    initiator: Some(Initiator {
                        display_name: owner().display_name,
                        id: owner().id,
                    }),
                    owner: Some(owner()),
                    storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                    ..MultipartUpload::default()
                });
            }
        }
    }
    let (next_key, next_id) = match (truncated, last) {
        (true, Some((k, id))) => (Some(names.name(&k)), id),
        _ => (None, None),
    };
    Ok(ListMultipartUploadsOutput {
        bucket: Some(input.bucket),
        prefix: Some(names.name(&prefix)),
        delimiter: delimiter.map(|d| names.name(&d)),
        key_marker: Some(names.name(&key_marker)),
        upload_id_marker: Some(id_marker),
        next_key_marker: next_key,
        next_upload_id_marker: next_id,
        max_uploads: Some(max as i32),
        is_truncated: Some(truncated),
        uploads: Some(uploads),
        common_prefixes: (!prefixes.is_empty()).then(|| {
            prefixes
                .into_iter()
                .map(|p| CommonPrefix {
                    prefix: Some(names.name(&p)),
                })
                .collect()
        }),
        encoding_type: input.encoding_type,
        ..ListMultipartUploadsOutput::default()
    })
}
