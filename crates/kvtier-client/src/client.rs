//! The async client.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Deadlines;
use crate::conn::{Pool, Response};
use crate::reader::{BlockSink, IntoSlice, OwnedBlocks, read_stream};
use crate::wire::frame::{self, EndStatus};
use crate::wire::{
    BatchLookupAnswer, BatchSpec, BatchStoreAnswer, CheckpointSpec, ErrorBody, FlushAnswer, Health,
    LayoutInfo, LayoutSpec, LoadRequest, LookupAnswer, PromptSpec, Readiness, RestoreHead,
    SnapshotSpec, SsdAdmin, SsdAdminAnswer, StoreAnswer, UPLOAD_CONTENT_TYPE, tokens_to_b64,
};

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
    /// No whole answer within the call's deadline ([`Deadlines`]): the server is stalled
    /// or unreachable. The connection was closed.
    #[error("no answer to {what} within {after:?}")]
    Deadline {
        /// The call (`/v1/lookup`, `/v1/load`, …).
        what: String,
        /// The deadline it had.
        after: Duration,
    },
}

impl ClientError {
    /// True for answers worth retrying unchanged: 503 (the server is reattaching a tier
    /// or shutting down) and transport failures.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Transport(_) | ClientError::Deadline { .. } => true,
            ClientError::Api { status, .. } => *status == 503,
            ClientError::Protocol(_) => false,
        }
    }
}

type Result<T> = std::result::Result<T, ClientError>;

/// What [`Client::restore`] returned: every part of one boundary, or nothing.
#[derive(Debug, Clone, Default)]
pub struct RestoredPrefix {
    /// Prompt tokens the restored parts carry (0: nothing was restored).
    pub tokens: usize,
    /// The KV blocks, in order (empty for a layout without attention layers).
    pub blocks: Vec<Bytes>,
    /// The recurrent state after `tokens` tokens, for a layout with state groups.
    pub state: Option<Bytes>,
}

impl RestoredPrefix {
    /// Reads a `/v1/restore` answer, checking that its parts add up to its length.
    fn parse(body: &Bytes) -> Result<Self> {
        let protocol = |m: String| ClientError::Protocol(format!("/v1/restore: {m}"));
        let (json, raw) = frame::split_upload(body).map_err(protocol)?;
        let head: RestoreHead =
            serde_json::from_slice(json).map_err(|e| protocol(e.to_string()))?;
        let kv = (head.blocks as u64)
            .checked_mul(head.block_bytes)
            .ok_or_else(|| protocol("block count overflows".into()))?;
        if kv.checked_add(head.state_bytes) != Some(raw.len() as u64) {
            return Err(protocol(format!(
                "{} blocks of {} bytes and {} bytes of state announced, {} bytes sent",
                head.blocks,
                head.block_bytes,
                head.state_bytes,
                raw.len()
            )));
        }
        let start = body.len() - raw.len();
        let b = head.block_bytes as usize;
        let blocks = (0..head.blocks)
            .map(|i| body.slice(start + i * b..start + (i + 1) * b))
            .collect();
        let state = (head.state_bytes > 0).then(|| body.slice(start + kv as usize..));
        Ok(Self {
            tokens: head.tokens,
            blocks,
            state,
        })
    }
}

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
    /// Lookups and loads: read straight from the socket (see `conn`).
    pool: std::sync::Arc<Pool>,
    base: String,
    token: Option<String>,
    deadlines: Deadlines,
}

impl Client {
    /// A client of the server at `base_url` (e.g. `http://127.0.0.1:7700`), with the
    /// default [`Deadlines`].
    pub fn new(base_url: &str) -> Result<Self> {
        Self::with_deadlines(base_url, Deadlines::DEFAULT)
    }

    /// A client of the server at `base_url` whose calls fail past `deadlines`.
    pub fn with_deadlines(base_url: &str, deadlines: Deadlines) -> Result<Self> {
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(64)
            .connect_timeout(deadlines.connect)
            .build()?;
        let pool = Pool::new(base_url, deadlines.connect).ok_or_else(|| {
            ClientError::Protocol(format!("`{base_url}` is not an http://host:port address"))
        })?;
        Ok(Self {
            http,
            pool: std::sync::Arc::new(pool),
            base: base_url.trim_end_matches('/').to_string(),
            token: None,
            deadlines,
        })
    }

    /// The deadlines of this client's calls.
    pub fn deadlines(&self) -> Deadlines {
        self.deadlines
    }

    /// Sends `token` as a bearer token with every request.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// A small call, bounded by the request deadline (reqwest's timeout covers the whole
    /// exchange, the body's reading included).
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.request_within(method, path, self.deadlines.request)
    }

    /// A call that moves blocks, bounded by the transfer deadline.
    fn transfer(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.request_within(method, path, self.deadlines.transfer)
    }

    fn request_within(
        &self,
        method: reqwest::Method,
        path: &str,
        deadline: Duration,
    ) -> reqwest::RequestBuilder {
        let r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(deadline);
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
        Err(api_error(status.as_u16(), &body))
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
        self.post_within(path, body, self.deadlines.request).await
    }

    /// [`Client::post_json`] for an admin call that waits on the disk or the network
    /// (a flush, a reattach, a withdrawal): bounded by the transfer deadline.
    async fn post_admin<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T> {
        self.post_within(path, body, self.deadlines.transfer).await
    }

    async fn post_within<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        deadline: Duration,
    ) -> Result<T> {
        let resp = self
            .request_within(reqwest::Method::POST, path, deadline)
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
        within(
            "/v1/lookup",
            self.deadlines.request,
            self.lookup_now(prompt),
        )
        .await
    }

    async fn lookup_now(&self, prompt: &PromptSpec) -> Result<LookupAnswer> {
        // The binary form: a JSON head without tokens, then the tokens as LE u32s.
        let head = PromptSpec {
            layout: prompt.layout.clone(),
            tokens: Vec::new(),
            tokens_b64: None,
            extra_keys: prompt.extra_keys.clone(),
        };
        let json = serde_json::to_vec(&head).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let tokens = prompt.token_ids().map_err(ClientError::Protocol)?;
        let mut body = Vec::with_capacity(12 + json.len() + 4 * tokens.len());
        body.extend_from_slice(&frame::upload_head(json.len() as u32));
        body.extend_from_slice(&json);
        crate::wire::tokens_to_le(&tokens, &mut body);
        self.fast_json("/v1/lookup", UPLOAD_CONTENT_TYPE, &[&body])
            .await
    }

    /// Many short prompts' cached prefixes in one request (SGLang's pages: a prompt each),
    /// in the prompts' order; bounded by the request deadline.
    pub async fn lookup_batch(
        &self,
        layout: &str,
        prompts: &[&[u32]],
    ) -> Result<BatchLookupAnswer> {
        let spec = batch_spec(layout, prompts);
        let body = serde_json::to_vec(&spec).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let answer: BatchLookupAnswer = within(
            "/v1/lookup/batch",
            self.deadlines.request,
            self.fast_json("/v1/lookup/batch", "application/json", &[&body]),
        )
        .await?;
        if answer.hits.len() != prompts.len() {
            return Err(ClientError::Protocol(format!(
                "/v1/lookup/batch: {} answers for {} prompts",
                answer.hits.len(),
                prompts.len()
            )));
        }
        Ok(answer)
    }

    /// Loads the blocks named by a lookup's handles, in one response; each block in a
    /// buffer of its own.
    pub async fn load(&self, request: &LoadRequest) -> Result<LoadedPrefix> {
        let mut sink = OwnedBlocks::default();
        let status = self.load_with(request, &mut sink).await?;
        Ok(LoadedPrefix {
            blocks: sink.blocks,
            status,
        })
    }

    /// Loads the blocks named by a lookup's handles into `dst`, one after another (block
    /// `i` of `n`-byte blocks at `i·n`), as an engine fills its own staging memory. Returns
    /// how many blocks arrived and why the stream ended. A stream that would overrun
    /// `dst` is refused before any byte past its end is written.
    pub async fn load_into(
        &self,
        request: &LoadRequest,
        dst: &mut [u8],
    ) -> Result<(usize, EndStatus)> {
        let mut sink = IntoSlice::new(dst);
        let status = self.load_with(request, &mut sink).await?;
        Ok((sink.blocks, status))
    }

    async fn load_with(
        &self,
        request: &LoadRequest,
        sink: &mut dyn BlockSink,
    ) -> Result<EndStatus> {
        let body = serde_json::to_vec(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
        within("/v1/load", self.deadlines.transfer, async {
            let r = self.fast("/v1/load", "application/json", &[&body]).await?;
            read_stream(&self.pool, r, sink).await
        })
        .await
    }

    /// Sends a body (its parts in order) over the fast connection pool; an error status
    /// becomes [`ClientError::Api`].
    /// [`Client::fast`], then the answer's body read and parsed as JSON.
    async fn fast_json<T: DeserializeOwned>(
        &self,
        path: &str,
        content_type: &str,
        body: &[&[u8]],
    ) -> Result<T> {
        let r = self.fast(path, content_type, body).await?;
        let answer = self
            .pool
            .body(r)
            .await
            .map_err(|e| ClientError::Protocol(format!("{path}: {e}")))?;
        serde_json::from_slice(&answer).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    async fn fast(&self, path: &str, content_type: &str, body: &[&[u8]]) -> Result<Response> {
        let r = self
            .pool
            .send("POST", path, self.token.as_deref(), content_type, body)
            .await
            .map_err(|e| ClientError::Protocol(format!("{path}: {e}")))?;
        if r.status == 200 {
            return Ok(r);
        }
        let status = r.status;
        let body = self
            .pool
            .body(r)
            .await
            .map_err(|e| ClientError::Protocol(format!("{path}: {e}")))?;
        Err(api_error(status, &body))
    }

    /// Stores `payloads[i]` as block `i` of `prompt` (each exactly one block of its
    /// layout). The payloads are sent as they are, without a copy.
    pub async fn store(&self, prompt: &PromptSpec, payloads: Vec<Bytes>) -> Result<StoreAnswer> {
        self.store_durable(prompt, payloads, None).await
    }

    /// Stores like [`Client::store`], answered only once the blocks are at least as durable
    /// as `durability` asks: `"written"` (they survive a kill of the server) or `"synced"`
    /// (they survive a power loss); `None` takes the server's default. A server that cannot
    /// keep that promise answers an error, never a success.
    pub async fn store_durable(
        &self,
        prompt: &PromptSpec,
        payloads: Vec<Bytes>,
        durability: Option<&str>,
    ) -> Result<StoreAnswer> {
        let parts: Vec<&[u8]> = payloads.iter().map(|p| &p[..]).collect();
        self.store_from(prompt, &parts, durability).await
    }

    /// Stores `payloads[i]` as block `i` of `prompt` straight from the caller's memory (an
    /// engine's own KV buffers): each payload is written to the socket as it is, so the
    /// kernel's copy is the only one on this side. `durability` as in
    /// [`Client::store_durable`].
    pub async fn store_from(
        &self,
        prompt: &PromptSpec,
        payloads: &[&[u8]],
        durability: Option<&str>,
    ) -> Result<StoreAnswer> {
        let head = upload_head(&prompt.compact())?;
        let path = durable_path("/v1/store", durability);
        let mut parts = Vec::with_capacity(payloads.len() + 1);
        parts.push(&head[..]);
        parts.extend_from_slice(payloads);
        within(
            "/v1/store",
            self.deadlines.transfer,
            self.fast_json(&path, UPLOAD_CONTENT_TYPE, &parts),
        )
        .await
    }

    /// Stores many short prompts in one request: `payloads` are every whole block of each
    /// prompt, prompt after prompt, sent as they are; one answer per prompt, in order.
    /// `durability` as in [`Client::store_durable`].
    pub async fn store_batch(
        &self,
        layout: &str,
        prompts: &[&[u32]],
        payloads: &[&[u8]],
        durability: Option<&str>,
    ) -> Result<BatchStoreAnswer> {
        let head = upload_head(&batch_spec(layout, prompts))?;
        let path = durable_path("/v1/store/batch", durability);
        let mut parts = Vec::with_capacity(payloads.len() + 1);
        parts.push(&head[..]);
        parts.extend_from_slice(payloads);
        let answer: BatchStoreAnswer = within(
            "/v1/store/batch",
            self.deadlines.transfer,
            self.fast_json(&path, UPLOAD_CONTENT_TYPE, &parts),
        )
        .await?;
        if answer.answers.len() != prompts.len() {
            return Err(ClientError::Protocol(format!(
                "/v1/store/batch: {} answers for {} prompts",
                answer.answers.len(),
                prompts.len()
            )));
        }
        Ok(answer)
    }

    /// Stores the recurrent state reached after exactly `spec.tokens`.
    pub async fn snapshot_put(&self, spec: &SnapshotSpec, blob: Bytes) -> Result<()> {
        let body = upload_body(spec, vec![blob])?;
        let resp = self
            .transfer(reqwest::Method::PUT, "/v1/snapshot")
            .header(reqwest::header::CONTENT_TYPE, UPLOAD_CONTENT_TYPE)
            .body(body)
            .send()
            .await?;
        Self::check(resp).await.map(|_| ())
    }

    /// The state stored for exactly `spec.tokens`, if any.
    pub async fn snapshot_get(&self, spec: &SnapshotSpec) -> Result<Option<Bytes>> {
        let resp = self
            .transfer(reqwest::Method::POST, "/v1/snapshot/get")
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

    /// Stores the recurrent state reached after the first `spec.blocks` whole blocks of
    /// the prompt (a checkpoint boundary of its layout). Whether it was kept: `false`
    /// when the server's checkpoint bucket could not make room.
    pub async fn checkpoint_put(&self, spec: &CheckpointSpec, state: Bytes) -> Result<bool> {
        let body = upload_body(spec, vec![state])?;
        let resp = self
            .transfer(reqwest::Method::PUT, "/v1/checkpoint")
            .header(reqwest::header::CONTENT_TYPE, UPLOAD_CONTENT_TYPE)
            .body(body)
            .send()
            .await?;
        if resp.status() == reqwest::StatusCode::INSUFFICIENT_STORAGE {
            return Ok(false);
        }
        Self::check(resp).await.map(|_| true)
    }

    /// Looks `prompt` up and reads every part of the hit in one request: its KV blocks
    /// and, for a layout with state groups, the recurrent state at their end. All or
    /// nothing: [`RestoredPrefix::tokens`] is 0 and both parts are empty when any part
    /// could not be read.
    pub async fn restore(&self, prompt: &PromptSpec) -> Result<RestoredPrefix> {
        let resp = self
            .transfer(reqwest::Method::POST, "/v1/restore")
            .json(&prompt.compact())
            .send()
            .await?;
        let body = Self::check(resp).await?.bytes().await?;
        RestoredPrefix::parse(&body)
    }

    /// Deletes every block of a layout; returns how many were removed.
    pub async fn delete_layout(&self, layout: &str) -> Result<u64> {
        let resp = self
            .transfer(reqwest::Method::DELETE, &format!("/v1/layouts/{layout}"))
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

    /// `GET /readyz`: whether the node is ready, check by check (answered as well when it
    /// is not: the 503's body is the same document).
    pub async fn ready(&self) -> Result<Readiness> {
        let resp = self.request(reqwest::Method::GET, "/readyz").send().await?;
        if resp.status() != reqwest::StatusCode::SERVICE_UNAVAILABLE {
            return self.json(resp).await;
        }
        let body = resp.bytes().await?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(e.to_string()))
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
        self.post_admin("/admin/ssd", request).await
    }

    /// `POST /admin/flush`: waits until everything queued for the SSD is written; true
    /// only if it all was (see [`Client::admin_flush_report`]).
    pub async fn admin_flush(&self) -> Result<bool> {
        Ok(self.admin_flush_report().await?.drained)
    }

    /// `POST /admin/flush`, the whole answer: whether everything queued was written and
    /// synced, and how many blocks queued since the previous flush were not.
    pub async fn admin_flush_report(&self) -> Result<FlushAnswer> {
        self.post_admin("/admin/flush", &serde_json::json!({}))
            .await
    }

    /// `POST /admin/cluster/withdraw`: deletes this replica's object `manifest` from the
    /// shared tier in two phases (withdrawn now, deleted after the grace window). Another
    /// replica's object is refused (403).
    pub async fn admin_cluster_withdraw(&self, manifest: &str) -> Result<serde_json::Value> {
        self.post_admin(
            "/admin/cluster/withdraw",
            &serde_json::json!({ "object": manifest }),
        )
        .await
    }
}

/// Runs `call`, failing with [`ClientError::Deadline`] if it has not finished within
/// `deadline` (the call, and the connection it held, are dropped).
async fn within<T>(
    what: &str,
    deadline: Duration,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(deadline, call)
        .await
        .unwrap_or_else(|_| {
            Err(ClientError::Deadline {
                what: what.to_string(),
                after: deadline,
            })
        })
}

/// A store's path with the acknowledgement it asks for (`?durability=`), if any.
fn durable_path(path: &str, durability: Option<&str>) -> String {
    match durability {
        Some(d) => format!("{path}?durability={d}"),
        None => path.to_string(),
    }
}

/// A batch's prompts in the wire's compact form.
fn batch_spec(layout: &str, prompts: &[&[u32]]) -> BatchSpec {
    BatchSpec {
        layout: layout.to_string(),
        prompts: prompts.iter().map(|p| tokens_to_b64(p)).collect(),
    }
}

/// An upload's frame and JSON head: what precedes its payload.
fn upload_head<H: Serialize>(head: &H) -> Result<Vec<u8>> {
    let json = serde_json::to_vec(head).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let json_len = u32::try_from(json.len())
        .map_err(|_| ClientError::Protocol("request head longer than 4 GiB".into()))?;
    let mut first = Vec::with_capacity(12 + json.len());
    first.extend_from_slice(&frame::upload_head(json_len));
    first.extend_from_slice(&json);
    Ok(first)
}

/// An upload body: the framing head, the JSON head, then the payloads, as a list of
/// buffers (sent without concatenating them).
fn upload_body<H: Serialize>(head: &H, payloads: Vec<Bytes>) -> Result<reqwest::Body> {
    let mut parts = Vec::with_capacity(payloads.len() + 1);
    parts.push(Bytes::from(upload_head(head)?));
    parts.extend(payloads);
    let stream = futures_util::stream::iter(parts.into_iter().map(Ok::<_, std::io::Error>));
    Ok(reqwest::Body::wrap_stream(stream))
}

/// An error answer's status and body as [`ClientError::Api`].
fn api_error(status: u16, body: &[u8]) -> ClientError {
    let (code, message) = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => (e.error.code, e.error.message),
        Err(_) => ("unknown".into(), String::from_utf8_lossy(body).into_owned()),
    };
    ClientError::Api {
        status,
        code,
        message,
    }
}
