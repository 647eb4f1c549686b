//! Hybrid and recurrent models through Python (issue 16, `docs/hybrid.md`): the state
//! groups a layout names, and a restore — every group's part of one token boundary, or
//! nothing — as Python sees them.

use bytes::Bytes;
use pyo3::prelude::*;

use crate::block::Block;

/// One group of recurrent layers as Python names it: `(kind, num_layers, state_bytes)`,
/// e.g. `("mamba2/bf16/...", 24, 1_572_864)`.
pub(crate) type GroupArg = (String, u32, u64);

/// The engine's state groups of `groups`, in layer order.
pub(crate) fn groups_of(groups: Option<Vec<GroupArg>>) -> Vec<kvtier_core::StateGroup> {
    groups
        .unwrap_or_default()
        .into_iter()
        .map(|(kind, num_layers, state_bytes)| kvtier_core::StateGroup {
            kind,
            num_layers,
            state_bytes,
        })
        .collect()
}

/// What a restore read: the KV blocks of the attention layers and the recurrent state
/// after exactly `tokens` tokens — all of one boundary, or nothing (`tokens` 0, falsy).
#[pyclass(frozen, module = "kvtier._kvtier")]
pub struct Restored {
    tokens: usize,
    blocks: Vec<Bytes>,
    state: Option<Bytes>,
}

impl From<kvtier_core::engine::Restored> for Restored {
    /// The cache's restore (already emptied when it is not whole: see `Cache::restore`).
    fn from(r: kvtier_core::engine::Restored) -> Self {
        Self {
            tokens: r.tokens,
            blocks: r.blocks,
            state: r.state,
        }
    }
}

#[pymethods]
impl Restored {
    /// Prompt tokens the restored parts carry (0: nothing was restored; compute the
    /// prompt from its start).
    #[getter]
    fn tokens(&self) -> usize {
        self.tokens
    }

    /// The KV blocks, in order, each a read-only view (empty for a layout without
    /// attention layers).
    #[getter]
    fn blocks(&self) -> Vec<Block> {
        self.blocks.iter().cloned().map(Block::new).collect()
    }

    /// The recurrent state of every state group after `tokens` tokens, as a read-only
    /// view; `None` for an attention-only layout or when nothing was restored.
    #[getter]
    fn state(&self) -> Option<Block> {
        self.state.clone().map(Block::new)
    }

    fn __bool__(&self) -> bool {
        self.tokens > 0
    }

    fn __repr__(&self) -> String {
        format!(
            "<kvtier.Restored of {} tokens: {} blocks, {} bytes of state>",
            self.tokens,
            self.blocks.len(),
            self.state.as_ref().map_or(0, Bytes::len)
        )
    }
}
