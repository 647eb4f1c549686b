//! kvtier-gateway: `kvtier gateway`, an S3-compatible object server whose objects live in
//! kvtier's own segment store (the SSD tier's record format), so that a ranged GET is one
//! positioned read verified by per-chunk checksums.
//!
//! - [`store`]: buckets, objects and multipart parts as records, with an ordered index.
//! - [`s3`]: the S3 operations (s3s does parsing, XML, errors and SigV4).
//! - [`serve`]: the listener (TCP_NODELAY), authentication modes, start and stop.
//!
//! The supported API is listed in docs/gateway.md.

pub mod cli;
pub mod s3;
pub mod serve;
pub mod store;

pub use serve::{Auth, Counters, GatewayConfig, RunningGateway};
