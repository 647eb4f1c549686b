//! The recurrent-state endpoints of hybrid and recurrent models (issue 16,
//! `docs/hybrid.md`): checkpoint puts, and restores that return every group's part of one
//! boundary or nothing. The composed lookup is `POST /v1/lookup` (its `state` field).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use kvtier_client::wire::frame;
use kvtier_client::wire::{CheckpointSpec, PromptSpec, RestoreHead, UPLOAD_CONTENT_TYPE};

use super::auth::Scope;
use super::data::{limit, prompt_of, put_answer, upload};
use super::input::{self, blocking, read_body};
use crate::error::ApiError;
use crate::state::AppState;

type App = State<Arc<AppState>>;

/// `PUT /v1/checkpoint`: the recurrent state after the first `blocks` whole blocks of a
/// prompt (an upload: the JSON head, then the state's bytes). Refused (400) off the
/// layout's checkpoint boundaries, at any size but the layout's state size, and for a
/// layout without state groups; 507 when the checkpoint bucket could not make room.
pub async fn checkpoint_put(
    State(app): App,
    Extension(scope): Extension<Scope>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(body, limit(&app)).await?;
    let (spec, state): (CheckpointSpec, Bytes) = upload(&app, &body)?;
    let prompt = prompt_of(
        &app,
        &scope,
        &PromptSpec {
            layout: spec.layout,
            tokens: spec.tokens,
            tokens_b64: None,
            extra_keys: spec.extra_keys,
        },
    )?;
    let engine = app.engine.clone();
    let blocks = spec.blocks;
    let outcome = blocking(move || Ok(engine.checkpoint_put(&prompt, blocks, &state)?)).await?;
    Ok(put_answer(outcome))
}

/// `POST /v1/restore`: looks the prompt up and reads every part of the hit at once: the
/// KV blocks and, for a layout with state groups, the recurrent state at their end. The
/// answer is an upload-framed body: a [`RestoreHead`], then the blocks back to back, then
/// the state. All or nothing: when a part cannot be read in full, `tokens` is 0 and no
/// bytes follow (the caller computes the prompt).
pub async fn restore(
    State(app): App,
    Extension(scope): Extension<Scope>,
    body: Body,
) -> Result<Response, ApiError> {
    let spec: PromptSpec = input::json_body(&app, body).await?;
    let prompt = prompt_of(&app, &scope, &spec)?;
    let block_bytes = prompt.layout().block_bytes();
    let engine = app.engine.clone();
    let restored = blocking(move || {
        let found = engine.lookup(&prompt);
        Ok(engine.restore(&found)?)
    })
    .await?;
    let state_bytes = restored.state.as_ref().map_or(0, |s| s.len() as u64);
    let head = RestoreHead {
        tokens: restored.tokens,
        blocks: restored.blocks.len(),
        block_bytes,
        state_bytes,
    };
    let json = serde_json::to_vec(&head).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("cannot encode the restore head: {e}"),
        )
    })?;
    // The head, then the blocks and the state as the engine holds them: sent part by
    // part, never copied into one buffer.
    let mut head = frame::upload_head(json.len() as u32).to_vec();
    head.extend_from_slice(&json);
    let parts = std::iter::once(Bytes::from(head))
        .chain(restored.blocks)
        .chain(restored.state)
        .map(Ok::<_, std::convert::Infallible>);
    let mut resp = Body::from_stream(futures_util::stream::iter(parts)).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(UPLOAD_CONTENT_TYPE),
    );
    Ok(resp)
}
