//! Real models through `kvtier serve` (built with `--features models`): Gemma's KV blocks
//! and Mamba's state snapshots restored through the server and after it restarts on the
//! same directory decode exactly like the cold turn, the hybrid model's KV and state
//! reach a second replica through S3, and `kvtier demo` runs every phase.
//!
//! These live here rather than in `kvtier-candle`, which does not depend on the server;
//! the conversations and their cold references are `kvtier_candle::conversation`, the same
//! the embedded tests in `crates/kvtier-candle/tests/` use.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod demo;
// The model fixtures the embedded tests use, one copy for both crates.
#[path = "../../../kvtier-candle/tests/fixtures/mod.rs"]
mod fixtures;
// The real `kvtier gateway` the remote-tier tests run.
#[path = "../gateway/mod.rs"]
mod gateway;
mod gemma;
mod hybrid;
// The binary's own launcher, so the demo runs its served phase exactly as `kvtier demo`.
#[path = "../../src/loopback.rs"]
mod loopback;
mod mamba;
