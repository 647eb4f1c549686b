//! A client of `kvtier serve`, with the embedded engine's calls. Requests run on a small
//! runtime of the client's own while the calling thread waits with the GIL released;
//! stores send the caller's buffers to the socket as they are, loads read into the
//! caller's buffer or into buffers handed out as read-only blocks.

use bytes::Bytes;
use kvtier_client::wire::{
    CheckpointSpec, LayoutSpec, LoadRequest, PromptSpec, SnapshotSpec, StateGroupSpec,
};
use kvtier_client::{Client as Http, ClientError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::block::Block;
use crate::errors::{self, invalid};
use crate::input::{Exported, exports_of, payloads_of, room_for, store_report};
use crate::layout::{Found, Hit, Layout};
use crate::state::{GroupArg, Restored, groups_of};

/// A client of one `kvtier serve` (`url`: `http://HOST:PORT`; `token`: the data token,
/// when the server requires one).
#[pyclass(frozen, module = "kvtier._kvtier")]
pub struct Client {
    http: Http,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    /// Runs `fut` to completion with the GIL released.
    fn call<T: Send>(
        &self,
        py: Python<'_>,
        fut: impl Future<Output = Result<T, ClientError>> + Send,
    ) -> PyResult<T> {
        py.detach(|| self.runtime.block_on(fut))
            .map_err(from_client)
    }
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (url, token=None))]
    fn new(url: &str, token: Option<String>) -> PyResult<Self> {
        let mut http = Http::new(url).map_err(from_client)?;
        if let Some(token) = token {
            http = http.with_token(token);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kvtier-py-client")
            .enable_all()
            .build()
            .map_err(|e| {
                errors::raise(
                    "internal",
                    format!("cannot start the client's runtime: {e}"),
                )
            })?;
        Ok(Self { http, runtime })
    }

    /// Registers a layout with the server (the same arguments as `Engine.register_layout`).
    #[pyo3(signature = (
        model, dtype, tokens_per_block, num_layers, num_kv_heads, head_dim, *,
        tp_rank=0, tp_size=1, pp_stage=0, pp_size=1, lora_id=None, tenant_salt=None,
        weights_digest=None, tokenizer_digest=None, state_groups=None, checkpoint_every=None
    ))]
    #[allow(
        clippy::too_many_arguments,
        reason = "one keyword per part of the layout key"
    )]
    fn register_layout(
        &self,
        py: Python<'_>,
        model: &str,
        dtype: &str,
        tokens_per_block: u32,
        num_layers: u32,
        num_kv_heads: u32,
        head_dim: u32,
        tp_rank: u32,
        tp_size: u32,
        pp_stage: u32,
        pp_size: u32,
        lora_id: Option<String>,
        tenant_salt: Option<Vec<u8>>,
        weights_digest: Option<String>,
        tokenizer_digest: Option<String>,
        state_groups: Option<Vec<GroupArg>>,
        checkpoint_every: Option<u32>,
    ) -> PyResult<Layout> {
        let groups = groups_of(state_groups);
        let state_bytes = kvtier_core::StateGroup::total_bytes(&groups);
        let spec = LayoutSpec {
            model_id: model.to_owned(),
            weights_digest: weights_digest.unwrap_or_default(),
            tokenizer_digest: tokenizer_digest.unwrap_or_default(),
            dtype: dtype.to_owned(),
            tokens_per_block,
            num_layers,
            num_kv_heads,
            head_dim,
            tp_rank,
            tp_size,
            pp_stage,
            pp_size,
            lora_id,
            tenant_salt: hex(&tenant_salt.unwrap_or_default()),
            state_groups: groups
                .into_iter()
                .map(|g| StateGroupSpec {
                    kind: g.kind,
                    num_layers: g.num_layers,
                    state_bytes: g.state_bytes,
                })
                .collect(),
            checkpoint_every,
        };
        let info = self.call(py, self.http.register_layout(&spec))?;
        Ok(Layout::of_server(&info, dtype, state_bytes))
    }

    /// How many leading whole blocks of `tokens` the server holds under `layout`.
    fn lookup(&self, py: Python<'_>, layout: &Layout, tokens: Vec<u32>) -> PyResult<Hit> {
        let prompt = PromptSpec::new(layout.digest_hex(), tokens);
        let answer = self.call(py, self.http.lookup(&prompt))?;
        Ok(Hit::remote(answer, layout))
    }

    /// Stores the blocks of `tokens` (as `Engine.store`), sent from the caller's buffers
    /// as they are.
    fn store<'py>(
        &self,
        py: Python<'py>,
        layout: &Layout,
        tokens: Vec<u32>,
        blocks: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let exports = exports_of(blocks)?;
        let payloads = payloads_of(layout, &exports, blocks, tokens.len())?;
        let prompt = PromptSpec::new(layout.digest_hex(), tokens);
        let answer = self.call(py, self.http.store_from(&prompt, &payloads, None))?;
        drop(exports);
        store_report(
            py,
            answer.stored,
            answer.duplicates,
            answer.stored_lower_only,
            answer.stopped.as_deref(),
            &answer.durability,
        )
    }

    /// The matched blocks of `hit`, each a read-only view of the bytes received (fewer
    /// than `hit.blocks` when a block was lost since the lookup).
    fn load(&self, py: Python<'_>, hit: &Hit) -> PyResult<Vec<Block>> {
        let request = load_request(hit)?;
        let loaded = self.call(py, self.http.load(&request))?;
        Ok(loaded.blocks.into_iter().map(Block::new).collect())
    }

    /// Reads the matched blocks of `hit` straight into `out` (writable, C-contiguous, at
    /// least `hit.nbytes`, or the share of `layers`); the number of blocks written.
    /// `layers=(start, end)`: only those layers of each block, back to back.
    #[pyo3(signature = (hit, out, layers=None))]
    fn load_into(
        &self,
        py: Python<'_>,
        hit: &Hit,
        out: &Bound<'_, PyAny>,
        layers: Option<(u32, u32)>,
    ) -> PyResult<usize> {
        let mut request = load_request(hit)?;
        let per_block = hit.bytes_per_block(layers)?;
        request.layers = layers.map(|(start, end)| [start, end]);
        let mut target = Exported::get(out, true, "out")?;
        let dst = room_for(hit, per_block, &mut target)?;
        let (n, _status) = self.call(py, self.http.load_into(&request, dst))?;
        Ok(n)
    }

    /// Stores the recurrent state reached after exactly `tokens` (and `session`).
    #[pyo3(signature = (layout, tokens, state, session=None))]
    fn snapshot_put(
        &self,
        py: Python<'_>,
        layout: &Layout,
        tokens: Vec<u32>,
        state: &Bound<'_, PyAny>,
        session: Option<Vec<u8>>,
    ) -> PyResult<&'static str> {
        let blob = Exported::get(state, false, "state")?;
        // The request body owns its bytes: one copy of the state.
        let bytes = Bytes::copy_from_slice(blob.bytes());
        let spec = snapshot_spec(layout, tokens, session);
        self.call(py, self.http.snapshot_put(&spec, bytes))?;
        Ok("stored")
    }

    /// The state stored for exactly `tokens` (and `session`), or `None`.
    #[pyo3(signature = (layout, tokens, session=None))]
    fn snapshot_get(
        &self,
        py: Python<'_>,
        layout: &Layout,
        tokens: Vec<u32>,
        session: Option<Vec<u8>>,
    ) -> PyResult<Option<Block>> {
        let spec = snapshot_spec(layout, tokens, session);
        let got = self.call(py, self.http.snapshot_get(&spec))?;
        Ok(got.map(Block::new))
    }

    /// Keeps the recurrent state after the first `blocks` whole blocks of `tokens` on the
    /// server (as `Engine.checkpoint_put`): `stored`, or `rejected` when the server had
    /// no room for it.
    fn checkpoint_put(
        &self,
        py: Python<'_>,
        layout: &Layout,
        tokens: Vec<u32>,
        blocks: usize,
        state: &Bound<'_, PyAny>,
    ) -> PyResult<&'static str> {
        let blob = Exported::get(state, false, "state")?;
        layout.check_state(blob.bytes())?;
        // The request body owns its bytes: one copy of the state.
        let bytes = Bytes::copy_from_slice(blob.bytes());
        let spec = CheckpointSpec {
            layout: layout.digest_hex().to_owned(),
            tokens,
            extra_keys: Vec::new(),
            blocks,
        };
        let kept = self.call(py, self.http.checkpoint_put(&spec, bytes))?;
        Ok(if kept { "stored" } else { "rejected" })
    }

    /// Every part of the server's hit for `tokens` in one answer, or nothing (as
    /// `Engine.restore`).
    fn restore(&self, py: Python<'_>, layout: &Layout, tokens: Vec<u32>) -> PyResult<Restored> {
        let prompt = PromptSpec::new(layout.digest_hex(), tokens);
        let got = self.call(py, self.http.restore(&prompt))?;
        Ok(Restored::new(got.tokens, got.blocks, got.state))
    }

    /// The server's counters (`/v1/stats`).
    fn stats(&self, py: Python<'_>) -> PyResult<std::collections::BTreeMap<String, u64>> {
        self.call(py, self.http.stats())
    }
}

/// The load request for a server's hit; an error for the embedded engine's.
fn load_request(hit: &Hit) -> PyResult<LoadRequest> {
    match &hit.found {
        Found::Remote { handles } => Ok(LoadRequest {
            layout: hit.layout.clone(),
            handles: handles.clone(),
            layers: None,
        }),
        Found::Local(_) => Err(invalid(
            "this hit came from an Engine: load it with the Engine",
        )),
    }
}

fn snapshot_spec(layout: &Layout, tokens: Vec<u32>, session: Option<Vec<u8>>) -> SnapshotSpec {
    SnapshotSpec {
        layout: layout.digest_hex().to_owned(),
        tokens,
        session: session.map(|s| hex(&s)),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A client error as a Python exception: the server's error code names the kind where it
/// is one (`invalid`, `no_space`, …), else the HTTP status does; no answer at all is
/// `unavailable`.
fn from_client(e: ClientError) -> PyErr {
    let kind = match &e {
        ClientError::Api { status, code, .. } => match (code.as_str(), *status) {
            (k @ ("invalid" | "no_space" | "corrupt" | "unavailable" | "internal"), _) => k,
            (_, 503) => "unavailable",
            (_, 507) => "no_space",
            (_, 400..=499) => "invalid",
            _ => "internal",
        },
        ClientError::Transport(_) | ClientError::Protocol(_) => "unavailable",
    };
    let code = match &e {
        ClientError::Api { code, .. } => Some(code.clone()),
        _ => None,
    };
    errors::raise_with_code(kind, e.to_string(), code)
}
