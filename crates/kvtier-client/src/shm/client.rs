//! A local client of `kvtier serve`'s shared arena.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use kvtier_core::ErrorKind;
use parking_lot::Mutex;
use serde::Serialize;

use super::fds;
use super::map::Mapping;
use super::proto::{
    self, CommitHead, Hello, Id, Leased, LoadHead, Op, ReserveHead, Reserved, Slot, Welcome,
};
use crate::wire::{ErrorDetail, PromptSpec, StoreAnswer};

/// What went wrong talking to the shared arena.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// The socket failed (the server is gone, or refused the connection).
    #[error("shared arena: {0}")]
    Io(#[from] std::io::Error),
    /// The server refused the request.
    #[error("shared arena refused: {code}: {message}")]
    Refused {
        /// A stable code (`expired`, `bad_checksum`, `not_reserved`, ...).
        code: String,
        /// What was wrong, for people.
        message: String,
    },
    /// The answer did not follow the protocol.
    #[error("shared arena: malformed answer: {0}")]
    Protocol(String),
}

impl ShmError {
    /// The engine's error kind for this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ShmError::Refused { code, .. } => {
                ErrorKind::from_name(code).unwrap_or(ErrorKind::Invalid)
            }
            ShmError::Io(_) | ShmError::Protocol(_) => ErrorKind::Unavailable,
        }
    }

    /// The server's code, for a refusal.
    pub fn code(&self) -> Option<&str> {
        match self {
            ShmError::Refused { code, .. } => Some(code),
            _ => None,
        }
    }
}

impl From<ShmError> for kvtier_core::Error {
    fn from(e: ShmError) -> Self {
        kvtier_core::Error::new(e.kind(), "call to kvtier serve's shared arena").with_source(e)
    }
}

#[derive(Debug)]
struct Inner {
    socket: Mutex<UnixStream>,
    arena: Mapping,
    staging: Mapping,
    welcome: Welcome,
}

impl Inner {
    /// One request, one answer.
    fn call(&self, op: Op, head: &impl Serialize, tail: &[u8]) -> Result<proto::Frame, ShmError> {
        let mut socket = self.socket.lock();
        let frame = proto::write(&mut *socket, op as u8, head, tail)
            .and_then(|()| proto::read(&mut *socket))
            .map_err(|e| out_of_step(&socket, e))?
            .ok_or_else(|| out_of_step(&socket, std::io::ErrorKind::UnexpectedEof.into()))?;
        answer(frame)
    }
}

/// A call that failed part way (a timeout, a broken frame) leaves the connection out of
/// step: the server's late answer to it would be read as the answer to the next call — a
/// lease of other blocks. So the connection is shut down, and every later call on it
/// fails (`Unavailable`); a new [`ShmClient`] connects afresh.
fn out_of_step(socket: &UnixStream, e: std::io::Error) -> ShmError {
    let _ = socket.shutdown(std::net::Shutdown::Both);
    ShmError::Io(e)
}

fn answer(frame: proto::Frame) -> Result<proto::Frame, ShmError> {
    match frame.kind {
        proto::OK => Ok(frame),
        proto::ERROR => {
            let e: ErrorDetail = frame.head().map_err(|e| ShmError::Protocol(e.message))?;
            Err(ShmError::Refused {
                code: e.code,
                message: e.message,
            })
        }
        other => Err(ShmError::Protocol(format!("status byte {other}"))),
    }
}

/// A connection to a shared arena: the arena mapped read-only, this client's staging
/// memory mapped read-write. Cheap to clone (clones share the connection; calls on it
/// take turns).
#[derive(Debug, Clone)]
pub struct ShmClient {
    inner: Arc<Inner>,
}

impl ShmClient {
    /// Connects to the socket at `path` and maps what it hands over; a server that does
    /// not answer a call within [`ShmClient::TIMEOUT`] fails it.
    pub fn connect(path: &Path) -> Result<Self, ShmError> {
        Self::connect_with(path, Self::TIMEOUT)
    }

    /// How long a call waits for the server by default: longer than any store's commit
    /// (a synced one waits for the disk), short enough that a stalled server is an error.
    pub const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

    /// [`ShmClient::connect`] with the time a call may wait for the server (sending or
    /// receiving) before it fails with a timeout (`ShmError::Io`).
    pub fn connect_with(path: &Path, timeout: std::time::Duration) -> Result<Self, ShmError> {
        let mut socket = UnixStream::connect(path)?;
        socket.set_read_timeout(Some(timeout))?;
        socket.set_write_timeout(Some(timeout))?;
        proto::write(
            &mut socket,
            Op::Hello as u8,
            &Hello {
                version: proto::VERSION,
            },
            b"",
        )?;
        let (frame, files) = fds::recv(&mut socket)?
            .ok_or_else(|| ShmError::Io(std::io::ErrorKind::UnexpectedEof.into()))?;
        let welcome: Welcome = answer(frame)?
            .head()
            .map_err(|e| ShmError::Protocol(e.message))?;
        let [arena_file, staging_file] = <[_; 2]>::try_from(files).map_err(|f| {
            ShmError::Protocol(format!(
                "{} descriptors with the welcome (2 expected)",
                f.len()
            ))
        })?;
        let size = |n: u64| {
            usize::try_from(n).map_err(|_| ShmError::Protocol(format!("a region of {n} bytes")))
        };
        let arena = Mapping::map(arena_file.as_fd(), size(welcome.arena_bytes)?, false)?;
        let staging = Mapping::map(staging_file.as_fd(), size(welcome.staging_bytes)?, true)?;
        Ok(Self {
            inner: Arc::new(Inner {
                socket: Mutex::new(socket),
                arena,
                staging,
                welcome,
            }),
        })
    }

    /// Where the arena is mapped in this process, `(address, bytes)`, read-only: a GPU
    /// registers it once and reads leased blocks from it by DMA.
    pub fn arena_region(&self) -> (usize, usize) {
        (self.inner.arena.address(), self.inner.arena.len())
    }

    /// Where this client's staging memory is mapped, `(address, bytes)`.
    pub fn staging_region(&self) -> (usize, usize) {
        (self.inner.staging.address(), self.inner.staging.len())
    }

    /// Bytes of blocks this client may hold leased at once.
    pub fn max_leased(&self) -> u64 {
        self.inner.welcome.max_leased
    }

    /// Leases the blocks of `layout` (hex digest) named by lookup `handles`, from block 0
    /// on, stopping at the first one no longer held: each block's place in the arena,
    /// never reused while the lease lives.
    pub fn load(&self, layout: &str, handles: &[[u8; 16]]) -> Result<Lease, ShmError> {
        let tail: Vec<u8> = handles.iter().flatten().copied().collect();
        let frame = self.inner.call(
            Op::Load,
            &LoadHead {
                layout: layout.into(),
            },
            &tail,
        )?;
        let head: Leased = frame.head().map_err(|e| ShmError::Protocol(e.message))?;
        // Released on drop, should the answer be malformed.
        let mut lease = Lease {
            client: self.clone(),
            id: head.lease,
            slots: Vec::new(),
            complete: head.complete,
        };
        lease.slots = Slot::parse_all(&frame.tail)
            .filter(|s| {
                s.len() <= handles.len()
                    && s.iter().all(|s| self.inner.arena.holds(s.offset, s.len))
            })
            .ok_or_else(|| {
                ShmError::Protocol("slots outside the arena, or more than asked".into())
            })?;
        Ok(lease)
    }

    /// [`ShmClient::load`] of the handles a lookup answered (`LookupAnswer::handles`: 32
    /// hex digits per block).
    pub fn load_handles(&self, layout: &str, handles: &str) -> Result<Lease, ShmError> {
        let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        let bad = || ShmError::Refused {
            code: "bad_handles".into(),
            message: "handles are 32 hex digits per block".into(),
        };
        if !handles.len().is_multiple_of(32) {
            return Err(bad());
        }
        let parsed = handles
            .as_bytes()
            .chunks_exact(32)
            .map(|h| {
                let mut out = [0u8; 16];
                for (o, pair) in out.iter_mut().zip(h.chunks_exact(2)) {
                    *o = digit(pair[0])? << 4 | digit(pair[1])?;
                }
                Some(out)
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?;
        self.load(layout, &parsed)
    }

    /// Reserves staging room for `blocks` blocks of `prompt` from block `first_block` on
    /// (block `first_block - 1` must be held already).
    pub fn reserve(
        &self,
        prompt: &PromptSpec,
        first_block: usize,
        blocks: usize,
    ) -> Result<Reservation, ShmError> {
        let head = ReserveHead {
            prompt: prompt.clone(),
            first_block: first_block as u32,
            blocks: blocks as u32,
        };
        let frame = self.inner.call(Op::Reserve, &head, b"")?;
        let got: Reserved = frame.head().map_err(|e| ShmError::Protocol(e.message))?;
        let offsets = proto::parse_u64s(&frame.tail)
            .filter(|o| {
                o.len() == blocks
                    && o.iter()
                        .all(|&o| self.inner.staging.holds(o, got.block_bytes))
            })
            .ok_or_else(|| ShmError::Protocol("staging offsets outside staging memory".into()))?;
        Ok(Reservation {
            id: got.reservation,
            block_bytes: got.block_bytes as usize,
            offsets,
        })
    }

    /// Block `i` of a reservation, in staging memory, to write its payload into.
    pub fn staging_mut<'a>(&'a self, reservation: &'a mut Reservation, i: usize) -> &'a mut [u8] {
        let offset = reservation.offsets[i] as usize;
        // SAFETY: the server handed this range to this reservation alone (checked inside
        // the mapping when reserved), and `&mut Reservation` makes the slice exclusive.
        #[expect(unsafe_code, reason = "a reserved staging range is written in place")]
        unsafe {
            self.inner
                .staging
                .bytes_mut(offset, reservation.block_bytes)
        }
    }

    /// Commits a reservation whose blocks are written: the server copies each into the
    /// arena, checks it against `crcs` (CRC32C of each payload as written; computed here
    /// from staging memory when `None`) and keeps them. `durability`: `queued`, `written`
    /// or `synced` (default: the server's).
    pub fn commit(
        &self,
        mut reservation: Reservation,
        crcs: Option<&[u32]>,
        durability: Option<&str>,
    ) -> Result<StoreAnswer, ShmError> {
        let n = reservation.offsets.len();
        let crcs: Vec<u32> = match crcs {
            Some(c) if c.len() == n => c.to_vec(),
            Some(c) => {
                return Err(ShmError::Protocol(format!(
                    "{} checksums for {n} blocks",
                    c.len()
                )));
            }
            None => (0..n)
                .map(|i| kvtier_core::arena::crc32c(self.staging_mut(&mut reservation, i)))
                .collect(),
        };
        let (head, tail) = reservation.part(0, crcs, durability);
        self.commit_raw(&head, &tail)
    }

    /// A commit as sent, however wrong (for tests of the server's checks).
    pub fn commit_raw(&self, head: &CommitHead, tail: &[u8]) -> Result<StoreAnswer, ShmError> {
        let frame = self.inner.call(Op::Commit, head, tail)?;
        frame.head().map_err(|e| ShmError::Protocol(e.message))
    }

    /// Gives a reservation's room back without storing.
    pub fn cancel(&self, reservation: Reservation) -> Result<(), ShmError> {
        self.inner
            .call(Op::Cancel, &Id { id: reservation.id }, b"")
            .map(|_| ())
    }

    /// Stores `payloads` as the first blocks of `prompt`: reserve, copy into staging
    /// memory, commit — in pieces as large as staging memory holds, each piece's blocks
    /// after the last one's, and each piece committed in parts of 8 MiB sent as they are
    /// written (the server copies one part while this thread writes the next). The answer
    /// adds up the parts; one that stops early (`stopped`) ends the store there.
    pub fn store(
        &self,
        prompt: &PromptSpec,
        payloads: &[&[u8]],
        durability: Option<&str>,
    ) -> Result<StoreAnswer, ShmError> {
        let Some(first) = payloads.first() else {
            let durability = durability.unwrap_or("queued").to_string();
            return Ok(StoreAnswer {
                stored: 0,
                duplicates: 0,
                stored_lower_only: 0,
                stopped: None,
                durability,
            });
        };
        let per_piece =
            (self.inner.staging.len() / first.len().max(1).next_multiple_of(4096)).max(1);
        let mut total: Option<StoreAnswer> = None;
        for (k, piece) in payloads.chunks(per_piece).enumerate() {
            let got = self.store_piece(prompt, k * per_piece, piece, durability)?;
            let stopped = got.stopped.is_some();
            total = Some(add(total, got));
            if stopped {
                break;
            }
        }
        total.ok_or_else(|| ShmError::Protocol("no piece stored".into()))
    }

    fn store_piece(
        &self,
        prompt: &PromptSpec,
        first_block: usize,
        payloads: &[&[u8]],
        durability: Option<&str>,
    ) -> Result<StoreAnswer, ShmError> {
        let r = self.reserve(prompt, first_block, payloads.len())?;
        if let Some((i, p)) = payloads
            .iter()
            .enumerate()
            .find(|(_, p)| p.len() != r.block_bytes)
        {
            let message = format!(
                "payload {i} is {} bytes; the layout's blocks are {}",
                p.len(),
                r.block_bytes
            );
            let _ = self.cancel(r);
            return Err(ShmError::Refused {
                code: "invalid".into(),
                message,
            });
        }
        // Committed in parts, each sent as soon as it is written and answered later: the
        // server copies part k into the arena while this thread writes part k + 1.
        let per_part = (PART_BYTES / r.block_bytes.max(1)).max(1);
        let mut socket = self.inner.socket.lock();
        let mut sent = 0;
        let mut failed = None;
        for (k, part) in payloads.chunks(per_part).enumerate() {
            let first = k * per_part;
            let mut crcs = Vec::with_capacity(part.len());
            for (j, p) in part.iter().enumerate() {
                let (offset, len) = (r.offsets[first + j], r.block_bytes);
                // SAFETY: as in `staging_mut`: this reservation's range, inside the mapping
                // (checked when reserved), written by this thread alone until committed.
                #[expect(unsafe_code, reason = "a reserved staging range is written in place")]
                let dst = unsafe { self.inner.staging.bytes_mut(offset as usize, len) };
                crcs.push(kvtier_core::arena::copy_checked(dst, p));
            }
            let (head, tail) = r.part(first, crcs, durability);
            if let Err(e) = proto::write(&mut *socket, Op::Commit as u8, &head, &tail) {
                failed = Some(out_of_step(&socket, e));
                break;
            }
            sent += 1;
        }
        // Every answer is read, in order, so the connection stays in step; the first error
        // is the store's (the parts after a refused one are refused too).
        let mut total: Option<StoreAnswer> = None;
        for _ in 0..sent {
            let got = proto::read(&mut *socket)
                .map_err(|e| out_of_step(&socket, e))
                .and_then(|f| {
                    f.ok_or_else(|| out_of_step(&socket, std::io::ErrorKind::UnexpectedEof.into()))
                })
                .and_then(answer)
                .and_then(|f| {
                    f.head::<StoreAnswer>()
                        .map_err(|e| ShmError::Protocol(e.message))
                });
            match got {
                Ok(got) => total = Some(add(total, got)),
                Err(e @ ShmError::Io(_)) => return Err(failed.unwrap_or(e)),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        match (failed, total) {
            (Some(e), _) => Err(e),
            (None, Some(t)) => Ok(t),
            (None, None) => Err(ShmError::Protocol("no part stored".into())),
        }
    }
}

/// Bytes of one committed part of a store (see [`ShmClient::store`]).
const PART_BYTES: usize = 8 << 20;

/// Two answers of one store's parts or pieces, added up (the first `stopped`, the later
/// durability).
fn add(total: Option<StoreAnswer>, got: StoreAnswer) -> StoreAnswer {
    match total {
        None => got,
        Some(t) => StoreAnswer {
            stored: t.stored + got.stored,
            duplicates: t.duplicates + got.duplicates,
            stored_lower_only: t.stored_lower_only + got.stored_lower_only,
            stopped: t.stopped.or(got.stopped),
            durability: got.durability,
        },
    }
}

/// Staging room reserved for a store (see [`ShmClient::reserve`]).
#[derive(Debug)]
pub struct Reservation {
    /// The reservation's id.
    pub id: u64,
    /// Bytes of each block.
    pub block_bytes: usize,
    /// Where each block goes in staging memory.
    pub offsets: Vec<u64>,
}

impl Reservation {
    /// The commit of the part starting at block `first`, one checksum per block from
    /// there (`crcs`): its head and its tail of slots.
    fn part(
        &self,
        first: usize,
        crcs: impl IntoIterator<Item = u32>,
        durability: Option<&str>,
    ) -> (CommitHead, Vec<u8>) {
        let mut tail = Vec::new();
        for (&offset, crc) in self.offsets[first..].iter().zip(crcs) {
            Slot {
                offset,
                len: self.block_bytes as u64,
                crc,
            }
            .put(&mut tail);
        }
        let head = CommitHead {
            reservation: self.id,
            first: first as u32,
            durability: durability.map(str::to_string),
        };
        (head, tail)
    }
}

/// Blocks leased from the arena (see [`ShmClient::load`]): released on drop.
#[derive(Debug)]
pub struct Lease {
    client: ShmClient,
    id: u64,
    slots: Vec<Slot>,
    complete: bool,
}

impl Lease {
    /// The lease's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Where each leased block lies in the arena.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Whether every block asked for is leased.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// Block `i`'s bytes, in place in the arena.
    pub fn block(&self, i: usize) -> &[u8] {
        let s = self.slots[i];
        // SAFETY: checked inside the mapping when leased; the server writes no leased
        // block's slot until the lease ends, which `&self` keeps from happening.
        #[expect(unsafe_code, reason = "a leased block is read in place")]
        unsafe {
            self.client
                .inner
                .arena
                .bytes(s.offset as usize, s.len as usize)
        }
    }

    /// Whether block `i`'s bytes match the checksum the server gave.
    pub fn verify(&self, i: usize) -> bool {
        kvtier_core::arena::crc32c(self.block(i)) == self.slots[i].crc
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Best effort: a lost connection released every lease with it.
        let _ = self
            .client
            .inner
            .call(Op::Release, &Id { id: self.id }, b"");
    }
}
