//! The body of a load answer, produced while it is sent: blocks are read from the engine
//! in batches of at most [`BATCH_BYTES`], so a load of a long prefix held on the SSD never
//! holds more than one batch in memory, and its first bytes leave before its last block is
//! read. The frames are those of docs/API.md; the length is not known up front (a block
//! may be lost mid-way), so the answer is sent in chunked transfer encoding.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{Stream, StreamExt, stream};
use kvtier_client::wire::frame::{self, EndStatus};
use kvtier_core::{Engine, Lookup};

/// Bytes read per batch.
const BATCH_BYTES: u64 = 32 << 20;

struct State {
    engine: Arc<Engine>,
    resolved: Lookup,
    requested: usize,
    layers: Option<Range<u32>>,
    per_batch: usize,
    /// Blocks sent so far.
    next: usize,
    /// Why the stream ends, once known.
    end: Option<EndStatus>,
    header_sent: bool,
    finished: bool,
}

/// The frames of a load of `resolved` (which resolved from `requested` handles), each
/// block `per_block` bytes (the whole block or its layers).
pub fn blocks(
    engine: Arc<Engine>,
    resolved: Lookup,
    requested: usize,
    layers: Option<Range<u32>>,
    per_block: u64,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let state = State {
        engine,
        per_batch: (BATCH_BYTES / per_block.max(1)).max(1) as usize,
        resolved,
        requested,
        layers,
        next: 0,
        end: None,
        header_sent: false,
        finished: false,
    };
    stream::unfold(state, step)
        .map(|parts: Vec<Bytes>| stream::iter(parts.into_iter().map(Ok)))
        .flatten()
}

/// The next frames.
async fn step(mut st: State) -> Option<(Vec<Bytes>, State)> {
    if st.finished {
        return None;
    }
    if !st.header_sent {
        st.header_sent = true;
        let head = frame::stream_header(st.requested as u32);
        return Some((vec![Bytes::copy_from_slice(&head)], st));
    }
    let held = st.resolved.blocks.len();
    if st.end.is_none() && st.next == held {
        // Every resolved block went out; fewer resolved than asked for means lost.
        st.end = Some(if held == st.requested {
            EndStatus::Complete
        } else {
            EndStatus::Lost
        });
    }
    if let Some(status) = st.end {
        st.finished = true;
        let end = frame::end_frame(st.next as u32, status);
        return Some((vec![Bytes::copy_from_slice(&end)], st));
    }
    let upto = (st.next + st.per_batch).min(held);
    // The batch's share of the resolved tokens (the hit accounting counts in them).
    let tokens_per_block = st.resolved.matched_tokens / held.max(1);
    let batch = Lookup {
        layout: st.resolved.layout,
        blocks: st.resolved.blocks[st.next..upto].to_vec(),
        matched_tokens: (upto - st.next) * tokens_per_block,
        state: None,
    };
    let engine = st.engine.clone();
    let layers = st.layers.clone();
    let loaded = kvtier_listen::http::spawn_blocking(move || match layers {
        Some(r) => engine.load_layers(&batch, r),
        None => engine.load(&batch),
    })
    .await;
    let loaded = match loaded {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, block = st.next, "a load failed mid-stream");
            st.end = Some(EndStatus::Failed);
            return Some((Vec::new(), st));
        }
        Err(e) => {
            tracing::error!(error = %e, "a load worker failed");
            st.end = Some(EndStatus::Failed);
            return Some((Vec::new(), st));
        }
    };
    let mut parts = Vec::with_capacity(2 * loaded.blocks.len());
    for (bytes, r) in loaded.blocks.iter().zip(&st.resolved.blocks[st.next..upto]) {
        let head = frame::block_header(st.next as u32, bytes.len() as u64, &r.hash.0);
        parts.push(Bytes::copy_from_slice(&head));
        parts.push(bytes.clone());
        st.next += 1;
    }
    if !loaded.complete {
        st.end = Some(EndStatus::Lost);
    }
    Some((parts, st))
}
