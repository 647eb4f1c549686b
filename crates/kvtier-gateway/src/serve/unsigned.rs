//! `--auth none`: a signed request is served as if it were unsigned.
//!
//! s3s checks a signature only through an authentication provider, and a gateway without
//! authentication has none: s3s would answer every signed request `501 NotImplemented`.
//! But clients sign whether or not the server checks (boto3, the AWS CLI, object_store
//! given credentials), so with authentication off the listener drops the signature — the
//! `Authorization` header, a presigned URL's signing parameters — and s3s sees an
//! unsigned request, which it allows.
//!
//! An `aws-chunked` body (`x-amz-content-sha256: STREAMING-…`, chunk signatures or an
//! unsigned trailer) is decoded by s3s only while it checks the signature. Here the
//! listener decodes it itself: [`AwsChunkedBody`] strips the framing (chunk sizes, chunk
//! signatures, trailers) as the bytes stream through, and refuses a body whose framing is
//! malformed or whose decoded size differs from `x-amz-decoded-content-length` — the
//! framing is never stored as if it were the object. Chunk signatures and trailing
//! checksums are not verified, as with SigV4 on (docs/gateway.md).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderValue;
use http::request::Parts;
use http_body::{Body as HttpBody, Frame};

/// The signing parameters of a SigV4 presigned URL (`X-Amz-Signature` names one).
const SIGV4_QUERY: [&str; 8] = [
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
    "X-Amz-Security-Token",
    "X-Amz-Region-Set",
];

/// The signing parameters of a SigV2 presigned URL (`Signature` with `AWSAccessKeyId`).
const SIGV2_QUERY: [&str; 3] = ["AWSAccessKeyId", "Signature", "Expires"];

/// The longest chunk-size line or trailer line accepted (a size with its 64-digit
/// signature takes about 90 bytes).
const LINE_MAX: usize = 4096;

/// The most trailer bytes accepted after the last chunk.
const TRAILERS_MAX: usize = 16 << 10;

/// Removes the request's signature: its `Authorization` header and a presigned URL's
/// signing parameters (the rest of the query stays, in its order).
pub fn drop_signature(parts: &mut Parts) {
    parts.headers.remove(http::header::AUTHORIZATION);
    let Some(query) = parts.uri.query() else {
        return;
    };
    let name = |kv: &str| kv.split_once('=').map_or(kv, |(k, _)| k).to_owned();
    let names: Vec<String> = query.split('&').map(name).collect();
    let signing: &[&str] = if names.iter().any(|n| n == "X-Amz-Signature") {
        &SIGV4_QUERY
    } else if names.iter().any(|n| n == "Signature") && names.iter().any(|n| n == "AWSAccessKeyId")
    {
        &SIGV2_QUERY
    } else {
        return;
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| !signing.contains(&name(kv).as_str()))
        .collect();
    let path = parts.uri.path();
    let path_and_query = if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    };
    let mut uri = parts.uri.clone().into_parts();
    // A subset of a valid query is a valid query: these cannot fail.
    if let Ok(pq) = path_and_query.parse() {
        uri.path_and_query = Some(pq);
        if let Ok(uri) = http::Uri::from_parts(uri) {
            parts.uri = uri;
        }
    }
}

/// Whether the body is framed in `aws-chunked` (signed chunks, or unsigned with a
/// trailer).
pub fn is_aws_chunked(parts: &Parts) -> bool {
    let streaming = parts
        .headers
        .get("x-amz-content-sha256")
        .is_some_and(|v| v.as_bytes().starts_with(b"STREAMING-"));
    let encoded = parts
        .headers
        .get_all(http::header::CONTENT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("aws-chunked"));
    streaming || encoded
}

/// Turns the head of an `aws-chunked` request into the head of the decoded one: its
/// length is `x-amz-decoded-content-length` (returned), `aws-chunked` leaves
/// Content-Encoding, and the payload is marked unsigned. `None` when the decoded length
/// is missing or not a number (S3 answers 411 then).
pub fn decoded_head(parts: &mut Parts) -> Option<u64> {
    let decoded: u64 = parts
        .headers
        .get("x-amz-decoded-content-length")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let h = &mut parts.headers;
    h.insert(http::header::CONTENT_LENGTH, HeaderValue::from(decoded));
    // hyper has already undone any HTTP chunking.
    h.remove(http::header::TRANSFER_ENCODING);
    h.remove("x-amz-decoded-content-length");
    h.remove("x-amz-trailer");
    h.insert(
        "x-amz-content-sha256",
        HeaderValue::from_static("UNSIGNED-PAYLOAD"),
    );
    let rest: Vec<String> = h
        .get_all(http::header::CONTENT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case("aws-chunked"))
        .map(str::to_owned)
        .collect();
    h.remove(http::header::CONTENT_ENCODING);
    if let Ok(v) = HeaderValue::from_str(&rest.join(", "))
        && !rest.is_empty()
    {
        h.insert(http::header::CONTENT_ENCODING, v);
    }
    Some(decoded)
}

/// Where the decoder is in the framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Reading a chunk-size line (`hex[;chunk-signature=…]` CRLF).
    SizeLine,
    /// Inside a chunk's data, with this many bytes left.
    Data(u64),
    /// After a chunk's data: the CRLF that closes it, with this many of its bytes seen.
    DataEnd(u8),
    /// After the last (empty) chunk: trailer lines up to an empty line.
    Trailers,
    /// The framing ended.
    Done,
}

/// Strips `aws-chunked` framing from bytes fed in pieces of any size; the data comes
/// out as slices of the pieces (no copy).
#[derive(Debug)]
pub struct Dechunker {
    at: At,
    /// The line being read (size or trailer), without its CRLF.
    line: Vec<u8>,
    /// Whether the line's CR was seen.
    cr: bool,
    trailer_bytes: usize,
    expected: u64,
    produced: u64,
}

impl Dechunker {
    /// A decoder for a body that must decode to `expected` bytes.
    pub fn new(expected: u64) -> Self {
        Self {
            at: At::SizeLine,
            line: Vec::new(),
            cr: false,
            trailer_bytes: 0,
            expected,
            produced: 0,
        }
    }

    /// Decodes `piece`, pushing its data onto `out`.
    pub fn feed(&mut self, piece: Bytes, out: &mut VecDeque<Bytes>) -> Result<(), String> {
        let mut i = 0;
        while i < piece.len() {
            match self.at {
                At::Data(left) => {
                    let n = (piece.len() - i).min(usize::try_from(left).unwrap_or(usize::MAX));
                    out.push_back(piece.slice(i..i + n));
                    i += n;
                    let left = left - n as u64;
                    self.at = if left == 0 {
                        At::DataEnd(0)
                    } else {
                        At::Data(left)
                    };
                }
                At::DataEnd(seen) => {
                    let want = if seen == 0 { b'\r' } else { b'\n' };
                    if piece[i] != want {
                        return Err("aws-chunked: a chunk's data is not followed by CRLF".into());
                    }
                    i += 1;
                    self.at = if seen == 0 {
                        At::DataEnd(1)
                    } else {
                        At::SizeLine
                    };
                }
                At::SizeLine | At::Trailers => {
                    if let Some(line) = self.take_line(&piece, &mut i)? {
                        self.end_of_line(&line)?;
                    }
                }
                At::Done => {
                    return Err("aws-chunked: bytes after the end of the framing".into());
                }
            }
        }
        Ok(())
    }

    /// Checks that the body ended where the framing did.
    pub fn finish(&self) -> Result<(), String> {
        match self.at {
            At::Done => Ok(()),
            // The closing empty line after the last chunk is sometimes left out.
            At::Trailers if self.line.is_empty() && !self.cr => Ok(()),
            _ => Err(format!(
                "aws-chunked: the body ended inside its framing after {} of {} bytes",
                self.produced, self.expected
            )),
        }
    }

    /// Reads bytes of `piece` from `*i` into the current line; the whole line once its
    /// CRLF is read.
    fn take_line(&mut self, piece: &[u8], i: &mut usize) -> Result<Option<Vec<u8>>, String> {
        while *i < piece.len() {
            let b = piece[*i];
            *i += 1;
            if self.at == At::Trailers {
                self.trailer_bytes += 1;
                if self.trailer_bytes > TRAILERS_MAX {
                    return Err(format!("aws-chunked: trailers over {TRAILERS_MAX} bytes"));
                }
            }
            if self.cr {
                if b != b'\n' {
                    return Err("aws-chunked: CR without LF in a framing line".into());
                }
                self.cr = false;
                return Ok(Some(std::mem::take(&mut self.line)));
            }
            if b == b'\r' {
                self.cr = true;
            } else if self.line.len() == LINE_MAX {
                return Err(format!("aws-chunked: a framing line over {LINE_MAX} bytes"));
            } else {
                self.line.push(b);
            }
        }
        Ok(None)
    }

    fn end_of_line(&mut self, line: &[u8]) -> Result<(), String> {
        if self.at == At::Trailers {
            // Trailers (checksums, a trailer signature) are read past, not kept.
            if line.is_empty() {
                self.finish_data()?;
                self.at = At::Done;
            }
            return Ok(());
        }
        let size = line.split(|&b| b == b';').next().unwrap_or_default();
        let size = std::str::from_utf8(size).map(str::trim).unwrap_or_default();
        if size.is_empty() || size.len() > 16 || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "aws-chunked: malformed chunk size line {:?}",
                String::from_utf8_lossy(&line[..line.len().min(64)])
            ));
        }
        let size = u64::from_str_radix(size, 16).map_err(|e| format!("aws-chunked: {e}"))?;
        if size == 0 {
            self.at = At::Trailers;
            return Ok(());
        }
        self.produced = self.produced.saturating_add(size);
        if self.produced > self.expected {
            return Err(format!(
                "aws-chunked: chunks hold more than the {} bytes of x-amz-decoded-content-length",
                self.expected
            ));
        }
        self.at = At::Data(size);
        Ok(())
    }

    fn finish_data(&self) -> Result<(), String> {
        if self.produced == self.expected {
            Ok(())
        } else {
            Err(format!(
                "aws-chunked: chunks hold {} bytes, x-amz-decoded-content-length says {}",
                self.produced, self.expected
            ))
        }
    }
}

/// A request body with its `aws-chunked` framing stripped (see [`Dechunker`]).
pub struct AwsChunkedBody<B> {
    inner: B,
    decoder: Dechunker,
    ready: VecDeque<Bytes>,
    ended: bool,
}

impl<B> AwsChunkedBody<B> {
    /// Decodes `inner`, which must decode to `expected` bytes.
    pub fn new(inner: B, expected: u64) -> Self {
        Self {
            inner,
            decoder: Dechunker::new(expected),
            ready: VecDeque::new(),
            ended: false,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> HttpBody for AwsChunkedBody<B>
where
    B: HttpBody<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(data) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    // HTTP trailers (not aws-chunked ones) carry no object bytes.
                    if let Ok(data) = frame.into_data()
                        && let Err(e) = this.decoder.feed(data, &mut this.ready)
                    {
                        this.ended = true;
                        return Poll::Ready(Some(Err(e.into())));
                    }
                }
                Some(Err(e)) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    this.ended = true;
                    if let Err(e) = this.decoder.finish() {
                        return Poll::Ready(Some(Err(e.into())));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.ready.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let left = self.decoder.expected.saturating_sub(self.decoder.produced)
            + self.ready.iter().map(|b| b.len() as u64).sum::<u64>();
        if self.ended {
            http_body::SizeHint::with_exact(left)
        } else {
            let mut hint = http_body::SizeHint::new();
            hint.set_upper(self.decoder.expected);
            hint
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    fn decode_in_pieces(framed: &[u8], expected: u64, piece: usize) -> Result<Vec<u8>, String> {
        let mut d = Dechunker::new(expected);
        let mut out = VecDeque::new();
        for p in framed.chunks(piece.max(1)) {
            d.feed(Bytes::copy_from_slice(p), &mut out)?;
        }
        d.finish()?;
        Ok(out.iter().flat_map(|b| b.iter().copied()).collect())
    }

    fn signed(data: &[u8], chunk: usize) -> Vec<u8> {
        let sig = "ab".repeat(32);
        let mut out = Vec::new();
        for c in data.chunks(chunk) {
            out.extend_from_slice(format!("{:x};chunk-signature={sig}\r\n", c.len()).as_bytes());
            out.extend_from_slice(c);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(format!("0;chunk-signature={sig}\r\n\r\n").as_bytes());
        out
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn signed_chunks_decode_whatever_the_pieces() {
        let d = data(1000);
        let framed = signed(&d, 300);
        for piece in [1, 2, 3, 7, 64, 301, framed.len()] {
            assert_eq!(
                decode_in_pieces(&framed, 1000, piece).unwrap(),
                d,
                "{piece}"
            );
        }
    }

    #[test]
    fn unsigned_chunks_with_a_trailer_decode() {
        let d = data(70_000);
        let mut framed = Vec::new();
        for c in d.chunks(65_536) {
            framed.extend_from_slice(format!("{:X}\r\n", c.len()).as_bytes());
            framed.extend_from_slice(c);
            framed.extend_from_slice(b"\r\n");
        }
        framed.extend_from_slice(b"0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n");
        for piece in [1, 5, 4096, framed.len()] {
            assert_eq!(decode_in_pieces(&framed, 70_000, piece).unwrap(), d);
        }
    }

    #[test]
    fn an_empty_object_is_one_empty_chunk() {
        assert_eq!(decode_in_pieces(b"0\r\n\r\n", 0, 1).unwrap(), b"");
        // Without the closing empty line.
        assert_eq!(decode_in_pieces(b"0\r\n", 0, 1).unwrap(), b"");
    }

    #[test]
    fn malformed_framing_is_refused() {
        let d = data(100);
        let good = signed(&d, 40);
        let cases: Vec<(Vec<u8>, u64, &str)> = vec![
            (good.clone(), 99, "more than"),
            (good.clone(), 101, "say"),
            (good[..good.len() - 30].to_vec(), 100, "ended inside"),
            ([good.clone(), b"x".to_vec()].concat(), 100, "after the end"),
            (b"zz\r\nabc".to_vec(), 100, "malformed chunk size"),
            (b"\r\n".to_vec(), 100, "malformed chunk size"),
            (b"3\r\nabcXY0\r\n\r\n".to_vec(), 3, "not followed by CRLF"),
            (b"3\rXabc".to_vec(), 3, "CR without LF"),
            (vec![b'1'; LINE_MAX + 1], 3, "over"),
            (b"11111111111111111\r\n".to_vec(), 3, "malformed chunk size"),
        ];
        for (framed, expected, why) in cases {
            let err = decode_in_pieces(&framed, expected, 7).unwrap_err();
            assert!(err.contains(why), "{err} (wanted {why})");
        }
        let mut long_trailers = b"0\r\n".to_vec();
        for _ in 0..400 {
            long_trailers
                .extend_from_slice(b"x-amz-meta-pad:0123456789012345678901234567890123456789\r\n");
        }
        let err = decode_in_pieces(&long_trailers, 0, 512).unwrap_err();
        assert!(err.contains("trailers over"), "{err}");
    }

    fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder().method("PUT").uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn signatures_are_dropped_and_other_parameters_kept() {
        let mut p = parts(
            "/b/k?partNumber=2&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=a%2Fb&X-Amz-Date=20261124T000000Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature=ff&uploadId=u1",
            &[("authorization", "AWS4-HMAC-SHA256 Credential=x")],
        );
        drop_signature(&mut p);
        assert_eq!(p.uri.to_string(), "/b/k?partNumber=2&uploadId=u1");
        assert!(!p.headers.contains_key("authorization"));
        let mut p = parts("/b/k?AWSAccessKeyId=a&Expires=9&Signature=s", &[]);
        drop_signature(&mut p);
        assert_eq!(p.uri.to_string(), "/b/k");
        // Without a signature the query is left alone (an `Expires` of its own stays).
        let mut p = parts("/b?list-type=2&Expires=9", &[]);
        drop_signature(&mut p);
        assert_eq!(p.uri.to_string(), "/b?list-type=2&Expires=9");
    }

    #[test]
    fn the_decoded_head_says_the_object_length_and_keeps_other_encodings() {
        let mut p = parts(
            "/b/k",
            &[
                ("content-encoding", "gzip, aws-chunked"),
                ("content-length", "999"),
                ("x-amz-decoded-content-length", "100"),
                ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"),
            ],
        );
        assert!(is_aws_chunked(&p));
        assert_eq!(decoded_head(&mut p), Some(100));
        assert_eq!(p.headers["content-length"], "100");
        assert_eq!(p.headers["content-encoding"], "gzip");
        assert_eq!(p.headers["x-amz-content-sha256"], "UNSIGNED-PAYLOAD");
        assert!(!is_aws_chunked(&p));
        let mut p = parts("/b/k", &[("content-encoding", "aws-chunked")]);
        assert!(is_aws_chunked(&p));
        assert_eq!(decoded_head(&mut p), None);
    }
}
