//! One local client of the shared arena: its staging memory, its leases and reservations,
//! and the requests it sends, answered in order on a thread of its own. Everything the
//! client holds is dropped with the session, however it ends (a release, a closed socket,
//! a killed process): leased slots go back to the arena, reserved room to the free lists.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvtier_client::shm::fds;
use kvtier_client::shm::proto::{
    self, CommitHead, Frame, Hello, Id, Leased, LoadHead, Op, ReserveHead, Reserved, Slot, Welcome,
};
use kvtier_client::wire::{ErrorDetail, HANDLE_HEX_LEN, StoreAnswer};
use kvtier_core::arena::BlockBuf;

// The socket's file mode is its guard: a client that can open it acts for every tenant.
use crate::routes::auth::Scope;
use kvtier_core::{Ack, BlockHash, Engine, Prompt, StoreOptions};

use super::staging::Staging;
use super::stats::{SHM, ShmStats};
use crate::error::ApiError;
use crate::state::AppState;

/// How long a request may take to arrive once its first byte has (and an answer to be
/// taken by the client).
const FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// How often an idle session looks for expired reservations.
const TICK: Duration = Duration::from_millis(250);
/// Reservations remembered after they end, to say why a late commit is refused.
const ENDED_KEPT: usize = 1024;

/// What a session's limits are.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub staging: u64,
    pub reserve_ttl: Duration,
    pub max_leased: u64,
    pub max_tokens: usize,
}

struct Reservation {
    prompt: Prompt,
    first_block: usize,
    /// The arena buffers of the blocks not committed yet (the first is block `committed`).
    bufs: Vec<BlockBuf>,
    offsets: Vec<u64>,
    block_bytes: u64,
    deadline: Instant,
    /// Blocks committed so far: a reservation is committed in parts, in order.
    committed: usize,
}

#[derive(Debug, Clone, Copy)]
enum Ended {
    Committed,
    Expired,
    Cancelled,
    Refused,
}

/// One client.
pub struct Session {
    id: u32,
    app: Arc<AppState>,
    engine: Arc<Engine>,
    limits: Limits,
    staging: Option<Staging>,
    next: u32,
    leases: HashMap<u64, (Vec<Bytes>, u64)>,
    leased: u64,
    reservations: HashMap<u64, Reservation>,
    ended: VecDeque<(u64, Ended)>,
}

type Answer = Result<(Vec<u8>, Vec<u8>), ErrorDetail>;

fn refuse(code: &str, message: impl Into<String>) -> ErrorDetail {
    ErrorDetail {
        code: code.into(),
        message: message.into(),
    }
}

fn from_api(e: ApiError) -> ErrorDetail {
    refuse(e.code, e.message)
}

fn json(v: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

impl Session {
    pub fn new(id: u32, app: Arc<AppState>, limits: Limits) -> Self {
        Self {
            id,
            engine: app.engine.clone(),
            app,
            limits,
            staging: None,
            next: 0,
            leases: HashMap::new(),
            leased: 0,
            reservations: HashMap::new(),
            ended: VecDeque::new(),
        }
    }

    /// Serves the client until it hangs up, breaks the protocol or the server stops.
    pub fn run(mut self, mut socket: UnixStream) {
        // A client that stops reading its answers is dropped like one that stops sending.
        let _ = socket.set_write_timeout(Some(FRAME_TIMEOUT));
        loop {
            self.expire(Instant::now());
            // Wait for a request's first byte without consuming it, waking now and then
            // to free expired reservations; then read the whole frame under a deadline.
            let _ = socket.set_read_timeout(Some(TICK));
            let mut first = [0u8];
            match rustix::net::recv(&socket, &mut first[..], rustix::net::RecvFlags::PEEK) {
                Ok((0, _)) => return,
                Ok(_) => {}
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => continue,
                Err(_) => return,
            }
            let _ = socket.set_read_timeout(Some(FRAME_TIMEOUT));
            let frame = match proto::read(&mut socket) {
                Ok(Some(f)) => f,
                Ok(None) | Err(_) => return,
            };
            let hello = frame.kind == Op::Hello as u8;
            let sent = match self.handle(&frame) {
                Ok((head, tail)) if hello => self.welcome(&mut socket, &head, &tail),
                Ok((head, tail)) => std::io::Write::write_all(
                    &mut socket,
                    &proto::encode_raw(proto::OK, &head, &tail),
                ),
                Err(e) => {
                    std::io::Write::write_all(&mut socket, &proto::encode(proto::ERROR, &e, b""))
                }
            };
            if sent.is_err() {
                return;
            }
        }
    }

    fn welcome(&self, socket: &mut UnixStream, head: &[u8], tail: &[u8]) -> std::io::Result<()> {
        let (Some(arena), Some(staging)) = (self.engine.arena().file(), &self.staging) else {
            return Err(std::io::Error::other("no shared arena"));
        };
        fds::send(
            socket,
            &proto::encode_raw(proto::OK, head, tail),
            &[arena, staging.file().as_fd()],
        )
    }

    /// A request's head, parsed within the server's limits.
    fn head<T: serde::de::DeserializeOwned>(&self, frame: &Frame) -> Result<T, ErrorDetail> {
        frame.head_within(kvtier_client::wire::ParseLimits {
            max_tokens: self.limits.max_tokens,
        })
    }

    fn handle(&mut self, frame: &Frame) -> Answer {
        let op = Op::from_byte(frame.kind)
            .ok_or_else(|| refuse("bad_op", format!("op byte {}", frame.kind)))?;
        if op != Op::Hello && self.staging.is_none() {
            return Err(refuse(
                "bad_op",
                "the first request on a connection must be hello",
            ));
        }
        match op {
            Op::Hello => self.hello(self.head(frame)?),
            Op::Load => self.load(self.head(frame)?, &frame.tail),
            Op::Release => {
                let Id { id } = self.head(frame)?;
                let (_, bytes) = self.leases.remove(&id).ok_or_else(|| {
                    refuse(
                        "unknown_lease",
                        format!("lease {id} is not held by this client"),
                    )
                })?;
                self.leased -= bytes;
                ShmStats::sub(&SHM.leased_bytes, bytes);
                Ok((b"{}".to_vec(), Vec::new()))
            }
            Op::Reserve => self.reserve(self.head(frame)?),
            Op::Commit => self.commit(self.head(frame)?, &frame.tail),
            Op::Cancel => {
                let Id { id } = self.head(frame)?;
                let r = self.take(id)?;
                self.free(&r);
                self.end(id, Ended::Cancelled);
                Ok((b"{}".to_vec(), Vec::new()))
            }
        }
    }

    fn hello(&mut self, hello: Hello) -> Answer {
        if self.staging.is_some() {
            return Err(refuse("bad_op", "hello twice on one connection"));
        }
        if hello.version != proto::VERSION {
            return Err(refuse(
                "bad_version",
                format!(
                    "protocol version {} (this server speaks {})",
                    hello.version,
                    proto::VERSION
                ),
            ));
        }
        let Some((_, arena_bytes)) = self
            .engine
            .arena()
            .region()
            .filter(|_| self.engine.arena().file().is_some())
        else {
            return Err(refuse("unavailable", "this server's arena is not shared"));
        };
        let staging = Staging::new(self.limits.staging).map_err(|e| {
            refuse(
                "no_space",
                format!(
                    "cannot make {} bytes of staging memory: {e}",
                    self.limits.staging
                ),
            )
        })?;
        let welcome = Welcome {
            version: proto::VERSION,
            arena_bytes: arena_bytes as u64,
            staging_bytes: staging.len(),
            max_leased: self.limits.max_leased,
        };
        self.staging = Some(staging);
        ShmStats::add(&SHM.clients, 1);
        Ok((json(&welcome), Vec::new()))
    }

    fn new_id(&mut self) -> u64 {
        self.next = self.next.wrapping_add(1);
        (u64::from(self.id) << 32) | u64::from(self.next)
    }

    fn load(&mut self, head: LoadHead, tail: &[u8]) -> Answer {
        let layout =
            crate::routes::known_layout(&self.app, &Scope::All, &head.layout).map_err(from_api)?;
        let width = HANDLE_HEX_LEN / 2;
        if !tail.len().is_multiple_of(width) {
            return Err(refuse(
                "bad_handles",
                format!("handles are {width} bytes each; got {} bytes", tail.len()),
            ));
        }
        let most = self.limits.max_tokens / layout.tokens_per_block().max(1);
        let hashes: Vec<BlockHash> = tail
            .chunks_exact(width)
            .map(|c| BlockHash(<[u8; 16]>::try_from(c).unwrap_or_default()))
            .collect();
        if hashes.len() > most {
            return Err(refuse(
                "too_many_blocks",
                format!(
                    "{} handles; at most {most} blocks fit in max_tokens",
                    hashes.len()
                ),
            ));
        }
        let lookup = self
            .engine
            .resolve(layout.digest(), &hashes)
            .map_err(|e| from_api(e.into()))?;
        let loaded = self.engine.load(&lookup).map_err(|e| from_api(e.into()))?;
        let arena = self.engine.arena();
        let mut held = Vec::with_capacity(loaded.blocks.len());
        let mut slots = Vec::with_capacity(loaded.blocks.len());
        let mut bytes = 0u64;
        for block in loaded.blocks {
            let len = block.len() as u64;
            if self.leased + bytes + len > self.limits.max_leased {
                break;
            }
            // A block promoted from the SSD or remote tier lies in that tier's read buffer,
            // not in the arena: it is copied into a slot for the client to read.
            let (block, offset) = match arena.offset_of(&block) {
                Some(offset) => (block, offset),
                None => {
                    let buf = self.engine.block_buffer(block.len());
                    if !buf.in_arena() {
                        break;
                    }
                    let Some((copy, _)) = buf.fill_checked(&block) else {
                        break;
                    };
                    let Some(offset) = arena.offset_of(&copy) else {
                        break;
                    };
                    (copy, offset)
                }
            };
            slots.push(Slot {
                offset: offset as u64,
                len,
                crc: arena.checksum(&block),
            });
            held.push(block);
            bytes += len;
        }
        let complete = held.len() == hashes.len();
        let lease = self.new_id();
        self.leases.insert(lease, (held, bytes));
        self.leased += bytes;
        ShmStats::add(&SHM.leases, 1);
        ShmStats::add(&SHM.leased_bytes, bytes);
        let mut out = Vec::with_capacity(slots.len() * Slot::BYTES);
        slots.iter().for_each(|s| s.put(&mut out));
        Ok((json(&Leased { lease, complete }), out))
    }

    fn reserve(&mut self, head: ReserveHead) -> Answer {
        let prompt =
            crate::routes::prompt_of(&self.app, &Scope::All, &head.prompt).map_err(from_api)?;
        let first = head.first_block as usize;
        let count = head.blocks as usize;
        if count == 0 || first.saturating_add(count) > prompt.num_blocks() {
            return Err(refuse(
                "invalid",
                format!(
                    "{count} blocks from block {first} on, for a prompt of {} whole blocks",
                    prompt.num_blocks()
                ),
            ));
        }
        let block_bytes = prompt.layout().block_bytes();
        let staging = self
            .staging
            .as_mut()
            .ok_or_else(|| refuse("bad_op", "no staging memory"))?;
        let offsets = staging.reserve(count as u64, block_bytes).ok_or_else(|| {
            refuse(
                "no_space",
                format!(
                    "{count} blocks of {block_bytes} bytes do not fit in the free part of this client's \
                     {}-byte staging memory (commit or cancel reservations, store fewer blocks at once, \
                     or raise shm.staging)",
                    staging.len()
                ),
            )
        })?;
        // The arena room now, so that a commit never fails for want of it (room made in
        // the RAM budget first: the blocks this store will replace let go of their slots).
        let bufs = self.engine.block_buffers(block_bytes as usize, count);
        let id = self.new_id();
        self.reservations.insert(
            id,
            Reservation {
                prompt,
                first_block: first,
                bufs,
                offsets: offsets.clone(),
                block_bytes,
                deadline: Instant::now() + self.limits.reserve_ttl,
                committed: 0,
            },
        );
        ShmStats::add(&SHM.reserved_bytes, count as u64 * block_bytes);
        let answer = Reserved {
            reservation: id,
            block_bytes,
            ttl_ms: self.limits.reserve_ttl.as_millis() as u64,
        };
        let tail: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
        Ok((json(&answer), tail))
    }

    /// Takes reservation `id` out of the table (its staging room still taken: see
    /// [`Session::free`]), or says why it is not there.
    fn take(&mut self, id: u64) -> Result<Reservation, ErrorDetail> {
        if id >> 32 != u64::from(self.id) {
            return Err(refuse(
                "not_yours",
                format!("reservation {id} belongs to another client"),
            ));
        }
        if let Some(r) = self.reservations.remove(&id) {
            return Ok(r);
        }
        let why = self
            .ended
            .iter()
            .find(|(e, _)| *e == id)
            .map(|(_, why)| *why);
        Err(match why {
            Some(Ended::Committed) => refuse(
                "already_committed",
                format!("reservation {id} was committed already"),
            ),
            Some(Ended::Expired) => refuse(
                "expired",
                format!("reservation {id} expired before its commit; its room was freed"),
            ),
            Some(Ended::Cancelled | Ended::Refused) | None => refuse(
                "not_reserved",
                format!("reservation {id} is not held by this client"),
            ),
        })
    }

    /// Gives back the staging room of a reservation's blocks not committed yet (its arena
    /// buffers go back when it is dropped).
    fn free(&mut self, r: &Reservation) {
        if let Some(s) = self.staging.as_mut() {
            s.release(&r.offsets[r.committed..], r.block_bytes);
        }
        let left = (r.offsets.len() - r.committed) as u64 * r.block_bytes;
        ShmStats::sub(&SHM.reserved_bytes, left);
    }

    fn end(&mut self, id: u64, why: Ended) {
        if self.ended.len() == ENDED_KEPT {
            self.ended.pop_front();
        }
        self.ended.push_back((id, why));
    }

    /// Commits the next part of a reservation (`head.first` must be the first block not
    /// committed yet; a whole reservation is one part): its blocks are checked, copied into
    /// the arena and stored, and their staging room is free again. The last part ends the
    /// reservation; a bad part ends it, freeing the rest.
    fn commit(&mut self, head: CommitHead, tail: &[u8]) -> Answer {
        let answer = self.commit_checked(head, tail);
        if answer.is_err() {
            ShmStats::add(&SHM.refused_commits, 1);
        }
        answer
    }

    fn commit_checked(&mut self, head: CommitHead, tail: &[u8]) -> Answer {
        let id = head.reservation;
        // A reservation past its deadline is expired, even if the tick has not come yet.
        self.expire(Instant::now());
        let mut r = self.take(id)?;
        let part = self.commit_part(&mut r, &head, tail);
        match &part {
            Ok(_) if r.committed < r.offsets.len() => {
                self.reservations.insert(id, r);
            }
            Ok(_) => self.end(id, Ended::Committed),
            Err(_) => {
                self.free(&r);
                self.end(id, Ended::Refused);
            }
        }
        let report = part?;
        Ok((json(&StoreAnswer::from(&report)), Vec::new()))
    }

    fn commit_part(
        &mut self,
        r: &mut Reservation,
        head: &CommitHead,
        tail: &[u8],
    ) -> Result<kvtier_core::StoreReport, ErrorDetail> {
        let first = head.first as usize;
        let count = tail.len() / Slot::BYTES;
        if first != r.committed || count == 0 || first + count > r.offsets.len() {
            return Err(refuse(
                "not_reserved",
                format!(
                    "a part of {count} blocks from block {first}; the reservation's next \
                     uncommitted block is {} of {}",
                    r.committed,
                    r.offsets.len()
                ),
            ));
        }
        let offsets = &r.offsets[first..first + count];
        let bufs: Vec<BlockBuf> = r.bufs.drain(..count).collect();
        let (blocks, ack) = self.check_and_copy(bufs, offsets, r.block_bytes, head, tail)?;
        if let Some(s) = self.staging.as_mut() {
            s.release(offsets, r.block_bytes);
        }
        r.committed += count;
        let bytes = count as u64 * r.block_bytes;
        ShmStats::sub(&SHM.reserved_bytes, bytes);
        ShmStats::add(&SHM.commits, 1);
        ShmStats::add(&SHM.committed_bytes, bytes);
        let options = StoreOptions {
            ack,
            first_block: r.first_block + first,
        };
        self.engine
            .store_owned(&r.prompt, blocks, options)
            .map_err(|e| from_api(e.into()))
    }

    /// Checks a commit against its reservation and copies each block from staging memory
    /// into its arena slot, checksumming what landed there; any mismatch refuses it whole.
    fn check_and_copy(
        &self,
        bufs: Vec<BlockBuf>,
        offsets: &[u64],
        block_bytes: u64,
        head: &CommitHead,
        tail: &[u8],
    ) -> Result<(Vec<Bytes>, Option<Ack>), ErrorDetail> {
        let ack = match &head.durability {
            None => None,
            Some(d) => Some(d.parse::<Ack>().map_err(|_| {
                refuse(
                    "invalid",
                    format!("durability `{d}`: expected queued, written or synced"),
                )
            })?),
        };
        let slots = Slot::parse_all(tail)
            .ok_or_else(|| refuse("invalid", "a commit's tail is 24-byte slots"))?;
        if slots.len() != offsets.len() {
            return Err(refuse(
                "invalid",
                format!(
                    "{} blocks committed; {} reserved",
                    slots.len(),
                    offsets.len()
                ),
            ));
        }
        for (i, (s, &reserved)) in slots.iter().zip(offsets).enumerate() {
            if s.offset != reserved {
                return Err(refuse(
                    "not_reserved",
                    format!(
                        "block {i} names staging offset {}; it was reserved at {reserved}",
                        s.offset
                    ),
                ));
            }
            if s.len != block_bytes {
                return Err(refuse(
                    "bad_size",
                    format!(
                        "block {i} is {} bytes; the layout's blocks are {block_bytes}",
                        s.len
                    ),
                ));
            }
        }
        let staging = self
            .staging
            .as_ref()
            .ok_or_else(|| refuse("bad_op", "no staging memory"))?;
        let sources: Vec<&[u8]> = slots
            .iter()
            .map(|s| {
                staging
                    .bytes(s.offset, s.len)
                    .ok_or_else(|| refuse("not_reserved", "a range outside staging memory"))
            })
            .collect::<Result<_, _>>()?;
        let copied = copy_all(bufs, &sources);
        let mut blocks = Vec::with_capacity(copied.len());
        for (i, (got, want)) in copied.into_iter().zip(&slots).enumerate() {
            match got {
                Some((bytes, crc)) if crc == want.crc => blocks.push(bytes),
                Some((_, crc)) => {
                    return Err(refuse(
                        "bad_checksum",
                        format!(
                            "block {i}: CRC32C {crc:08x} of the bytes copied; the commit says {:08x}",
                            want.crc
                        ),
                    ));
                }
                None => return Err(refuse("internal", format!("block {i} could not be copied"))),
            }
        }
        Ok((blocks, ack))
    }

    /// Frees reservations past their deadline.
    fn expire(&mut self, now: Instant) {
        let late: Vec<u64> = self
            .reservations
            .iter()
            .filter(|(_, r)| r.deadline < now)
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            if let Ok(r) = self.take(id) {
                self.free(&r);
                self.end(id, Ended::Expired);
                ShmStats::add(&SHM.expired, 1);
            }
        }
    }
}

impl Drop for Session {
    /// The client is gone: what it held leaves the gauges (the blocks and the room
    /// themselves go back as the session's fields are dropped).
    fn drop(&mut self) {
        if self.staging.is_some() {
            ShmStats::sub(&SHM.clients, 1);
        }
        ShmStats::sub(&SHM.leased_bytes, self.leased);
        let reserved: u64 = self
            .reservations
            .values()
            .map(|r| (r.offsets.len() - r.committed) as u64 * r.block_bytes)
            .sum();
        ShmStats::sub(&SHM.reserved_bytes, reserved);
    }
}

/// Below this many bytes a commit is copied on the session's thread alone.
const SPREAD_MIN: usize = 8 << 20;

/// Fills `bufs[i]` from `sources[i]` (see [`BlockBuf::fill_checked`]), the blocks spread
/// over the cores in contiguous shares: the server's copy is the one a store through the
/// shared arena adds, and it runs at the machine's memory bandwidth, not one core's.
fn copy_all(bufs: Vec<BlockBuf>, sources: &[&[u8]]) -> Vec<Option<(Bytes, u32)>> {
    let total: usize = sources.iter().map(|s| s.len()).sum();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = if total < SPREAD_MIN {
        1
    } else {
        cores.min(bufs.len())
    };
    if threads <= 1 {
        return bufs
            .into_iter()
            .zip(sources)
            .map(|(b, s)| b.fill_checked(s))
            .collect();
    }
    let per = bufs.len().div_ceil(threads);
    let mut bufs = bufs.into_iter();
    let shares: Vec<Vec<BlockBuf>> = (0..threads)
        .map(|_| bufs.by_ref().take(per).collect())
        .collect();
    std::thread::scope(|scope| {
        let running: Vec<_> = shares
            .into_iter()
            .zip(sources.chunks(per))
            .map(|(share, srcs)| {
                scope.spawn(move || {
                    share
                        .into_iter()
                        .zip(srcs)
                        .map(|(b, s)| b.fill_checked(s))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        running
            .into_iter()
            .flat_map(|t| t.join().unwrap_or_default())
            .collect()
    })
}
