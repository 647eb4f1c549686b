//! kvtier-core: the engine of kvtier, a tiered, persistent, shareable KV-cache store for
//! LLM inference.
//!
//! - [`layout`]: what a KV byte means ([`LayoutKey`]) and the block geometry it implies.
//! - [`hash`]: the 128-bit block hash chain seeded by the layout digest.
//! - [`index`]: the in-memory prefix index, the only place hit or miss is decided.
//! - [`tier`]: the [`Tier`] trait, the RAM tier, the write-behind queue in front of slow
//!   tiers, and the conformance suite every tier runs (the SSD tier lives in `kvtier-ssd`).
//! - [`snapshot`]: the exact-prefix snapshot bucket for recurrent-state models.
//! - [`engine`]: all of the above behind one API.
//! - [`events`]: residency events (inserted, removed, promoted, demoted) for observers.
//! - [`stats`]: counters with per-component prefixes.
//!
//! ```
//! use kvtier_core::{Engine, ExtraKeys, KvDtype, LayoutKey};
//! # fn main() -> kvtier_core::Result<()> {
//! let engine = Engine::builder().build()?;
//! let layout = engine.register_layout(LayoutKey::new("demo", KvDtype::F16, 16, 2, 2, 8))?;
//! let tokens: Vec<u32> = (0..40).collect(); // two whole blocks and a partial one
//! let prompt = engine.prompt(layout.digest(), &tokens, &ExtraKeys::none())?;
//! let kv = vec![7u8; layout.block_bytes() as usize];
//! engine.store(&prompt, &[&kv, &kv])?;
//! let hit = engine.lookup(&prompt);
//! assert_eq!(hit.matched_tokens, 32);
//! let loaded = engine.load(&hit)?;
//! assert!(loaded.complete && loaded.blocks[1] == kv);
//! # Ok(()) }
//! ```

pub mod arena;
pub mod budget;
pub mod clock;
pub mod copy;
pub mod engine;
pub mod error;
pub mod events;
pub mod hash;
pub mod index;
pub mod layout;
pub mod poison;
pub mod registry;
mod shard;
pub mod snapshot;
pub mod stats;
pub mod tier;
pub mod units;

pub use engine::{
    Ack, DEFAULT_MAX_TOKENS, Engine, EngineBuilder, EngineConfig, Flushed, Loaded, PersistConfig,
    PersistMode, Reattached, StoreOptions, StoreReport, TierFlushed, TierOpener,
};
pub use error::{Error, ErrorKind, Result};
pub use hash::{BlockHash, ExtraKeys};
pub use index::{BlockRef, Lookup, Prompt, StateRef};
pub use layout::{ColdCodec, KvDtype, Layout, LayoutDigest, LayoutKey, StateGroup};
pub use shard::PassThroughHasher;
pub use tier::{Tier, TierKind};
