//! A registered layout, and the answer to a lookup — shared by the embedded engine and
//! the client of `kvtier serve`.

use std::sync::Arc;

use kvtier_core::index::Lookup;
use kvtier_core::layout::Layout as CoreLayout;
use pyo3::prelude::*;

use crate::errors::invalid;

/// A layout registered with an engine or a server: what every block stored under it is
/// computed for (model, dtype, geometry, parallelism, adapter, tenant). Blocks are never
/// shared across layouts.
#[pyclass(frozen, module = "kvtier._kvtier")]
pub struct Layout {
    digest: String,
    block_bytes: usize,
    tokens_per_block: u32,
    num_layers: u32,
    dtype: String,
    /// Bytes of the recurrent state at one boundary (0 without state groups).
    state_bytes: u64,
    /// For a layout with state groups, tokens between its checkpoint boundaries.
    checkpoint_every: Option<u32>,
    /// The engine's layout, for one registered with an embedded engine.
    core: Option<Arc<CoreLayout>>,
}

impl Layout {
    /// A layout of the embedded engine (`checkpoint_every`: the distance in force, for
    /// a layout with state groups).
    pub(crate) fn of_core(core: Arc<CoreLayout>, checkpoint_every: Option<u32>) -> Self {
        let key = core.key();
        Self {
            digest: core.digest().to_string(),
            block_bytes: core.block_bytes() as usize,
            tokens_per_block: key.tokens_per_block,
            num_layers: key.num_layers,
            dtype: key.dtype.to_string(),
            state_bytes: key.state_bytes(),
            checkpoint_every,
            core: Some(core),
        }
    }

    /// A layout a server registered, with `state_bytes` of state per boundary.
    pub(crate) fn of_server(
        info: &kvtier_client::wire::LayoutInfo,
        dtype: &str,
        state_bytes: u64,
    ) -> Self {
        Self {
            digest: info.layout.clone(),
            block_bytes: info.block_bytes as usize,
            tokens_per_block: info.tokens_per_block,
            num_layers: info.num_layers,
            dtype: dtype.to_owned(),
            state_bytes,
            checkpoint_every: info.checkpoint_every,
            core: None,
        }
    }

    /// Checks that `state` is one whole state of this layout, before anything is sent.
    pub(crate) fn check_state(&self, state: &[u8]) -> PyResult<()> {
        if self.state_bytes == 0 {
            return Err(invalid(format!(
                "layout {} names no state groups: it has no recurrent state to checkpoint",
                self.digest
            )));
        }
        if state.len() as u64 != self.state_bytes {
            return Err(invalid(format!(
                "a state of {} bytes; layout {} names {} bytes of state",
                state.len(),
                self.digest,
                self.state_bytes
            )));
        }
        Ok(())
    }

    /// The engine's layout; an error for a layout registered with a server.
    pub(crate) fn core(&self) -> PyResult<&Arc<CoreLayout>> {
        self.core.as_ref().ok_or_else(|| {
            invalid("this layout was registered with a Client: register it with the Engine")
        })
    }

    pub(crate) fn digest_hex(&self) -> &str {
        &self.digest
    }

    pub(crate) fn bytes_per_block(&self) -> usize {
        self.block_bytes
    }

    pub(crate) fn whole_blocks(&self, tokens: usize) -> usize {
        tokens / self.tokens_per_block.max(1) as usize
    }

    pub(crate) fn dtype_name(&self) -> &str {
        &self.dtype
    }
}

#[pymethods]
impl Layout {
    /// The layout's digest (hex): its name in the store.
    #[getter]
    fn digest(&self) -> String {
        self.digest.clone()
    }

    /// Bytes of one block (every layer, K and V).
    #[getter]
    fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Tokens per block.
    #[getter]
    fn tokens_per_block(&self) -> u32 {
        self.tokens_per_block
    }

    /// Layers per block.
    #[getter]
    fn num_layers(&self) -> u32 {
        self.num_layers
    }

    /// The dtype's name (`f16`, `bf16`, …).
    #[getter]
    fn dtype(&self) -> String {
        self.dtype.clone()
    }

    /// Bytes of the recurrent state of every state group at one token boundary (0 for
    /// an attention-only layout).
    #[getter]
    fn state_bytes(&self) -> u64 {
        self.state_bytes
    }

    /// For a layout with state groups, the tokens between checkpoint boundaries (a
    /// checkpoint is kept only after a multiple of them); `None` otherwise.
    #[getter]
    fn checkpoint_every(&self) -> Option<u32> {
        self.checkpoint_every
    }

    fn __repr__(&self) -> String {
        format!(
            "<kvtier.Layout {} of {} tokens per block, {} bytes per block>",
            self.digest, self.tokens_per_block, self.block_bytes
        )
    }
}

/// Where a hit came from, and what loading it takes.
pub(crate) enum Found {
    /// The embedded engine's lookup.
    Local(Lookup),
    /// A server's answer: the handles a load sends back.
    Remote {
        /// The opaque handles.
        handles: String,
    },
}

/// How much of a prompt is cached: the leading whole blocks found, and where.
#[pyclass(frozen, module = "kvtier._kvtier")]
pub struct Hit {
    pub(crate) found: Found,
    pub(crate) layout: String,
    pub(crate) block_bytes: usize,
    pub(crate) num_layers: u32,
    pub(crate) matched_tokens: usize,
    pub(crate) blocks: usize,
    pub(crate) tiers: Vec<String>,
    /// For a layout with state groups, the fastest tier holding the state at the end of
    /// the matched blocks.
    pub(crate) state_tier: Option<String>,
}

impl Hit {
    /// Bytes of one block a load of `layers` fills: the whole block, or its pages of
    /// layers `start..end` (every layer's page is the same size). An error for an empty
    /// range or one past the layout's layers.
    pub(crate) fn bytes_per_block(&self, layers: Option<(u32, u32)>) -> PyResult<usize> {
        match layers {
            None => Ok(self.block_bytes),
            Some((start, end)) if start < end && end <= self.num_layers => {
                Ok(self.block_bytes / self.num_layers as usize * (end - start) as usize)
            }
            Some((start, end)) => Err(crate::errors::invalid(format!(
                "layers ({start}, {end}) is empty or past the layout's {} layers",
                self.num_layers
            ))),
        }
    }

    /// The answer of the embedded engine.
    pub(crate) fn local(lookup: Lookup, layout: &Layout) -> Self {
        Self {
            layout: layout.digest.clone(),
            block_bytes: layout.block_bytes,
            num_layers: layout.num_layers,
            matched_tokens: lookup.matched_tokens,
            blocks: lookup.blocks.len(),
            tiers: lookup
                .blocks
                .iter()
                .map(|b| b.tier.name().to_owned())
                .collect(),
            state_tier: lookup.state.map(|s| s.tier.name().to_owned()),
            found: Found::Local(lookup),
        }
    }

    /// A server's answer.
    pub(crate) fn remote(answer: kvtier_client::wire::LookupAnswer, layout: &Layout) -> Self {
        Self {
            layout: layout.digest.clone(),
            block_bytes: layout.block_bytes,
            num_layers: layout.num_layers,
            matched_tokens: answer.matched_tokens,
            blocks: answer.blocks(),
            // One letter per block: r RAM, s SSD, o object storage.
            tiers: answer.tiers.chars().map(tier_name).collect(),
            state_tier: answer
                .state
                .as_ref()
                .map(|s| s.tier.chars().next().map_or_else(String::new, tier_name)),
            found: Found::Remote {
                handles: answer.handles,
            },
        }
    }
}

#[pymethods]
impl Hit {
    /// Tokens covered by the matched blocks (a multiple of the block size).
    #[getter]
    fn matched_tokens(&self) -> usize {
        self.matched_tokens
    }

    /// How many leading blocks matched.
    #[getter]
    fn blocks(&self) -> usize {
        self.blocks
    }

    /// Bytes a load of every matched block fills.
    #[getter]
    fn nbytes(&self) -> usize {
        self.blocks * self.block_bytes
    }

    /// The fastest tier holding each matched block (`ram`, `ssd`, `remote`).
    #[getter]
    fn tiers(&self) -> Vec<String> {
        self.tiers.clone()
    }

    /// For a layout with state groups, the fastest tier holding the recurrent state at
    /// the end of the matched blocks (a hit of such a layout always has one); `None`
    /// otherwise.
    #[getter]
    fn state_tier(&self) -> Option<String> {
        self.state_tier.clone()
    }

    /// Whether anything matched (for a recurrent-only layout, a state with no blocks).
    fn __bool__(&self) -> bool {
        self.matched_tokens > 0
    }

    fn __repr__(&self) -> String {
        format!(
            "<kvtier.Hit of {} tokens in {} blocks>",
            self.matched_tokens, self.blocks
        )
    }
}

/// The tier a server's one-letter code names: r RAM, s SSD, o object storage.
fn tier_name(code: char) -> String {
    match code {
        'r' => "ram",
        's' => "ssd",
        'o' => "remote",
        _ => "unknown",
    }
    .to_owned()
}
