//! kvtier's cluster metadata plane over etcd (docs/cluster.md, ADR 0013).
//!
//! Every replica answers hit or miss from memory; through etcd it learns of every other
//! replica's run objects in the shared S3 store, and tells them of its own:
//!
//! - **Records** ([`record`]): one advertisement per run object (not per block), keyed by
//!   the run, never leased — an object stays valid when its writer dies — and tombstones
//!   for deletion; one per state object (recurrent-state snapshots and checkpoints).
//!   Applying a record twice changes nothing.
//! - **The catalog** ([`ClusterCatalog`]) plugs into the remote tier's catalog seam
//!   ([`kvtier_remote::Catalog`]): the tier does not know etcd, and a single-machine
//!   build does not link this crate.
//! - **Replay and watch** ([`follow`]): a paginated read at one revision, a watch from the
//!   next, a full resync when the watch's revision was compacted.
//! - **Membership and fencing** ([`member`]): a leased member key and a generation
//!   counter; every publish is a transaction that compares both.
//! - **Write-behind publishing** ([`publish`]): a store never waits on etcd.
//! - **Two-phase GC** ([`gc`], [`leader`]): withdraw with a tombstone, wait out the grace
//!   window, then delete; by the owner, or by the elected GC leader for orphans, budgets
//!   and tombstones their deleter left unfinished.
//! - **Signed records** ([`signed`]): with the cluster's signing key, every advertisement,
//!   tombstone and delete marker carries a tag only a key holder can compute.
//! - **Status** ([`status`]): what `kvtier cluster status` prints.

pub mod catalog;
pub mod config;
pub mod deletes;
pub mod follow;
pub mod gc;
pub mod keys;
pub mod leader;
pub mod member;
pub mod publish;
pub mod reconcile;
pub mod record;
pub mod signed;
mod states;
pub mod stats;
pub mod status;
pub mod view;

pub use catalog::{ClusterCatalog, connect_once, connect_once_as};
pub use config::{ClusterConfig, EtcdAccess, EtcdAuth, EtcdTls, parse_endpoints};
/// The etcd client this crate speaks through (for tools and benchmarks beside it).
pub use etcd_client;
pub use gc::Withdrawal;
pub use keys::Keys;
pub use record::{Advert, Member, Priority, StateAdvert, Tombstone};
pub use stats::ClusterStats;
