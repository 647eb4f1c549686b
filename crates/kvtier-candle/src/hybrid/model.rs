//! The hybrid model, token by token, and its state: one KV cache per attention layer and
//! one Mamba state (every Mamba layer's SSM and convolution state).

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Embedding, Linear, RmsNorm, VarBuilder};
use candle_transformers::models::mamba::{MambaBlock, State};

use super::attention::{Attention, KvCache};
use super::config::{HYBRID_TOKENS_PER_BLOCK, HybridConfig, LayerKind};
use crate::mamba::{decode_state, encode_state};
use crate::{Error, Result};

const NORM_EPS: f64 = 1e-5;
const ROPE_THETA: f64 = 10_000.0;

enum Layer {
    // Boxed: a Mamba block is three times an attention layer's size.
    Mamba {
        norm: RmsNorm,
        mixer: Box<MambaBlock>,
    },
    Attention {
        norm: RmsNorm,
        attn: Attention,
    },
}

/// The model and what identifies it.
pub struct HybridModel {
    embedding: Embedding,
    layers: Vec<Layer>,
    norm_f: RmsNorm,
    lm_head: Linear,
    /// RoPE tables, `[max_positions, head_dim / 2]`.
    cos: Tensor,
    sin: Tensor,
    config: HybridConfig,
    weights_digest: String,
}

impl std::fmt::Debug for HybridModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridModel")
            .field("config", &self.config)
            .field("weights_digest", &self.weights_digest)
            .finish_non_exhaustive()
    }
}

/// Everything the model carries from one token to the next.
pub struct HybridState {
    /// Every Mamba layer's state, and the position (tokens fed so far).
    pub mamba: State,
    /// One cache per attention layer, in layer order.
    pub kv: Vec<KvCache>,
}

impl HybridState {
    /// Tokens fed so far.
    pub fn pos(&self) -> usize {
        self.mamba.pos
    }
}

impl HybridModel {
    /// Loads safetensors weights of shape `config`.
    pub fn load(path: &Path, config: HybridConfig) -> Result<Arc<Self>> {
        let weights_digest = crate::digest::file_sha256(path)?;
        let bytes = std::fs::read(path)
            .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
        let vb = VarBuilder::from_buffered_safetensors(bytes, DType::F32, &Device::Cpu)?;
        let d = config.d_model;
        let embedding = candle_nn::embedding(config.padded_vocab(), d, vb.pp("embedding"))?;
        let mamba = config.mamba_config();
        let mut layers = Vec::with_capacity(config.layers.len());
        let mut mamba_index = 0;
        for (i, kind) in config.layers.iter().enumerate() {
            let vb = vb.pp("layers").pp(i);
            let norm = candle_nn::rms_norm(d, NORM_EPS, vb.pp("norm"))?;
            layers.push(match kind {
                LayerKind::Mamba => {
                    // Each Mamba block keeps its state in its own slot of the one State.
                    let mixer = Box::new(MambaBlock::new(mamba_index, &mamba, vb.pp("mixer"))?);
                    mamba_index += 1;
                    Layer::Mamba { norm, mixer }
                }
                LayerKind::Attention => Layer::Attention {
                    norm,
                    attn: Attention::new(d, config.num_heads, config.head_dim, vb.pp("attn"))?,
                },
            });
        }
        let norm_f = candle_nn::rms_norm(d, NORM_EPS, vb.pp("norm_f"))?;
        let lm_head = Linear::new(embedding.embeddings().clone(), None);
        let (cos, sin) = rope_tables(&config)?;
        Ok(Arc::new(Self {
            embedding,
            layers,
            norm_f,
            lm_head,
            cos,
            sin,
            config,
            weights_digest,
        }))
    }

    /// The model's shape.
    pub fn config(&self) -> &HybridConfig {
        &self.config
    }

    /// SHA-256 of the weights file, hex.
    pub fn weights_digest(&self) -> &str {
        &self.weights_digest
    }

    /// The state before any token.
    pub fn fresh_state(&self) -> Result<HybridState> {
        let mamba = State::new(1, &self.config.mamba_config(), DType::F32, &Device::Cpu)?;
        Ok(HybridState {
            mamba,
            kv: self.empty_caches(),
        })
    }

    fn empty_caches(&self) -> Vec<KvCache> {
        self.layers
            .iter()
            .filter_map(|l| match l {
                Layer::Attention { attn, .. } => Some(attn.cache()),
                Layer::Mamba { .. } => None,
            })
            .collect()
    }

    /// Feeds `token` through every layer; returns the logits of the next token.
    pub fn step(&self, state: &mut HybridState, token: u32) -> Result<Vec<f32>> {
        if token as usize >= self.config.vocab_size {
            return Err(Error::Invalid(format!(
                "token {token} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        let pos = state.pos();
        if pos >= self.config.max_positions {
            return Err(Error::Invalid(format!(
                "position {pos} is past the model's {} positions",
                self.config.max_positions
            )));
        }
        let cos = self.cos.narrow(0, pos, 1)?;
        let sin = self.sin.narrow(0, pos, 1)?;
        let mut xs = self
            .embedding
            .forward(&Tensor::new(&[token], &Device::Cpu)?)?;
        let mut caches = state.kv.iter_mut();
        for layer in &self.layers {
            xs = match layer {
                Layer::Mamba { norm, mixer } => {
                    (mixer.forward(&norm.forward(&xs)?, &mut state.mamba)? + &xs)?
                }
                Layer::Attention { norm, attn } => {
                    let cache = caches.next().ok_or_else(|| {
                        Error::Invalid("a state with fewer KV caches than attention layers".into())
                    })?;
                    (attn.forward(&norm.forward(&xs)?, cache, &cos, &sin)? + &xs)?
                }
            };
        }
        // The Mamba blocks read the position to pick their convolution slot; it moves
        // once per token, after every layer (as candle's own Mamba model does).
        state.mamba.pos += 1;
        let logits = self.lm_head.forward(&self.norm_f.forward(&xs)?)?;
        let mut v = logits.flatten_all()?.to_vec1::<f32>()?;
        v.truncate(self.config.vocab_size);
        Ok(v)
    }

    /// Block `index` of the tokens in `state`: every attention layer's page, in layer
    /// order.
    pub fn block(&self, state: &HybridState, index: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.config.block_bytes());
        for cache in &state.kv {
            cache.write_page(
                index * HYBRID_TOKENS_PER_BLOCK,
                HYBRID_TOKENS_PER_BLOCK,
                &mut out,
            )?;
        }
        Ok(out)
    }

    /// The recurrent part of `state` as bytes (the Mamba state blob, position included).
    pub fn encode_state(&self, state: &HybridState) -> Result<Vec<u8>> {
        encode_state(&self.config.mamba_config(), &state.mamba)
    }

    /// The state after the tokens `blocks` cover, from those blocks and the recurrent
    /// state `blob` of the same boundary. Refused ([`Error::Mismatch`]) when a block has
    /// the wrong size or the state is not at the blocks' end.
    pub fn restore(&self, blocks: &[Bytes], blob: &[u8]) -> Result<HybridState> {
        let mamba = decode_state(&self.config.mamba_config(), blob)?;
        self.restore_parts(blocks, mamba)
    }

    /// [`Self::restore`] with the Mamba state already decoded.
    pub fn restore_parts(&self, blocks: &[Bytes], mamba: State) -> Result<HybridState> {
        let tokens = blocks.len() * HYBRID_TOKENS_PER_BLOCK;
        if mamba.pos != tokens {
            return Err(Error::Mismatch(format!(
                "a recurrent state at token {} with KV blocks of {tokens} tokens",
                mamba.pos
            )));
        }
        let mut kv = self.empty_caches();
        for (i, block) in blocks.iter().enumerate() {
            if block.len() != self.config.block_bytes() {
                return Err(Error::Mismatch(format!(
                    "block {i} has {} bytes; this model's have {}",
                    block.len(),
                    self.config.block_bytes()
                )));
            }
            let mut at = 0;
            for cache in &mut kv {
                let n = cache.page_bytes(HYBRID_TOKENS_PER_BLOCK);
                cache.append_page(&block[at..at + n])?;
                at += n;
            }
        }
        Ok(HybridState { mamba, kv })
    }
}

/// RoPE's cosines and sines for every position, `[max_positions, head_dim / 2]`.
fn rope_tables(config: &HybridConfig) -> Result<(Tensor, Tensor)> {
    let half = config.head_dim / 2;
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| ROPE_THETA.powf(-((2 * i) as f64) / config.head_dim as f64))
        .collect();
    let angles: Vec<f32> = (0..config.max_positions)
        .flat_map(|p| inv_freq.iter().map(move |f| (p as f64 * f) as f32))
        .collect();
    let angles = Tensor::from_vec(angles, (config.max_positions, half), &Device::Cpu)?;
    Ok((angles.cos()?, angles.sin()?))
}
