//! Batches of short prompts in one request (`POST /v1/lookup/batch`, `POST /v1/store/batch`):
//! SGLang files each page of its host pool as a prompt of its own, and a round trip per
//! page made its `batch_exists` of 1,024 pages 1,024 requests. A batch is answered prompt
//! by prompt exactly as that many single calls would be; loading the blocks of many
//! prompts needs no batch call (one `/v1/load` takes any handles of a layout).

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, State};
use bytes::Bytes;
use kvtier_client::wire::{
    BatchLookupAnswer, BatchSpec, BatchStoreAnswer, LookupAnswer, MAX_BATCH_PROMPTS, PromptSpec,
    StateHit, StoreAnswer, tokens_from_b64,
};

use super::auth::Scope;
use super::data::{asked_ack, limit, prompt_of};
use super::input::{self, blocking};
use super::upload::{self, BodyChunks};
use crate::error::ApiError;
use crate::state::AppState;

type App = State<Arc<AppState>>;

/// The prompts of a batch, checked: at most [`MAX_BATCH_PROMPTS`] of them, each a prompt
/// a single call would take.
fn prompts_of(
    app: &AppState,
    scope: &Scope,
    spec: &BatchSpec,
) -> Result<Vec<kvtier_core::Prompt>, ApiError> {
    if spec.prompts.len() > MAX_BATCH_PROMPTS {
        return Err(ApiError::bad(
            "too_many_prompts",
            format!(
                "{} prompts in one batch; at most {MAX_BATCH_PROMPTS}",
                spec.prompts.len()
            ),
        ));
    }
    spec.prompts
        .iter()
        .enumerate()
        .map(|(i, b64)| {
            let tokens = tokens_from_b64(b64)
                .map_err(|e| ApiError::bad("bad_tokens", format!("prompt {i}: {e}")))?;
            prompt_of(app, scope, &PromptSpec::new(spec.layout.clone(), tokens))
        })
        .collect()
}

/// One lookup's answer, as `/v1/lookup` gives it.
fn answer_of(found: &kvtier_core::Lookup) -> LookupAnswer {
    let mut handles = Vec::with_capacity(found.blocks.len() * 32);
    for b in &found.blocks {
        input::push_hex(&mut handles, &b.hash.0);
    }
    LookupAnswer {
        matched_tokens: found.matched_tokens,
        // Hex digits and tier letters only: ASCII.
        handles: String::from_utf8_lossy(&handles).into_owned(),
        tiers: found.blocks.iter().map(|b| b.tier.letter()).collect(),
        state: found.state.as_ref().map(|s| StateHit {
            blocks: s.blocks,
            tier: s.tier.letter().to_string(),
        }),
    }
}

/// `POST /v1/lookup/batch`: each prompt's cached prefix, from memory.
pub async fn lookup_batch(
    State(app): App,
    Extension(scope): Extension<Scope>,
    body: Body,
) -> Result<Json<BatchLookupAnswer>, ApiError> {
    let spec: BatchSpec = input::json_body(&app, body).await?;
    let prompts = prompts_of(&app, &scope, &spec)?;
    let hits = prompts
        .iter()
        .map(|p| answer_of(&app.engine.lookup(p)))
        .collect();
    Ok(Json(BatchLookupAnswer { hits }))
}

/// `POST /v1/store/batch`: every prompt's whole blocks, the payload prompt after prompt;
/// all of it checked before any is kept, then stored prompt by prompt (a prompt that
/// stops early — no space — does not stop the others), acknowledged as `/v1/store` is
/// (`?durability=`).
pub async fn store_batch(
    State(app): App,
    Extension(scope): Extension<Scope>,
    uri: axum::http::Uri,
    body: Body,
) -> Result<Json<BatchStoreAnswer>, ApiError> {
    let mut chunks = BodyChunks::new(body, limit(&app))?;
    let ack = match asked_ack(&uri) {
        Ok(ack) => ack,
        Err(e) => return Err(chunks.refuse(e).await),
    };
    let (spec, first): (BatchSpec, Bytes) = match upload::read_head(&app, &mut chunks).await {
        Ok(head) => head,
        Err(e) => return Err(chunks.refuse(e).await),
    };
    let prompts = match prompts_of(&app, &scope, &spec) {
        Ok(p) => p,
        Err(e) => return Err(chunks.refuse(e).await),
    };
    let Some(block) = prompts.first().map(|p| p.layout().block_bytes() as usize) else {
        return Ok(Json(BatchStoreAnswer {
            answers: Vec::new(),
        }));
    };
    let want: usize = prompts.iter().map(|p| p.num_blocks()).sum();
    let read = match upload::read_blocks(&mut chunks, first, &app.engine, block, want).await {
        Ok(read) => read,
        Err(e) => return Err(chunks.refuse(e).await),
    };
    if read.payload_len != (want * block) as u64 {
        return Err(ApiError::bad(
            "bad_payload_length",
            format!(
                "{} payload bytes; the batch's {want} whole blocks of {block} bytes are {}",
                read.payload_len,
                want * block
            ),
        ));
    }
    let engine = app.engine.clone();
    let answers = blocking(move || {
        let mut blocks = read.blocks.into_iter();
        let mut answers = Vec::with_capacity(prompts.len());
        for prompt in &prompts {
            let own: Vec<Bytes> = blocks.by_ref().take(prompt.num_blocks()).collect();
            let options = kvtier_core::StoreOptions {
                ack,
                ..Default::default()
            };
            let report = engine.store_owned(prompt, own, options)?;
            answers.push(StoreAnswer::from(&report));
        }
        Ok(answers)
    })
    .await?;
    Ok(Json(BatchStoreAnswer { answers }))
}

/// The blocks of `hashes` cut into `chains` (blocks per chain), each resolved from the
/// layout's root as one load's handles are ([`kvtier_core::Engine::resolve`]), joined in
/// order; resolution stops at the first chain not found whole, so the blocks served are
/// those of the leading whole chains.
pub(super) fn resolve_chains(
    engine: &kvtier_core::Engine,
    layout: kvtier_core::LayoutDigest,
    hashes: &[kvtier_core::BlockHash],
    chains: &[u32],
) -> Result<kvtier_core::Lookup, ApiError> {
    let total: u64 = chains.iter().map(|&c| u64::from(c)).sum();
    if total != hashes.len() as u64 || chains.contains(&0) {
        return Err(ApiError::bad(
            "bad_chains",
            format!(
                "chains of {total} blocks in all (none empty) for {} handles",
                hashes.len()
            ),
        ));
    }
    let mut joined = kvtier_core::Lookup {
        layout,
        matched_tokens: 0,
        blocks: Vec::with_capacity(hashes.len()),
        state: None,
    };
    let mut at = 0;
    for &len in chains {
        let chain = &hashes[at..at + len as usize];
        at += len as usize;
        let found = engine.resolve(layout, chain)?;
        if found.blocks.len() != chain.len() {
            break;
        }
        joined.matched_tokens += found.matched_tokens;
        joined.blocks.extend(found.blocks);
    }
    Ok(joined)
}
