//! One causal self-attention layer with rotary positions, fed one token at a time, and
//! its KV cache.
//!
//! The cache keeps K (after RoPE) and V as plain f32 vectors, token-major
//! (`[tokens, heads, head_dim]`), and every step builds its tensors from them. That makes
//! a cache filled from kvtier blocks indistinguishable from one the model filled itself —
//! the same numbers in the same order through the same kernels — so a restored turn is
//! bit-identical to a cold one. A block page is that layout's slice for the block's
//! tokens: K, then V.

use candle_core::{Device, Module, Tensor};
use candle_nn::{Linear, VarBuilder, linear_no_bias};

use crate::{Error, Result};

/// The projections of one attention layer.
#[derive(Debug, Clone)]
pub struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    num_heads: usize,
    head_dim: usize,
}

/// K and V of every token so far for one attention layer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvCache {
    k: Vec<f32>,
    v: Vec<f32>,
    /// Floats per token in each of K and V (`heads · head_dim`).
    width: usize,
}

impl KvCache {
    /// An empty cache of `width` floats per token.
    pub fn new(width: usize) -> Self {
        Self {
            k: Vec::new(),
            v: Vec::new(),
            width,
        }
    }

    /// Tokens held.
    pub fn tokens(&self) -> usize {
        self.k.len() / self.width.max(1)
    }

    /// Bytes of one page (K and V of `tokens` tokens).
    pub fn page_bytes(&self, tokens: usize) -> usize {
        2 * tokens * self.width * 4
    }

    /// Appends the page of tokens `first..first + tokens` to `out`: K, then V.
    pub fn write_page(&self, first: usize, tokens: usize, out: &mut Vec<u8>) -> Result<()> {
        let (from, to) = (first * self.width, (first + tokens) * self.width);
        if to > self.k.len() {
            return Err(Error::Invalid(format!(
                "a page of tokens {first}..{} from a cache of {}",
                first + tokens,
                self.tokens()
            )));
        }
        out.extend_from_slice(bytemuck::cast_slice(&self.k[from..to]));
        out.extend_from_slice(bytemuck::cast_slice(&self.v[from..to]));
        Ok(())
    }

    /// Appends the tokens of `page` (as [`Self::write_page`] wrote it).
    pub fn append_page(&mut self, page: &[u8]) -> Result<()> {
        let half = page.len() / 2;
        if !page.len().is_multiple_of(2 * 4 * self.width.max(1)) {
            return Err(Error::Mismatch(format!(
                "a KV page of {} bytes for {} floats per token",
                page.len(),
                self.width
            )));
        }
        self.k
            .extend(bytemuck::pod_collect_to_vec::<u8, f32>(&page[..half]));
        self.v
            .extend(bytemuck::pod_collect_to_vec::<u8, f32>(&page[half..]));
        Ok(())
    }
}

impl Attention {
    /// Loads the layer's projections from `vb` (`q_proj`, `k_proj`, `v_proj`, `o_proj`).
    pub fn new(d_model: usize, num_heads: usize, head_dim: usize, vb: VarBuilder) -> Result<Self> {
        let inner = num_heads * head_dim;
        Ok(Self {
            q: linear_no_bias(d_model, inner, vb.pp("q_proj"))?,
            k: linear_no_bias(d_model, inner, vb.pp("k_proj"))?,
            v: linear_no_bias(d_model, inner, vb.pp("v_proj"))?,
            o: linear_no_bias(inner, d_model, vb.pp("o_proj"))?,
            num_heads,
            head_dim,
        })
    }

    /// An empty cache for this layer.
    pub fn cache(&self) -> KvCache {
        KvCache::new(self.num_heads * self.head_dim)
    }

    /// Attends from the token `xs` (`[1, d_model]`, normalised) at the position `cos` and
    /// `sin` (`[1, head_dim / 2]`) name to every token in `cache` and itself, appending
    /// its K and V to the cache; the layer's output, `[1, d_model]`.
    pub fn forward(
        &self,
        xs: &Tensor,
        cache: &mut KvCache,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<Tensor> {
        let (h, d) = (self.num_heads, self.head_dim);
        let heads = |t: Tensor| t.reshape((1, h, 1, d));
        let q = candle_nn::rotary_emb::rope(&heads(self.q.forward(xs)?)?, cos, sin)?;
        let k = candle_nn::rotary_emb::rope(&heads(self.k.forward(xs)?)?, cos, sin)?;
        let v = self.v.forward(xs)?;
        cache.k.extend(k.flatten_all()?.to_vec1::<f32>()?);
        cache.v.extend(v.flatten_all()?.to_vec1::<f32>()?);
        let t = cache.tokens();
        let by_head = |data: &[f32]| -> Result<Tensor> {
            Ok(Tensor::from_slice(data, (t, h, d), &Device::Cpu)?
                .transpose(0, 1)?
                .contiguous()?)
        };
        let (keys, values) = (by_head(&cache.k)?, by_head(&cache.v)?);
        let q = q.reshape((h, 1, d))?;
        let scores = (q.matmul(&keys.t()?)? / (d as f64).sqrt())?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let out = probs.matmul(&values)?.reshape((1, h * d))?;
        Ok(self.o.forward(&out)?)
    }
}
