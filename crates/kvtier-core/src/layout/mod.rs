//! What a KV byte means: the [`LayoutKey`], its canonical encoding and digest, and the
//! geometry of a block payload that follows from it.
//!
//! Two caches computed under different models, weights, tokenizers, dtypes, block sizes,
//! parallelism shards, adapters or tenants must never serve each other's bytes. Every one
//! of those facts is a field of [`LayoutKey`]; its 128-bit digest seeds every block hash
//! (see [`crate::hash`]), so blocks of two layouts live in disjoint key spaces.

mod cold;
mod dtype;
mod geometry;
mod key;

pub use cold::ColdCodec;

pub use dtype::KvDtype;
pub use geometry::BlockGeometry;
pub use key::{
    LAYOUT_SCHEMA_VERSION, Layout, LayoutDigest, LayoutKey, MAX_BLOCK_BYTES, StateGroup,
};
