//! kvtier-ssd: the persistent SSD tier of kvtier.
//!
//! - [`format`]: the on-disk format (records, segment headers, index logs), version 1.
//! - [`store`]: the append-only segment store: writes, verified reads, recovery, the
//!   directory lock.
//! - [`SsdTier`]: the store behind kvtier-core's `Tier` trait, with an in-memory index of
//!   what it holds, dedup and collision guards, and quarantine of corrupt records.

pub mod format;
pub mod store;
mod tier;

pub use store::{Durability, RecoveryReport, SegmentStore, StoreConfig};
pub use tier::{Compacted, Enforced, SsdConfig, SsdTier};
