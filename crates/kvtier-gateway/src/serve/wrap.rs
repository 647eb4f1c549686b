//! What the listener does around s3s for each request:
//!
//! - **Body timeout** (the shared listener's, `kvtier_listen::http`): a request body that
//!   sends nothing for `body_timeout` fails (the PUT is answered with an error and its
//!   reserved space released).
//! - **Chunked bodies without a length** (`Transfer-Encoding: chunked`, no
//!   Content-Length, not `aws-chunked`): s3s needs a length, so such a body is gathered
//!   (up to [`CHUNKED_MAX`]) and handed on with its length; larger ones get 411.
//! - **Range**: a malformed or multi-range `Range` header is dropped, so the whole object
//!   is sent with 200, as S3 does. When the signature covers it (boto3 signs it), it
//!   cannot be dropped here without breaking the signature: the request is marked, and
//!   dropped after s3s has checked the signature (`signed_range.rs`).
//! - **An empty Content-MD5** is refused (`InvalidDigest`), as S3 refuses it.
//! - **Presigned URLs** valid for more than 7 days are refused (403), as S3 refuses them.
//! - **XML answers**: characters XML 1.0 cannot carry literally (C0 controls but tab and
//!   newline, and carriage return, which parsers would turn into newline) are written as
//!   character references, as S3 writes them; a 304 carries no body.
//! - **Refusals** (any 4xx but the ordinary outcomes 404, 409, 412, 416) are logged
//!   rate-limited and counted (`kvtier_listen::refusals`, the log both front ends
//!   share). A failed request whose body may be unread closes its connection
//!   (`Connection: close`).
//! - **CORS preflights** (`OPTIONS`) are answered as S3 answers them for a bucket without a
//!   CORS configuration: 400 without `Origin`, 403 with one (CORS is not supported).
//! - **Request ids**: every response carries `x-amz-request-id`, and an error's XML body
//!   the same id in `<RequestId>`, as S3 answers (clients log it; support asks for it).
//! - **Without authentication** (`--auth none`) a signed request is served as unsigned
//!   and an `aws-chunked` body decoded here (`unsigned.rs`): s3s would refuse the first
//!   and store the second's framing.
//! - **GetObjectAttributes**: its `<ETag>` is written without quotes, as S3 writes it
//!   there (s3s quotes every ETag element).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Body as HttpBody;
use kvtier_listen::http::TimedBody;
use kvtier_listen::refusals::{Level, Refusals};
use s3s::service::S3Service;

use super::{signed_range, unsigned};

/// The largest chunked body without a length that is accepted (gathered in memory).
pub const CHUNKED_MAX: usize = 8 << 20;

/// S3's longest presigned URL validity: 7 days.
const MAX_PRESIGNED_SECS: u64 = 7 * 24 * 3600;

/// Shared by every request of a gateway.
#[derive(Debug)]
pub struct Shaper {
    pub service: S3Service,
    pub refusals: Arc<Refusals>,
    pub request_ids: RequestIds,
    /// Authentication is off (`--auth none`): signatures are dropped and `aws-chunked`
    /// bodies decoded here (`unsigned.rs`).
    pub unsigned: bool,
}

/// Request ids: a per-process starting point (time and process id, so that ids of two
/// runs hardly ever meet) plus a counter; 16 hex digits, as S3's.
#[derive(Debug)]
pub struct RequestIds {
    base: u64,
    next: AtomicU64,
}

impl RequestIds {
    pub fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // Spread the bits (a multiplicative hash) so consecutive starts differ widely.
        let base =
            (nanos ^ (u64::from(std::process::id()) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Self {
            base,
            next: AtomicU64::new(0),
        }
    }

    fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:016X}", self.base.wrapping_add(n))
    }
}

/// Whether an answer of `status` is a refusal: the client's mistake, not an ordinary
/// outcome (404, 409, 412 and 416 are answers a client asks for).
fn is_refusal(status: u16) -> bool {
    (400..500).contains(&status) && !matches!(status, 404 | 409 | 412 | 416)
}

fn xml_error(status: StatusCode, code: &str, message: &str) -> Response<s3s::Body> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
    );
    let mut res = Response::new(s3s::Body::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    res
}

/// Whether a Range header is one range S3 would honour: `bytes=a-b` (a ≤ b),
/// `bytes=a-`, or `bytes=-n`.
fn single_range(v: &str) -> bool {
    let Some(spec) = v.trim().strip_prefix("bytes=") else {
        return false;
    };
    let Some((a, b)) = spec.trim().split_once('-') else {
        return false;
    };
    let num = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    match (a.trim(), b.trim()) {
        (a, "") => num(a),
        ("", n) => num(n),
        (a, b) if num(a) && num(b) => match (a.parse::<u64>(), b.parse::<u64>()) {
            (Ok(a), Ok(b)) => a <= b,
            _ => false,
        },
        _ => false,
    }
}

/// Whether the request's SigV4 signature covers its Range header (then it cannot be
/// dropped before s3s has checked the signature).
fn range_is_signed(parts: &http::request::Parts) -> bool {
    let in_header = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|a| a.split("SignedHeaders=").nth(1))
        .is_some_and(|rest| {
            rest.split([',', ' '])
                .next()
                .is_some_and(|l| l.split(';').any(|h| h == "range"))
        });
    let in_query = parts.uri.query().is_some_and(|q| {
        q.split('&').any(|kv| {
            kv.strip_prefix("X-Amz-SignedHeaders=")
                .is_some_and(|l| l.split("%3B").chain(l.split(';')).any(|h| h == "range"))
        })
    });
    in_header || in_query
}

fn presigned_expiry_too_long(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        q.split('&').any(|kv| {
            kv.split_once('=').is_some_and(|(k, v)| {
                k == "X-Amz-Expires" && v.parse::<u64>().map_or(true, |s| s > MAX_PRESIGNED_SECS)
            })
        })
    })
}

/// Writes characters XML 1.0 cannot carry literally as character references.
fn xml_safe(body: &[u8]) -> Option<Vec<u8>> {
    let bad = |b: u8| b < 0x20 && b != b'\t' && b != b'\n';
    if !body.iter().any(|&b| bad(b)) {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() + 64);
    for &b in body {
        if bad(b) {
            out.extend_from_slice(format!("&#x{b:X};").as_bytes());
        } else {
            out.push(b);
        }
    }
    Some(out)
}

impl Shaper {
    /// Serves one request.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<TimedBody>,
        peer: SocketAddr,
    ) -> Response<s3s::Body> {
        let method = req.method().as_str().to_owned();
        let path = req.uri().path().to_owned();
        let attributes = req.method() == http::Method::GET
            && req.uri().query().is_some_and(|q| {
                q.split('&')
                    .any(|kv| kv == "attributes" || kv.starts_with("attributes="))
            });
        let res = self.shaped(req).await;
        let status = res.status().as_u16();
        if is_refusal(status) {
            self.refusals.note(
                Level::Info,
                "s3_request",
                &format_args!("{method} {path} from {peer}: {status}"),
            );
        }
        let res = if attributes && res.status().is_success() {
            unquote_etag(res)
        } else {
            res
        };
        with_request_id(res, &self.request_ids.next())
    }

    async fn shaped(&self, req: Request<TimedBody>) -> Response<s3s::Body> {
        if req.method() == http::Method::OPTIONS {
            return preflight(req.headers());
        }
        let (mut parts, body) = req.into_parts();
        if self.unsigned {
            unsigned::drop_signature(&mut parts);
        }
        if presigned_expiry_too_long(parts.uri.query()) {
            return xml_error(
                StatusCode::FORBIDDEN,
                "AccessDenied",
                "X-Amz-Expires must be less than a week (in seconds)",
            );
        }
        if parts
            .headers
            .get("content-md5")
            .is_some_and(|v| v.as_bytes().trim_ascii().is_empty())
        {
            // s3s reads an empty header as none; S3 refuses it.
            return xml_error(
                StatusCode::BAD_REQUEST,
                "InvalidDigest",
                "Content-MD5 is empty",
            );
        }
        if let Some(r) = parts.headers.get(http::header::RANGE)
            && !r.to_str().is_ok_and(single_range)
        {
            if range_is_signed(&parts) {
                parts.extensions.insert(signed_range::SignedBadRange);
            } else {
                parts.headers.remove(http::header::RANGE);
            }
        }
        let chunked_without_length = parts
            .headers
            .get(http::header::TRANSFER_ENCODING)
            .is_some_and(|te| {
                te.to_str()
                    .is_ok_and(|s| s.to_ascii_lowercase().contains("chunked"))
            })
            && !parts.headers.contains_key(http::header::CONTENT_LENGTH)
            && !parts.headers.contains_key("x-amz-decoded-content-length");
        let aws_chunked = self.unsigned && unsigned::is_aws_chunked(&parts);
        let body = if aws_chunked {
            let Some(decoded) = unsigned::decoded_head(&mut parts) else {
                let mut res = xml_error(
                    StatusCode::LENGTH_REQUIRED,
                    "MissingContentLength",
                    "an aws-chunked body needs x-amz-decoded-content-length",
                );
                // Its body is left unread.
                res.headers_mut()
                    .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
                return res;
            };
            s3s::Body::http_body(unsigned::AwsChunkedBody::new(body, decoded))
        } else if chunked_without_length {
            match gather(body, CHUNKED_MAX).await {
                Ok(bytes) => {
                    parts
                        .headers
                        .insert(http::header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
                    s3s::Body::from(bytes)
                }
                Err(message) => {
                    return xml_error(
                        StatusCode::LENGTH_REQUIRED,
                        "MissingContentLength",
                        &message,
                    );
                }
            }
        } else {
            s3s::Body::http_body(body)
        };
        let is_get = parts.method == http::Method::GET;
        let has_body = chunked_without_length
            || aws_chunked
            || parts
                .headers
                .get(http::header::CONTENT_LENGTH)
                .is_some_and(|v| v.as_bytes() != b"0");
        let res = match self.service.call(Request::from_parts(parts, body)).await {
            Ok(res) => res,
            Err(e) => {
                tracing::error!(error = ?e, "the S3 service failed");
                return xml_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    "internal error",
                );
            }
        };
        let mut res = finish(res, is_get);
        if has_body && !res.status().is_success() {
            // The body may be left unread (a refusal comes before it is read): close the
            // connection rather than read its bytes as the next request.
            res.headers_mut()
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        res
    }
}

/// A CORS preflight (`OPTIONS`): no bucket has a CORS configuration here, so one that
/// names an origin and a method is refused as S3 refuses it without a configuration
/// (403); one that does not is a bad request (400), as in S3.
fn preflight(headers: &http::HeaderMap) -> Response<s3s::Body> {
    if headers.contains_key(http::header::ORIGIN)
        && headers.contains_key(http::header::ACCESS_CONTROL_REQUEST_METHOD)
    {
        xml_error(
            StatusCode::FORBIDDEN,
            "AccessForbidden",
            "CORSResponse: CORS is not enabled for this bucket.",
        )
    } else {
        xml_error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "Insufficient information. Origin request header needed.",
        )
    }
}

async fn gather(mut body: TimedBody, max: usize) -> Result<Bytes, String> {
    let mut buf = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| format!("reading the body failed: {e}"))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Err(format!(
                    "a chunked body without Content-Length may hold at most {max} bytes"
                ));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buf))
}

/// Sets `x-amz-request-id`, and puts the same id in an XML error body (`<RequestId>`).
fn with_request_id(res: Response<s3s::Body>, id: &str) -> Response<s3s::Body> {
    let (mut parts, mut body) = res.into_parts();
    if let Ok(v) = HeaderValue::from_str(id) {
        parts.headers.insert("x-amz-request-id", v);
    }
    let xml = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|c| c.as_bytes().starts_with(b"application/xml"));
    if parts.status.as_u16() >= 300
        && xml
        && let Some(bytes) = body.take_bytes()
    {
        let with_id = error_with_request_id(&bytes, id).unwrap_or_else(|| bytes.to_vec());
        parts.headers.insert(
            http::header::CONTENT_LENGTH,
            HeaderValue::from(with_id.len()),
        );
        return Response::from_parts(parts, s3s::Body::from(with_id));
    }
    Response::from_parts(parts, body)
}

/// The error document `xml` with `<RequestId>id</RequestId>` before its `</Error>`, or
/// `None` when it is no error document or already names a request id.
fn error_with_request_id(xml: &[u8], id: &str) -> Option<Vec<u8>> {
    const END: &[u8] = b"</Error>";
    if xml.windows(11).any(|w| w == b"<RequestId>") {
        return None;
    }
    let at = xml.windows(END.len()).rposition(|w| w == END)?;
    let mut out = Vec::with_capacity(xml.len() + id.len() + 24);
    out.extend_from_slice(&xml[..at]);
    out.extend_from_slice(b"<RequestId>");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"</RequestId>");
    out.extend_from_slice(&xml[at..]);
    Some(out)
}

/// GetObjectAttributes' `<ETag>"x"</ETag>` written as S3 writes it: `<ETag>x</ETag>`.
fn unquote_etag(res: Response<s3s::Body>) -> Response<s3s::Body> {
    let (mut parts, mut body) = res.into_parts();
    let Some(bytes) = body.take_bytes() else {
        return Response::from_parts(parts, body);
    };
    // Only GetObjectAttributes' own document is touched (never an object's bytes).
    let Some(text) = std::str::from_utf8(&bytes)
        .ok()
        .filter(|t| t.contains("<GetObjectAttributesResponse"))
    else {
        return Response::from_parts(parts, s3s::Body::from(bytes));
    };
    let out = text
        .replace("<ETag>\"", "<ETag>")
        .replace("\"</ETag>", "</ETag>")
        .replace("<ETag>&quot;", "<ETag>")
        .replace("&quot;</ETag>", "</ETag>");
    parts
        .headers
        .insert(http::header::CONTENT_LENGTH, HeaderValue::from(out.len()));
    Response::from_parts(parts, s3s::Body::from(out))
}

fn finish(res: Response<s3s::Body>, is_get: bool) -> Response<s3s::Body> {
    let (mut parts, mut body) = res.into_parts();
    if parts.status == StatusCode::NOT_MODIFIED {
        parts.headers.remove(http::header::CONTENT_LENGTH);
        parts.headers.remove(http::header::CONTENT_TYPE);
        return Response::from_parts(parts, s3s::Body::empty());
    }
    let xml = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|c| c.as_bytes().starts_with(b"application/xml"));
    if is_get
        && xml
        && let Some(bytes) = body.take_bytes()
    {
        return match xml_safe(&bytes) {
            Some(safe) => {
                parts
                    .headers
                    .insert(http::header::CONTENT_LENGTH, HeaderValue::from(safe.len()));
                Response::from_parts(parts, s3s::Body::from(safe))
            }
            None => Response::from_parts(parts, s3s::Body::from(bytes)),
        };
    }
    Response::from_parts(parts, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_the_clients_mistakes_not_ordinary_outcomes() {
        for refused in [400, 403, 405, 411, 413, 431] {
            assert!(is_refusal(refused), "{refused}");
        }
        for ordinary in [200, 206, 304, 404, 409, 412, 416, 500, 503] {
            assert!(!is_refusal(ordinary), "{ordinary}");
        }
    }

    #[test]
    fn ranges_s3_ignores_are_recognised() {
        for ok in ["bytes=0-9", "bytes=5-", "bytes=-3", "bytes=4-4"] {
            assert!(single_range(ok), "{ok}");
        }
        for bad in [
            "bytes=9-0",
            "bytes=0-1,4-5",
            "bytes=",
            "chars=0-1",
            "bytes=a-b",
            "bytes=-",
        ] {
            assert!(!single_range(bad), "{bad}");
        }
    }

    #[test]
    fn control_characters_become_references_and_clean_xml_is_untouched() {
        assert_eq!(xml_safe(b"<Key>a</Key>"), None);
        assert_eq!(
            xml_safe(b"<Key>a\x01b\rc\td\ne</Key>").as_deref(),
            Some(&b"<Key>a&#x1;b&#xD;c\td\ne</Key>"[..])
        );
        assert!(presigned_expiry_too_long(Some("X-Amz-Expires=609901&a=b")));
        assert!(!presigned_expiry_too_long(Some("X-Amz-Expires=604800")));
        assert!(!presigned_expiry_too_long(None));
    }

    fn body_of(res: Response<s3s::Body>) -> Vec<u8> {
        let (_, mut body) = res.into_parts();
        body.take_bytes().map(|b| b.to_vec()).unwrap_or_default()
    }

    #[test]
    fn only_the_attributes_document_loses_its_etag_quotes() {
        let doc =
            "<GetObjectAttributesResponse><ETag>\"abc-2\"</ETag></GetObjectAttributesResponse>";
        let out = body_of(unquote_etag(Response::new(s3s::Body::from(doc.to_owned()))));
        assert_eq!(
            out,
            b"<GetObjectAttributesResponse><ETag>abc-2</ETag></GetObjectAttributesResponse>"
        );
        // Anything else (an object's bytes, say) is left exactly as it is.
        let other = "<x><ETag>\"abc\"</ETag></x>";
        let out = body_of(unquote_etag(Response::new(s3s::Body::from(
            other.to_owned(),
        ))));
        assert_eq!(out, other.as_bytes());
    }

    #[test]
    fn a_request_id_goes_into_error_documents_once() {
        let doc = b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code></Error>";
        assert_eq!(
            error_with_request_id(doc, "AB12").as_deref(),
            Some(&b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><RequestId>AB12</RequestId></Error>"[..])
        );
        let named = b"<Error><RequestId>X</RequestId></Error>";
        assert_eq!(error_with_request_id(named, "AB12"), None);
        assert_eq!(error_with_request_id(b"<ListBucketResult/>", "AB12"), None);
        let ids = RequestIds::new();
        let (a, b) = (ids.next(), ids.next());
        assert!(a != b && a.len() == 16 && b.len() == 16, "{a} {b}");
    }
}
