//! Checking what a request carries before it touches the store: keys, user metadata,
//! Content-MD5, conditions, and the headers an object keeps; and streaming a body into a
//! record with bounded memory.

use futures_util::StreamExt;
use http::HeaderMap;
use s3s::dto::{ETagCondition, StreamingBlob, Timestamp};
use s3s::{S3Error, S3Result, s3_error};

use crate::store::{EtagMatch, Headers, Precondition, RecordWriter};

/// S3's limit on a key: 1,024 bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 1024;

/// S3's limit on user metadata: 2 KB, counting the bytes of every name and value.
pub const MAX_METADATA_BYTES: usize = 2048;

/// Bytes gathered from the body before they are written (one blocking write per batch).
const WRITE_BATCH: usize = 1 << 20;

/// Refuses keys S3 refuses (longer than 1,024 bytes: `KeyTooLongError`) and keys holding
/// NUL or a C1 control character (U+0080..U+009F), which only arrive from a key decoded
/// with the wrong character set and which no client can send back as it listed them:
/// `InvalidURI`, 400, before the store is asked (so a GET of one is 400, not 404).
pub fn check_key(key: &str) -> S3Result<()> {
    if key.len() > MAX_KEY_BYTES {
        return Err(s3_error!(
            KeyTooLongError,
            "Your key is too long: at most 1,024 bytes"
        ));
    }
    if key
        .chars()
        .any(|c| c == '\0' || ('\u{80}'..='\u{9f}').contains(&c))
    {
        return Err(s3_error!(InvalidURI, "Couldn't parse the specified URI."));
    }
    Ok(())
}

/// Refuses user metadata larger than S3 allows (`MetadataTooLarge`).
pub fn check_metadata(metadata: Option<&s3s::dto::Metadata>) -> S3Result<()> {
    let size: usize = metadata
        .map(|m| m.iter().map(|(k, v)| k.len() + v.len()).sum())
        .unwrap_or(0);
    if size > MAX_METADATA_BYTES {
        return Err(s3_error!(
            MetadataTooLarge,
            "Your metadata headers exceed the maximum allowed metadata size (2 KB)"
        ));
    }
    Ok(())
}

/// Checks a Content-MD5 header (base64 of the 16-byte MD5) against `md5`. An empty or
/// malformed header is `InvalidDigest`; a mismatch is `BadDigest`.
pub fn check_md5(header: Option<&str>, md5: &[u8; 16]) -> S3Result<()> {
    let Some(header) = header else {
        return Ok(());
    };
    use base64::Engine;
    let given = base64::engine::general_purpose::STANDARD
        .decode(header.trim())
        .map_err(|_| s3_error!(InvalidDigest, "Content-MD5 is not base64"))?;
    if given.len() != 16 {
        return Err(s3_error!(InvalidDigest, "Content-MD5 is not 16 bytes"));
    }
    if given != md5 {
        return Err(s3_error!(BadDigest, "the body does not match Content-MD5"));
    }
    Ok(())
}

/// Refuses an empty or malformed Content-MD5 before the body is read.
pub fn check_md5_form(header: Option<&str>) -> S3Result<()> {
    match header {
        Some(h) if h.trim().is_empty() => Err(s3_error!(InvalidDigest, "Content-MD5 is empty")),
        _ => Ok(()),
    }
}

fn etag_match(c: &ETagCondition) -> EtagMatch {
    match c {
        ETagCondition::Any => EtagMatch::Any,
        ETagCondition::ETag(t) => EtagMatch::Tags(vec![t.value().to_owned()]),
    }
}

fn secs(t: &Timestamp) -> i64 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp()
}

/// The conditions of a GET or HEAD.
pub fn read_conditions(
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
    if_unmodified_since: Option<&Timestamp>,
) -> Precondition {
    Precondition {
        if_match: if_match.map(etag_match),
        if_none_match: if_none_match.map(etag_match),
        if_modified_since: if_modified_since.map(secs),
        if_unmodified_since: if_unmodified_since.map(secs),
    }
}

/// The conditions of a write (PUT, CompleteMultipartUpload, DELETE). `If-Modified-Since`
/// has no meaning for a write (RFC 9110 defines it for GET and HEAD) and S3 does not
/// evaluate it: refused with 501 rather than ignored. `If-Unmodified-Since` is evaluated.
pub fn write_conditions(
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    headers: &HeaderMap,
) -> S3Result<Precondition> {
    if headers.contains_key(http::header::IF_MODIFIED_SINCE) {
        return Err(s3_error!(
            NotImplemented,
            "If-Modified-Since is not supported on writes"
        ));
    }
    let if_unmodified_since = match headers.get(http::header::IF_UNMODIFIED_SINCE) {
        None => None,
        Some(v) => {
            let t = v
                .to_str()
                .ok()
                .and_then(|s| Timestamp::parse(s3s::dto::TimestampFormat::HttpDate, s).ok())
                .ok_or_else(|| s3_error!(InvalidArgument, "If-Unmodified-Since is not a date"))?;
            Some(secs(&t))
        }
    };
    Ok(Precondition {
        if_match: if_match.map(etag_match),
        if_none_match: if_none_match.map(etag_match),
        if_modified_since: None,
        if_unmodified_since,
    })
}

/// The headers an object keeps. `aws-chunked` in Content-Encoding describes the upload,
/// not the object, and is dropped as S3 drops it.
pub fn kept_headers(
    cache_control: Option<String>,
    content_disposition: Option<String>,
    content_encoding: Option<String>,
    content_language: Option<String>,
    expires: Option<&Timestamp>,
) -> Headers {
    let content_encoding = content_encoding.and_then(|e| {
        let kept: Vec<&str> = e
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty() && !p.eq_ignore_ascii_case("aws-chunked"))
            .collect();
        (!kept.is_empty()).then(|| kept.join(", "))
    });
    Headers {
        cache_control,
        content_disposition,
        content_encoding,
        content_language,
        expires_ms: expires.map(|t| {
            let t = time::OffsetDateTime::from(t.clone());
            (t.unix_timestamp_nanos() / 1_000_000) as i64
        }),
    }
}

fn blocking_err(e: tokio::task::JoinError) -> S3Error {
    S3Error::internal_error(e)
}

/// Streams `body` into `writer` in batches of at most 1 MiB (the memory a request holds),
/// each written on the blocking pool. Returns the writer once the body ended.
pub async fn stream_into(
    mut writer: RecordWriter,
    body: Option<StreamingBlob>,
) -> S3Result<RecordWriter> {
    let Some(mut body) = body else {
        return Ok(writer);
    };
    let mut batch: Vec<u8> = Vec::with_capacity(WRITE_BATCH.min(64 << 10));
    loop {
        let next = body.next().await;
        let done = next.is_none();
        if let Some(piece) = next {
            let piece =
                piece.map_err(|e| s3_error!(IncompleteBody, "reading the body failed: {e}"))?;
            batch.extend_from_slice(&piece);
        }
        if batch.len() >= WRITE_BATCH || (done && !batch.is_empty()) {
            let full = std::mem::take(&mut batch);
            writer = tokio::task::spawn_blocking(move || writer.write(&full).map(|()| writer))
                .await
                .map_err(blocking_err)?
                .map_err(super::s3_err)?;
        }
        if done {
            return Ok(writer);
        }
    }
}

/// The five `x-amz-grant-*` headers of a bucket request or an ACL call (`$input`: any s3s
/// input type with these fields — they share names, not a trait), for
/// [`canned_public_read`] and `acl::restates`. Object uploads have no `grant_write`.
macro_rules! bucket_grants {
    ($input:expr) => {
        [
            $input.grant_full_control.as_ref(),
            $input.grant_read.as_ref(),
            $input.grant_read_acp.as_ref(),
            $input.grant_write.as_ref(),
            $input.grant_write_acp.as_ref(),
        ]
    };
}
pub(crate) use bucket_grants;

/// What a request's canned ACL (`x-amz-acl`) asks of an object or bucket: whether it is
/// `public-read`. With one account, `private`, `authenticated-read`,
/// `bucket-owner-read` and `bucket-owner-full-control` all mean "the owner only", as
/// nothing but the owner can authenticate. Anything that would let someone else write
/// (`public-read-write`), `aws-exec-read`, and explicit grants (`x-amz-grant-*`) are
/// refused with 501 rather than ignored.
pub fn canned_public_read(acl: Option<&str>, grants: &[Option<&String>]) -> S3Result<bool> {
    if grants.iter().any(Option::is_some) {
        return Err(s3_error!(
            NotImplemented,
            "x-amz-grant-* headers are not supported; use a canned ACL (private or public-read)"
        ));
    }
    match acl.map(str::trim) {
        None
        | Some(
            "private" | "authenticated-read" | "bucket-owner-read" | "bucket-owner-full-control",
        ) => Ok(false),
        Some("public-read") => Ok(true),
        Some(other) => Err(s3_error!(
            NotImplemented,
            "the canned ACL {other:?} is not supported here (private and public-read are)"
        )),
    }
}
