//! kvtier-candle: real models through kvtier, on candle (CPU).
//!
//! - [`gemma`]: Gemma 3 270M from its GGUF, with a KV cache that can be cut into kvtier
//!   blocks and filled back from them.
//! - [`mamba`]: Mamba (candle-transformers) with deterministic weights and a recurrent
//!   state that snapshots to bytes and back.
//! - [`hybrid`]: a small hybrid (attention and Mamba layers) assembled from candle's parts,
//!   with seeded weights: the proof of the all-or-nothing rule for hybrid hits.
//! - [`reuse`]: a turn of a conversation with kvtier underneath — the embedded engine or
//!   a `kvtier serve` — for attention KV blocks and for recurrent-state snapshots. The
//!   server itself is started by the caller ([`reuse::ServeLauncher`]): this crate does
//!   not depend on `kvtier-server`.
//!
//! - [`demo`]: `kvtier demo`, a multi-turn chat workload measured cold and warm.
//! - [`conversation`]: the two-turn conversations and cold references the reuse tests of
//!   this crate and of `crates/kvtier` (through `kvtier serve`) share.
//!
//! Reuse is exact: a turn that restores a prefix decodes the same tokens from the same
//! logits, bit for bit, as one that computes everything (`docs/adr/0008-real-models.md`).

pub mod bench;
pub mod conversation;
pub mod demo;
mod digest;
mod error;
pub mod gemma;
pub mod hybrid;
pub mod mamba;
pub mod prompts;
pub mod reuse;

pub use digest::file_sha256;
pub use error::{Error, Result};
