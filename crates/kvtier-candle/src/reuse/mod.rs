//! Models talking to kvtier: the backend calls, a Gemma turn over KV blocks, a Mamba turn
//! over state snapshots, a hybrid turn over both at once, and the seam to a `kvtier serve`
//! on loopback.

mod backend;
mod gemma;
mod hybrid;
mod loopback;
mod mamba;

pub use backend::{Backend, BoundLayout, Hit, RestoredState, Served};
pub use gemma::{GEMMA_TOKENS_PER_BLOCK, GemmaRunner, LoadMode, TurnReport};
pub use hybrid::{HybridRunner, HybridTurn};
pub use loopback::{LoopbackServer, ServeLauncher};
pub use mamba::{MambaRunner, MambaTurn};
