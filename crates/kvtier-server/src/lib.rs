//! `kvtier serve`: the engine as a per-replica daemon (seed 001's layer 2) for inference
//! engines that do not embed the crate.
//!
//! - [`config`]: settings from defaults, a TOML file, environment and flags.
//! - `routes`: the HTTP API (docs/API.md) — data endpoints, admin control plane, health.
//! - [`metrics`]: Prometheus exposition of every engine counter and request latencies.
//! - [`state`]: the engine and the SSD tier's open / reattach.
//! - [`listen`]: connections, with timeouts and a cap.
//! - [`serve`]: start, graceful shutdown.

pub mod config;
pub mod error;
pub mod listen;
pub mod metrics;
mod routes;
pub mod serve;
pub mod state;
pub mod units;

pub use config::{ServeArgs, Settings};
pub use serve::{Running, Stopped, run};
