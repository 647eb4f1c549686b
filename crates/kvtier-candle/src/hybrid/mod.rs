//! A small hybrid model — attention layers and Mamba layers interleaved — assembled from
//! candle's parts with deterministic weights (issue 16, `docs/hybrid.md`).
//!
//! It exists to prove kvtier's composition rule on a real forward pass: its attention
//! layers carry their past as KV blocks, its Mamba layers as one recurrent state, and a
//! restore is correct only when both come from the same token boundary. Restoring the KV
//! of 128 tokens with the recurrent state of 64 (or a zero state) does not fail — it
//! decodes different tokens — which is why kvtier serves both or neither.
//!
//! - [`config`]: the shape (which layer is which, width, heads).
//! - [`weights`]: the seeded safetensors file, loaded like a downloaded checkpoint.
//! - [`attention`]: one causal self-attention layer with RoPE and its KV cache, which
//!   cuts into kvtier blocks and fills back from them.
//! - [`model`]: the model, token by token, and its state (KV caches plus Mamba state).

pub mod attention;
pub mod config;
mod model;
mod weights;

pub use config::{HYBRID_TOKENS_PER_BLOCK, HybridConfig, LayerKind, synthetic_config};
pub use model::{HybridModel, HybridState};
pub use weights::write_synthetic;
