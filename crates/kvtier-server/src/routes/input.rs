//! Reading and checking request input: bodies within the size limit, JSON with named
//! errors, hex handles, known layouts.

use std::sync::Arc;

use axum::body::Body;
use axum::http::StatusCode;
use bytes::{Bytes, BytesMut};
use kvtier_client::wire::{BlockExtraKeys, Limit, ParseError, ParseLimits, parse_within};
use kvtier_core::{BlockHash, ExtraKeys, Layout, LayoutDigest};
use serde::de::DeserializeOwned;

use super::auth::Scope;
use super::upload::BodyChunks;
use crate::error::ApiError;
use crate::state::AppState;

/// A buffer reserved for an announced length is at most this large, whatever length the
/// client announces (past it the buffer grows as bytes arrive). The default JSON limit:
/// any JSON body is read into one buffer of exactly its size.
const RESERVE_AHEAD: u64 = 64 << 20;

/// A chunk of a chunked body smaller than this is copied into a piece of [`PIECE`] bytes
/// instead of being kept as it came.
const SMALL_CHUNK: usize = 4 << 10;
const PIECE: usize = 64 << 10;

/// Reads the whole body, refusing more than `limit` bytes (413, before reading anything
/// when the announced length is already over), bodies that do not arrive within the body
/// timeout (408) and cut-off bodies (400).
///
/// A request holds little more than its bytes at any time: an announced body is copied
/// into one buffer of its length as it arrives; a chunked one is kept chunk by chunk and
/// joined once at the end (a buffer grown by doubling held up to three times the body).
/// One chunk needs no copy. Stores do not come here: they read their payload straight
/// into per-block buffers (see `upload`).
pub async fn read_body(body: Body, limit: u64) -> Result<Bytes, ApiError> {
    let mut chunks = BodyChunks::new(body, limit)?;
    let Some(announced) = chunks.announced() else {
        // Small chunks are gathered into pieces of 64 KiB: a client sending its body a
        // byte per chunk must not make the server keep a handle per byte.
        let mut parts = Vec::new();
        let mut small = BytesMut::new();
        while let Some(chunk) = chunks.next().await? {
            if chunk.len() >= SMALL_CHUNK {
                if !small.is_empty() {
                    parts.push(small.split().freeze());
                }
                parts.push(chunk);
            } else {
                small.extend_from_slice(&chunk);
                if small.len() >= PIECE {
                    parts.push(small.split().freeze());
                }
            }
        }
        if !small.is_empty() {
            parts.push(small.freeze());
        }
        if parts.len() <= 1 {
            return Ok(parts.pop().unwrap_or_default());
        }
        let mut buf = BytesMut::with_capacity(chunks.received() as usize);
        for p in parts {
            buf.extend_from_slice(&p);
        }
        return Ok(buf.freeze());
    };
    let mut buf = BytesMut::new();
    while let Some(chunk) = chunks.next().await? {
        if buf.is_empty() && chunk.len() as u64 == announced {
            return Ok(chunk);
        }
        if buf.capacity() == 0 {
            buf.reserve(announced.min(RESERVE_AHEAD) as usize);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// The largest JSON request body: `max_json`, and never more than `max_body`.
pub fn json_limit(app: &AppState) -> u64 {
    let s = app.node.settings.read();
    s.max_json.0.min(s.max_body.0)
}

/// What a request's JSON may hold, checked while it is parsed.
pub fn parse_limits(app: &AppState) -> ParseLimits {
    ParseLimits {
        max_tokens: app.node.settings.read().max_tokens,
    }
}

/// Parses a request's JSON, naming what was wrong. Token lists and the other bounded
/// fields are refused at the first item over the limit (see `kvtier_client::wire::bounded`),
/// so no request grows past its body while it is parsed.
pub fn json<T: DeserializeOwned>(app: &AppState, bytes: &[u8]) -> Result<T, ApiError> {
    parse_within(bytes, parse_limits(app)).map_err(|e| match e {
        ParseError::Malformed(e) => ApiError::bad("bad_json", format!("malformed JSON: {e}")),
        // As the same prompt's refusal after parsing is (the engine's `max_tokens`).
        ParseError::OverLimit {
            limit: Limit::Tokens,
            message,
        } => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            kvtier_core::ErrorKind::Invalid.name(),
            message,
        ),
        ParseError::OverLimit {
            limit: Limit::Prompts,
            message,
        } => ApiError::bad("too_many_prompts", message),
    })
}

/// Reads a JSON request body within [`json_limit`] and parses it ([`json`]).
pub async fn json_body<T: DeserializeOwned>(app: &AppState, body: Body) -> Result<T, ApiError> {
    let bytes = read_body(body, json_limit(app)).await?;
    json(app, &bytes)
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
///
/// A digit pair per byte from a table: a lookup's answer spells out every handle (4 KiB
/// of digits for a 2,048-token prompt), and a digit at a time was 8% of the request
/// thread's time per lookup.
pub fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(2 * bytes.len());
    out.extend(bytes.iter().flat_map(|&b| HEX_PAIRS[b as usize]));
}

/// The two lowercase hex digits of every byte.
static HEX_PAIRS: [[u8; 2]; 256] = hex_pairs();

const fn hex_pairs() -> [[u8; 2]; 256] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        pairs[b] = [DIGITS[b >> 4], DIGITS[b & 15]];
        b += 1;
    }
    pairs
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

/// A registered layout within `scope`; 404 `unknown_layout`, or 403 `wrong_tenant` for
/// another tenant's layout.
pub fn known_layout(
    app: &AppState,
    scope: &Scope,
    digest_hex: &str,
) -> Result<Arc<Layout>, ApiError> {
    let digest = LayoutDigest(hex16("layout", digest_hex)?);
    let layout = app.engine.layout(digest).map_err(|_| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_layout",
            format!("layout {digest_hex} is not registered (POST /v1/layouts first)"),
        )
    })?;
    scope.admits(&layout)?;
    Ok(layout)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_digits_of_every_byte() {
        let bytes: Vec<u8> = (0..=255).collect();
        let mut out = b"prefix:".to_vec();
        push_hex(&mut out, &bytes);
        let want: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(out, [b"prefix:".as_slice(), want.as_bytes()].concat());
    }
}
