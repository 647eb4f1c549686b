//! The one Python class over the caller API ([`kvtier_node::Cache`]): an engine in this
//! process or a client of `kvtier serve`, with the same calls. The package's `Engine` and
//! `Client` are subclasses that only choose the constructor's arguments, and
//! `kvtier.open` shares one embedded engine per process and settings.
//!
//! Every call that copies bytes, hashes a prompt or touches a tier or the network runs
//! with the GIL released.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kvtier_core::snapshot::SnapshotPut;
use kvtier_core::{KvDtype, LayoutKey};
use kvtier_node::{Cache as Inner, Settings};
use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::block::Block;
use crate::errors::{closed, from_core, invalid, with_code};
use crate::input::{Exported, exports_of, payloads_of, store_report};
use crate::layout::{Hit, Layout};
use crate::state::{GroupArg, Restored, groups_of};

/// How long `close()` (and a garbage-collected engine) waits for queued writes.
const CLOSE_WITHIN: Duration = Duration::from_secs(30);

/// A kvtier cache: an engine in this process (`settings`, a dict in the settings file's
/// shape such as `{"ram": "2GiB", "ssd": {"enabled": False}}`, or `config_file`, a
/// settings file; defaults are those of `kvtier serve`), or a client of the `kvtier
/// serve` at `url` (`http://HOST:PORT`; `token`: the data token or a tenant's, when it
/// requires one).
#[pyclass(frozen, subclass, module = "kvtier._kvtier")]
pub struct Cache {
    /// `None` once closed.
    inner: RwLock<Option<Arc<Inner>>>,
}

impl Cache {
    fn inner(&self) -> PyResult<Arc<Inner>> {
        self.inner.read().clone().ok_or_else(closed)
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        if let Some(cache) = self.inner.get_mut().take() {
            cache.close(CLOSE_WITHIN);
        }
    }
}

/// The settings of an embedded engine: a dict (through JSON, so the same serde
/// definitions as the settings file apply: names, units, defaults) or a file.
fn settings_of(
    py: Python<'_>,
    settings: Option<&Bound<'_, PyDict>>,
    config_file: Option<PathBuf>,
) -> PyResult<Settings> {
    match (settings, config_file) {
        (Some(_), Some(_)) => Err(invalid("give settings or a config file, not both")),
        (Some(dict), None) => {
            let json: String = py
                .import("json")?
                .call_method1("dumps", (dict,))?
                .extract()?;
            serde_json::from_str(&json).map_err(|e| invalid(format!("settings: {e}")))
        }
        (None, Some(path)) => Settings::from_file(&path).map_err(from_core),
        (None, None) => Ok(Settings::default()),
    }
}

/// A client's deadlines from Python's `connect_timeout`, `request_timeout` and
/// `transfer_timeout` (seconds; `None`: the default).
fn deadlines_of(timeouts: [Option<f64>; 3]) -> PyResult<kvtier_node::Deadlines> {
    let mut d = kvtier_node::Deadlines::DEFAULT;
    let names = ["connect_timeout", "request_timeout", "transfer_timeout"];
    let slots = [&mut d.connect, &mut d.request, &mut d.transfer];
    for ((value, name), slot) in timeouts.into_iter().zip(names).zip(slots) {
        if let Some(secs) = value {
            *slot = std::time::Duration::try_from_secs_f64(secs)
                .ok()
                .filter(|t| !t.is_zero())
                .ok_or_else(|| {
                    invalid(format!(
                        "{name} must be a positive number of seconds, not {secs}"
                    ))
                })?;
        }
    }
    Ok(d)
}

#[pymethods]
impl Cache {
    #[new]
    #[pyo3(signature = (
        url=None,
        settings=None,
        *,
        config_file=None,
        token=None,
        shm=None,
        connect_timeout=None,
        request_timeout=None,
        transfer_timeout=None,
    ))]
    #[expect(clippy::too_many_arguments, reason = "Python's keyword arguments")]
    fn new(
        py: Python<'_>,
        url: Option<&str>,
        settings: Option<&Bound<'_, PyDict>>,
        config_file: Option<PathBuf>,
        token: Option<String>,
        shm: Option<PathBuf>,
        connect_timeout: Option<f64>,
        request_timeout: Option<f64>,
        transfer_timeout: Option<f64>,
    ) -> PyResult<Self> {
        let timeouts = [connect_timeout, request_timeout, transfer_timeout];
        let inner = match url {
            Some(url) => {
                if settings.is_some() || config_file.is_some() {
                    return Err(invalid(
                        "give a server's url or an engine's settings, not both",
                    ));
                }
                let deadlines = deadlines_of(timeouts)?;
                py.detach(|| Inner::served_with(url, token, shm.as_deref(), deadlines))
                    .map_err(from_core)?
            }
            None => {
                if token.is_some() {
                    return Err(invalid("a token is for a server's url"));
                }
                if shm.is_some() {
                    return Err(invalid("a shared arena's socket is for a server's url"));
                }
                if timeouts.iter().any(Option::is_some) {
                    return Err(invalid("timeouts are for a server's url"));
                }
                let settings = settings_of(py, settings, config_file)?;
                py.detach(|| Inner::open(settings)).map_err(from_core)?
            }
        };
        Ok(Self {
            inner: RwLock::new(Some(Arc::new(inner))),
        })
    }

    /// Registers a layout (registering the same one again returns it again).
    #[pyo3(signature = (
        model, dtype, tokens_per_block, num_layers, num_kv_heads, head_dim, *,
        tp_rank=0, tp_size=1, pp_stage=0, pp_size=1, lora_id=None, tenant_salt=None,
        weights_digest=None, tokenizer_digest=None, state_groups=None, checkpoint_every=None,
        cold_codec=None
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
        cold_codec: Option<&str>,
    ) -> PyResult<Layout> {
        // Parsed here for an engine and a server alike; a bad name gets the code the
        // server answers it with.
        let dtype: KvDtype = dtype.parse().map_err(|e| with_code(e, "bad_layout"))?;
        let mut key = LayoutKey::new(
            model,
            dtype,
            tokens_per_block,
            num_layers,
            num_kv_heads,
            head_dim,
        );
        key.tp_rank = tp_rank;
        key.tp_size = tp_size;
        key.pp_stage = pp_stage;
        key.pp_size = pp_size;
        key.lora_id = lora_id;
        key.tenant_salt = tenant_salt.unwrap_or_default();
        key.weights_digest = weights_digest.unwrap_or_default();
        key.tokenizer_digest = tokenizer_digest.unwrap_or_default();
        key.state_groups = groups_of(state_groups);
        key.cold_codec = cold_codec
            .map(str::parse)
            .transpose()
            .map_err(|e| with_code(e, "bad_layout"))?;
        let cache = self.inner()?;
        let inner = py
            .detach(|| cache.register_layout(key, checkpoint_every))
            .map_err(from_core)?;
        Ok(Layout { inner })
    }

    /// How many leading whole blocks of `tokens` are cached under `layout`. Memory only:
    /// no tier is read.
    fn lookup(&self, py: Python<'_>, layout: &Layout, tokens: Vec<u32>) -> PyResult<Hit> {
        let cache = self.inner()?;
        let inner = py
            .detach(|| cache.lookup(&layout.inner, &tokens))
            .map_err(from_core)?;
        Ok(Hit { inner })
    }

    /// `lookup` of many short prompts at once (SGLang's pages: a prompt each), in order: a
    /// server answers them in one request. `Hit.join` makes their blocks one load.
    fn lookup_many(
        &self,
        py: Python<'_>,
        layout: &Layout,
        prompts: Vec<Vec<u32>>,
    ) -> PyResult<Vec<Hit>> {
        let cache = self.inner()?;
        let tokens: Vec<&[u32]> = prompts.iter().map(|p| &p[..]).collect();
        let hits = py
            .detach(|| cache.lookup_many(&layout.inner, &tokens))
            .map_err(from_core)?;
        Ok(hits.into_iter().map(|inner| Hit { inner }).collect())
    }

    /// `store` of many short prompts at once: `blocks[i]` is prompt `i`'s blocks as
    /// `store` takes them; one answer per prompt, in order. A server over HTTP takes them
    /// in one request.
    fn store_many<'py>(
        &self,
        py: Python<'py>,
        layout: &Layout,
        prompts: Vec<Vec<u32>>,
        blocks: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let cache = self.inner()?;
        let items = blocks
            .try_iter()?
            .collect::<PyResult<Vec<Bound<'py, PyAny>>>>()?;
        if items.len() != prompts.len() {
            return Err(crate::errors::invalid(format!(
                "{} prompts with {} sets of blocks",
                prompts.len(),
                items.len()
            )));
        }
        let exports = items.iter().map(exports_of).collect::<PyResult<Vec<_>>>()?;
        let payloads = exports
            .iter()
            .zip(&items)
            .zip(&prompts)
            .map(|((e, b), t)| payloads_of(&layout.inner, e, b, t.len()))
            .collect::<PyResult<Vec<_>>>()?;
        let per_prompt: Vec<&[&[u8]]> = payloads.iter().map(|p| &p[..]).collect();
        let tokens: Vec<&[u32]> = prompts.iter().map(|p| &p[..]).collect();
        let answers = py
            .detach(|| cache.store_many(&layout.inner, &tokens, &per_prompt))
            .map_err(from_core)?;
        drop(exports);
        answers.iter().map(|a| store_report(py, a)).collect()
    }

    /// Stores the blocks of `tokens` under `layout`: `blocks` is one buffer holding whole
    /// blocks back to back, or a list or tuple of buffers of one block each (bytes,
    /// bytearray, contiguous numpy arrays, …; read in place, never kept: a server's are
    /// sent from them as they are).
    fn store<'py>(
        &self,
        py: Python<'py>,
        layout: &Layout,
        tokens: Vec<u32>,
        blocks: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let cache = self.inner()?;
        let exports = exports_of(blocks)?;
        let payloads = payloads_of(&layout.inner, &exports, blocks, tokens.len())?;
        let answer = py
            .detach(|| cache.store(&layout.inner, &tokens, &payloads))
            .map_err(from_core)?;
        drop(exports);
        store_report(py, &answer)
    }

    /// The matched blocks of `hit`, each a read-only view of the bytes (kvtier's own for
    /// an engine, those received for a server: no copy). Fewer than `hit.blocks` when a
    /// block was lost since the lookup: recompute from there.
    fn load(&self, py: Python<'_>, hit: &Hit) -> PyResult<Vec<Block>> {
        let cache = self.inner()?;
        let blocks = py
            .detach(|| cache.load(&hit.inner, None))
            .map_err(from_core)?;
        Ok(blocks.into_iter().map(Block::new).collect())
    }

    /// Copies the matched blocks of `hit` back to back into `out` (a writable,
    /// C-contiguous buffer of at least `hit.nbytes` bytes, or the share of `layers`); the
    /// number of blocks written (fewer than `hit.blocks` when a block was lost since the
    /// lookup). `layers=(start, end)`: only those layers of each block, back to back. A
    /// server's blocks are read from the socket straight into `out`.
    #[pyo3(signature = (hit, out, layers=None))]
    fn load_into(
        &self,
        py: Python<'_>,
        hit: &Hit,
        out: &Bound<'_, PyAny>,
        layers: Option<(u32, u32)>,
    ) -> PyResult<usize> {
        let cache = self.inner()?;
        let mut target = Exported::get(out, true, "out")?;
        let dst = target.bytes_mut();
        py.detach(|| cache.load_into(&hit.inner, layers, dst))
            .map_err(from_core)
    }

    /// Stores the recurrent state reached after exactly `tokens` (and `session`);
    /// `stored`, `replaced` or `rejected` (larger than the snapshot budget; a server
    /// answers `stored` for both kept outcomes).
    #[pyo3(signature = (layout, tokens, state, session=None))]
    fn snapshot_put(
        &self,
        py: Python<'_>,
        layout: &Layout,
        tokens: Vec<u32>,
        state: &Bound<'_, PyAny>,
        session: Option<Vec<u8>>,
    ) -> PyResult<&'static str> {
        let cache = self.inner()?;
        let blob = Exported::get(state, false, "state")?;
        let bytes = blob.bytes();
        let put = py
            .detach(|| cache.snapshot_put(&layout.inner, &tokens, session.as_deref(), bytes))
            .map_err(from_core)?;
        Ok(put_name(put))
    }

    /// The state stored for exactly `tokens` (and `session`), as a read-only view, or
    /// `None`.
    #[pyo3(signature = (layout, tokens, session=None))]
    fn snapshot_get(
        &self,
        py: Python<'_>,
        layout: &Layout,
        tokens: Vec<u32>,
        session: Option<Vec<u8>>,
    ) -> PyResult<Option<Block>> {
        let cache = self.inner()?;
        let got = py
            .detach(|| cache.snapshot_get(&layout.inner, &tokens, session.as_deref()))
            .map_err(from_core)?;
        Ok(got.map(Block::new))
    }

    /// Keeps `state`, the recurrent state of every state group of `layout` after exactly
    /// the first `blocks` whole blocks of `tokens` (a checkpoint boundary: a multiple of
    /// `layout.checkpoint_every` tokens); `stored`, `replaced` or `rejected` (no room for
    /// it). Refused for a layout without state groups, another boundary, or a state of
    /// another size.
    fn checkpoint_put(
        &self,
        py: Python<'_>,
        layout: &Layout,
        tokens: Vec<u32>,
        blocks: usize,
        state: &Bound<'_, PyAny>,
    ) -> PyResult<&'static str> {
        let cache = self.inner()?;
        let blob = Exported::get(state, false, "state")?;
        let bytes = blob.bytes();
        let put = py
            .detach(|| cache.checkpoint_put(&layout.inner, &tokens, blocks, bytes))
            .map_err(from_core)?;
        Ok(put_name(put))
    }

    /// Looks `tokens` up and reads every part of the hit at once: the KV blocks and, for
    /// a layout with state groups, the recurrent state at their end. All or nothing: a
    /// layout with state groups is restored only at a boundary where both are there and
    /// readable; otherwise nothing (`tokens` 0) and the caller computes the prompt.
    fn restore(&self, py: Python<'_>, layout: &Layout, tokens: Vec<u32>) -> PyResult<Restored> {
        let cache = self.inner()?;
        let restored = py
            .detach(|| cache.restore(&layout.inner, &tokens))
            .map_err(from_core)?;
        Ok(Restored::from(restored))
    }

    /// Where the cache's blocks lie in this process: `(address, nbytes)` of an engine's
    /// arena, one region mapped at start (every block stored into it lies inside, so a GPU
    /// can register it once and read blocks by DMA), or of the read-only mapping of a
    /// server's shared arena (a client opened with `shm`). `None` for a server's client
    /// over HTTP only and for an engine without an arena.
    #[getter]
    fn arena(&self) -> PyResult<Option<(usize, usize)>> {
        Ok(self.inner()?.arena())
    }

    /// `(address, nbytes)` of a shared-arena client's staging memory in this process (its
    /// reservations' places lie in it), for a GPU to register once; `None` for an engine
    /// and for a client over HTTP only.
    #[getter]
    fn staging(&self) -> PyResult<Option<(usize, usize)>> {
        Ok(self.inner()?.staging())
    }

    /// The matched blocks of `hit` held in place, for a caller that copies them itself (a
    /// GPU): a `Lease` whose `places` are `(address, nbytes)` of each block, read-only,
    /// valid until it is released. An engine's blocks lie in its arena, a server's in its
    /// shared arena (a client opened with `shm`); refused for a client over HTTP only.
    fn lease(&self, py: Python<'_>, hit: &Hit) -> PyResult<crate::direct::Lease> {
        let cache = self.inner()?;
        let lease = py.detach(|| cache.lease(&hit.inner)).map_err(from_core)?;
        Ok(crate::direct::Lease::new(lease))
    }

    /// Room for `blocks` blocks of `tokens` from block `first_block` on, written in place
    /// by the caller (a GPU) and then committed: a `Reservation` whose `places` are
    /// `(address, nbytes)` to write each block at. An engine's arena slots, or staging
    /// memory of a server's shared arena; refused for a client over HTTP only.
    #[pyo3(signature = (layout, tokens, blocks, first_block=0))]
    fn reserve(
        &self,
        py: Python<'_>,
        layout: &Layout,
        tokens: Vec<u32>,
        blocks: usize,
        first_block: usize,
    ) -> PyResult<crate::direct::Reservation> {
        let cache = self.inner()?;
        let reservation = py
            .detach(|| cache.reserve(&layout.inner, &tokens, first_block, blocks))
            .map_err(from_core)?;
        Ok(crate::direct::Reservation::new(reservation))
    }

    /// Every counter, by the names `/v1/stats` uses.
    fn stats(&self, py: Python<'_>) -> PyResult<BTreeMap<String, u64>> {
        let cache = self.inner()?;
        py.detach(|| cache.stats()).map_err(from_core)
    }

    /// Where an engine's KV events are published: `{"endpoint": ..., "replay_endpoint":
    /// ... or None, "epoch": ...}` (ports filled in); `None` without `kv_events.endpoint`
    /// and for a server (its settings say where it publishes).
    fn kv_events<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let cache = self.inner()?;
        let Some(k) = cache.node().and_then(|n| n.kv_events.as_ref()) else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("endpoint", k.endpoint())?;
        d.set_item("replay_endpoint", k.replay_endpoint())?;
        d.set_item("epoch", k.epoch())?;
        Ok(Some(d))
    }

    /// Writes everything an engine queued for the tiers below RAM and syncs them; true
    /// only if the queues drained within `timeout` seconds and every write since the
    /// previous flush reached its tier (a full disk's refusals make it false). A server
    /// is flushed through its admin API.
    #[pyo3(signature = (timeout=30.0))]
    fn flush(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let cache = self.inner()?;
        let within = seconds(timeout)?;
        py.detach(|| cache.flush(within)).map_err(from_core)
    }

    /// Whether this is an engine in this process (else a client of a server).
    #[getter]
    fn embedded(&self) -> PyResult<bool> {
        Ok(self.inner()?.is_embedded())
    }

    /// Flushes and stops an engine, or lets go of a server (idempotent); later calls
    /// raise `ClosedError`.
    #[pyo3(signature = (timeout=30.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let within = seconds(timeout)?;
        // Taken in a statement of its own: the write guard must be gone before the GIL is
        // let go and taken back, or a thread holding the GIL and waiting to read `inner`
        // (a store on another thread) and this one waiting for the GIL deadlock.
        let taken = self.inner.write().take();
        if let Some(cache) = taken {
            // The node goes here too (its KV-event publisher sends what is queued).
            py.detach(move || {
                cache.close(within);
                drop(cache);
            });
        }
        Ok(())
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.read().is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py, CLOSE_WITHIN.as_secs_f64())?;
        Ok(false)
    }
}

/// A timeout in seconds, refused unless finite and not negative.
fn seconds(s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| invalid(format!("timeout {s} is not a number of seconds ≥ 0")))
}

/// The Python name of a snapshot or checkpoint put's outcome.
fn put_name(put: SnapshotPut) -> &'static str {
    match put {
        SnapshotPut::Stored => "stored",
        SnapshotPut::Replaced => "replaced",
        SnapshotPut::Rejected => "rejected",
    }
}
