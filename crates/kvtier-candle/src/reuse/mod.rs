//! Models talking to kvtier: the backend calls, a Gemma turn over KV blocks, a Mamba turn
//! over state snapshots.

mod backend;
mod gemma;
mod local_server;
mod mamba;

pub use backend::{Backend, BoundLayout, Hit, Served};
pub use gemma::{GEMMA_TOKENS_PER_BLOCK, GemmaRunner, LoadMode, TurnReport};
pub use local_server::LocalServer;
pub use mamba::{MambaRunner, MambaTurn};
