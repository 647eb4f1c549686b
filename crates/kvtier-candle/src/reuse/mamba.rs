//! One Mamba turn with kvtier's snapshot bucket: restore the state reached after an
//! exact earlier prefix of the prompt, feed only the new tokens, decode greedily, and
//! keep the state reached at the turn's end under exactly the tokens it consumed.
//!
//! Recurrent state cannot be cut at an arbitrary token, so there is no longest-prefix
//! search: the caller names the lengths where a snapshot may exist (the ends of earlier
//! turns, which a conversation knows), and the longest one kvtier holds for exactly
//! those tokens wins.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvtier_core::{KvDtype, LayoutKey};

use super::backend::{Backend, BoundLayout};
use crate::gemma::argmax;
use crate::mamba::{MambaModel, decode_state, encode_state};
use crate::{Error, Result};

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
}

/// Mamba on the CPU with its state snapshots in kvtier.
#[derive(Debug)]
pub struct MambaRunner {
    model: Arc<MambaModel>,
    backend: Arc<Backend>,
    layout: BoundLayout,
    /// Store the end-of-turn state (on by default).
    pub store: bool,
}

impl MambaRunner {
    /// The key snapshots are filed under: the model's identity and shape.
    pub fn layout_key(model: &MambaModel) -> LayoutKey {
        let c = model.config();
        let mut key = LayoutKey::new(
            format!("kvtier/mamba-synthetic-{}x{}", c.n_layer, c.d_model),
            KvDtype::F32,
            16,
            c.n_layer as u32,
            1,
            crate::mamba::D_STATE as u32,
        );
        key.weights_digest = model.weights_digest().to_owned();
        key.tokenizer_digest = format!("bytes-{}", c.vocab_size);
        key
    }

    /// A runner filing snapshots under [`Self::layout_key`].
    pub fn new(model: Arc<MambaModel>, backend: Arc<Backend>) -> Result<Self> {
        let key = Self::layout_key(&model);
        Self::with_layout(model, backend, key)
    }

    /// A runner filing snapshots under `key`.
    pub fn with_layout(
        model: Arc<MambaModel>,
        backend: Arc<Backend>,
        key: LayoutKey,
    ) -> Result<Self> {
        let layout = backend.bind(key)?;
        Ok(Self {
            model,
            backend,
            layout,
            store: true,
        })
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<Backend> {
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
        let mut candidates: Vec<usize> = hints
            .iter()
            .copied()
            .filter(|&h| h > 0 && h < prompt.len())
            .collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        candidates.dedup();
        let mut state = None;
        for len in candidates {
            let t = Instant::now();
            let Some(blob) = self.backend.snapshot_get(&self.layout, &prompt[..len])? else {
                continue;
            };
            match decode_state(self.model.config(), &blob) {
                Ok(s) if s.pos == len => {
                    turn.load = t.elapsed();
                    turn.bytes_loaded = blob.len() as u64;
                    turn.reused_tokens = len;
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
        let mut logits = self.model.feed(&mut state, &prompt[turn.reused_tokens..])?;
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
                .snapshot_put(&self.layout, &consumed, Bytes::from(blob))?;
        }
        Ok(turn)
    }
}
