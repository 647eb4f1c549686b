//! Models talking to kvtier through the caller API (`kvtier_node::Cache`, re-exported
//! here: an embedded engine or a `kvtier serve`, the same calls): a Gemma turn over KV blocks, a Mamba turn
//! over state snapshots, a hybrid turn over both at once, and the seam to a `kvtier serve`
//! on loopback.

mod gemma;
mod hybrid;
mod loopback;
mod mamba;

pub use gemma::{GEMMA_TOKENS_PER_BLOCK, GemmaRunner, LoadMode, TurnReport};
pub use hybrid::{HybridRunner, HybridTurn};
pub use kvtier_node::{Cache, CacheLayout, Hit};
pub use loopback::{LoopbackServer, ServeLauncher};
pub use mamba::{MambaRunner, MambaTurn};
