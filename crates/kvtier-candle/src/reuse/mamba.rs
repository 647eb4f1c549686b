//! One Mamba turn with kvtier's snapshot bucket: restore the state reached after an
//! exact earlier prefix of the prompt, feed only the new tokens, decode greedily, and
//! keep the state reached at the turn's end under exactly the tokens it consumed.
//!
//! Recurrent state cannot be cut at an arbitrary token, so there is no longest-prefix
//! search over snapshots: the caller names the lengths where a snapshot may exist (the
//! ends of earlier turns, which a conversation knows), and the longest one kvtier holds
//! for exactly those tokens wins.
//!
//! With checkpoints on ([`MambaRunner::with_checkpoints`]) the runner also keeps the
//! state every N tokens while it reads a prompt, and a later prompt that shares only a
//! part of it restores the deepest checkpoint on its own chain (kvtier's lookup finds it)
//! and replays the rest: a prompt that diverges mid-way from a cached one is no longer a
//! full recompute.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_core::{KvDtype, LayoutKey};

use crate::gemma::argmax;
use crate::mamba::{MambaModel, decode_state, encode_state, state_group};
use crate::{Error, Result};
use kvtier_node::{Cache, CacheLayout};

/// What one Mamba turn did.
#[derive(Debug, Clone, Default)]
pub struct MambaTurn {
    /// Greedily decoded tokens.
    pub tokens: Vec<u32>,
    /// The logits each token was chosen from.
    pub logits: Vec<Vec<f32>>,
    /// Prompt tokens whose effect came from a restored snapshot.
    pub reused_tokens: usize,
    /// Prompt arrival to the first token's logits.
    pub ttft: Duration,
    /// Time to fetch and decode the snapshot.
    pub load: Duration,
    /// Snapshot bytes fetched.
    pub bytes_loaded: u64,
    /// Tokens the stored end-of-turn snapshot covers (the next turn's hint).
    pub snapshot_tokens: usize,
    /// Bytes of that snapshot.
    pub bytes_stored: u64,
    /// Why a snapshot that was found could not be used, if so.
    pub refused: Option<String>,
    /// Whether the restored state was a checkpoint (rather than an end-of-turn snapshot).
    pub from_checkpoint: bool,
    /// Checkpoints this turn stored while reading the prompt.
    pub checkpoints_stored: usize,
}

/// Mamba on the CPU with its state snapshots in kvtier.
#[derive(Debug)]
pub struct MambaRunner {
    model: Arc<MambaModel>,
    backend: Arc<Cache>,
    layout: CacheLayout,
    /// Tokens between checkpoints, when checkpoints are on.
    checkpoint_every: Option<usize>,
    /// Store the end-of-turn state and checkpoints (on by default).
    pub store: bool,
}

impl MambaRunner {
    /// The key snapshots are filed under: the model's identity and shape. Mamba has no
    /// attention layers, so no KV blocks; its one state group is every layer's SSM and
    /// convolution state, in this crate's encoding.
    pub fn layout_key(model: &MambaModel) -> LayoutKey {
        let c = model.config();
        let mut key = LayoutKey::new(
            format!("kvtier/mamba-synthetic-{}x{}", c.n_layer, c.d_model),
            KvDtype::F32,
            16,
            0,
            1,
            1,
        );
        key.weights_digest = model.weights_digest().to_owned();
        key.tokenizer_digest = format!("bytes-{}", c.vocab_size);
        key.state_groups = vec![state_group(c)];
        key
    }

    /// A runner filing snapshots under [`Self::layout_key`].
    pub fn new(model: Arc<MambaModel>, backend: Arc<Cache>) -> Result<Self> {
        let key = Self::layout_key(&model);
        Self::with_layout(model, backend, key)
    }

    /// A runner filing snapshots under `key`.
    pub fn with_layout(
        model: Arc<MambaModel>,
        backend: Arc<Cache>,
        key: LayoutKey,
    ) -> Result<Self> {
        let layout = backend.register_layout(key, None)?;
        Ok(Self {
            model,
            backend,
            layout,
            checkpoint_every: None,
            store: true,
        })
    }

    /// Keeps a checkpoint of the state every `tokens` tokens (rounded up to whole blocks)
    /// of each prompt, and restores the deepest one a prompt shares. Needs an embedded
    /// engine.
    pub fn with_checkpoints(mut self, tokens: usize) -> Result<Self> {
        self.layout = self.backend.set_checkpoint_every(&self.layout, tokens)?;
        self.checkpoint_every = self.layout.checkpoint_every().map(|t| t as usize);
        Ok(self)
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<Cache> {
        &self.backend
    }

    /// Runs one turn. `hints` are prefix lengths where a snapshot may exist; the longest
    /// that kvtier holds for exactly `prompt[..len]` is restored.
    pub fn run_turn(&self, prompt: &[u32], max_new: usize, hints: &[usize]) -> Result<MambaTurn> {
        if prompt.is_empty() || max_new == 0 {
            return Err(Error::Invalid(
                "a turn needs a prompt and at least one new token".into(),
            ));
        }
        let started = Instant::now();
        let mut turn = MambaTurn::default();
        let mut state = self.restore_checkpoint(prompt, &mut turn)?;
        let mut candidates: Vec<usize> = hints
            .iter()
            .copied()
            .filter(|&h| h > turn.reused_tokens && h < prompt.len())
            .collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        candidates.dedup();
        for len in candidates {
            let t = Instant::now();
            let Some(blob) = self
                .backend
                .snapshot_get(&self.layout, &prompt[..len], None)?
            else {
                continue;
            };
            match decode_state(self.model.config(), &blob) {
                Ok(s) if s.pos == len => {
                    turn.load = t.elapsed();
                    turn.bytes_loaded = blob.len() as u64;
                    turn.reused_tokens = len;
                    turn.from_checkpoint = false;
                    state = Some(s);
                    break;
                }
                Ok(s) => {
                    turn.refused = Some(format!(
                        "a snapshot for {len} tokens says it is at {}",
                        s.pos
                    ));
                }
                Err(e) => turn.refused = Some(e.to_string()),
            }
        }
        let mut state = match state {
            Some(s) => s,
            None => self.model.fresh_state()?,
        };
        let mut logits = self.read_prompt(prompt, &mut state, &mut turn)?;
        turn.ttft = started.elapsed();
        let mut consumed = prompt.to_vec();
        for i in 0..max_new {
            let next = argmax(&logits);
            turn.tokens.push(next);
            turn.logits.push(std::mem::take(&mut logits));
            if i + 1 < max_new {
                logits = self.model.step(&mut state, next)?;
                consumed.push(next);
            }
        }
        if self.store {
            let blob = encode_state(self.model.config(), &state)?;
            turn.bytes_stored = blob.len() as u64;
            turn.snapshot_tokens = consumed.len();
            self.backend
                .snapshot_put(&self.layout, &consumed, None, &blob)?;
        }
        Ok(turn)
    }

    /// The state of the deepest checkpoint kvtier holds on `prompt`'s chain (short of its
    /// last token, which must be fed to get logits), if checkpoints are on.
    fn restore_checkpoint(
        &self,
        prompt: &[u32],
        turn: &mut MambaTurn,
    ) -> Result<Option<candle_transformers::models::mamba::State>> {
        if self.checkpoint_every.is_none() || prompt.len() < 2 {
            return Ok(None);
        }
        let t = Instant::now();
        let restored = self
            .backend
            .restore(&self.layout, &prompt[..prompt.len() - 1])?;
        let Some(blob) = restored.state else {
            return Ok(None);
        };
        match decode_state(self.model.config(), &blob) {
            Ok(s) if s.pos == restored.tokens => {
                turn.load = t.elapsed();
                turn.bytes_loaded = blob.len() as u64;
                turn.reused_tokens = restored.tokens;
                turn.from_checkpoint = true;
                Ok(Some(s))
            }
            Ok(s) => {
                turn.refused = Some(format!(
                    "a checkpoint for {} tokens says it is at {}",
                    restored.tokens, s.pos
                ));
                Ok(None)
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
        state: &mut candle_transformers::models::mamba::State,
        turn: &mut MambaTurn,
    ) -> Result<Vec<f32>> {
        let every = self.checkpoint_every.filter(|_| self.store);
        let tpb = self.layout.tokens_per_block();
        let mut logits = Vec::new();
        for (i, &token) in prompt.iter().enumerate().skip(turn.reused_tokens) {
            logits = self.model.step(state, token)?;
            let fed = i + 1;
            if let Some(every) = every
                && fed.is_multiple_of(every)
            {
                let blob = encode_state(self.model.config(), state)?;
                self.backend
                    .checkpoint_put(&self.layout, prompt, fed / tpb, &blob)?;
                turn.checkpoints_stored += 1;
            }
        }
        Ok(logits)
    }
}
