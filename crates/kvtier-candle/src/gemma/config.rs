//! The shape of a Gemma 3 model, read from its GGUF metadata.

use candle_core::quantized::gguf_file;

use crate::{Error, Result};

/// Gemma 3's local (sliding-window) layers use this RoPE base; the GGUF states only the
/// global one unless it carries `rope.local_freq_base`.
const LOCAL_ROPE_BASE: f32 = 10_000.0;
/// One layer in this many is global; the rest attend to a sliding window.
const DEFAULT_GLOBAL_EVERY: usize = 6;

/// Everything the forward pass needs to know about the model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmaConfig {
    /// Transformer blocks.
    pub num_layers: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention).
    pub num_kv_heads: usize,
    /// Elements per head (keys and values).
    pub head_dim: usize,
    /// ε of every RMS norm.
    pub rms_eps: f32,
    /// Tokens a local layer looks back over, itself included.
    pub sliding_window: usize,
    /// Layer `i` is global when `(i + 1) % global_every == 0`.
    pub global_every: usize,
    /// RoPE base of the global layers.
    pub rope_base_global: f32,
    /// RoPE base of the local layers.
    pub rope_base_local: f32,
    /// Vocabulary size (rows of the tied embedding).
    pub vocab_size: usize,
    /// Begin-of-sequence token id.
    pub bos: u32,
    /// End-of-sequence token id.
    pub eos: u32,
}

impl GemmaConfig {
    /// Reads the shape from GGUF metadata (architecture `gemma3`).
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self> {
        let arch = match content.metadata.get("general.architecture") {
            Some(v) => v.to_string()?.clone(),
            None => "gemma3".to_owned(),
        };
        if arch != "gemma3" {
            return Err(Error::Weights(format!(
                "the GGUF is a `{arch}` model; only `gemma3` is supported"
            )));
        }
        let get = |key: &str| {
            content
                .metadata
                .get(&format!("gemma3.{key}"))
                .ok_or_else(|| Error::Weights(format!("the GGUF has no `gemma3.{key}`")))
        };
        let u = |key: &str| -> Result<usize> { Ok(get(key)?.to_u32()? as usize) };
        let vocab_size = match content.tensor_infos.get("token_embd.weight") {
            Some(info) => info.shape.dims2()?.0,
            None => return Err(Error::Weights("the GGUF has no token_embd.weight".into())),
        };
        let token = |key: &str, default: u32| {
            content
                .metadata
                .get(key)
                .and_then(|v| v.to_u32().ok())
                .unwrap_or(default)
        };
        let config = Self {
            num_layers: u("block_count")?,
            hidden: u("embedding_length")?,
            num_heads: u("attention.head_count")?,
            num_kv_heads: u("attention.head_count_kv")?,
            head_dim: u("attention.key_length")?,
            rms_eps: get("attention.layer_norm_rms_epsilon")?.to_f32()?,
            sliding_window: u("attention.sliding_window")?,
            global_every: u("attention.sliding_window_type").unwrap_or(DEFAULT_GLOBAL_EVERY),
            rope_base_global: get("rope.freq_base")?.to_f32()?,
            rope_base_local: get("rope.local_freq_base")
                .and_then(|v| Ok(v.to_f32()?))
                .unwrap_or(LOCAL_ROPE_BASE),
            vocab_size,
            bos: token("tokenizer.ggml.bos_token_id", 2),
            eos: token("tokenizer.ggml.eos_token_id", 1),
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<()> {
        let value_dim = self.head_dim;
        if self.num_layers == 0
            || self.num_heads == 0
            || self.num_kv_heads == 0
            || value_dim == 0
            || self.sliding_window == 0
            || self.global_every == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
            || !self.head_dim.is_multiple_of(2)
        {
            return Err(Error::Weights(format!("unusable model shape: {self:?}")));
        }
        Ok(())
    }

    /// Whether layer `layer` attends to the whole context.
    pub fn is_global(&self, layer: usize) -> bool {
        (layer + 1).is_multiple_of(self.global_every)
    }

    /// Bytes of K and V for one token across all layers, as f32.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.num_layers * self.num_kv_heads * self.head_dim * 2 * 4
    }
}
