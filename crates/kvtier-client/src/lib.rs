//! The client side of kvtier's network API (`kvtier serve`; see docs/API.md).
//!
//! - [`wire`]: the request and response types and the binary framing of loads and
//!   stores, shared with the server so both ends agree by construction.
//! - [`Client`]: an async client over one connection pool (connections are reused
//!   across calls and clones).

pub mod wire;

mod client;
mod conn;
mod reader;

pub use client::{Client, ClientError, LoadedPrefix, RestoredPrefix};
