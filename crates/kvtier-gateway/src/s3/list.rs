//! ListObjectsV2 and ListObjects (v1) over the store's ordered index.
//!
//! - `encoding-type=url`: keys, prefixes, delimiter, start-after and markers in the
//!   answer are percent-encoded (every byte but `A-Z a-z 0-9 - _ . ~ /`), as S3 does.
//!   Without it keys are sent as stored; characters XML 1.0 cannot carry literally are
//!   written as character references by the listener (`serve/wrap.rs`), never a 500.
//! - An empty delimiter is no delimiter (and is not echoed); an empty continuation token
//!   starts at the beginning (and is echoed, empty).
//! - `fetch-owner=true` (v2) adds the owner to each entry; v1 always does.

use s3s::dto::{
    Bucket, CommonPrefix, EncodingType, ListBucketsInput, ListBucketsOutput,
    ListObjectVersionsInput, ListObjectVersionsOutput, ListObjectsInput, ListObjectsOutput,
    ListObjectsV2Input, ListObjectsV2Output, ObjectVersion, Owner,
};
use s3s::{S3Result, s3_error};

use super::{etag, timestamp};

/// ListBuckets: by name, with `prefix`, `max-buckets` (1..=10,000; without it every
/// bucket) and a continuation token naming the last bucket of the previous page.
pub(super) fn buckets(
    store: &GatewayStore,
    input: ListBucketsInput,
) -> S3Result<ListBucketsOutput> {
    let max = match input.max_buckets {
        None => usize::MAX,
        Some(n) if (1..=10_000).contains(&n) => n as usize,
        Some(_) => {
            return Err(s3_error!(
                InvalidArgument,
                "max-buckets must be between 1 and 10000"
            ));
        }
    };
    let after = match input
        .continuation_token
        .as_deref()
        .filter(|t| !t.is_empty())
    {
        None => None,
        Some(t) => Some(decode_bucket_token(t).ok_or_else(|| {
            s3_error!(
                InvalidArgument,
                "The continuation token provided is incorrect"
            )
        })?),
    };
    let prefix = input.prefix.clone().unwrap_or_default();
    let mut matching = store
        .buckets()
        .into_iter()
        .filter(|(name, _)| name.starts_with(&prefix))
        .filter(|(name, _)| after.as_ref().is_none_or(|a| name > a));
    let page: Vec<(String, u64)> = matching.by_ref().take(max).collect();
    let more = matching.next().is_some();
    let next = if more {
        page.last().map(|(name, _)| bucket_token(name))
    } else {
        None
    };
    Ok(ListBucketsOutput {
        buckets: Some(
            page.into_iter()
                .map(|(name, ms)| Bucket {
                    name: Some(name),
                    creation_date: Some(timestamp(ms)),
                    ..Bucket::default()
                })
                .collect(),
        ),
        continuation_token: next,
        owner: Some(owner()),
        prefix: input.prefix,
    })
}

/// A ListBuckets continuation token: the last bucket name, hex (a bucket name is ASCII).
fn bucket_token(name: &str) -> String {
    kvtier_core::hash::hex(name.as_bytes())
}

fn decode_bucket_token(token: &str) -> Option<String> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let raw: Option<Vec<u8>> = (0..token.len() / 2)
        .map(|i| u8::from_str_radix(token.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    String::from_utf8(raw?).ok()
}
use crate::store::{GatewayStore, ListPage, ListQuery, decode_token};

/// The owner every object is listed with (one account per gateway).
pub(super) fn owner() -> Owner {
    Owner {
        display_name: Some("kvtier".into()),
        id: Some("kvtier".into()),
    }
}

fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// How names go out: as stored, or percent-encoded.
pub(super) struct Names(bool);

impl Names {
    pub(super) fn of(encoding: Option<&EncodingType>) -> S3Result<Self> {
        match encoding.map(EncodingType::as_str) {
            None => Ok(Names(false)),
            Some(e) if e.eq_ignore_ascii_case("url") => Ok(Names(true)),
            Some(_) => Err(s3_error!(
                InvalidArgument,
                "Invalid Encoding Method specified in Request"
            )),
        }
    }
    pub(super) fn name(&self, s: &str) -> String {
        if self.0 { url_encode(s) } else { s.to_owned() }
    }
    fn opt(&self, s: Option<String>) -> Option<String> {
        s.map(|s| self.name(&s))
    }
}

fn max_keys(given: Option<i32>) -> S3Result<i32> {
    let n = given.unwrap_or(1000);
    if n < 0 {
        return Err(s3_error!(InvalidArgument, "max-keys must not be negative"));
    }
    Ok(n)
}

fn contents(page: &ListPage, names: &Names, with_owner: bool) -> Vec<s3s::dto::Object> {
    page.objects
        .iter()
        .map(|(key, o)| s3s::dto::Object {
            key: Some(names.name(key)),
            size: Some(o.size as i64),
            e_tag: Some(etag(&o.info.etag)),
            last_modified: Some(timestamp(o.info.modified_ms)),
            owner: with_owner.then(owner),
            storage_class: Some(s3s::dto::ObjectStorageClass::from_static("STANDARD")),
            ..s3s::dto::Object::default()
        })
        .collect()
}

fn prefixes(page: &ListPage, names: &Names) -> Vec<CommonPrefix> {
    page.common_prefixes
        .iter()
        .map(|p| CommonPrefix {
            prefix: Some(names.name(p)),
        })
        .collect()
}

/// ListObjectsV2.
pub fn v2(store: &GatewayStore, input: ListObjectsV2Input) -> S3Result<ListObjectsV2Output> {
    let names = Names::of(input.encoding_type.as_ref())?;
    let max_keys = max_keys(input.max_keys)?;
    let token = input.continuation_token.clone().filter(|t| !t.is_empty());
    if let Some(t) = &token
        && decode_token(t).is_none()
    {
        return Err(s3_error!(
            InvalidArgument,
            "The continuation token provided is incorrect"
        ));
    }
    let delimiter = input.delimiter.clone().filter(|d| !d.is_empty());
    let query = ListQuery {
        prefix: input.prefix.clone().unwrap_or_default(),
        delimiter: delimiter.clone(),
        max_keys: (max_keys as usize).min(1000),
        continuation: token,
        start_after: input.start_after.clone(),
    };
    let page = store.list(&input.bucket, &query).map_err(super::s3_err)?;
    let key_count = (page.objects.len() + page.common_prefixes.len()) as i32;
    Ok(ListObjectsV2Output {
        name: Some(input.bucket),
        prefix: Some(names.name(&query.prefix)),
        delimiter: names.opt(delimiter),
        max_keys: Some(max_keys),
        key_count: Some(key_count),
        continuation_token: input.continuation_token,
        start_after: names.opt(input.start_after),
        is_truncated: Some(page.truncated),
        next_continuation_token: page.next_token.clone(),
        contents: Some(contents(&page, &names, input.fetch_owner == Some(true))),
        common_prefixes: Some(prefixes(&page, &names)),
        encoding_type: input.encoding_type,
        ..ListObjectsV2Output::default()
    })
}

/// ListObjects (v1): `marker` is a key to start after; `NextMarker` is given when
/// truncated with a delimiter (S3 gives it only then; clients use the last key
/// otherwise), and names the last key or common prefix returned.
pub fn v1(store: &GatewayStore, input: ListObjectsInput) -> S3Result<ListObjectsOutput> {
    let names = Names::of(input.encoding_type.as_ref())?;
    let max_keys = max_keys(input.max_keys)?;
    let delimiter = input.delimiter.clone().filter(|d| !d.is_empty());
    let marker = input.marker.clone().filter(|m| !m.is_empty());
    let query = ListQuery {
        prefix: input.prefix.clone().unwrap_or_default(),
        delimiter: delimiter.clone(),
        max_keys: (max_keys as usize).min(1000),
        continuation: None,
        start_after: marker,
    };
    let page = store.list(&input.bucket, &query).map_err(super::s3_err)?;
    let next_marker = if page.truncated && delimiter.is_some() {
        let last_key = page.objects.last().map(|(k, _)| k.clone());
        let last_prefix = page.common_prefixes.last().cloned();
        std::cmp::max(last_key, last_prefix).map(|m| names.name(&m))
    } else {
        None
    };
    Ok(ListObjectsOutput {
        name: Some(input.bucket),
        prefix: Some(names.name(&query.prefix)),
        marker: Some(names.name(input.marker.as_deref().unwrap_or(""))),
        delimiter: names.opt(delimiter),
        max_keys: Some(max_keys),
        is_truncated: Some(page.truncated),
        next_marker,
        contents: Some(contents(&page, &names, true)),
        common_prefixes: Some(prefixes(&page, &names)),
        encoding_type: input.encoding_type,
        ..ListObjectsOutput::default()
    })
}

/// ListObjectVersions of a bucket without versioning (the only kind here): each object
/// is its one version, `null`, the latest, as S3 lists an unversioned bucket.
pub fn versions(
    store: &GatewayStore,
    input: ListObjectVersionsInput,
) -> S3Result<ListObjectVersionsOutput> {
    let names = Names::of(input.encoding_type.as_ref())?;
    let max_keys = max_keys(input.max_keys)?;
    let delimiter = input.delimiter.clone().filter(|d| !d.is_empty());
    let query = ListQuery {
        prefix: input.prefix.clone().unwrap_or_default(),
        delimiter: delimiter.clone(),
        max_keys: (max_keys as usize).min(1000),
        continuation: None,
        start_after: input.key_marker.clone().filter(|m| !m.is_empty()),
    };
    let page = store.list(&input.bucket, &query).map_err(super::s3_err)?;
    let next = page.truncated.then(|| {
        let last_key = page.objects.last().map(|(k, _)| k.clone());
        std::cmp::max(last_key, page.common_prefixes.last().cloned())
    });
    let versions = page
        .objects
        .iter()
        .map(|(key, o)| ObjectVersion {
            key: Some(names.name(key)),
            size: Some(o.size as i64),
            e_tag: Some(etag(&o.info.etag)),
            last_modified: Some(timestamp(o.info.modified_ms)),
            owner: Some(owner()),
            is_latest: Some(true),
            version_id: Some("null".into()),
            ..ObjectVersion::default()
        })
        .collect();
    Ok(ListObjectVersionsOutput {
        name: Some(input.bucket),
        prefix: Some(names.name(&query.prefix)),
        delimiter: names.opt(delimiter),
        key_marker: input.key_marker,
        max_keys: Some(max_keys),
        is_truncated: Some(page.truncated),
        next_key_marker: next.flatten().map(|m| names.name(&m)),
        next_version_id_marker: page.truncated.then(|| "null".to_owned()),
        versions: Some(versions),
        common_prefixes: Some(prefixes(&page, &names)),
        encoding_type: input.encoding_type,
        ..ListObjectVersionsOutput::default()
    })
}
