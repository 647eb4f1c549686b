//! The data endpoints: layouts, lookup, load, store, snapshots, namespace delete, stats.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use kvtier_client::wire::frame;
use kvtier_client::wire::{
    BLOCKS_CONTENT_TYPE, HANDLE_HEX_LEN, LayoutInfo, LayoutSpec, LoadRequest, PromptSpec,
    SnapshotSpec, StoreAnswer, UPLOAD_CONTENT_TYPE,
};

use super::auth::Scope;
use super::input::{self, blocking, known_layout, read_body};
use super::upload::{self, BodyChunks};
use crate::error::ApiError;
use crate::state::AppState;

type App = State<Arc<AppState>>;

pub(super) fn limit(app: &AppState) -> u64 {
    app.node.settings.read().max_body.0
}

/// `POST /v1/layouts`: registers a layout (idempotent).
pub async fn register_layout(
    State(app): App,
    Extension(scope): Extension<Scope>,
    body: Body,
) -> Result<Json<LayoutInfo>, ApiError> {
    let spec: LayoutSpec = input::json_body(&app, body).await?;
    let mut key = spec
        .to_key()
        .map_err(|e| ApiError::bad(e.code, e.message))?;
    // A tenant's token gives the salt: the layout is the tenant's whatever was asked.
    key.tenant_salt = scope.salt_for(std::mem::take(&mut key.tenant_salt));
    let layout = app.engine.register_layout(key).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "bad_layout",
            e.message().to_string(),
        )
    })?;
    let checkpoint_every = app
        .engine
        .configure_checkpoints(layout.digest(), spec.checkpoint_every.map(|t| t as usize))
        .map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "bad_layout",
                e.message().to_string(),
            )
        })?
        .map(|t| t as u32);
    Ok(Json(LayoutInfo {
        layout: layout.digest().to_hex(),
        block_bytes: layout.block_bytes(),
        tokens_per_block: layout.tokens_per_block() as u32,
        num_layers: layout.geometry().num_layers,
        checkpoint_every,
    }))
}

/// The prompt a request names: its layout, tokens (either form) and extra keys.
pub(crate) fn prompt_of(
    app: &AppState,
    scope: &Scope,
    spec: &PromptSpec,
) -> Result<kvtier_core::Prompt, ApiError> {
    let layout = known_layout(app, scope, &spec.layout)?;
    let tokens = spec
        .token_ids()
        .map_err(|e| ApiError::bad("bad_tokens", e))?;
    let extras = input::extra_keys(&spec.extra_keys)?;
    Ok(app.engine.prompt(layout.digest(), &tokens, &extras)?)
}

/// `POST /v1/lookup`: how much of a prompt is cached, from memory.
///
/// The body is JSON, or (content type `application/vnd.kvtier.upload`) a JSON head
/// without tokens followed by the tokens as little-endian `u32`s — the cheapest form.
pub async fn lookup(
    State(app): App,
    Extension(scope): Extension<Scope>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(body, input::json_limit(&app)).await?;
    let binary = headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == UPLOAD_CONTENT_TYPE.as_bytes());
    let spec: PromptSpec = if binary {
        let (mut spec, raw): (PromptSpec, Bytes) = upload(&app, &body)?;
        if !spec.tokens.is_empty() || spec.tokens_b64.is_some() || !raw.len().is_multiple_of(4) {
            return Err(ApiError::bad(
                "bad_tokens",
                "a binary lookup carries its tokens after the head, as whole little-endian u32s",
            ));
        }
        spec.tokens = kvtier_client::wire::tokens_from_le(&raw);
        spec
    } else {
        input::json(&app, &body)?
    };
    let prompt = prompt_of(&app, &scope, &spec)?;
    let found = app.engine.lookup(&prompt);
    // The answer is written directly: its strings hold only hex digits and tier letters,
    // which JSON needs no escaping for (a serializer scanned them byte by byte).
    let n = found.blocks.len();
    let mut out = Vec::with_capacity(64 + n * (HANDLE_HEX_LEN + 1));
    out.extend_from_slice(b"{\"matched_tokens\":");
    out.extend_from_slice(found.matched_tokens.to_string().as_bytes());
    out.extend_from_slice(b",\"handles\":\"");
    for b in &found.blocks {
        input::push_hex(&mut out, &b.hash.0);
    }
    out.extend_from_slice(b"\",\"tiers\":\"");
    out.extend(found.blocks.iter().map(|b| b.tier.letter() as u8));
    out.push(b'"');
    if let Some(state) = found.state {
        out.extend_from_slice(b",\"state\":{\"blocks\":");
        out.extend_from_slice(state.blocks.to_string().as_bytes());
        out.extend_from_slice(b",\"tier\":\"");
        out.push(state.tier.letter() as u8);
        out.extend_from_slice(b"\"}");
    }
    out.push(b'}');
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        out,
    )
        .into_response())
}

/// `POST /v1/load`: the blocks named by lookup handles, in one framed binary stream.
pub async fn load(
    State(app): App,
    Extension(scope): Extension<Scope>,
    body: Body,
) -> Result<Response, ApiError> {
    let req: LoadRequest = input::json_body(&app, body).await?;
    let layout = known_layout(&app, &scope, &req.layout)?;
    if !req.handles.len().is_multiple_of(HANDLE_HEX_LEN) {
        return Err(ApiError::bad(
            "bad_handles",
            format!(
                "handles are {HANDLE_HEX_LEN} hex digits per block; got {} digits",
                req.handles.len()
            ),
        ));
    }
    let count = req.handles.len() / HANDLE_HEX_LEN;
    let most = app.node.settings.read().max_tokens / layout.tokens_per_block();
    if count > most {
        return Err(ApiError::bad(
            "too_many_blocks",
            format!("{count} handles; at most {most} blocks fit in max_tokens"),
        ));
    }
    let hashes = (0..count)
        .map(|i| {
            let h = req
                .handles
                .get(i * HANDLE_HEX_LEN..(i + 1) * HANDLE_HEX_LEN);
            input::block_hash(h.unwrap_or(""))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let layers = match req.layers {
        None => None,
        Some([a, b]) if a < b && b <= layout.geometry().num_layers => Some(a..b),
        Some([a, b]) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "bad_layers",
                format!(
                    "layer range {a}..{b} is empty or past the layout's {} layers",
                    layout.geometry().num_layers
                ),
            ));
        }
    };
    // Resolving reads memory only; the blocks are read batch by batch as the response
    // is sent (see `load_stream`).
    let resolved = match &req.chains {
        None => app.engine.resolve(layout.digest(), &hashes)?,
        Some(chains) => {
            super::batch::resolve_chains(&app.engine, layout.digest(), &hashes, chains)?
        }
    };
    let per_block = match &layers {
        Some(r) => layout
            .geometry()
            .layer_range(r.clone())
            .map_or(layout.block_bytes(), |b| b.end - b.start),
        None => layout.block_bytes(),
    };
    let stream = super::load_stream::blocks(
        app.engine.clone(),
        resolved,
        hashes.len(),
        layers,
        per_block,
    );
    let mut resp = Body::from_stream(stream).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(BLOCKS_CONTENT_TYPE),
    );
    Ok(resp)
}

/// Splits an upload body into its JSON head and payload bytes.
pub(super) fn upload<T: serde::de::DeserializeOwned>(
    app: &AppState,
    body: &Bytes,
) -> Result<(T, Bytes), ApiError> {
    let (head, payload) = frame::split_upload(body).map_err(|e| ApiError::bad("bad_upload", e))?;
    let head = input::json(app, head)?;
    let start = body.len() - payload.len();
    Ok((head, body.slice(start..)))
}

/// The acknowledgement a store asks for with `?durability=queued|written|synced`; `None`
/// without the parameter (the server's default applies; a stronger default wins).
pub(super) fn asked_ack(uri: &axum::http::Uri) -> Result<Option<kvtier_core::Ack>, ApiError> {
    let mut ack = None;
    for pair in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "durability" {
            return Err(ApiError::bad(
                "bad_query",
                format!("unknown query parameter `{name}` (only `durability`)"),
            ));
        }
        let level: kvtier_core::Ack = value.parse().map_err(|_| {
            ApiError::bad(
                "bad_query",
                format!("durability `{value}`: expected queued, written or synced"),
            )
        })?;
        ack = Some(level);
    }
    Ok(ack)
}

/// `POST /v1/store`: the blocks of a token sequence, all validated before any is kept.
/// Answers only once the blocks are as durable as asked (`?durability=`) or as the
/// server's default promises, whichever is stronger.
pub async fn store(
    State(app): App,
    Extension(scope): Extension<Scope>,
    uri: axum::http::Uri,
    body: Body,
) -> Result<Json<StoreAnswer>, ApiError> {
    // The body first: one over the limit is answered 413 whatever else is wrong.
    let mut chunks = BodyChunks::new(body, limit(&app))?;
    let ack = match asked_ack(&uri) {
        Ok(ack) => ack,
        Err(e) => return Err(chunks.refuse(e).await),
    };
    let (spec, first): (PromptSpec, Bytes) = match upload::read_head(&app, &mut chunks).await {
        Ok(head) => head,
        Err(e) => return Err(chunks.refuse(e).await),
    };
    store_payload(app, &scope, ack, spec, chunks, first).await
}

/// A store of the payload still to come in `chunks` (after `first`), for the prompt
/// `spec` names, acknowledged at `ack` (or the server's stronger default). The payload is
/// read straight into the blocks' own buffers, which the engine keeps without a copy.
pub(super) async fn store_payload(
    app: Arc<AppState>,
    scope: &Scope,
    ack: Option<kvtier_core::Ack>,
    spec: PromptSpec,
    mut chunks: BodyChunks,
    first: Bytes,
) -> Result<Json<StoreAnswer>, ApiError> {
    let prompt = match prompt_of(&app, scope, &spec) {
        Ok(p) => p,
        // Answered before the payload was read: read it anyway, so the answer is not lost
        // to a connection reset (and is 413 if the payload is over the limit).
        Err(e) => return Err(chunks.refuse(e).await),
    };
    let block = prompt.layout().block_bytes() as usize;
    let read = match upload::read_blocks(
        &mut chunks,
        first,
        &app.engine,
        block,
        prompt.num_blocks(),
    )
    .await
    {
        Ok(read) => read,
        Err(e) => return Err(chunks.refuse(e).await),
    };
    if read.payload_len % block as u64 != 0 {
        return Err(ApiError::bad(
            "bad_payload_length",
            format!(
                "{} payload bytes are not a whole number of {block}-byte blocks of layout {}",
                read.payload_len, spec.layout
            ),
        ));
    }
    let n = read.payload_len / block as u64;
    if n > prompt.num_blocks() as u64 {
        return Err(ApiError::bad(
            "bad_payload_length",
            format!(
                "{n} blocks of payload for {} tokens, which make {} whole blocks",
                prompt.tokens().len(),
                prompt.num_blocks()
            ),
        ));
    }
    let engine = app.engine.clone();
    let report = blocking(move || {
        let options = kvtier_core::StoreOptions {
            ack,
            ..Default::default()
        };
        Ok(engine.store_owned(&prompt, read.blocks, options)?)
    })
    .await?;
    Ok(Json(StoreAnswer::from(&report)))
}

fn session(spec: &SnapshotSpec) -> Result<Option<Vec<u8>>, ApiError> {
    spec.session
        .as_deref()
        .map(|s| input::hex_bytes("session", s))
        .transpose()
}

/// `PUT /v1/snapshot`: recurrent state after exactly these tokens.
pub async fn snapshot_put(
    State(app): App,
    Extension(scope): Extension<Scope>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(body, limit(&app)).await?;
    let (spec, blob): (SnapshotSpec, Bytes) = upload(&app, &body)?;
    let layout = known_layout(&app, &scope, &spec.layout)?;
    let session = session(&spec)?;
    let engine = app.engine.clone();
    let outcome = blocking(move || {
        Ok(engine.snapshot_put(layout.digest(), &spec.tokens, session.as_deref(), &blob)?)
    })
    .await?;
    Ok(put_answer(outcome))
}

/// The answer to a snapshot or checkpoint put: `{"stored": true}`, or 507 with `false`
/// when the bucket could not make room for it.
pub(super) fn put_answer(outcome: kvtier_core::snapshot::SnapshotPut) -> Response {
    let stored = !matches!(outcome, kvtier_core::snapshot::SnapshotPut::Rejected);
    let status = if stored {
        StatusCode::OK
    } else {
        StatusCode::INSUFFICIENT_STORAGE
    };
    (status, Json(serde_json::json!({ "stored": stored }))).into_response()
}

/// `POST /v1/snapshot/get`: the state stored for exactly these tokens, or 404.
pub async fn snapshot_get(
    State(app): App,
    Extension(scope): Extension<Scope>,
    body: Body,
) -> Result<Response, ApiError> {
    let spec: SnapshotSpec = input::json_body(&app, body).await?;
    let layout = known_layout(&app, &scope, &spec.layout)?;
    let session = session(&spec)?;
    let engine = app.engine.clone();
    let got = blocking(move || {
        Ok(engine.snapshot_get(layout.digest(), &spec.tokens, session.as_deref())?)
    })
    .await?;
    match got {
        Some(blob) => Ok((
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            )],
            blob,
        )
            .into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "snapshot_miss",
            "no snapshot is stored for exactly this prefix",
        )),
    }
}

/// `DELETE /v1/layouts/{layout}`: every block of a layout, in every tier.
pub async fn delete_layout(
    State(app): App,
    Extension(scope): Extension<Scope>,
    Path(digest): Path<String>,
) -> Result<Response, ApiError> {
    let layout = known_layout(&app, &scope, &digest)?;
    let engine = app.engine.clone();
    let removed = blocking(move || Ok(engine.delete_namespace(layout.digest())?)).await?;
    Ok(Json(serde_json::json!({ "removed_blocks": removed })).into_response())
}

/// `GET /v1/stats`: every counter of the node and the edge, by flat name — the same
/// samples `GET /metrics` renders.
pub async fn stats(State(app): App) -> Json<BTreeMap<String, u64>> {
    Json(crate::metrics::all_samples(&app.node.sources()).flat())
}
