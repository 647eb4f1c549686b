//! Reading a request body as it arrives: chunk by chunk within the body limit, an upload's
//! head first, then a store's payload straight into one buffer per block.
//!
//! A store's blocks end up in the RAM tier, which keeps the buffers it is given. Reading
//! the payload into those buffers directly — each network chunk copied once, into the
//! block it belongs to — is the whole store path's only copy: gathering the body first
//! and copying each block out of it again cost a second pass over every byte (measured:
//! `server.store.2MiB.GBps` at 0.26–0.34× raw loopback TCP with two copies).

use axum::body::{Body, BodyDataStream};
use axum::http::StatusCode;
use bytes::Bytes;
use futures_util::StreamExt;
use kvtier_client::wire::frame;
use kvtier_core::Engine;
use kvtier_core::arena::BlockBuf;
use serde::de::DeserializeOwned;

use super::input;
use crate::error::ApiError;
use crate::state::AppState;

/// Payload bytes a store copies before it lets other requests on its thread run.
const YIELD_EVERY: usize = 1 << 20;

/// A request body's chunks, refusing more than its limit in total.
pub struct BodyChunks {
    stream: BodyDataStream,
    limit: u64,
    total: u64,
    announced: Option<u64>,
}

impl BodyChunks {
    /// The chunks of `body`; refused at once (413) when its announced length is already
    /// over `limit`.
    pub fn new(body: Body, limit: u64) -> Result<Self, ApiError> {
        use axum::body::HttpBody as _;
        let hint = body.size_hint();
        if hint.lower() > limit {
            return Err(too_large(limit));
        }
        Ok(Self {
            announced: hint.exact(),
            stream: body.into_data_stream(),
            limit,
            total: 0,
        })
    }

    /// The length the client announced, if it did.
    pub fn announced(&self) -> Option<u64> {
        self.announced
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.total
    }

    /// The next chunk, or `None` at the end. Errors: more than the limit (413), a body that
    /// did not arrive within the body timeout (408), a cut-off body (400).
    pub async fn next(&mut self) -> Result<Option<Bytes>, ApiError> {
        let Some(chunk) = self.stream.next().await else {
            return Ok(None);
        };
        let chunk = chunk.map_err(|e| {
            let inner = e.into_inner();
            match crate::listen::timed_out(inner.as_ref()) {
                Some(t) => {
                    ApiError::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", t.to_string())
                }
                None => ApiError::bad(
                    "body_unreadable",
                    format!("the request body could not be read: {inner}"),
                ),
            }
        })?;
        self.total += chunk.len() as u64;
        if self.total > self.limit {
            return Err(too_large(self.limit));
        }
        Ok(Some(chunk))
    }

    /// The answer to a request refused with `err` before its body was read whole: reads
    /// the rest of the body and throws it away (within the limit and the body timeout), so
    /// that the answer reaches the client — closing a socket with unread bytes makes the
    /// kernel reset the connection, and the client would see a reset instead of the
    /// answer — and answers 413 instead of `err` when the body turns out over the limit.
    ///
    /// So a body over `max_body` is answered 413 however it is framed: with a
    /// `Content-Length` over the limit the request is refused before anything else is
    /// looked at; a chunked body's length is known only once it has arrived, and a fault
    /// found in its first bytes (a bad upload head, an unknown layout) must not answer
    /// differently from the same body sent with its length.
    pub async fn refuse(&mut self, err: ApiError) -> ApiError {
        if matches!(
            err.status,
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT
        ) {
            return err;
        }
        loop {
            match self.next().await {
                Ok(Some(_)) => {}
                Ok(None) => return err,
                Err(e) if e.status == StatusCode::PAYLOAD_TOO_LARGE => return e,
                Err(_) => return err,
            }
        }
    }
}

fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!(
            "the request body is larger than the limit of {limit} bytes (max_body; max_json for \
             a JSON body)"
        ),
    )
}

/// Reads an upload's head (the 12-byte frame, then the JSON head) and returns the head with
/// the payload bytes that arrived in the same chunk (not copied).
pub async fn read_head<T: DeserializeOwned>(
    app: &AppState,
    chunks: &mut BodyChunks,
) -> Result<(T, Bytes), ApiError> {
    // The head is JSON: bounded as JSON bodies are (and by the body's own limit).
    let head_limit = input::json_limit(app).min(chunks.limit);
    let bad = |m: String| ApiError::bad("bad_upload", m);
    let mut head: Vec<u8> = Vec::with_capacity(256);
    // The frame first; once it is read, how long the JSON head is.
    let mut need = 12usize;
    let mut framed = false;
    loop {
        let Some(mut chunk) = chunks.next().await? else {
            return Err(bad(if framed {
                format!(
                    "upload head says {} bytes of JSON but only {} bytes follow",
                    need - 12,
                    head.len() - 12
                )
            } else {
                "upload body does not start with the KVTU magic".into()
            }));
        };
        loop {
            let take = (need - head.len()).min(chunk.len());
            head.extend_from_slice(&chunk.split_to(take));
            if head.len() < need {
                break; // this chunk is used up
            }
            if !framed {
                framed = true;
                let json_len = frame::upload_json_len(&head).map_err(bad)?;
                need = 12usize.saturating_add(json_len);
                if json_len as u64 > head_limit {
                    return Err(ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "body_too_large",
                        format!(
                            "the upload's JSON head is {json_len} bytes; at most {head_limit} \
                             (max_json)"
                        ),
                    ));
                }
                head.reserve(json_len);
                continue;
            }
            return Ok((input::json(app, &head[12..])?, chunk));
        }
    }
}

/// A store's payload, read into one buffer per block.
pub struct Blocks {
    /// Whole blocks, at most as many as were asked for.
    pub blocks: Vec<Bytes>,
    /// Every payload byte received, including any past the blocks kept.
    pub payload_len: u64,
}

/// Reads the payload — `first`, then the rest of the body — into buffers of `block` bytes
/// from `engine`'s arena, each taken as its first byte arrives (memory follows the bytes
/// received, not the length announced). At most `most` blocks are kept; bytes past them,
/// and a trailing partial block, are read and counted but not kept, so the caller can say
/// what was wrong with the whole payload.
pub async fn read_blocks(
    chunks: &mut BodyChunks,
    first: Bytes,
    engine: &Engine,
    block: usize,
    most: usize,
) -> Result<Blocks, ApiError> {
    if block == 0 {
        return Err(ApiError::bad(
            "bad_payload_length",
            "the layout's blocks are empty",
        ));
    }
    let mut blocks = Vec::with_capacity(
        most.min(
            chunks
                .announced()
                .map_or(0, |n| (n / block as u64) as usize + 1),
        ),
    );
    let mut filling: Option<BlockBuf> = None;
    let mut payload_len = 0u64;
    let mut since_yield = 0usize;
    let mut piece = first;
    loop {
        payload_len += piece.len() as u64;
        let mut rest = &piece[..];
        while !rest.is_empty() && blocks.len() < most {
            let buf = filling.get_or_insert_with(|| engine.block_buffer(block));
            let took = buf.append(rest);
            rest = &rest[took..];
            if buf.remaining() == 0
                && let Some(full) = filling.take()
            {
                blocks.push(full.freeze());
            }
        }
        // Let other requests run between pieces: a large store's chunks are always ready,
        // and tokio's cooperative budget lets a task run through many of them in one turn.
        // Measured (ADR 0007): with two request threads and 16 clients looking up, a
        // store ran at 0.08x raw TCP without this yield and 0.65x with it.
        since_yield += piece.len();
        if since_yield >= YIELD_EVERY {
            since_yield = 0;
            tokio::task::yield_now().await;
        }
        match chunks.next().await? {
            Some(next) => piece = next,
            None => break,
        }
    }
    Ok(Blocks {
        blocks,
        payload_len,
    })
}
