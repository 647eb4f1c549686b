//! The embedded engine: a kvtier node in this process, assembled by `kvtier-node` from
//! the same settings as `kvtier serve` (with the same defaults), used without HTTP.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvtier_core::hash::ExtraKeys;
use kvtier_core::index::Lookup;
use kvtier_core::layout::{KvDtype, LayoutDigest, LayoutKey};
use kvtier_core::snapshot::SnapshotPut;
use kvtier_core::tier::RejectReason;
use kvtier_core::{Engine as CoreEngine, StoreReport};
use kvtier_node::{Node, Settings};
use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::block::Block;
use crate::errors::{self, from_core, invalid};
use crate::input::{Exported, exports_of, payloads_of, room_for, store_report};
use crate::layout::{Found, Hit, Layout};
use crate::state::{GroupArg, Restored, groups_of, put_name};

/// How long `close()` (and a garbage-collected engine) waits for queued writes.
const CLOSE_WITHIN: Duration = Duration::from_secs(30);

/// An engine in this process. Settings are those of `kvtier serve`, defaults included:
/// `settings`, a dict in the settings file's shape (`{"ram": "2GiB", "ssd": {"enabled":
/// False}}`), or `config_file`, a settings file (TOML).
#[pyclass(frozen, module = "kvtier._kvtier")]
pub struct Engine {
    /// `None` once closed.
    node: RwLock<Option<Arc<Node>>>,
}

impl Engine {
    fn node(&self) -> PyResult<Arc<Node>> {
        self.node
            .read()
            .clone()
            .ok_or_else(|| errors::raise("closed", "the engine is closed"))
    }

    fn engine(&self) -> PyResult<Arc<CoreEngine>> {
        Ok(self.node()?.engine.clone())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(node) = self.node.get_mut().take() {
            node.engine.shutdown(CLOSE_WITHIN);
        }
    }
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (settings=None, *, config_file=None))]
    fn new(
        py: Python<'_>,
        settings: Option<&Bound<'_, PyDict>>,
        config_file: Option<PathBuf>,
    ) -> PyResult<Self> {
        let settings: Settings = match (settings, config_file) {
            (Some(_), Some(_)) => {
                return Err(invalid("give settings or a config file, not both"));
            }
            (Some(dict), None) => {
                // Through JSON: the same serde definitions (names, units, defaults) as
                // the settings file.
                let json: String = py
                    .import("json")?
                    .call_method1("dumps", (dict,))?
                    .extract()?;
                serde_json::from_str(&json).map_err(|e| invalid(format!("settings: {e}")))?
            }
            (None, Some(path)) => Settings::from_file(&path).map_err(invalid)?,
            (None, None) => Settings::default(),
        };
        settings.validate().map_err(invalid)?;
        let node = py
            .detach(|| Node::open(settings))
            .map_err(|e| errors::raise("unavailable", e))?;
        Ok(Self {
            node: RwLock::new(Some(node)),
        })
    }

    /// Registers a layout (registering the same one again returns it again).
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
        let dtype: KvDtype = dtype.parse().map_err(from_core)?;
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
        let engine = self.engine()?;
        let core = engine.register_layout(key).map_err(from_core)?;
        let every = engine
            .configure_checkpoints(core.digest(), checkpoint_every.map(|t| t as usize))
            .map_err(from_core)?;
        Ok(Layout::of_core(core, every.map(|t| t as u32)))
    }

    /// How many leading whole blocks of `tokens` are cached under `layout`. Memory only:
    /// no tier is read.
    fn lookup(&self, py: Python<'_>, layout: &Layout, tokens: Vec<u32>) -> PyResult<Hit> {
        let engine = self.engine()?;
        let digest = layout.core()?.digest();
        let lookup = py
            .detach(|| -> kvtier_core::Result<Lookup> {
                let prompt = engine.prompt(digest, &tokens, &ExtraKeys::none())?;
                Ok(engine.lookup(&prompt))
            })
            .map_err(from_core)?;
        Ok(Hit::local(lookup, layout))
    }

    /// Stores the blocks of `tokens` under `layout`: `blocks` is one buffer holding whole
    /// blocks back to back, or a list or tuple of buffers of one block each (bytes,
    /// bytearray, contiguous numpy arrays, …; read in place, never kept).
    fn store<'py>(
        &self,
        py: Python<'py>,
        layout: &Layout,
        tokens: Vec<u32>,
        blocks: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let engine = self.engine()?;
        let digest = layout.core()?.digest();
        let exports = exports_of(blocks)?;
        let payloads = payloads_of(layout, &exports, blocks, tokens.len())?;
        let report = py
            .detach(|| -> kvtier_core::Result<StoreReport> {
                let prompt = engine.prompt(digest, &tokens, &ExtraKeys::none())?;
                engine.store(&prompt, &payloads)
            })
            .map_err(from_core)?;
        drop(exports);
        store_report(
            py,
            report.stored,
            report.duplicates,
            report.stored_lower_only,
            report.stopped.map(reject_name),
            report.ack.name(),
        )
    }

    /// The matched blocks of `hit`, each a read-only view of kvtier's own bytes (no
    /// copy). Fewer than `hit.blocks` when a block was lost since the lookup: recompute
    /// from there.
    fn load(&self, py: Python<'_>, hit: &Hit) -> PyResult<Vec<Block>> {
        let engine = self.engine()?;
        let refs = local(hit)?;
        let loaded = py.detach(|| engine.load(refs)).map_err(from_core)?;
        Ok(loaded.blocks.into_iter().map(Block::new).collect())
    }

    /// Copies the matched blocks of `hit` back to back into `out` (a writable,
    /// C-contiguous buffer of at least `hit.nbytes` bytes, or the share of `layers`); the
    /// number of blocks written (fewer than `hit.blocks` when a block was lost since the
    /// lookup). `layers=(start, end)`: only those layers of each block, back to back.
    #[pyo3(signature = (hit, out, layers=None))]
    fn load_into(
        &self,
        py: Python<'_>,
        hit: &Hit,
        out: &Bound<'_, PyAny>,
        layers: Option<(u32, u32)>,
    ) -> PyResult<usize> {
        let engine = self.engine()?;
        let Found::Local(lookup) = &hit.found else {
            return Err(invalid(
                "this hit came from a Client: load it with the Client",
            ));
        };
        let block = hit.bytes_per_block(layers)?;
        let mut target = Exported::get(out, true, "out")?;
        let dst = room_for(hit, block, &mut target)?;
        py.detach(|| -> kvtier_core::Result<usize> {
            let loaded = match layers {
                None => engine.load(&lookup.blocks)?,
                Some((start, end)) => engine.load_layers(lookup, start..end)?,
            };
            for (i, b) in loaded.blocks.iter().enumerate() {
                dst[i * block..(i + 1) * block].copy_from_slice(b);
            }
            Ok(loaded.blocks.len())
        })
        .map_err(from_core)
    }

    /// Stores the recurrent state reached after exactly `tokens` (and `session`);
    /// `stored`, `replaced` or `rejected` (larger than the snapshot budget).
    #[pyo3(signature = (layout, tokens, state, session=None))]
    fn snapshot_put(
        &self,
        py: Python<'_>,
        layout: &Layout,
        tokens: Vec<u32>,
        state: &Bound<'_, PyAny>,
        session: Option<Vec<u8>>,
    ) -> PyResult<&'static str> {
        let engine = self.engine()?;
        let blob = Exported::get(state, false, "state")?;
        let bytes = blob.bytes();
        let digest = layout.core()?.digest();
        let put = py
            .detach(|| engine.snapshot_put(digest, &tokens, session.as_deref(), bytes))
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
        let engine = self.engine()?;
        let digest: LayoutDigest = layout.core()?.digest();
        let got: Option<Bytes> = py
            .detach(|| engine.snapshot_get(digest, &tokens, session.as_deref()))
            .map_err(from_core)?;
        Ok(got.map(Block::new))
    }

    /// Keeps `state`, the recurrent state of every state group of `layout` after exactly
    /// the first `blocks` whole blocks of `tokens` (a checkpoint boundary: a multiple of
    /// `layout.checkpoint_every` tokens); `stored`, `replaced` or `rejected` (no room in
    /// the checkpoint budget). Refused for a layout without state groups, another
    /// boundary, or a state of another size.
    fn checkpoint_put(
        &self,
        py: Python<'_>,
        layout: &Layout,
        tokens: Vec<u32>,
        blocks: usize,
        state: &Bound<'_, PyAny>,
    ) -> PyResult<&'static str> {
        let engine = self.engine()?;
        let blob = Exported::get(state, false, "state")?;
        let bytes = blob.bytes();
        layout.check_state(bytes)?;
        let digest = layout.core()?.digest();
        let put = py
            .detach(|| -> kvtier_core::Result<SnapshotPut> {
                let prompt = engine.prompt(digest, &tokens, &ExtraKeys::none())?;
                engine.checkpoint_put(&prompt, blocks, bytes)
            })
            .map_err(from_core)?;
        Ok(put_name(put))
    }

    /// Looks `tokens` up and reads every part of the hit at once: the KV blocks and, for
    /// a layout with state groups, the recurrent state at their end. All or nothing: a
    /// layout with state groups is restored only at a boundary where both are there and
    /// readable; otherwise nothing (`tokens` 0) and the caller computes the prompt.
    fn restore(&self, py: Python<'_>, layout: &Layout, tokens: Vec<u32>) -> PyResult<Restored> {
        let engine = self.engine()?;
        let digest = layout.core()?.digest();
        let restored = py
            .detach(|| -> kvtier_core::Result<kvtier_core::engine::Restored> {
                let prompt = engine.prompt(digest, &tokens, &ExtraKeys::none())?;
                engine.restore(&engine.lookup(&prompt))
            })
            .map_err(from_core)?;
        Ok(Restored::new(
            restored.tokens,
            restored.blocks,
            restored.state,
        ))
    }

    /// Every counter, by the names `/v1/stats` uses.
    fn stats(&self) -> PyResult<std::collections::BTreeMap<String, u64>> {
        Ok(self.node()?.counters())
    }

    /// Where KV events are published: `{"endpoint": ..., "replay_endpoint": ... or None,
    /// "epoch": ...}` (ports filled in), or `None` without `kv_events.endpoint`.
    fn kv_events<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let node = self.node()?;
        let Some(k) = &node.kv_events else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("endpoint", k.endpoint())?;
        d.set_item("replay_endpoint", k.replay_endpoint())?;
        d.set_item("epoch", k.epoch())?;
        Ok(Some(d))
    }

    /// Writes everything queued for the tiers below RAM and syncs them; true only if the
    /// queues drained within `timeout` seconds and every write since the previous flush
    /// reached its tier (a full disk's refusals make it false).
    #[pyo3(signature = (timeout=30.0))]
    fn flush(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let engine = self.engine()?;
        let within = seconds(timeout)?;
        Ok(py.detach(|| engine.flush(within)))
    }

    /// Flushes and stops the engine (idempotent); later calls raise `ClosedError`.
    #[pyo3(signature = (timeout=30.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let within = seconds(timeout)?;
        if let Some(node) = self.node.write().take() {
            // The node goes here too (its KV-event publisher sends what is queued).
            py.detach(move || {
                node.engine.shutdown(within);
                drop(node);
            });
        }
        Ok(())
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.node.read().is_none()
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

/// The engine's lookup behind `hit`; an error for a server's hit.
fn local(hit: &Hit) -> PyResult<&[kvtier_core::BlockRef]> {
    match &hit.found {
        Found::Local(lookup) => Ok(&lookup.blocks),
        Found::Remote { .. } => Err(invalid(
            "this hit came from a Client: load it with the Client",
        )),
    }
}

/// A timeout in seconds, refused unless finite and not negative.
fn seconds(s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| invalid(format!("timeout {s} is not a number of seconds ≥ 0")))
}

/// The server's name for why a store stopped.
fn reject_name(r: RejectReason) -> &'static str {
    match r {
        RejectReason::NoSpace => "no_space",
        RejectReason::ParentMissing => "parent_missing",
        RejectReason::Collision => "collision",
        RejectReason::Quarantined => "quarantined",
    }
}
