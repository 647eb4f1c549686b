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
    /// The engine's layout, for one registered with an embedded engine.
    core: Option<Arc<CoreLayout>>,
}

impl Layout {
    /// A layout of the embedded engine.
    pub(crate) fn of_core(core: Arc<CoreLayout>) -> Self {
        let key = core.key();
        Self {
            digest: core.digest().to_string(),
            block_bytes: core.block_bytes() as usize,
            tokens_per_block: key.tokens_per_block,
            num_layers: key.num_layers,
            dtype: key.dtype.to_string(),
            core: Some(core),
        }
    }

    /// A layout a server registered.
    pub(crate) fn of_server(info: &kvtier_client::wire::LayoutInfo, dtype: &str) -> Self {
        Self {
            digest: info.layout.clone(),
            block_bytes: info.block_bytes as usize,
            tokens_per_block: info.tokens_per_block,
            num_layers: info.num_layers,
            dtype: dtype.to_owned(),
            core: None,
        }
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
            tiers: answer
                .tiers
                .chars()
                .map(|c| {
                    match c {
                        'r' => "ram",
                        's' => "ssd",
                        'o' => "remote",
                        _ => "unknown",
                    }
                    .to_owned()
                })
                .collect(),
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

    fn __bool__(&self) -> bool {
        self.blocks > 0
    }

    fn __repr__(&self) -> String {
        format!(
            "<kvtier.Hit of {} tokens in {} blocks>",
            self.matched_tokens, self.blocks
        )
    }
}
