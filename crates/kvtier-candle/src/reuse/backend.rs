//! Where a model's cached state lives: an engine in this process (RAM, and the SSD tier
//! when attached), or a `kvtier serve` reached over HTTP. The model code is the same for
//! both; only these calls differ.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use kvtier_client::Client;
use kvtier_client::wire::{
    CheckpointSpec, LayoutSpec, LoadRequest, PromptSpec, SnapshotSpec, StateGroupSpec,
};
use kvtier_core::{Engine, ExtraKeys, Layout, LayoutKey, Lookup};

use crate::{Error, Result};

/// A kvtier server, called from synchronous model code through a runtime of its own.
#[derive(Debug)]
pub struct Served {
    client: Client,
    runtime: tokio::runtime::Runtime,
}

/// The cache a model talks to.
#[derive(Debug)]
pub enum Backend {
    /// An engine in this process.
    Embedded(Arc<Engine>),
    /// A `kvtier serve` process.
    Served(Served),
}

/// A layout registered with a backend.
#[derive(Debug, Clone)]
pub struct BoundLayout {
    key: LayoutKey,
    digest_hex: String,
    layout: Option<Arc<Layout>>,
    block_bytes: u64,
}

impl BoundLayout {
    /// The layout key.
    pub fn key(&self) -> &LayoutKey {
        &self.key
    }

    /// Tokens per block.
    pub fn tokens_per_block(&self) -> usize {
        self.key.tokens_per_block as usize
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// The layout digest, hex.
    pub fn digest_hex(&self) -> &str {
        &self.digest_hex
    }
}

/// The answer to a lookup: how many tokens are cached and how to load them.
#[derive(Debug, Clone)]
pub struct Hit {
    /// Tokens covered by the matched blocks.
    pub matched_tokens: usize,
    handle: HitHandle,
}

#[derive(Debug, Clone)]
enum HitHandle {
    Engine(Lookup),
    /// 32 hex digits per block.
    Served(String),
}

/// Every part of one boundary a [`Backend::restore`] read, or nothing.
#[derive(Debug, Clone, Default)]
pub struct RestoredState {
    /// KV blocks of the attention layers (none for a recurrent-only layout).
    pub blocks: Vec<Bytes>,
    /// The recurrent state after exactly `tokens` tokens.
    pub state: Option<Bytes>,
    /// Tokens restored; 0 when nothing was.
    pub tokens: usize,
}

impl Hit {
    /// Blocks matched.
    pub fn blocks(&self) -> usize {
        match &self.handle {
            HitHandle::Engine(l) => l.blocks.len(),
            HitHandle::Served(h) => h.len() / 32,
        }
    }
}

impl Backend {
    /// A backend calling the server at `base_url` (e.g. `http://127.0.0.1:7070`).
    pub fn served(base_url: &str, token: Option<String>) -> Result<Self> {
        let mut client = Client::new(base_url)?;
        if let Some(token) = token {
            client = client.with_token(token);
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io("cannot start the client runtime", e))?;
        Ok(Self::Served(Served { client, runtime }))
    }

    /// Registers `key` (idempotent).
    pub fn bind(&self, key: LayoutKey) -> Result<BoundLayout> {
        match self {
            Backend::Embedded(engine) => {
                let layout = engine.register_layout(key.clone())?;
                Ok(BoundLayout {
                    digest_hex: layout.digest().to_hex(),
                    block_bytes: layout.block_bytes(),
                    layout: Some(layout),
                    key,
                })
            }
            Backend::Served(s) => {
                let spec = layout_spec(&key, None);
                let info = s.runtime.block_on(s.client.register_layout(&spec))?;
                Ok(BoundLayout {
                    digest_hex: info.layout,
                    block_bytes: info.block_bytes,
                    layout: None,
                    key,
                })
            }
        }
    }

    /// How much of `tokens` is cached under `layout`.
    pub fn lookup(&self, layout: &BoundLayout, tokens: &[u32]) -> Result<Hit> {
        match self {
            Backend::Embedded(engine) => {
                let prompt =
                    engine.prompt(engine_layout(layout)?.digest(), tokens, &ExtraKeys::none())?;
                let lookup = engine.lookup(&prompt);
                Ok(Hit {
                    matched_tokens: lookup.matched_tokens,
                    handle: HitHandle::Engine(lookup),
                })
            }
            Backend::Served(s) => {
                let spec = PromptSpec::new(layout.digest_hex.clone(), tokens.to_vec());
                let answer = s.runtime.block_on(s.client.lookup(&spec))?;
                Ok(Hit {
                    matched_tokens: answer.matched_tokens,
                    handle: HitHandle::Served(answer.handles),
                })
            }
        }
    }

    /// The first `blocks` matched blocks of `hit`, whole, or only layer `layer` of each.
    /// Fewer come back when the cache lost some since the lookup.
    pub fn load(
        &self,
        layout: &BoundLayout,
        hit: &Hit,
        blocks: usize,
        layer: Option<u32>,
    ) -> Result<Vec<Bytes>> {
        if blocks > hit.blocks() {
            return Err(Error::Invalid(format!(
                "{blocks} blocks asked of a hit of {}",
                hit.blocks()
            )));
        }
        match (self, &hit.handle) {
            (Backend::Embedded(engine), HitHandle::Engine(lookup)) => {
                let mut lookup = lookup.clone();
                lookup.blocks.truncate(blocks);
                let loaded = match layer {
                    None => engine.load(&lookup.blocks)?,
                    Some(l) => engine.load_layers(&lookup, l..l + 1)?,
                };
                Ok(loaded.blocks)
            }
            (Backend::Served(s), HitHandle::Served(handles)) => {
                let request = LoadRequest {
                    layout: layout.digest_hex.clone(),
                    handles: handles[..blocks * 32].to_owned(),
                    layers: layer.map(|l| [l, l + 1]),
                };
                Ok(s.runtime.block_on(s.client.load(&request))?.blocks)
            }
            _ => Err(Error::Invalid("a hit from another backend".into())),
        }
    }

    /// Stores `payloads[i]` as block `i` of `tokens`; returns blocks newly kept.
    pub fn store(
        &self,
        layout: &BoundLayout,
        tokens: &[u32],
        payloads: Vec<Bytes>,
    ) -> Result<usize> {
        match self {
            Backend::Embedded(engine) => {
                let prompt =
                    engine.prompt(engine_layout(layout)?.digest(), tokens, &ExtraKeys::none())?;
                let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_ref()).collect();
                Ok(engine.store(&prompt, &refs)?.stored)
            }
            Backend::Served(s) => {
                let spec = PromptSpec::new(layout.digest_hex.clone(), tokens.to_vec());
                Ok(s.runtime.block_on(s.client.store(&spec, payloads))?.stored)
            }
        }
    }

    /// Sets the distance between checkpoints of `layout` (a layout with state groups) and
    /// returns the one in force (a served backend registers the layout again with it).
    pub fn set_checkpoint_every(&self, layout: &BoundLayout, tokens: usize) -> Result<usize> {
        match self {
            Backend::Embedded(engine) => {
                Ok(engine.set_checkpoint_every(engine_layout(layout)?.digest(), tokens)?)
            }
            Backend::Served(s) => {
                let tokens = u32::try_from(tokens)
                    .map_err(|_| Error::Invalid(format!("a checkpoint every {tokens} tokens")))?;
                let spec = layout_spec(&layout.key, Some(tokens));
                let info = s.runtime.block_on(s.client.register_layout(&spec))?;
                info.checkpoint_every.map(|t| t as usize).ok_or_else(|| {
                    Error::Invalid("the server keeps no checkpoints for this layout".into())
                })
            }
        }
    }

    /// Keeps `blob`, the recurrent state after the first `blocks` whole blocks of `tokens`,
    /// as a checkpoint.
    pub fn checkpoint_put(
        &self,
        layout: &BoundLayout,
        tokens: &[u32],
        blocks: usize,
        blob: &[u8],
    ) -> Result<()> {
        match self {
            Backend::Embedded(engine) => {
                let prompt =
                    engine.prompt(engine_layout(layout)?.digest(), tokens, &ExtraKeys::none())?;
                engine.checkpoint_put(&prompt, blocks, blob)?;
                Ok(())
            }
            Backend::Served(s) => {
                let spec = CheckpointSpec {
                    layout: layout.digest_hex.clone(),
                    tokens: tokens.to_vec(),
                    extra_keys: Vec::new(),
                    blocks,
                };
                let state = Bytes::copy_from_slice(blob);
                s.runtime.block_on(s.client.checkpoint_put(&spec, state))?;
                Ok(())
            }
        }
    }

    /// Looks `tokens` up and reads every part of the hit at once (KV blocks and the
    /// recurrent state of the same boundary), or nothing; see `Engine::restore`. One
    /// request to a server.
    pub fn restore(&self, layout: &BoundLayout, tokens: &[u32]) -> Result<RestoredState> {
        let (blocks, state, tokens) = match self {
            Backend::Embedded(engine) => {
                let prompt =
                    engine.prompt(engine_layout(layout)?.digest(), tokens, &ExtraKeys::none())?;
                let r = engine.restore(&engine.lookup(&prompt))?;
                (r.blocks, r.state, r.tokens)
            }
            Backend::Served(s) => {
                let spec = PromptSpec::new(layout.digest_hex.clone(), tokens.to_vec());
                let r = s.runtime.block_on(s.client.restore(&spec))?;
                (r.blocks, r.state, r.tokens)
            }
        };
        Ok(RestoredState {
            blocks,
            state,
            tokens,
        })
    }

    /// Keeps the recurrent state reached after exactly `tokens`.
    pub fn snapshot_put(&self, layout: &BoundLayout, tokens: &[u32], blob: Bytes) -> Result<()> {
        match self {
            Backend::Embedded(engine) => {
                engine.snapshot_put(engine_layout(layout)?.digest(), tokens, None, &blob)?;
                Ok(())
            }
            Backend::Served(s) => {
                let spec = snapshot_spec(layout, tokens);
                Ok(s.runtime.block_on(s.client.snapshot_put(&spec, blob))?)
            }
        }
    }

    /// The state stored for exactly `tokens`, if any.
    pub fn snapshot_get(&self, layout: &BoundLayout, tokens: &[u32]) -> Result<Option<Bytes>> {
        match self {
            Backend::Embedded(engine) => {
                Ok(engine.snapshot_get(engine_layout(layout)?.digest(), tokens, None)?)
            }
            Backend::Served(s) => {
                let spec = snapshot_spec(layout, tokens);
                Ok(s.runtime.block_on(s.client.snapshot_get(&spec))?)
            }
        }
    }

    /// The cache's counters (`index_lookup_hits`, `snapshot_hits`, ...).
    pub fn counters(&self) -> Result<BTreeMap<String, u64>> {
        match self {
            Backend::Embedded(engine) => Ok(engine.stats().counters().into_iter().collect()),
            Backend::Served(s) => Ok(s.runtime.block_on(s.client.stats())?),
        }
    }
}

fn engine_layout(layout: &BoundLayout) -> Result<&Arc<Layout>> {
    layout
        .layout
        .as_ref()
        .ok_or_else(|| Error::Invalid("a layout bound to a server, used with an engine".into()))
}

/// `key` as the server's registration asks for it, with `checkpoint_every` if given.
fn layout_spec(key: &LayoutKey, checkpoint_every: Option<u32>) -> LayoutSpec {
    LayoutSpec {
        model_id: key.model_id.clone(),
        weights_digest: key.weights_digest.clone(),
        tokenizer_digest: key.tokenizer_digest.clone(),
        dtype: key.dtype.name().to_owned(),
        tokens_per_block: key.tokens_per_block,
        num_layers: key.num_layers,
        num_kv_heads: key.num_kv_heads,
        head_dim: key.head_dim,
        tp_rank: key.tp_rank,
        tp_size: key.tp_size,
        pp_stage: key.pp_stage,
        pp_size: key.pp_size,
        lora_id: key.lora_id.clone(),
        tenant_salt: kvtier_core::hash::hex(&key.tenant_salt),
        state_groups: key
            .state_groups
            .iter()
            .map(|g| StateGroupSpec {
                kind: g.kind.clone(),
                num_layers: g.num_layers,
                state_bytes: g.state_bytes,
            })
            .collect(),
        checkpoint_every,
    }
}

fn snapshot_spec(layout: &BoundLayout, tokens: &[u32]) -> SnapshotSpec {
    SnapshotSpec {
        layout: layout.digest_hex.clone(),
        tokens: tokens.to_vec(),
        session: None,
    }
}
