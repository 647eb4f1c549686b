//! Reading and checking request input: bodies within the size limit, JSON with named
//! errors, hex handles, known layouts.

use std::sync::Arc;

use axum::body::Body;
use axum::http::StatusCode;
use bytes::{Bytes, BytesMut};
use kvtier_client::wire::BlockExtraKeys;
use kvtier_core::{BlockHash, ExtraKeys, Layout, LayoutDigest};
use serde::de::DeserializeOwned;

use super::upload::BodyChunks;
use crate::error::ApiError;
use crate::state::AppState;

/// Buffers reserved ahead of the bytes that arrived are at most this large, whatever
/// length the client announces: memory follows the bytes actually received.
const RESERVE_AHEAD: u64 = 16 << 20;

/// Reads the whole body, refusing more than `limit` bytes (413, before reading anything
/// when the announced length is already over), bodies that do not arrive within the body
/// timeout (408) and cut-off bodies (400).
///
/// The bytes are gathered into one buffer as they arrive, so a request holds at most
/// `limit` bytes (plus one chunk) however it sends them. Stores do not come here: they
/// read their payload straight into per-block buffers (see `upload`).
pub async fn read_body(body: Body, limit: u64) -> Result<Bytes, ApiError> {
    let mut chunks = BodyChunks::new(body, limit)?;
    let announced = chunks.announced().unwrap_or(0);
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    while let Some(chunk) = chunks.next().await? {
        // One chunk needs no copy; from the second on, chunks are gathered.
        match first.take() {
            None if buf.is_empty() => first = Some(chunk),
            held => {
                if buf.is_empty() {
                    let total = chunks.received();
                    let expected = announced.max(total).min(total + RESERVE_AHEAD);
                    buf.reserve(expected as usize);
                }
                if let Some(h) = held {
                    buf.extend_from_slice(&h);
                }
                buf.extend_from_slice(&chunk);
            }
        }
    }
    Ok(first.unwrap_or_else(|| buf.freeze()))
}

/// Parses JSON, naming what was wrong.
pub fn json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad("bad_json", format!("malformed JSON: {e}")))
}

/// Decodes hex of any length.
pub fn hex_bytes(what: &str, s: &str) -> Result<Vec<u8>, ApiError> {
    let bad = || ApiError::bad("bad_hex", format!("{what} `{s}` is not hex"));
    if !s.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

/// Appends `bytes` as lowercase hex digits.
pub fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(2 * bytes.len());
    for b in bytes {
        out.extend_from_slice(&[DIGITS[(b >> 4) as usize], DIGITS[(b & 15) as usize]]);
    }
}

/// Decodes 32 hex digits.
pub fn hex16(what: &str, s: &str) -> Result<[u8; 16], ApiError> {
    let v = hex_bytes(what, s)?;
    v.try_into()
        .map_err(|_| ApiError::bad("bad_hex", format!("{what} `{s}` is not 32 hex digits")))
}

/// A block handle.
pub fn block_hash(s: &str) -> Result<BlockHash, ApiError> {
    hex16("block handle", s).map(BlockHash)
}

/// A registered layout, or 404 `unknown_layout`.
pub fn known_layout(app: &AppState, digest_hex: &str) -> Result<Arc<Layout>, ApiError> {
    let digest = LayoutDigest(hex16("layout", digest_hex)?);
    app.engine.layout(digest).map_err(|_| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_layout",
            format!("layout {digest_hex} is not registered (POST /v1/layouts first)"),
        )
    })
}

/// Per-block extra keys from the wire.
pub fn extra_keys(blocks: &[BlockExtraKeys]) -> Result<ExtraKeys, ApiError> {
    let mut extras = ExtraKeys::none();
    for b in blocks {
        for k in &b.keys {
            extras.push(b.block, hex_bytes("extra key", k)?);
        }
    }
    Ok(extras)
}

/// Runs blocking engine work off the async threads.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    // At the process's priority even when called on the bulk lane (kvtier_listen).
    kvtier_listen::http::spawn_blocking(f).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("worker failed: {e}"),
        )
    })?
}
