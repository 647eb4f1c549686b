//! Gemma 3 (text) on candle: quantised weights from a GGUF, a forward pass written here
//! so its KV cache can leave and re-enter the model.

mod config;
mod forward;
mod kv;
mod locate;
mod requant;
mod vocab;
mod weights;

pub use config::GemmaConfig;
pub use forward::{BeforeLayer, argmax};
pub use kv::{KvCache, KvShape, LayerTensors};
pub use locate::{GGUF_ENV, locate_gguf};
pub use vocab::Vocab;
pub use weights::GemmaWeights;
