//! kvtier-remote: the shared object-storage tier (issue 6, in progress).
//!
//! So far: [`placement`], which decides the endpoint and bucket of every object by
//! rendezvous hashing (seed 001 §4.3). The object layout and the tier itself are planned in
//! `docs/adr/0009-remote-tier-and-gateway.md`.

pub mod placement;
