//! The async client.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::wire::frame::{self, EndStatus, Frame, HEADER_LEN};
use crate::wire::{
    ErrorBody, Health, LayoutInfo, LayoutSpec, LoadRequest, LookupAnswer, PromptSpec, SnapshotSpec,
    SsdAdmin, SsdAdminAnswer, StoreAnswer, UPLOAD_CONTENT_TYPE,
};

/// Largest block a client accepts in a load stream (a corrupt or hostile length must not
/// make it allocate without bound).
const MAX_BLOCK_BYTES: u64 = 1 << 32;

/// What went wrong with a call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request did not get an answer (connection refused or reset, timeout).
    #[error("request failed: {0}")]
    Transport(#[from] reqwest::Error),
    /// The server answered with an error.
    #[error("server answered {status} {code}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The error code from the body (`bad_json`, `unknown_layout`, ...).
        code: String,
        /// The message from the body.
        message: String,
    },
    /// The answer did not follow the wire format (truncated stream, bad frame).
    #[error("malformed answer: {0}")]
    Protocol(String),
}

impl ClientError {
    /// True for answers worth retrying unchanged: 503 (the server is reattaching a tier
    /// or shutting down) and transport failures.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Transport(_) => true,
            ClientError::Api { status, .. } => *status == 503,
            ClientError::Protocol(_) => false,
        }
    }
}

type Result<T> = std::result::Result<T, ClientError>;

/// The blocks a load returned.
#[derive(Debug, Clone)]
pub struct LoadedPrefix {
    /// Bytes of the leading blocks (or of their requested layers), in order.
    pub blocks: Vec<Bytes>,
    /// Why the stream ended: `Complete`, or where the cached prefix stopped.
    pub status: EndStatus,
}

/// A client of one kvtier server; clones share the connection pool.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    /// A client of the server at `base_url` (e.g. `http://127.0.0.1:7700`).
    pub fn new(base_url: &str) -> Result<Self> {
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(64)
            .build()?;
        Ok(Self {
            http,
            base: base_url.trim_end_matches('/').to_string(),
            token: None,
        })
    }

    /// Sends `token` as a bearer token with every request.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Turns an error status into [`ClientError::Api`].
    async fn check(resp: reqwest::Response) -> Result<reqwest::Response> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.bytes().await.unwrap_or_default();
        let (code, message) = match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(e) => (e.error.code, e.error.message),
            Err(_) => (
                "unknown".into(),
                String::from_utf8_lossy(&body).into_owned(),
            ),
        };
        Err(ClientError::Api {
            status: status.as_u16(),
            code,
            message,
        })
    }

    async fn json<T: DeserializeOwned>(&self, resp: reqwest::Response) -> Result<T> {
        let resp = Self::check(resp).await?;
        let body = resp.bytes().await?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    async fn post_json<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T> {
        let resp = self
            .request(reqwest::Method::POST, path)
            .json(body)
            .send()
            .await?;
        self.json(resp).await
    }

    /// Registers a layout (idempotent) and returns its digest and block size.
    pub async fn register_layout(&self, spec: &LayoutSpec) -> Result<LayoutInfo> {
        self.post_json("/v1/layouts", spec).await
    }

    /// How much of a prompt is cached, answered from memory.
    pub async fn lookup(&self, prompt: &PromptSpec) -> Result<LookupAnswer> {
        self.post_json("/v1/lookup", prompt).await
    }

    /// Loads the blocks named by a lookup's handles, in one response.
    pub async fn load(&self, request: &LoadRequest) -> Result<LoadedPrefix> {
        let resp = self
            .request(reqwest::Method::POST, "/v1/load")
            .json(request)
            .send()
            .await?;
        let mut resp = Self::check(resp).await?;
        let mut reader = FrameReader::default();
        while let Some(chunk) = resp.chunk().await? {
            reader.push(chunk)?;
            if reader.status.is_some() {
                break;
            }
        }
        reader.finish()
    }

    /// Stores `payloads[i]` as block `i` of `prompt` (each exactly one block of its
    /// layout). The payloads are sent as they are, without a copy.
    pub async fn store(&self, prompt: &PromptSpec, payloads: Vec<Bytes>) -> Result<StoreAnswer> {
        let body = upload_body(prompt, payloads)?;
        let resp = self
            .request(reqwest::Method::POST, "/v1/store")
            .header(reqwest::header::CONTENT_TYPE, UPLOAD_CONTENT_TYPE)
            .body(body)
            .send()
            .await?;
        self.json(resp).await
    }

    /// Stores the recurrent state reached after exactly `spec.tokens`.
    pub async fn snapshot_put(&self, spec: &SnapshotSpec, blob: Bytes) -> Result<()> {
        let body = upload_body(spec, vec![blob])?;
        let resp = self
            .request(reqwest::Method::PUT, "/v1/snapshot")
            .header(reqwest::header::CONTENT_TYPE, UPLOAD_CONTENT_TYPE)
            .body(body)
            .send()
            .await?;
        Self::check(resp).await.map(|_| ())
    }

    /// The state stored for exactly `spec.tokens`, if any.
    pub async fn snapshot_get(&self, spec: &SnapshotSpec) -> Result<Option<Bytes>> {
        let resp = self
            .request(reqwest::Method::POST, "/v1/snapshot/get")
            .json(spec)
            .send()
            .await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            // 404 is a miss only when the server says so (an unknown layout is an error).
            let resp = Self::check(resp).await;
            return match resp {
                Err(ClientError::Api { code, .. }) if code == "snapshot_miss" => Ok(None),
                Err(e) => Err(e),
                Ok(_) => Ok(None),
            };
        }
        let resp = Self::check(resp).await?;
        Ok(Some(resp.bytes().await?))
    }

    /// Deletes every block of a layout; returns how many were removed.
    pub async fn delete_layout(&self, layout: &str) -> Result<u64> {
        let resp = self
            .request(reqwest::Method::DELETE, &format!("/v1/layouts/{layout}"))
            .send()
            .await?;
        let v: serde_json::Value = self.json(resp).await?;
        v.get("removed_blocks")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| ClientError::Protocol("no removed_blocks in the answer".into()))
    }

    /// Every engine counter.
    pub async fn stats(&self) -> Result<BTreeMap<String, u64>> {
        let resp = self
            .request(reqwest::Method::GET, "/v1/stats")
            .send()
            .await?;
        self.json(resp).await
    }

    /// `GET /health`.
    pub async fn health(&self) -> Result<Health> {
        let resp = self.request(reqwest::Method::GET, "/health").send().await?;
        self.json(resp).await
    }

    /// `GET /metrics`, as text.
    pub async fn metrics(&self) -> Result<String> {
        let resp = self
            .request(reqwest::Method::GET, "/metrics")
            .send()
            .await?;
        Ok(Self::check(resp).await?.text().await?)
    }

    /// `POST /admin/ssd`.
    pub async fn admin_ssd(&self, request: &SsdAdmin) -> Result<SsdAdminAnswer> {
        self.post_json("/admin/ssd", request).await
    }

    /// `POST /admin/flush`: waits until everything queued for the SSD is written.
    pub async fn admin_flush(&self) -> Result<bool> {
        let v: serde_json::Value = self
            .post_json("/admin/flush", &serde_json::json!({}))
            .await?;
        Ok(v.get("drained").and_then(serde_json::Value::as_bool) == Some(true))
    }
}

/// An upload body: the framing head, the JSON head, then the payloads, as a list of
/// buffers (sent without concatenating them).
fn upload_body<H: Serialize>(head: &H, payloads: Vec<Bytes>) -> Result<reqwest::Body> {
    let json = serde_json::to_vec(head).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let json_len = u32::try_from(json.len())
        .map_err(|_| ClientError::Protocol("request head longer than 4 GiB".into()))?;
    let mut first = BytesMut::with_capacity(12 + json.len());
    first.extend_from_slice(&frame::upload_head(json_len));
    first.extend_from_slice(&json);
    let mut parts = Vec::with_capacity(payloads.len() + 1);
    parts.push(first.freeze());
    parts.extend(payloads);
    let stream = futures_util::stream::iter(parts.into_iter().map(Ok::<_, std::io::Error>));
    Ok(reqwest::Body::wrap_stream(stream))
}

/// Decodes a load stream as its chunks arrive.
#[derive(Debug, Default)]
struct FrameReader {
    /// Bytes of an incomplete header.
    head: Vec<u8>,
    started: bool,
    /// The block being filled, and how many bytes it still needs.
    current: Option<(BytesMut, usize)>,
    blocks: Vec<Bytes>,
    status: Option<EndStatus>,
}

impl FrameReader {
    fn push(&mut self, mut chunk: Bytes) -> Result<()> {
        while !chunk.is_empty() {
            if self.status.is_some() {
                return Err(ClientError::Protocol("bytes after the end frame".into()));
            }
            if let Some((buf, left)) = &mut self.current {
                let n = (*left).min(chunk.len());
                buf.extend_from_slice(&chunk.split_to(n));
                *left -= n;
                if *left == 0
                    && let Some((buf, _)) = self.current.take()
                {
                    self.blocks.push(buf.freeze());
                }
                continue;
            }
            let need = HEADER_LEN - self.head.len();
            let n = need.min(chunk.len());
            self.head.extend_from_slice(&chunk.split_to(n));
            if self.head.len() < HEADER_LEN {
                continue;
            }
            let mut h = [0u8; HEADER_LEN];
            h.copy_from_slice(&self.head);
            self.head.clear();
            if !self.started {
                frame::parse_stream_header(&h).map_err(ClientError::Protocol)?;
                self.started = true;
                continue;
            }
            match frame::parse_frame(&h).map_err(ClientError::Protocol)? {
                Frame::Block { index, len, .. } => {
                    if index as usize != self.blocks.len() {
                        return Err(ClientError::Protocol(format!(
                            "block frame {index} where {} was due",
                            self.blocks.len()
                        )));
                    }
                    if len > MAX_BLOCK_BYTES {
                        return Err(ClientError::Protocol(format!("block of {len} bytes")));
                    }
                    if len == 0 {
                        self.blocks.push(Bytes::new());
                    } else {
                        self.current = Some((BytesMut::with_capacity(len as usize), len as usize));
                    }
                }
                Frame::End { sent, status } => {
                    if sent as usize != self.blocks.len() {
                        return Err(ClientError::Protocol(format!(
                            "end frame counts {sent} blocks, {} arrived",
                            self.blocks.len()
                        )));
                    }
                    self.status = Some(status);
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<LoadedPrefix> {
        match self.status {
            Some(status) => Ok(LoadedPrefix {
                blocks: self.blocks,
                status,
            }),
            None => Err(ClientError::Protocol(format!(
                "load stream cut off after {} blocks, without its end frame",
                self.blocks.len()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    fn stream(blocks: &[&[u8]], status: EndStatus) -> Vec<u8> {
        let mut out = frame::stream_header(blocks.len() as u32).to_vec();
        for (i, b) in blocks.iter().enumerate() {
            out.extend_from_slice(&frame::block_header(i as u32, b.len() as u64, &[7; 16]));
            out.extend_from_slice(b);
        }
        out.extend_from_slice(&frame::end_frame(blocks.len() as u32, status));
        out
    }

    #[test]
    fn frames_decode_whatever_the_chunking() {
        let a = vec![1u8; 1000];
        let b = vec![2u8; 77];
        let bytes = stream(&[&a, &b], EndStatus::Lost);
        for chunk in [1, 7, 31, 32, 33, 500, bytes.len()] {
            let mut r = FrameReader::default();
            for c in bytes.chunks(chunk) {
                r.push(Bytes::copy_from_slice(c)).unwrap();
            }
            let got = r.finish().unwrap();
            assert_eq!(got.status, EndStatus::Lost);
            assert_eq!(
                got.blocks,
                vec![Bytes::from(a.clone()), Bytes::from(b.clone())]
            );
        }
    }

    #[test]
    fn a_stream_without_its_end_frame_is_an_error() {
        let a = vec![1u8; 100];
        let bytes = stream(&[&a], EndStatus::Complete);
        let mut r = FrameReader::default();
        r.push(Bytes::copy_from_slice(&bytes[..bytes.len() - HEADER_LEN]))
            .unwrap();
        assert!(matches!(r.finish(), Err(ClientError::Protocol(_))));
        let mut r = FrameReader::default();
        r.push(Bytes::copy_from_slice(&bytes[..50])).unwrap();
        assert!(matches!(r.finish(), Err(ClientError::Protocol(_))));
    }

    #[test]
    fn garbage_is_refused() {
        let mut r = FrameReader::default();
        assert!(r.push(Bytes::from_static(&[0u8; 64])).is_err());
    }
}
