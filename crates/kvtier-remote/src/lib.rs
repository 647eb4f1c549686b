//! kvtier-remote: the shared object-storage tier, over any S3-compatible endpoint (AWS S3,
//! MinIO, Ceph RGW, Garage, `kvtier gateway`).
//!
//! - [`object`]: the object layout — run objects whose any block-aligned prefix is one
//!   byte range, and their manifests (docs/remote-tier.md).
//! - [`placement`]: which endpoint and bucket an object lives on (rendezvous hashing).
//! - [`RemoteTier`]: the tier, behind kvtier-core's `Tier` trait.
//! - [`catalog`]: how the tier learns of objects written elsewhere ([`Catalog`]; listing
//!   the bucket at open is [`ListCatalog`]) and whom it tells of its own.
//! - [`state`]: recurrent-state snapshots and checkpoints as self-verifying state
//!   objects, found from memory.
//! - [`IoRuntime`]: the runtime its requests run on, lent by the assembly.
//! - [`http1`] and [`sigv4`]: the lean HTTP/1.1 client and the signatures its direct
//!   reads of hits go through (`direct.rs`), one copy from the socket to the served
//!   buffer.

pub mod catalog;
mod config;
mod direct;
pub mod http1;
pub mod object;
pub mod placement;
mod recv;
mod runtime;
mod s3;
pub mod sign;
pub mod sigv4;
pub mod state;
mod tier;

pub use catalog::{Adopted, Catalog, ListCatalog, Listed, ObjectInfo, ObjectName};
pub use config::{Endpoint, RemoteConfig};
pub use runtime::IoRuntime;
pub use s3::check_reachable;
pub use sign::SigningKey;
pub use state::StateName;
pub use tier::RemoteTier;
