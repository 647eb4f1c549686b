//! KV events for KV-aware routers (llm-d, Dynamo): what kvtier holds, where, as it changes,
//! in vLLM's ZeroMQ wire format, so a router that reads vLLM's events reads kvtier's.
//!
//! - **Source.** The engine's residency events ([`kvtier_core::events`]) of every tier —
//!   stores, promotions and demotions as the receiving tier admits them, evictions, TTL
//!   expiry, deletes, a detached SSD tier — not what a client asked for.
//! - **Wire.** A ZeroMQ PUB socket sends `[topic, sequence (8 bytes, big-endian), payload]`,
//!   the payload a msgpack `EventBatch` `[ts, [event, …], data_parallel_rank]` whose events
//!   are vLLM's `BlockStored`, `BlockRemoved` and `AllBlocksCleared` ([`wire`]). The
//!   medium names the tier ([`Medium`]).
//! - **Replay.** An optional ROUTER socket answers a request carrying a start sequence
//!   with every buffered batch from there on, then an end marker (sequence −1), as vLLM's
//!   publisher does.
//! - **Epoch.** A sequence number is `epoch << 22 | n` ([`EPOCH_SHIFT`]): the epoch is the
//!   publisher's start time in milliseconds since 2020-01-01 UTC (strictly increasing
//!   within a process) and `n` counts its batches from 0. Every epoch opens with
//!   `AllBlocksCleared` followed by a listing of every block held, so a consumer that sees
//!   a new epoch (a restart) drops what it knew and relearns; one that ignores epochs
//!   still converges by applying batches in order. After 2^21 batches the next listing
//!   opens a new epoch (numbers never run out). A new subscription is answered with an
//!   empty batch (never before the epoch's listing), so a subscriber learns the current sequence (and any gap or new epoch)
//!   at once.
//! - **Never stale.** When the engine drops events because this publisher fell behind, the
//!   publisher re-lists (`AllBlocksCleared` and the listing) instead of publishing a view
//!   with holes.

mod access;
mod config;
mod publisher;
mod sockets;
mod translate;
pub mod wire;
pub mod zmq;

pub use config::{CurveConfig, KvEventsConfig};
pub use publisher::{BoundSockets, KvEventPublisher, PublisherStats, StatsReader};
pub use sockets::EPOCH_SHIFT;
pub use translate::Medium;
