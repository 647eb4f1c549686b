//! kvtier-node: how a kvtier node is assembled, in one place for every front end —
//! `kvtier serve`, `kvtier demo`, `kvtier bench`, the model crates and the coming Python
//! package.
//!
//! - [`settings`]: every setting, defined once with its default: serde for files
//!   (`--print-config` prints it back as written) and Python's dict.
//! - [`args`]: `kvtier serve`'s command line — a few named flags, `--set` for the rest,
//!   `--help` defaults rendered from the settings.
//! - [`units`]: sizes and durations in human units that round-trip as written (`2GB` stays
//!   `2GB`).
//! - [`overrides`]: any setting by its dotted path (`--set a.b=v`, `KVTIER__A__B=v`).
//! - [`node`]: settings → a running engine with its tiers and background work, and the
//!   live SSD change.
//! - [`cache`]: the caller API — one [`Cache`] over an embedded node or a client of
//!   `kvtier serve`, used by Python, the model runners and the benches.
//! - [`components`]: what the assembly injects into every part — one clock (monotonic
//!   and wall time) and one runtime for network I/O.

pub mod args;
pub mod cache;
mod cluster_deletes;
pub mod components;
pub mod node;
pub mod overrides;
pub mod registry;
pub mod settings;
/// Sizes and durations as people write them (defined in the core: one parser for every
/// front end).
pub use kvtier_core::units;

pub use args::ServeArgs;
pub use cache::{BlockLease, BlockReservation, Cache, CacheLayout, Deadlines, Hit};
pub use components::Components;
pub use node::{Node, cluster_endpoints, remote_config};
pub use settings::{AuthSettings, Settings, TenantToken};
