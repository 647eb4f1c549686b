//! Direct access to a cache's block memory, for a caller that moves the bytes itself — a
//! GPU's DMA engine or copy kernel (`kvtier.torch`) — instead of handing kvtier a buffer:
//!
//! - [`BlockLease`]: where each block of a hit lies in this process's memory, kept there
//!   (never reused) until the lease is dropped;
//! - [`BlockReservation`]: where to write each block of a store, kept until committed or
//!   dropped (dropped uncommitted: nothing is stored).
//!
//! An embedded engine's blocks lie in its arena and a reservation is a set of arena slots,
//! committed without any copy; a server's blocks lie in its shared arena, mapped
//! read-only here, and a reservation is staging memory the server copies from at commit
//! (ADR 0019). A server reached over HTTP only has no memory here: both calls are refused.

use bytes::Bytes;
use kvtier_client::shm::{Lease, Reservation, ShmClient};
use kvtier_client::wire::StoreAnswer;
use kvtier_core::arena::BlockBuf;
use kvtier_core::{Ack, Engine, Error, ErrorKind, Prompt, Result, StoreOptions};
use std::sync::Arc;

/// The blocks of a hit, held in place (see the module docs).
#[derive(Debug)]
pub struct BlockLease {
    places: Vec<(usize, usize)>,
    _held: Held,
}

#[derive(Debug)]
enum Held {
    /// An embedded engine's blocks: their buffers keep their arena slots.
    Local(#[allow(dead_code, reason = "held, never read: it keeps the slots")] Vec<Bytes>),
    /// A server's lease, released on drop.
    Shared(#[allow(dead_code, reason = "held, never read: dropping it releases the lease")] Lease),
}

impl BlockLease {
    pub(super) fn local(blocks: Vec<Bytes>) -> Self {
        Self {
            places: blocks
                .iter()
                .map(|b| (b.as_ptr() as usize, b.len()))
                .collect(),
            _held: Held::Local(blocks),
        }
    }

    pub(super) fn shared(client: &ShmClient, lease: Lease) -> Self {
        let (base, _) = client.arena_region();
        Self {
            places: lease
                .slots()
                .iter()
                .map(|s| (base + s.offset as usize, s.len as usize))
                .collect(),
            _held: Held::Shared(lease),
        }
    }

    /// `(address, bytes)` of each leased block, in order: the first blocks of the hit
    /// (fewer than it matched when some were lost since the lookup).
    pub fn places(&self) -> &[(usize, usize)] {
        &self.places
    }
}

/// Room for the blocks of a store, written in place (see the module docs).
#[derive(Debug)]
pub struct BlockReservation {
    places: Vec<(usize, usize)>,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Local {
        engine: Arc<Engine>,
        prompt: Prompt,
        first_block: usize,
        slots: Vec<BlockBuf>,
    },
    Shared {
        client: ShmClient,
        reservation: Reservation,
    },
}

impl BlockReservation {
    pub(super) fn local(
        engine: Arc<Engine>,
        prompt: Prompt,
        first_block: usize,
        blocks: usize,
    ) -> Result<Self> {
        let len = prompt.layout().block_bytes() as usize;
        let slots = engine.block_buffers(len, blocks);
        let places = slots
            .iter()
            .map(|s| s.slot_address().map(|a| (a, len)))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::NoSpace,
                    format!(
                        "no arena room for {blocks} blocks of {len} bytes (blocks held by \
                         readers keep their slots; store fewer at once)"
                    ),
                )
            })?;
        Ok(Self {
            places,
            kind: Kind::Local {
                engine,
                prompt,
                first_block,
                slots,
            },
        })
    }

    pub(super) fn shared(client: ShmClient, reservation: Reservation) -> Self {
        let (base, _) = client.staging_region();
        let places = reservation
            .offsets
            .iter()
            .map(|&o| (base + o as usize, reservation.block_bytes))
            .collect();
        Self {
            places,
            kind: Kind::Shared {
                client,
                reservation,
            },
        }
    }

    /// `(address, bytes)` where each block is to be written, in order.
    pub fn places(&self) -> &[(usize, usize)] {
        &self.places
    }

    /// Stores the blocks as written (each must be written whole first), acknowledged at
    /// `ack` or the cache's default when stronger. A server copies them out of staging
    /// memory and checks them (the checksums are computed here from what was written).
    pub fn commit(self, ack: Option<Ack>) -> Result<StoreAnswer> {
        match self.kind {
            Kind::Local {
                engine,
                prompt,
                first_block,
                slots,
            } => {
                let blocks = slots
                    .into_iter()
                    .map(BlockBuf::freeze_whole)
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        Error::new(ErrorKind::Internal, "a reserved slot left the arena")
                    })?;
                let options = StoreOptions { ack, first_block };
                Ok(StoreAnswer::from(
                    &engine.store_owned(&prompt, blocks, options)?,
                ))
            }
            Kind::Shared {
                client,
                reservation,
            } => Ok(client.commit(reservation, None, ack.map(Ack::name))?),
        }
    }

    /// Gives the room back without storing (dropping the reservation does too, for an
    /// engine; a server frees it when it expires or the connection closes).
    pub fn cancel(self) -> Result<()> {
        match self.kind {
            Kind::Local { .. } => Ok(()),
            Kind::Shared {
                client,
                reservation,
            } => Ok(client.cancel(reservation)?),
        }
    }
}
