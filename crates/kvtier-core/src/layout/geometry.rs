//! The byte layout of one block payload.
//!
//! A payload is layer-major: layer 0's page, then layer 1's, and so on. A page holds K then
//! V, each `tokens_per_block × kv_heads × head_dim` elements in token-major order. Every page
//! has the same size, so the "layout table" is computed from the [`super::LayoutKey`] rather
//! than stored: page `l` spans `l × page_bytes .. (l + 1) × page_bytes`. One layer of a
//! block can therefore be sliced out of a refcounted buffer without copying the rest.

use std::ops::Range;

/// Sizes derived from a validated layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockGeometry {
    /// Tokens in one block.
    pub tokens_per_block: u32,
    /// Layers (pages) in one block.
    pub num_layers: u32,
    /// Bytes of K (or of V) in one page.
    pub half_page_bytes: u64,
}

impl BlockGeometry {
    /// Bytes of one layer's page (K and V).
    pub fn page_bytes(&self) -> u64 {
        self.half_page_bytes * 2
    }

    /// Bytes of a whole block payload.
    pub fn block_bytes(&self) -> u64 {
        self.page_bytes() * u64::from(self.num_layers)
    }

    /// The byte range of layers `layers` inside a block payload, or `None` if the range is
    /// empty or reaches past the last layer.
    pub fn layer_range(&self, layers: Range<u32>) -> Option<Range<u64>> {
        if layers.start >= layers.end || layers.end > self.num_layers {
            return None;
        }
        let page = self.page_bytes();
        Some(u64::from(layers.start) * page..u64::from(layers.end) * page)
    }

    /// The byte range of layer `layer`'s K half.
    pub fn key_range(&self, layer: u32) -> Option<Range<u64>> {
        let page = self.layer_range(layer..layer + 1)?;
        Some(page.start..page.start + self.half_page_bytes)
    }

    /// The byte range of layer `layer`'s V half.
    pub fn value_range(&self, layer: u32) -> Option<Range<u64>> {
        let page = self.layer_range(layer..layer + 1)?;
        Some(page.start + self.half_page_bytes..page.end)
    }
}
