//! The Gemma KV cache, held outside the model so it can be cut into kvtier blocks and
//! filled back from them.
//!
//! Per layer, K and V live in a growable tensor `[1, kv_heads, positions, head_dim]`.
//! A kvtier block payload is layer-major: for each layer, K then V of the block's tokens,
//! token-major `[tokens, kv_heads, head_dim]` f32 (kvtier's `layout.md`), so a layer of a
//! block is one contiguous page.

use bytes::Bytes;
use candle_core::{Device, Tensor};
use candle_nn::kv_cache::Cache;

use super::config::GemmaConfig;
use crate::{Error, Result};

/// How many positions a fresh cache reserves before it first grows.
const INITIAL_POSITIONS: usize = 512;

/// K and V of every position a sequence has processed.
pub struct KvCache {
    keys: Vec<Cache>,
    values: Vec<Cache>,
    kv_heads: usize,
    head_dim: usize,
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("positions", &self.len())
            .finish_non_exhaustive()
    }
}

impl KvCache {
    /// An empty cache for a model of this shape.
    pub fn new(config: &GemmaConfig) -> Self {
        Self::with_capacity(config, INITIAL_POSITIONS)
    }

    /// An empty cache that holds `positions` before it first grows (growing copies every
    /// layer's K and V, so a turn reserves what it will reach).
    pub fn with_capacity(config: &GemmaConfig, positions: usize) -> Self {
        let positions = positions.max(1);
        let fresh = || {
            (0..config.num_layers)
                .map(|_| Cache::new(2, positions))
                .collect()
        };
        Self {
            keys: fresh(),
            values: fresh(),
            kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
        }
    }

    /// Positions held by layer 0 (all layers once a chunk has finished).
    pub fn len(&self) -> usize {
        self.layer_len(0)
    }

    /// True when nothing has been processed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions held by one layer.
    pub fn layer_len(&self, layer: usize) -> usize {
        self.keys.get(layer).map_or(0, Cache::current_seq_len)
    }

    /// Appends K and V `[1, kv_heads, n, head_dim]` to `layer`; returns all of the
    /// layer's K and V so far (views, no copy).
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let (Some(kc), Some(vc)) = (self.keys.get_mut(layer), self.values.get_mut(layer)) else {
            return Err(Error::Invalid(format!("layer {layer} out of range")));
        };
        kc.append(&k.contiguous()?)?;
        vc.append(&v.contiguous()?)?;
        match (kc.current_data()?, vc.current_data()?) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err(Error::Invalid("empty KV cache after an append".into())),
        }
    }

    fn elems_per_half_page(&self, tokens_per_block: usize) -> usize {
        tokens_per_block * self.kv_heads * self.head_dim
    }

    /// The payload of block `block` (positions `block·tpb .. (block+1)·tpb`), in kvtier's
    /// layer-major page order.
    pub fn block_payload(&self, block: usize, tokens_per_block: usize) -> Result<Vec<u8>> {
        let start = block * tokens_per_block;
        if start + tokens_per_block > self.len() {
            return Err(Error::Invalid(format!(
                "block {block} reaches past the {} cached positions",
                self.len()
            )));
        }
        let half = self.elems_per_half_page(tokens_per_block) * 4;
        let mut out = Vec::with_capacity(half * 2 * self.keys.len());
        for (kc, vc) in self.keys.iter().zip(&self.values) {
            for cache in [kc, vc] {
                let Some(all) = cache.current_data()? else {
                    return Err(Error::Invalid("a layer holds no KV".into()));
                };
                let page = all
                    .narrow(2, start, tokens_per_block)?
                    .transpose(1, 2)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                out.extend_from_slice(bytemuck::cast_slice(&page));
            }
        }
        Ok(out)
    }

    /// Appends whole blocks (payloads as [`Self::block_payload`] makes them) to every layer.
    pub fn import_blocks(&mut self, payloads: &[Bytes], tokens_per_block: usize) -> Result<()> {
        let page = self.elems_per_half_page(tokens_per_block) * 4 * 2;
        let layers = self.keys.len();
        for (i, p) in payloads.iter().enumerate() {
            if p.len() != page * layers {
                return Err(Error::Mismatch(format!(
                    "block {i} has {} bytes; this model's blocks have {}",
                    p.len(),
                    page * layers
                )));
            }
        }
        for layer in 0..layers {
            let pages: Vec<Bytes> = payloads
                .iter()
                .map(|p| p.slice(layer * page..(layer + 1) * page))
                .collect();
            self.import_layer(layer, &pages, tokens_per_block)?;
        }
        Ok(())
    }

    /// Appends one layer's pages (K then V of each block, in block order) to that layer.
    pub fn import_layer(
        &mut self,
        layer: usize,
        pages: &[Bytes],
        tokens_per_block: usize,
    ) -> Result<()> {
        let tensors = self.shape().layer_tensors(layer, pages, tokens_per_block)?;
        self.append_layer(layer, tensors)
    }

    /// The per-token shape of this cache's K and V.
    pub fn shape(&self) -> KvShape {
        KvShape {
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }

    /// Appends a layer's prefix made by [`KvShape::layer_tensors`].
    pub fn append_layer(&mut self, layer: usize, tensors: LayerTensors) -> Result<()> {
        self.append(layer, &tensors.k, &tensors.v)?;
        Ok(())
    }
}

/// K and V of one layer's prefix, ready to append (made on any thread).
#[derive(Debug, Clone)]
pub struct LayerTensors {
    k: Tensor,
    v: Tensor,
}

/// KV heads and head size: enough to turn pages into tensors away from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    kv_heads: usize,
    head_dim: usize,
}

impl KvShape {
    /// Converts one layer's pages (K then V of each block, in block order) into tensors,
    /// refusing any page whose size is not this model's.
    pub fn layer_tensors(
        &self,
        layer: usize,
        pages: &[Bytes],
        tokens_per_block: usize,
    ) -> Result<LayerTensors> {
        let half = tokens_per_block * self.kv_heads * self.head_dim * 4;
        let mut k = Vec::with_capacity(half / 4 * pages.len());
        let mut v = Vec::with_capacity(half / 4 * pages.len());
        for (i, page) in pages.iter().enumerate() {
            if page.len() != half * 2 {
                return Err(Error::Mismatch(format!(
                    "layer {layer} page of block {i} has {} bytes; expected {}",
                    page.len(),
                    half * 2
                )));
            }
            extend_f32(&mut k, &page[..half]);
            extend_f32(&mut v, &page[half..]);
        }
        let positions = tokens_per_block * pages.len();
        let (kv_heads, head_dim) = (self.kv_heads, self.head_dim);
        let to_tensor = |data: Vec<f32>| -> Result<Tensor> {
            if kv_heads == 1 {
                // Token-major with one head is already `[1, 1, positions, head_dim]`.
                return Ok(Tensor::from_vec(
                    data,
                    (1, 1, positions, head_dim),
                    &Device::Cpu,
                )?);
            }
            Ok(
                Tensor::from_vec(data, (1, positions, kv_heads, head_dim), &Device::Cpu)?
                    .transpose(1, 2)?
                    .contiguous()?,
            )
        };
        Ok(LayerTensors {
            k: to_tensor(k)?,
            v: to_tensor(v)?,
        })
    }
}

/// Appends little-endian f32s; bytes from the cache need not be 4-aligned.
fn extend_f32(dst: &mut Vec<f32>, bytes: &[u8]) {
    match bytemuck::try_cast_slice::<u8, f32>(bytes) {
        Ok(floats) => dst.extend_from_slice(floats),
        Err(_) => dst.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
    }
}
