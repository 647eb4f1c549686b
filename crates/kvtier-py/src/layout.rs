//! A registered layout, and the answer to a lookup, as Python sees them: thin wrappers of
//! the caller API's [`CacheLayout`] and [`kvtier_node::Hit`].

use kvtier_node::CacheLayout;
use pyo3::prelude::*;

use crate::errors::from_core;

/// A layout registered with an engine or a server: what every block stored under it is
/// computed for (model, dtype, geometry, parallelism, adapter, tenant). Blocks are never
/// shared across layouts.
#[pyclass(frozen, module = "kvtier._kvtier")]
pub struct Layout {
    pub(crate) inner: CacheLayout,
}

#[pymethods]
impl Layout {
    /// The layout's digest (hex): its name in the store.
    #[getter]
    fn digest(&self) -> String {
        self.inner.digest_hex().to_owned()
    }

    /// Bytes of one block (every layer, K and V).
    #[getter]
    fn block_bytes(&self) -> u64 {
        self.inner.block_bytes()
    }

    /// Tokens per block.
    #[getter]
    fn tokens_per_block(&self) -> usize {
        self.inner.tokens_per_block()
    }

    /// Layers per block.
    #[getter]
    fn num_layers(&self) -> u32 {
        self.inner.num_layers()
    }

    /// The dtype's name (`f16`, `bf16`, …).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.key().dtype.name()
    }

    /// Bytes of the recurrent state of every state group at one token boundary (0 for
    /// an attention-only layout).
    #[getter]
    fn state_bytes(&self) -> u64 {
        self.inner.state_bytes()
    }

    /// For a layout with state groups, the tokens between checkpoint boundaries (a
    /// checkpoint is kept only after a multiple of them); `None` otherwise.
    #[getter]
    fn checkpoint_every(&self) -> Option<u32> {
        self.inner.checkpoint_every()
    }

    fn __repr__(&self) -> String {
        format!(
            "<kvtier.Layout {} of {} tokens per block, {} bytes per block>",
            self.inner.digest_hex(),
            self.inner.tokens_per_block(),
            self.inner.block_bytes()
        )
    }
}

/// How much of a prompt is cached: the leading whole blocks found, and where.
#[pyclass(frozen, module = "kvtier._kvtier")]
pub struct Hit {
    pub(crate) inner: kvtier_node::Hit,
}

#[pymethods]
impl Hit {
    /// Tokens covered by the matched blocks (a multiple of the block size).
    #[getter]
    fn matched_tokens(&self) -> usize {
        self.inner.matched_tokens
    }

    /// How many leading blocks matched.
    #[getter]
    fn blocks(&self) -> usize {
        self.inner.blocks()
    }

    /// Bytes a load of every matched block fills.
    #[getter]
    fn nbytes(&self) -> PyResult<usize> {
        self.inner.nbytes(None).map_err(from_core)
    }

    /// The fastest tier holding each matched block (`ram`, `ssd`, `remote`).
    #[getter]
    fn tiers(&self) -> Vec<&'static str> {
        self.inner.tier_names()
    }

    /// For a layout with state groups, the fastest tier holding the recurrent state at
    /// the end of the matched blocks (a hit of such a layout always has one); `None`
    /// otherwise.
    #[getter]
    fn state_tier(&self) -> Option<&'static str> {
        self.inner.state_tier.map(|t| t.name())
    }

    /// The first `blocks` matched blocks only: a load of a prefix of the hit (the rest is
    /// to be recomputed), which reads nothing of the blocks after it.
    fn prefix(&self, blocks: usize) -> PyResult<Hit> {
        Ok(Hit {
            inner: self.inner.prefix(blocks).map_err(from_core)?,
        })
    }

    /// The blocks of `hits` (lookups of one layout by one cache, no recurrent state) as
    /// one hit, in order: one load of many short prompts' blocks (SGLang's pages).
    #[staticmethod]
    fn join(hits: Vec<PyRef<'_, Hit>>) -> PyResult<Hit> {
        let inner: Vec<kvtier_node::Hit> = hits.iter().map(|h| h.inner.clone()).collect();
        Ok(Hit {
            inner: kvtier_node::Hit::join(&inner).map_err(from_core)?,
        })
    }

    /// Whether anything matched (for a recurrent-only layout, a state with no blocks).
    fn __bool__(&self) -> bool {
        self.inner.matched_tokens > 0
    }

    fn __repr__(&self) -> String {
        format!(
            "<kvtier.Hit of {} tokens in {} blocks>",
            self.inner.matched_tokens,
            self.inner.blocks()
        )
    }
}
