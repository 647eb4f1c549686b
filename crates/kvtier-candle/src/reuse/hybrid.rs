//! One turn of the hybrid model with kvtier underneath: the attention layers' KV goes to
//! kvtier as blocks, the Mamba layers' state as checkpoints every N tokens, and a later
//! prompt restores the deepest boundary where kvtier holds both — or computes from the
//! start. The engine (or `kvtier serve`) enforces that rule; the runner also checks what
//! it gets back (block sizes, the state's own position) and treats anything off as a
//! miss.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvtier_core::{KvDtype, LayoutKey};

use crate::gemma::argmax;
use crate::hybrid::{HYBRID_TOKENS_PER_BLOCK, HybridModel, HybridState};
use crate::mamba::state_group;
use crate::{Error, Result};
use kvtier_node::{Cache, CacheLayout};

/// What one hybrid turn did.
#[derive(Debug, Clone, Default)]
pub struct HybridTurn {
    /// Greedily decoded tokens.
    pub tokens: Vec<u32>,
    /// The logits each token was chosen from.
    pub logits: Vec<Vec<f32>>,
    /// Prompt tokens whose KV and state came from kvtier.
    pub reused_tokens: usize,
    /// Prompt arrival to the first token's logits.
    pub ttft: Duration,
    /// Time to look up, fetch and rebuild the restored state.
    pub load: Duration,
    /// Bytes restored (blocks and state).
    pub bytes_loaded: u64,
    /// Why a restore that kvtier offered was not used, if so.
    pub refused: Option<String>,
    /// KV blocks this turn stored (new ones; duplicates are not counted).
    pub blocks_stored: usize,
    /// Checkpoints this turn stored while reading the prompt.
    pub checkpoints_stored: usize,
}

/// The hybrid model on the CPU with its KV blocks and checkpoints in kvtier.
#[derive(Debug)]
pub struct HybridRunner {
    model: Arc<HybridModel>,
    backend: Arc<Cache>,
    layout: CacheLayout,
    checkpoint_every: usize,
    /// Store the prompt's KV blocks (on by default).
    pub store_kv: bool,
    /// Store checkpoints of the recurrent state (on by default).
    pub store_state: bool,
}

impl HybridRunner {
    /// The key blocks and checkpoints are filed under: the model's identity and shape,
    /// its attention layers' geometry, and its Mamba layers as one state group.
    pub fn layout_key(model: &HybridModel) -> LayoutKey {
        let c = model.config();
        let mut key = LayoutKey::new(
            format!("kvtier/hybrid-synthetic-{}-{}", c.pattern(), c.d_model),
            KvDtype::F32,
            HYBRID_TOKENS_PER_BLOCK as u32,
            c.attention_layers() as u32,
            c.num_heads as u32,
            c.head_dim as u32,
        );
        key.weights_digest = model.weights_digest().to_owned();
        key.tokenizer_digest = format!("bytes-{}", c.vocab_size);
        key.state_groups = vec![state_group(&c.mamba_config())];
        key
    }

    /// A runner keeping a checkpoint every `checkpoint_every` tokens (rounded up to whole
    /// blocks by the cache).
    pub fn new(
        model: Arc<HybridModel>,
        backend: Arc<Cache>,
        checkpoint_every: usize,
    ) -> Result<Self> {
        let key = Self::layout_key(&model);
        Self::with_layout(model, backend, checkpoint_every, key)
    }

    /// [`HybridRunner::new`] storing under `key`, which must describe this model's blocks
    /// (its size is checked against the model's; a cold codec may be added, ADR 0021).
    pub fn with_layout(
        model: Arc<HybridModel>,
        backend: Arc<Cache>,
        checkpoint_every: usize,
        key: LayoutKey,
    ) -> Result<Self> {
        let layout = backend.register_layout(key, None)?;
        if layout.block_bytes() != model.config().block_bytes() as u64 {
            return Err(Error::Invalid(format!(
                "the cache computes {}-byte blocks for this layout; the model writes {}",
                layout.block_bytes(),
                model.config().block_bytes()
            )));
        }
        let layout = backend.set_checkpoint_every(&layout, checkpoint_every)?;
        let checkpoint_every = layout.checkpoint_every().unwrap_or_default() as usize;
        Ok(Self {
            model,
            backend,
            layout,
            checkpoint_every,
            store_kv: true,
            store_state: true,
        })
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<Cache> {
        &self.backend
    }

    /// Tokens between checkpoints, as the cache keeps them.
    pub fn checkpoint_every(&self) -> usize {
        self.checkpoint_every
    }

    /// Runs one turn: restore what kvtier holds for `prompt`, read the rest (keeping
    /// checkpoints), store the prompt's blocks, decode `max_new` tokens greedily.
    pub fn run_turn(&self, prompt: &[u32], max_new: usize) -> Result<HybridTurn> {
        if prompt.is_empty() || max_new == 0 {
            return Err(Error::Invalid(
                "a turn needs a prompt and at least one new token".into(),
            ));
        }
        let started = Instant::now();
        let mut turn = HybridTurn::default();
        let mut state = match self.restore(prompt, &mut turn)? {
            Some(s) => s,
            None => self.model.fresh_state()?,
        };
        let mut logits = self.read_prompt(prompt, &mut state, &mut turn)?;
        turn.ttft = started.elapsed();
        if self.store_kv {
            let whole = prompt.len() / HYBRID_TOKENS_PER_BLOCK;
            let blocks = (0..whole)
                .map(|i| self.model.block(&state, i).map(Bytes::from))
                .collect::<Result<Vec<_>>>()?;
            let payloads: Vec<&[u8]> = blocks.iter().map(|b| &b[..]).collect();
            turn.blocks_stored = self
                .backend
                .store(
                    &self.layout,
                    &prompt[..whole * HYBRID_TOKENS_PER_BLOCK],
                    &payloads,
                )?
                .stored;
        }
        for i in 0..max_new {
            let next = argmax(&logits);
            turn.tokens.push(next);
            turn.logits.push(std::mem::take(&mut logits));
            if i + 1 < max_new {
                logits = self.model.step(&mut state, next)?;
            }
        }
        Ok(turn)
    }

    /// The state at the deepest boundary of `prompt` (short of its last token, which must
    /// be fed to get logits) where kvtier restores both the KV blocks and the recurrent
    /// state; `None` to compute from the start.
    fn restore(&self, prompt: &[u32], turn: &mut HybridTurn) -> Result<Option<HybridState>> {
        if prompt.len() < 2 {
            return Ok(None);
        }
        let t = Instant::now();
        let restored = self
            .backend
            .restore(&self.layout, &prompt[..prompt.len() - 1])?;
        let Some(blob) = restored.state.filter(|_| restored.tokens > 0) else {
            return Ok(None);
        };
        if restored.blocks.len() * HYBRID_TOKENS_PER_BLOCK != restored.tokens {
            turn.refused = Some(format!(
                "a restore of {} tokens came with {} blocks",
                restored.tokens,
                restored.blocks.len()
            ));
            return Ok(None);
        }
        match self.model.restore(&restored.blocks, &blob) {
            Ok(state) => {
                turn.load = t.elapsed();
                turn.bytes_loaded =
                    restored.blocks.iter().map(|b| b.len() as u64).sum::<u64>() + blob.len() as u64;
                turn.reused_tokens = restored.tokens;
                Ok(Some(state))
            }
            Err(e) => {
                turn.refused = Some(e.to_string());
                Ok(None)
            }
        }
    }

    /// Feeds the prompt from where the restored state ends, keeping a checkpoint at every
    /// checkpoint boundary it passes; returns the logits after the last token.
    fn read_prompt(
        &self,
        prompt: &[u32],
        state: &mut HybridState,
        turn: &mut HybridTurn,
    ) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        for (i, &token) in prompt.iter().enumerate().skip(turn.reused_tokens) {
            logits = self.model.step(state, token)?;
            let fed = i + 1;
            if self.store_state && fed.is_multiple_of(self.checkpoint_every) {
                let blob = self.model.encode_state(state)?;
                self.backend.checkpoint_put(
                    &self.layout,
                    prompt,
                    fed / HYBRID_TOKENS_PER_BLOCK,
                    &blob,
                )?;
                turn.checkpoints_stored += 1;
            }
        }
        Ok(logits)
    }
}
