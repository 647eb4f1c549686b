//! Hybrid and recurrent models through Python (issue 16, `docs/hybrid.md`): the state
//! groups a layout names, and a restore — every group's part of one token boundary, or
//! nothing — shared by the embedded engine and the client.

use bytes::Bytes;
use kvtier_core::snapshot::SnapshotPut;
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

/// The Python name of a checkpoint put's outcome.
pub(crate) fn put_name(put: SnapshotPut) -> &'static str {
    match put {
        SnapshotPut::Stored => "stored",
        SnapshotPut::Replaced => "replaced",
        SnapshotPut::Rejected => "rejected",
    }
}

/// What a restore read: the KV blocks of the attention layers and the recurrent state
/// after exactly `tokens` tokens — all of one boundary, or nothing (`tokens` 0, falsy).
#[pyclass(frozen, module = "kvtier._kvtier")]
pub struct Restored {
    tokens: usize,
    blocks: Vec<Bytes>,
    state: Option<Bytes>,
}

impl Restored {
    pub(crate) fn new(tokens: usize, blocks: Vec<Bytes>, state: Option<Bytes>) -> Self {
        if tokens == 0 {
            // Nothing, whatever came along: a partial restore is never handed out.
            return Self {
                tokens: 0,
                blocks: Vec::new(),
                state: None,
            };
        }
        Self {
            tokens,
            blocks,
            state,
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
