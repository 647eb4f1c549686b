//! A registered layout, and the answer to a lookup.

use std::sync::Arc;

use kvtier_core::index::Lookup;
use kvtier_core::layout::Layout as CoreLayout;
use pyo3::prelude::*;

/// A layout registered with an engine: what every block stored under it is computed for
/// (model, dtype, geometry, parallelism, adapter, tenant). Blocks are never shared across
/// layouts.
#[pyclass(frozen, module = "kvtier._kvtier")]
pub struct Layout {
    pub(crate) inner: Arc<CoreLayout>,
}

#[pymethods]
impl Layout {
    /// The layout's digest (hex): its name in the store.
    #[getter]
    fn digest(&self) -> String {
        self.inner.digest().to_string()
    }

    /// Bytes of one block (every layer, K and V).
    #[getter]
    fn block_bytes(&self) -> usize {
        self.inner.block_bytes() as usize
    }

    /// Tokens per block.
    #[getter]
    fn tokens_per_block(&self) -> u32 {
        self.inner.key().tokens_per_block
    }

    /// Layers per block.
    #[getter]
    fn num_layers(&self) -> u32 {
        self.inner.key().num_layers
    }

    /// The dtype's name (`f16`, `bf16`, …).
    #[getter]
    fn dtype(&self) -> String {
        self.inner.key().dtype.to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "<kvtier.Layout {} of {} tokens per block, {} bytes per block>",
            self.inner.digest(),
            self.inner.key().tokens_per_block,
            self.inner.block_bytes()
        )
    }
}

/// How much of a prompt is cached: the leading whole blocks found, and where.
#[pyclass(frozen, module = "kvtier._kvtier")]
pub struct Hit {
    pub(crate) lookup: Lookup,
    pub(crate) block_bytes: usize,
}

#[pymethods]
impl Hit {
    /// Tokens covered by the matched blocks (a multiple of the block size).
    #[getter]
    fn matched_tokens(&self) -> usize {
        self.lookup.matched_tokens
    }

    /// How many leading blocks matched.
    #[getter]
    fn blocks(&self) -> usize {
        self.lookup.blocks.len()
    }

    /// Bytes a load of every matched block fills.
    #[getter]
    fn nbytes(&self) -> usize {
        self.lookup.blocks.len() * self.block_bytes
    }

    /// The fastest tier holding each matched block (`ram`, `ssd`, `remote`).
    #[getter]
    fn tiers(&self) -> Vec<String> {
        self.lookup
            .blocks
            .iter()
            .map(|b| b.tier.name().to_owned())
            .collect()
    }

    fn __bool__(&self) -> bool {
        !self.lookup.blocks.is_empty()
    }

    fn __repr__(&self) -> String {
        format!(
            "<kvtier.Hit of {} tokens in {} blocks>",
            self.lookup.matched_tokens,
            self.lookup.blocks.len()
        )
    }
}
