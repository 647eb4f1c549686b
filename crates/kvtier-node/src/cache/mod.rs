//! The caller API: one [`Cache`] over an engine in this process or a `kvtier serve`, with
//! every call a model runner, an engine connector or a language binding makes. Python's
//! `kvtier` package, the candle runners and the benches call this; a new call is written
//! here once (and once in the Python stubs), never once per front end.
//!
//! - [`CacheLayout`]: a registered layout (its key, digest and sizes);
//! - [`Hit`]: the answer to a lookup and what loading it takes;
//! - the served side (`served`): a client with a runtime of its own, so every call here
//!   is synchronous and may be made with a language's global lock released.

mod direct;
mod hit;
mod layout;
mod served;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvtier_client::wire::{
    CheckpointSpec, LayoutSpec, LoadRequest, PromptSpec, SnapshotSpec, StoreAnswer,
};
use kvtier_core::engine::Restored;
use kvtier_core::snapshot::SnapshotPut;
use kvtier_core::{Engine, Error, ExtraKeys, LayoutKey, Result};

pub use direct::{BlockLease, BlockReservation};
pub use hit::Hit;
pub use kvtier_client::Deadlines;
pub use layout::CacheLayout;

use crate::{Node, Settings};
use hit::Found;
use served::Served;

/// Where the cache is.
#[derive(Debug)]
enum Backend {
    /// An engine in this process; with the node that assembled it when there is one
    /// (its counters cover every subsystem, its KV-event publisher, its settings).
    Embedded {
        engine: Arc<Engine>,
        node: Option<Arc<Node>>,
    },
    /// A `kvtier serve` process.
    Served(Served),
}

/// A kvtier cache as every caller sees it: an engine in this process or a `kvtier serve`,
/// with the same calls, arguments and answers. See the module docs.
#[derive(Debug)]
pub struct Cache {
    backend: Backend,
}

impl Cache {
    /// A node in this process, assembled from `settings` (those of `kvtier serve`, with
    /// the same defaults).
    pub fn open(settings: Settings) -> Result<Self> {
        settings.validate()?;
        // Settings that passed validation but cannot be opened: a taken port, a directory
        // another node holds, an endpoint that does not answer.
        let node = Node::open(settings)?;
        Ok(Self::of_node(node))
    }

    /// The node `node`.
    pub fn of_node(node: Arc<Node>) -> Self {
        Self {
            backend: Backend::Embedded {
                engine: node.engine.clone(),
                node: Some(node),
            },
        }
    }

    /// The engine `engine` (built without a node: its own counters only).
    pub fn embedded(engine: Arc<Engine>) -> Self {
        Self {
            backend: Backend::Embedded { engine, node: None },
        }
    }

    /// The `kvtier serve` at `url` (`http://HOST:PORT`), sending `token` (the data
    /// token) when the server requires one, with the default [`Deadlines`].
    pub fn served(url: &str, token: Option<String>) -> Result<Self> {
        Self::served_with(url, token, None, Deadlines::DEFAULT)
    }

    /// [`Cache::served`], on the same host as the server, also connected to its shared
    /// arena through the Unix socket `shm` (the server's `shm.socket`; ADR 0019): whole
    /// blocks are loaded by reading them in place from the arena and stores go through
    /// staging memory, never over TCP; everything else goes over HTTP as before.
    pub fn served_shared(url: &str, token: Option<String>, shm: &std::path::Path) -> Result<Self> {
        Self::served_with(url, token, Some(shm), Deadlines::DEFAULT)
    }

    /// The `kvtier serve` at `url`, through its shared arena when `shm` is given, every
    /// call failing (an `Unavailable` error: a miss to the caller) once past its deadline
    /// — a stalled server is never waited for longer (`deadlines.transfer` bounds each
    /// call on the shared arena's socket too).
    pub fn served_with(
        url: &str,
        token: Option<String>,
        shm: Option<&std::path::Path>,
        deadlines: Deadlines,
    ) -> Result<Self> {
        Ok(Self {
            backend: Backend::Served(Served::connect(url, token, shm, deadlines)?),
        })
    }

    /// Where this cache's blocks lie in this process's memory, `(address, bytes)`, for a
    /// GPU to register once: an engine's arena, or the read-only mapping of a server's
    /// shared arena. `None` for a server reached over HTTP only (its memory is not mapped
    /// here) and for an engine without an arena.
    pub fn arena(&self) -> Option<(usize, usize)> {
        match &self.backend {
            Backend::Embedded { engine, .. } => engine.arena().region(),
            Backend::Served(s) => s.shm.as_ref().map(|c| c.arena_region()),
        }
    }

    /// Whether the cache is an engine in this process.
    pub fn is_embedded(&self) -> bool {
        matches!(self.backend, Backend::Embedded { .. })
    }

    /// The engine, for an embedded cache.
    pub fn engine(&self) -> Option<&Arc<Engine>> {
        match &self.backend {
            Backend::Embedded { engine, .. } => Some(engine),
            Backend::Served(_) => None,
        }
    }

    /// The node, for a cache opened from settings.
    pub fn node(&self) -> Option<&Arc<Node>> {
        match &self.backend {
            Backend::Embedded { node, .. } => node.as_ref(),
            Backend::Served(_) => None,
        }
    }

    /// Registers `key` (registering the same key again returns it again), with
    /// `checkpoint_every` tokens between checkpoints for a layout with state groups (the
    /// last registration's value is in force; `None` keeps the one in force).
    pub fn register_layout(
        &self,
        key: LayoutKey,
        checkpoint_every: Option<u32>,
    ) -> Result<CacheLayout> {
        match &self.backend {
            Backend::Embedded { engine, .. } => {
                let core = engine.register_layout(key.clone())?;
                let every = engine
                    .configure_checkpoints(core.digest(), checkpoint_every.map(|t| t as usize))?
                    .map(|t| t as u32);
                Ok(CacheLayout {
                    digest: core.digest().to_hex(),
                    block_bytes: core.block_bytes(),
                    checkpoint_every: every,
                    core: Some(core),
                    key,
                })
            }
            Backend::Served(s) => {
                let spec = LayoutSpec::of_key(&key, checkpoint_every);
                let info = s.call(s.client.register_layout(&spec))?;
                Ok(CacheLayout {
                    digest: info.layout,
                    block_bytes: info.block_bytes,
                    checkpoint_every: info.checkpoint_every,
                    core: None,
                    key,
                })
            }
        }
    }

    /// Sets the distance between checkpoints of `layout` (a layout with state groups) to
    /// `tokens` (rounded up to whole blocks) and returns the layout with the distance in
    /// force.
    pub fn set_checkpoint_every(&self, layout: &CacheLayout, tokens: usize) -> Result<CacheLayout> {
        let every = u32::try_from(tokens)
            .map_err(|_| Error::invalid(format!("a checkpoint every {tokens} tokens")))?;
        let layout = self.register_layout(layout.key.clone(), Some(every))?;
        if layout.checkpoint_every.is_none() {
            return Err(Error::invalid(format!(
                "layout {} keeps no checkpoints (it names no state groups)",
                layout.digest
            )));
        }
        Ok(layout)
    }

    /// How many leading whole blocks of `tokens` are cached under `layout`. Memory only:
    /// no tier is read.
    pub fn lookup(&self, layout: &CacheLayout, tokens: &[u32]) -> Result<Hit> {
        match &self.backend {
            Backend::Embedded { engine, .. } => {
                let prompt = engine.prompt(layout.core()?.digest(), tokens, &ExtraKeys::none())?;
                Ok(Hit::local(engine.lookup(&prompt), layout))
            }
            Backend::Served(s) => {
                let spec = PromptSpec::new(layout.digest.clone(), tokens.to_vec());
                Ok(Hit::served(s.call(s.client.lookup(&spec))?, layout))
            }
        }
    }

    /// [`Cache::lookup`] of many short prompts at once (SGLang's pages: a prompt each), in
    /// order: a server answers them in one request. Join the hits ([`Hit::join`]) to load
    /// their blocks in one call.
    pub fn lookup_many(&self, layout: &CacheLayout, prompts: &[&[u32]]) -> Result<Vec<Hit>> {
        match &self.backend {
            Backend::Embedded { .. } => prompts.iter().map(|t| self.lookup(layout, t)).collect(),
            Backend::Served(s) => Ok(s
                .call(s.client.lookup_batch(&layout.digest, prompts))?
                .hits
                .into_iter()
                .map(|answer| Hit::served(answer, layout))
                .collect()),
        }
    }

    /// The matched blocks of `hit`, whole, or only layers `start..end` of each. Fewer
    /// come back when the cache lost some since the lookup: the caller computes from
    /// there.
    pub fn load(&self, hit: &Hit, layers: Option<(u32, u32)>) -> Result<Vec<Bytes>> {
        hit.bytes_per_block(layers)?;
        match (&self.backend, &hit.found) {
            (Backend::Embedded { engine, .. }, Found::Local(lookup)) => Ok(match layers {
                None => engine.load(lookup)?,
                Some((start, end)) => engine.load_layers(lookup, start..end)?,
            }
            .blocks),
            (
                Backend::Served(s),
                Found::Served {
                    handles, chains, ..
                },
            ) => {
                let request = LoadRequest {
                    layout: hit.layout.clone(),
                    handles: handles.clone(),
                    layers: layers.map(|(start, end)| [start, end]),
                    chains: chains.clone(),
                };
                Ok(s.call(s.client.load(&request))?.blocks)
            }
            (_, found) => Err(other_cache(found)),
        }
    }

    /// Copies the matched blocks of `hit` (or layers `start..end` of each) back to back
    /// into `out`, which must hold [`Hit::nbytes`] of them; the number of blocks written
    /// (fewer when a block was lost since the lookup). A server's blocks are read from
    /// the socket straight into `out`, or, with its shared arena connected and whole blocks
    /// asked for, copied out of the arena in place.
    pub fn load_into(
        &self,
        hit: &Hit,
        layers: Option<(u32, u32)>,
        out: &mut [u8],
    ) -> Result<usize> {
        let per_block = hit.bytes_per_block(layers)?;
        let need = hit.blocks() * per_block;
        if out.len() < need {
            return Err(Error::invalid(format!(
                "out holds {} bytes; the hit's {} blocks need {need}",
                out.len(),
                hit.blocks()
            )));
        }
        match (&self.backend, &hit.found) {
            (Backend::Embedded { engine, .. }, Found::Local(lookup)) => {
                let loaded = match layers {
                    None => engine.load(lookup)?,
                    Some((start, end)) => engine.load_layers(lookup, start..end)?,
                };
                for (dst, block) in out.chunks_exact_mut(per_block).zip(&loaded.blocks) {
                    dst.copy_from_slice(block);
                }
                Ok(loaded.blocks.len())
            }
            (
                Backend::Served(s),
                Found::Served {
                    handles, chains, ..
                },
            ) => {
                // A joined hit's chains are resolved by `/v1/load`; the shared arena's
                // lease takes one chain.
                if let (Some(shm), None, None) = (&s.shm, layers, chains) {
                    // In place from the shared arena: one lease, one copy per block.
                    let lease = shm.load_handles(&hit.layout, handles)?;
                    let n = lease.slots().len();
                    if lease.slots().iter().any(|s| s.len != per_block as u64) {
                        return Err(Error::new(
                            kvtier_core::ErrorKind::Internal,
                            "the shared arena leased blocks of another size than the layout's",
                        ));
                    }
                    for (i, dst) in out.chunks_exact_mut(per_block).take(n).enumerate() {
                        kvtier_core::copy::copy_to_slice(dst, lease.block(i));
                    }
                    return Ok(n);
                }
                let request = LoadRequest {
                    layout: hit.layout.clone(),
                    handles: handles.clone(),
                    layers: layers.map(|(start, end)| [start, end]),
                    chains: chains.clone(),
                };
                Ok(s.call(s.client.load_into(&request, &mut out[..need]))?.0)
            }
            (_, found) => Err(other_cache(found)),
        }
    }

    /// Where a client's staging memory of a server's shared arena lies in this process,
    /// `(address, bytes)` (reservations are places in it), for a GPU to register once;
    /// `None` for an engine (its reservations are arena slots) and a client over HTTP.
    pub fn staging(&self) -> Option<(usize, usize)> {
        match &self.backend {
            Backend::Embedded { .. } => None,
            Backend::Served(s) => s.shm.as_ref().map(|c| c.staging_region()),
        }
    }

    /// The blocks of `hit` held in place, for a caller that copies them itself (a GPU):
    /// an engine's in its arena, a server's in its shared arena mapped here. Refused for a
    /// server reached over HTTP only.
    pub fn lease(&self, hit: &Hit) -> Result<BlockLease> {
        match (&self.backend, &hit.found) {
            (Backend::Embedded { engine, .. }, Found::Local(lookup)) => {
                Ok(BlockLease::local(engine.load(lookup)?.blocks))
            }
            (
                Backend::Served(s),
                Found::Served {
                    handles, chains, ..
                },
            ) => {
                let shm = s.shm.as_ref().ok_or_else(no_shared_arena)?;
                if chains.is_some() {
                    return Err(Error::invalid(
                        "a joined hit of a server is loaded with load or load_into, not leased",
                    ));
                }
                Ok(BlockLease::shared(
                    shm,
                    shm.load_handles(&hit.layout, handles)?,
                ))
            }
            (_, found) => Err(other_cache(found)),
        }
    }

    /// Room for `blocks` blocks of `tokens` under `layout`, from block `first_block` on
    /// (block `first_block - 1` must be held already), for a caller that writes them in
    /// place and then commits: an engine's arena slots, or staging memory of a server's
    /// shared arena. Refused for a server reached over HTTP only.
    pub fn reserve(
        &self,
        layout: &CacheLayout,
        tokens: &[u32],
        first_block: usize,
        blocks: usize,
    ) -> Result<BlockReservation> {
        match &self.backend {
            Backend::Embedded { engine, .. } => {
                let prompt = engine.prompt(layout.core()?.digest(), tokens, &ExtraKeys::none())?;
                if blocks == 0 || first_block + blocks > prompt.num_blocks() {
                    return Err(Error::invalid(format!(
                        "{blocks} blocks from block {first_block} on, for a prompt of {} whole blocks",
                        prompt.num_blocks()
                    )));
                }
                BlockReservation::local(engine.clone(), prompt, first_block, blocks)
            }
            Backend::Served(s) => {
                let shm = s.shm.as_ref().ok_or_else(no_shared_arena)?;
                let spec = PromptSpec::new(layout.digest.clone(), tokens.to_vec());
                Ok(BlockReservation::shared(
                    shm.clone(),
                    shm.reserve(&spec, first_block, blocks)?,
                ))
            }
        }
    }

    /// Stores `payloads[i]` as block `i` of `tokens` under `layout` (each exactly one
    /// block), read in place: a server's are written to the socket as they are, or into
    /// staging memory with its shared arena connected.
    pub fn store(
        &self,
        layout: &CacheLayout,
        tokens: &[u32],
        payloads: &[&[u8]],
    ) -> Result<StoreAnswer> {
        match &self.backend {
            Backend::Embedded { engine, .. } => {
                let prompt = engine.prompt(layout.core()?.digest(), tokens, &ExtraKeys::none())?;
                Ok(StoreAnswer::from(&engine.store(&prompt, payloads)?))
            }
            Backend::Served(s) => {
                let spec = PromptSpec::new(layout.digest.clone(), tokens.to_vec());
                match &s.shm {
                    Some(shm) => Ok(shm.store(&spec, payloads, None)?),
                    None => s.call(s.client.store_from(&spec, payloads, None)),
                }
            }
        }
    }

    /// [`Cache::store`] of many short prompts at once: `payloads[i]` are prompt `i`'s
    /// blocks; one answer per prompt, in order. A server over HTTP takes them in one
    /// request; through its shared arena (and in an engine) each is stored in place.
    pub fn store_many(
        &self,
        layout: &CacheLayout,
        prompts: &[&[u32]],
        payloads: &[&[&[u8]]],
    ) -> Result<Vec<StoreAnswer>> {
        if prompts.len() != payloads.len() {
            return Err(Error::invalid(format!(
                "{} prompts with {} lists of blocks",
                prompts.len(),
                payloads.len()
            )));
        }
        match &self.backend {
            Backend::Served(s) if s.shm.is_none() => {
                let flat: Vec<&[u8]> = payloads.iter().flat_map(|p| p.iter().copied()).collect();
                // The server reads each prompt's whole blocks: a prompt sent more or fewer
                // would shift every later prompt's bytes, so that is refused here.
                for (i, (tokens, blocks)) in prompts.iter().zip(payloads).enumerate() {
                    let whole = tokens.len() / layout.tokens_per_block().max(1);
                    if blocks.len() != whole
                        || blocks.iter().any(|b| b.len() as u64 != layout.block_bytes)
                    {
                        return Err(Error::invalid(format!(
                            "prompt {i} of a batch has {whole} whole blocks of {} bytes; {} buffers given",
                            layout.block_bytes,
                            blocks.len()
                        )));
                    }
                }
                Ok(
                    s.call(s.client.store_batch(&layout.digest, prompts, &flat, None))?
                        .answers,
                )
            }
            _ => prompts
                .iter()
                .zip(payloads)
                .map(|(tokens, blocks)| self.store(layout, tokens, blocks))
                .collect(),
        }
    }

    /// Keeps the recurrent state reached after exactly `tokens` (and `session`).
    /// `Stored` or `Replaced`, or `Rejected` when larger than the snapshot budget (a
    /// server answers `Stored` for both kept outcomes).
    pub fn snapshot_put(
        &self,
        layout: &CacheLayout,
        tokens: &[u32],
        session: Option<&[u8]>,
        state: &[u8],
    ) -> Result<SnapshotPut> {
        match &self.backend {
            Backend::Embedded { engine, .. } => {
                engine.snapshot_put(layout.core()?.digest(), tokens, session, state)
            }
            Backend::Served(s) => {
                let spec = snapshot_spec(layout, tokens, session);
                // The request body owns its bytes: one copy of the state.
                let body = Bytes::copy_from_slice(state);
                s.call(s.client.snapshot_put(&spec, body))?;
                Ok(SnapshotPut::Stored)
            }
        }
    }

    /// The state stored for exactly `tokens` (and `session`), if any.
    pub fn snapshot_get(
        &self,
        layout: &CacheLayout,
        tokens: &[u32],
        session: Option<&[u8]>,
    ) -> Result<Option<Bytes>> {
        match &self.backend {
            Backend::Embedded { engine, .. } => {
                engine.snapshot_get(layout.core()?.digest(), tokens, session)
            }
            Backend::Served(s) => {
                let spec = snapshot_spec(layout, tokens, session);
                s.call(s.client.snapshot_get(&spec))
            }
        }
    }

    /// Keeps `state`, the recurrent state of every state group of `layout` after exactly
    /// the first `blocks` whole blocks of `tokens` (a checkpoint boundary). Refused for a
    /// layout without state groups or a state of another size; `Rejected` when there is
    /// no room for it.
    pub fn checkpoint_put(
        &self,
        layout: &CacheLayout,
        tokens: &[u32],
        blocks: usize,
        state: &[u8],
    ) -> Result<SnapshotPut> {
        layout.check_state(state)?;
        match &self.backend {
            Backend::Embedded { engine, .. } => {
                let prompt = engine.prompt(layout.core()?.digest(), tokens, &ExtraKeys::none())?;
                engine.checkpoint_put(&prompt, blocks, state)
            }
            Backend::Served(s) => {
                let spec = CheckpointSpec {
                    layout: layout.digest.clone(),
                    tokens: tokens.to_vec(),
                    extra_keys: Vec::new(),
                    blocks,
                };
                let body = Bytes::copy_from_slice(state);
                Ok(match s.call(s.client.checkpoint_put(&spec, body))? {
                    true => SnapshotPut::Stored,
                    false => SnapshotPut::Rejected,
                })
            }
        }
    }

    /// Looks `tokens` up and reads every part of the hit at once: the KV blocks and, for
    /// a layout with state groups, the recurrent state at their end. All or nothing:
    /// `tokens` is 0 and nothing comes back unless every part was read (one request to a
    /// server).
    pub fn restore(&self, layout: &CacheLayout, tokens: &[u32]) -> Result<Restored> {
        let restored = match &self.backend {
            Backend::Embedded { engine, .. } => {
                let prompt = engine.prompt(layout.core()?.digest(), tokens, &ExtraKeys::none())?;
                engine.restore(&engine.lookup(&prompt))?
            }
            Backend::Served(s) => {
                let spec = PromptSpec::new(layout.digest.clone(), tokens.to_vec());
                let r = s.call(s.client.restore(&spec))?;
                Restored {
                    blocks: r.blocks,
                    state: r.state,
                    tokens: r.tokens,
                }
            }
        };
        if restored.tokens == 0 {
            // Nothing, whatever came along: a partial restore is never handed out.
            return Ok(Restored::default());
        }
        Ok(restored)
    }

    /// Every counter, by the names `/v1/stats` uses.
    pub fn stats(&self) -> Result<BTreeMap<String, u64>> {
        match &self.backend {
            Backend::Embedded {
                node: Some(node), ..
            } => Ok(node.counters()),
            Backend::Embedded { engine, .. } => Ok(engine.stats().counters().into_iter().collect()),
            Backend::Served(s) => s.call(s.client.stats()),
        }
    }

    /// Writes everything queued for the tiers below RAM and syncs them; true only if the
    /// queues drained within `within` and every write since the previous flush reached
    /// its tier. A server is flushed through its admin API instead.
    pub fn flush(&self, within: Duration) -> Result<bool> {
        match &self.backend {
            Backend::Embedded { engine, .. } => Ok(engine.flush(within)),
            Backend::Served(_) => Err(Error::invalid(
                "a kvtier serve is flushed through its admin API (POST /admin/flush)",
            )),
        }
    }

    /// Flushes (within `within`) and stops an embedded engine; later calls fail. A served
    /// cache only lets go of its connections.
    pub fn close(&self, within: Duration) {
        if let Backend::Embedded { engine, .. } = &self.backend {
            engine.shutdown(within);
        }
    }
}

fn snapshot_spec(layout: &CacheLayout, tokens: &[u32], session: Option<&[u8]>) -> SnapshotSpec {
    SnapshotSpec {
        layout: layout.digest.clone(),
        tokens: tokens.to_vec(),
        session: session.map(kvtier_core::hash::hex),
    }
}

/// A hit loaded from the other kind of cache than the one that looked it up.
fn no_shared_arena() -> Error {
    Error::invalid(
        "direct access to block memory needs the server's shared arena (connect with its \
         shm socket)",
    )
}

fn other_cache(found: &Found) -> Error {
    Error::invalid(match found {
        Found::Local(_) => "this hit came from an Engine in this process: load it with that Engine",
        Found::Served { .. } => {
            "this hit came from a Client of kvtier serve: load it with that Client"
        }
    })
}
