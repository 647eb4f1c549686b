//! The hybrid model's shape.

use candle_transformers::models::mamba::Config as MambaConfig;

/// Tokens per kvtier block of the hybrid model's attention layers.
pub const HYBRID_TOKENS_PER_BLOCK: usize = 16;

/// What one layer of the model is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Causal self-attention: its past is a KV cache (kvtier blocks).
    Attention,
    /// A Mamba mixer: its past is a recurrent state (a kvtier checkpoint).
    Mamba,
}

/// The hybrid model's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HybridConfig {
    /// Residual width.
    pub d_model: usize,
    /// Vocabulary (the synthetic model reads bytes: 256).
    pub vocab_size: usize,
    /// The layers, in order.
    pub layers: Vec<LayerKind>,
    /// Attention heads (every head has its own K and V: no grouped queries).
    pub num_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Longest prompt plus decode the RoPE tables are built for.
    pub max_positions: usize,
}

impl HybridConfig {
    /// Attention layers.
    pub fn attention_layers(&self) -> usize {
        self.count(LayerKind::Attention)
    }

    /// Mamba layers.
    pub fn mamba_layers(&self) -> usize {
        self.count(LayerKind::Mamba)
    }

    fn count(&self, kind: LayerKind) -> usize {
        self.layers.iter().filter(|&&k| k == kind).count()
    }

    /// The layers as letters, `A` attention and `M` Mamba (`MAMA`): part of the model's
    /// name in its layout key.
    pub fn pattern(&self) -> String {
        self.layers
            .iter()
            .map(|k| match k {
                LayerKind::Attention => 'A',
                LayerKind::Mamba => 'M',
            })
            .collect()
    }

    /// The shape candle's Mamba blocks are built with: the same width, and one state slot
    /// per Mamba layer (the attention layers have none).
    pub fn mamba_config(&self) -> MambaConfig {
        MambaConfig {
            d_model: self.d_model,
            n_layer: self.mamba_layers(),
            vocab_size: self.vocab_size,
            pad_vocab_size_multiple: 8,
        }
    }

    /// The vocabulary padded as the embedding table is stored.
    pub fn padded_vocab(&self) -> usize {
        self.vocab_size.div_ceil(8) * 8
    }

    /// Bytes of one kvtier block: K and V of every attention layer for
    /// [`HYBRID_TOKENS_PER_BLOCK`] tokens, f32.
    pub fn block_bytes(&self) -> usize {
        self.attention_layers() * 2 * HYBRID_TOKENS_PER_BLOCK * self.num_heads * self.head_dim * 4
    }
}

/// The synthetic hybrid: byte tokens, width 128, Mamba and attention alternating over
/// four layers (`MAMA`), four heads of 32.
pub fn synthetic_config() -> HybridConfig {
    HybridConfig {
        d_model: 128,
        vocab_size: 256,
        layers: vec![
            LayerKind::Mamba,
            LayerKind::Attention,
            LayerKind::Mamba,
            LayerKind::Attention,
        ],
        num_heads: 4,
        head_dim: 32,
        max_positions: 4096,
    }
}
