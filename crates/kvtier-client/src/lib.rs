//! The client side of kvtier's network API (`kvtier serve`; see docs/API.md).
//!
//! - [`wire`]: the request and response types and the binary framing of loads and
//!   stores, shared with the server so both ends agree by construction.
//! - [`Client`]: an async client over one connection pool (connections are reused
//!   across calls and clones), every call bounded by its [`Deadlines`].
//! - `convert`: the one mapping between the engine's types and the wire's (layout key ⇄
//!   [`wire::LayoutSpec`], store report → answer, [`ClientError`] → the engine's error
//!   kinds).

pub mod shm;
pub mod wire;

mod client;
mod conn;
mod convert;
mod deadlines;
mod reader;

pub use client::{Client, ClientError, LoadedPrefix, RestoredPrefix};
pub use convert::BadSpec;
pub use deadlines::Deadlines;
