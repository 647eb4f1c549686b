//! `kvtier serve`: the engine as a per-replica daemon (seed 001's layer 2) for inference
//! engines that do not embed the crate.
//!
//! - [`config`], [`units`]: the settings, defined once in `kvtier-node` and re-exported.
//! - `routes`: the HTTP API (docs/API.md) — data endpoints, admin control plane, health.
//! - [`metrics`]: Prometheus exposition of every engine counter and request latencies.
//! - [`state`]: the node (`kvtier-node`) and the metrics every handler shares.
//! - [`listen`]: connections, with timeouts and a cap.
//! - [`serve`]: start, graceful shutdown.
//! - [`local`]: a server on a thread of this process, for in-process callers (the model
//!   demo, bench rows and tests).

pub mod error;
pub mod listen;
pub mod local;
pub mod metrics;
mod routes;
pub mod serve;
pub mod shm;
pub mod state;

pub use kvtier_node::settings as config;
pub use kvtier_node::units;
pub use kvtier_node::{ServeArgs, Settings};
pub use local::LocalServer;
pub use serve::{Running, Stopped, run};
