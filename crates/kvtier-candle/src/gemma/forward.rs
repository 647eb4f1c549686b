//! The Gemma 3 forward pass on candle operations, over a [`KvCache`] it does not own.
//!
//! Prefill runs in chunks aligned to absolute positions (multiples of the chunk size).
//! That is what makes reuse exact: a chunk's arithmetic depends only on its tokens, its
//! position and the KV before it, so a prefix restored from kvtier followed by the
//! remaining chunks performs bit for bit the same operations as a cold prefill of the
//! whole prompt, as long as the restored length is a multiple of the chunk size (kvtier
//! blocks are; see `docs/adr/0008-real-models.md`).

use candle_core::{Device, Module, Tensor};
use candle_nn::rotary_emb::rope;

use super::kv::KvCache;
use super::weights::{Block, GemmaWeights};
use crate::{Error, Result};

/// Called before layer `layer` of a chunk runs, so its cached prefix can arrive late
/// (layer-wise loading). The default does nothing.
pub type BeforeLayer<'a> = dyn FnMut(usize, &mut KvCache) -> Result<()> + 'a;

impl GemmaWeights {
    /// Runs `tokens` at positions `kv.len()..` through the model, appending their K and V
    /// to `kv`, and returns the logits of the last token (`vocab_size` values).
    pub fn forward(&self, kv: &mut KvCache, tokens: &[u32]) -> Result<Vec<f32>> {
        self.forward_with(kv, tokens, &mut |_, _| Ok(()))
    }

    /// As [`Self::forward`], calling `before_layer` ahead of each layer. A hook that fills
    /// a layer's cached prefix must leave that layer holding exactly the positions before
    /// the chunk.
    pub fn forward_with(
        &self,
        kv: &mut KvCache,
        tokens: &[u32],
        before_layer: &mut BeforeLayer<'_>,
    ) -> Result<Vec<f32>> {
        let x = self.hidden(kv, tokens, before_layer)?;
        self.last_logits(&x)
    }

    /// Prefills `tokens[kv.len()..]` (the cache already holds the ones before) in chunks
    /// aligned to multiples of `chunk` positions, and returns the last token's logits.
    pub fn prefill(&self, kv: &mut KvCache, tokens: &[u32], chunk: usize) -> Result<Vec<f32>> {
        let mut pos = kv.len();
        if chunk == 0 || pos >= tokens.len() {
            return Err(Error::Invalid(format!(
                "nothing to prefill: {} tokens, {pos} cached, chunk {chunk}",
                tokens.len()
            )));
        }
        loop {
            let end = ((pos / chunk + 1) * chunk).min(tokens.len());
            let x = self.hidden(kv, &tokens[pos..end], &mut |_, _| Ok(()))?;
            if end == tokens.len() {
                return self.last_logits(&x);
            }
            pos = end;
        }
    }

    /// The residual stream after the last layer, `[1, n, hidden]`.
    fn hidden(
        &self,
        kv: &mut KvCache,
        tokens: &[u32],
        before_layer: &mut BeforeLayer<'_>,
    ) -> Result<Tensor> {
        let n = tokens.len();
        if n == 0 {
            return Err(Error::Invalid("no tokens to run".into()));
        }
        if let Some(&bad) = tokens
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(Error::Invalid(format!(
                "token {bad} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        let ids = Tensor::from_slice(tokens, (1, n), &self.device)?;
        let mut x = self.embedding.embedding(&ids)?;
        x = (x * (self.config.hidden as f64).sqrt())?;
        let mut start = None;
        for (layer, block) in self.blocks.iter().enumerate() {
            before_layer(layer, kv)?;
            let pos = kv.layer_len(layer);
            // Every layer must see the same positions; a hook that filled a layer short
            // (or too long) would shift the rotary phases.
            match start {
                None => start = Some(pos),
                Some(s) if s != pos => {
                    return Err(Error::Invalid(format!(
                        "layer {layer} holds {pos} positions, layer 0 held {s}"
                    )));
                }
                Some(_) => {}
            }
            if pos + n > self.max_positions {
                return Err(Error::Invalid(format!(
                    "the sequence would reach {} positions; the model was loaded for {}",
                    pos + n,
                    self.max_positions
                )));
            }
            x = self.block_forward(layer, block, kv, &x, pos)?;
        }
        Ok(x)
    }

    /// Logits of the last position of `x`.
    fn last_logits(&self, x: &Tensor) -> Result<Vec<f32>> {
        let (_, n, _) = x.dims3()?;
        let last = x.narrow(1, n - 1, 1)?.contiguous()?;
        let last = rms_norm(&last, &self.final_norm, self.config.rms_eps)?;
        let logits = self.output.forward(&last)?;
        Ok(logits.flatten_all()?.to_vec1::<f32>()?)
    }

    fn block_forward(
        &self,
        layer: usize,
        w: &Block,
        kv: &mut KvCache,
        x: &Tensor,
        start: usize,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (_, n, _) = x.dims3()?;
        let h = rms_norm(x, &w.attn_norm, c.rms_eps)?;
        let q =
            w.wq.forward(&h)?
                .reshape((1, n, c.num_heads, c.head_dim))?
                .transpose(1, 2)?
                .contiguous()?;
        let k =
            w.wk.forward(&h)?
                .reshape((1, n, c.num_kv_heads, c.head_dim))?
                .transpose(1, 2)?
                .contiguous()?;
        let v =
            w.wv.forward(&h)?
                .reshape((1, n, c.num_kv_heads, c.head_dim))?
                .transpose(1, 2)?;
        let q = rms_norm(&q, &w.q_norm, c.rms_eps)?;
        let k = rms_norm(&k, &w.k_norm, c.rms_eps)?;
        let global = c.is_global(layer);
        let (cos, sin) = if global {
            &self.rope_global
        } else {
            &self.rope_local
        };
        let (cos, sin) = (cos.narrow(0, start, n)?, sin.narrow(0, start, n)?);
        let q = rope(&q, &cos, &sin)?;
        let k = rope(&k, &cos, &sin)?;
        let (keys, values) = kv.append(layer, &k, &v)?;
        // Keys any query of this chunk can see: all for a global layer, the window for
        // a local one.
        let window = if global { usize::MAX } else { c.sliding_window };
        let lo = start.saturating_sub(window - 1);
        let len = start + n - lo;
        let keys = keys.narrow(2, lo, len)?;
        let values = values.narrow(2, lo, len)?;
        // Grouped-query attention: the query heads sharing a KV head become more rows.
        let groups = c.num_heads / c.num_kv_heads;
        let q = q.reshape((1, c.num_kv_heads, groups * n, c.head_dim))?;
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        let mut scores = (q.matmul(&keys.t()?)? * scale)?;
        if n > 1 {
            let mask = attention_mask(groups, n, start, lo, len, window, &self.device)?;
            scores = scores.broadcast_add(&mask)?;
        }
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let attn = probs
            .matmul(&values)?
            .reshape((1, c.num_heads, n, c.head_dim))?
            .transpose(1, 2)?
            .reshape((1, n, c.num_heads * c.head_dim))?;
        let attn = w.wo.forward(&attn)?;
        let x = (x + rms_norm(&attn, &w.post_attn_norm, c.rms_eps)?)?;
        let h = rms_norm(&x, &w.ffn_norm, c.rms_eps)?;
        let ff = (w.gate.forward(&h)?.gelu()? * w.up.forward(&h)?)?;
        let ff = w.down.forward(&ff)?;
        Ok((x + rms_norm(&ff, &w.post_ffn_norm, c.rms_eps)?)?)
    }
}

/// `0` where query row `r` (of `groups` repeats of `n` queries at `start..`) may see key
/// `lo + j`, `-inf` elsewhere: causal, and within `window` positions for local layers.
fn attention_mask(
    groups: usize,
    n: usize,
    start: usize,
    lo: usize,
    len: usize,
    window: usize,
    device: &Device,
) -> Result<Tensor> {
    let mut mask = Vec::with_capacity(groups * n * len);
    for _ in 0..groups {
        for r in 0..n {
            let p = start + r;
            mask.extend((0..len).map(|j| {
                let key = lo + j;
                if key <= p && p - key < window {
                    0.0f32
                } else {
                    f32::NEG_INFINITY
                }
            }));
        }
    }
    Ok(Tensor::from_vec(mask, (groups * n, len), device)?)
}

fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    Ok(candle_nn::ops::rms_norm(&x.contiguous()?, weight, eps)?)
}

/// Index of the largest logit (the first one on ties): greedy decoding.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}
