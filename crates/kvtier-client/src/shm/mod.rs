//! The local side of `kvtier serve`'s shared arena (docs/adr/0019-shared-arena.md): a
//! client on the same host connects to the server's Unix socket, maps the RAM tier's
//! arena read-only and a staging memory of its own read-write, reads leased blocks in
//! place and stores by writing into staging memory and committing.

mod client;
pub mod fds;
pub mod map;
pub mod proto;

pub use client::{Lease, Reservation, ShmClient, ShmError};
