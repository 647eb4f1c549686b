//! Layouts with state groups (hybrid and recurrent models): checkpoints of the recurrent
//! state at block boundaries, and the composition rule that serves a hit only where every
//! group of the layout can be restored (issue 16, `docs/hybrid.md`).
//!
//! ```text
//! block of the prompt     0   1   2   3   4   5   6   7
//! KV held (attention)     ■   ■   ■   ■   ■   ■   ·   ·
//! state held (recurrent)        ◆       ◆           ◆    checkpoints after 2, 4 and 8 blocks
//! served                  └ blocks 0..4 ┘◆               the state after 4 blocks with them;
//!                                                        KV of blocks 4 and 5 is not offered,
//!                                                        the state after 8 has no KV under it
//! ```
//!
//! A checkpoint is keyed by the hash of the block it ends on, which names the layout,
//! every earlier token and the extra keys, so a checkpoint can only be found for the exact
//! prefix it was computed after. Restoring KV without the state of the same boundary (or
//! the reverse) would leave some layers at another point of the prompt than the others:
//! garbled output, never a miss. So the lookup offers neither unless both are there, and
//! the restore returns neither unless both can be read.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::Engine;
use crate::error::{Error, Result};
use crate::index::{Lookup, Prompt, StateRef};
use crate::layout::{Layout, LayoutDigest};
use crate::snapshot::{SnapshotKey, SnapshotPut};
use crate::stats::StateStats;
use crate::tier::TierKind;

/// What [`Engine::restore`] read: every group's part of one boundary, or nothing.
#[derive(Debug, Clone, Default)]
pub struct Restored {
    /// The KV blocks of the attention layers, in order (empty for a recurrent-only
    /// layout).
    pub blocks: Vec<Bytes>,
    /// The recurrent state after exactly `tokens` tokens, for a layout with state groups.
    pub state: Option<Bytes>,
    /// Prompt tokens whose effect the restored parts carry; 0 when nothing was restored
    /// (the caller computes the whole prompt).
    pub tokens: usize,
}

#[derive(Debug, Default)]
pub(super) struct StateCounters {
    lookups: AtomicU64,
    hits: AtomicU64,
    refused: AtomicU64,
    trimmed: AtomicU64,
    restores: AtomicU64,
    restore_misses: AtomicU64,
}

impl StateCounters {
    pub(super) fn read(&self) -> StateStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StateStats {
            lookups: get(&self.lookups),
            hits: get(&self.hits),
            refused: get(&self.refused),
            trimmed: get(&self.trimmed),
            restores: get(&self.restores),
            restore_misses: get(&self.restore_misses),
        }
    }
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

impl Engine {
    /// Tokens between checkpoints of prompts under `layout`: the layout's own setting, or
    /// the engine's default, rounded up to whole blocks.
    pub fn checkpoint_every(&self, layout: LayoutDigest) -> Result<usize> {
        let l = self.layout(layout)?;
        let own = self.checkpoint_every.read().get(&layout).copied();
        let tokens = own.unwrap_or(self.config.checkpoint.every_tokens as usize);
        Ok(round_to_blocks(tokens, &l))
    }

    /// Sets the distance between checkpoints of prompts under `layout` to `tokens`
    /// (rounded up to whole blocks); returns the distance in force. Checkpoints already
    /// stored at other boundaries are no longer found and age out.
    pub fn set_checkpoint_every(&self, layout: LayoutDigest, tokens: usize) -> Result<usize> {
        let l = self.layout(layout)?;
        if tokens == 0 || tokens > self.config.max_tokens {
            return Err(Error::invalid(format!(
                "a checkpoint every {tokens} tokens; 1 to {} (max_tokens) are allowed",
                self.config.max_tokens
            )));
        }
        let every = round_to_blocks(tokens, &l);
        self.checkpoint_every.write().insert(layout, every);
        Ok(every)
    }

    /// Applies a layout registration's checkpoint setting: `tokens`, when given, becomes
    /// the distance between checkpoints of prompts under `layout`. Returns the distance in
    /// force, or `None` for a layout without state groups, which has no checkpoints and
    /// refuses a distance.
    pub fn configure_checkpoints(
        &self,
        layout: LayoutDigest,
        tokens: Option<usize>,
    ) -> Result<Option<usize>> {
        let l = self.layout(layout)?;
        match (l.has_state(), tokens) {
            (false, None) => Ok(None),
            (false, Some(_)) => Err(Error::invalid(
                "checkpoint_every is a setting of layouts with state groups; this one has none",
            )),
            (true, Some(tokens)) => self.set_checkpoint_every(layout, tokens).map(Some),
            (true, None) => self.checkpoint_every(layout).map(Some),
        }
    }

    /// The boundaries of `prompt`, in whole blocks, where a checkpoint belongs: every
    /// [`Engine::checkpoint_every`] tokens, up to the prompt's last whole block.
    pub fn checkpoint_boundaries(&self, prompt: &Prompt) -> Result<Vec<usize>> {
        let layout = prompt.layout();
        let every = self.checkpoint_every(layout.digest())? / layout.tokens_per_block();
        Ok((1..=prompt.num_blocks() / every)
            .map(|i| i * every)
            .collect())
    }

    /// Keeps `blob`, the recurrent state of every state group after exactly the first
    /// `blocks` whole blocks of `prompt`. Refused for a layout without state groups, a
    /// boundary that is not a checkpoint boundary (see [`Engine::checkpoint_boundaries`])
    /// and a blob whose size is not the layout's state size. The blob is copied; every
    /// tier below RAM that keeps snapshots gets it too.
    pub fn checkpoint_put(
        &self,
        prompt: &Prompt,
        blocks: usize,
        blob: &[u8],
    ) -> Result<SnapshotPut> {
        self.poison.check()?;
        let layout = prompt.layout().clone();
        let digest = layout.digest();
        self.layout(digest)?;
        if !layout.has_state() {
            return Err(Error::invalid(format!(
                "layout `{digest}` names no state groups, so it has no recurrent state to checkpoint"
            )));
        }
        let every = self.checkpoint_every(digest)? / layout.tokens_per_block();
        if blocks == 0 || blocks > prompt.num_blocks() || !blocks.is_multiple_of(every) {
            return Err(Error::invalid(format!(
                "a checkpoint after {blocks} blocks of a {}-block prompt; layout `{digest}` keeps them every {every} blocks",
                prompt.num_blocks()
            )));
        }
        if blob.len() as u64 != layout.state_bytes() {
            return Err(Error::invalid(format!(
                "a state of {} bytes; layout `{digest}` names {} bytes of state",
                blob.len(),
                layout.state_bytes()
            )));
        }
        let key = SnapshotKey::checkpoint(digest, prompt.hashes()[blocks - 1], blocks);
        let tokens = (blocks * layout.tokens_per_block()) as u64;
        let _admitted = self.admission.read();
        let owned = self.arena.copy(blob);
        let ram = &self.ram;
        let outcome = self
            .checkpoints
            .put(key, digest, owned.clone(), tokens, &|n| ram.evict_bytes(n));
        for slot in self.stack.slots().iter() {
            if slot.tier.snapshots().is_some() {
                slot.writer.enqueue_snapshot(key, digest, owned.clone());
            }
        }
        Ok(outcome)
    }

    /// The composed lookup of a layout with state groups (see [`Engine::lookup`]).
    pub(super) fn lookup_composed(&self, prompt: &Prompt) -> Lookup {
        let layout = prompt.layout().clone();
        let digest = layout.digest();
        bump(&self.state_counters.lookups);
        let mut found = if layout.has_kv() {
            self.index.lookup(prompt, usize::MAX)
        } else {
            Lookup {
                layout: digest,
                ..Lookup::default()
            }
        };
        let bound = if layout.has_kv() {
            found.blocks.len()
        } else {
            prompt.num_blocks()
        };
        let every = self
            .checkpoint_every(digest)
            .map_or(usize::MAX, |t| t / layout.tokens_per_block());
        let deepest = (1..=bound / every.max(1)).rev().find_map(|i| {
            let blocks = i * every;
            let key = SnapshotKey::checkpoint(digest, prompt.hashes()[blocks - 1], blocks);
            self.state_tier(&key)
                .map(|tier| StateRef { key, blocks, tier })
        });
        let Some(state) = deepest else {
            if !found.blocks.is_empty() {
                bump(&self.state_counters.refused);
            }
            return Lookup {
                layout: digest,
                ..Lookup::default()
            };
        };
        if layout.has_kv() && found.blocks.len() > state.blocks {
            bump(&self.state_counters.trimmed);
            found.blocks.truncate(state.blocks);
        }
        bump(&self.state_counters.hits);
        found.matched_tokens = state.blocks * layout.tokens_per_block();
        found.state = Some(state);
        self.prefetch_cold(&found);
        found
    }

    /// The fastest tier holding the checkpoint `key`, from memory alone.
    fn state_tier(&self, key: &SnapshotKey) -> Option<TierKind> {
        if self.checkpoints.contains(key) {
            return Some(TierKind::Ram);
        }
        self.stack
            .slots()
            .iter()
            .find(|s| {
                s.tier
                    .snapshots()
                    .is_some_and(|st| st.contains_snapshot(key))
            })
            .map(|s| s.kind())
    }

    /// Reads every part of the hit `lookup` names: its KV blocks and, for a layout with
    /// state groups, the checkpoint at their end. All or nothing: when either part can no
    /// longer be read in full (evicted, damaged, a tier failing) nothing is returned and
    /// `tokens` is 0, because KV without the state of the same boundary, or the reverse,
    /// must never be served. An attention-only lookup loads as [`Engine::load`] does.
    pub fn restore(&self, lookup: &Lookup) -> Result<Restored> {
        self.poison.check()?;
        let layout = self.layout(lookup.layout)?;
        let Some(state) = lookup.state else {
            if layout.has_state() {
                return Ok(Restored::default());
            }
            let loaded = self.load(lookup)?;
            return Ok(Restored {
                tokens: loaded.blocks.len() * layout.tokens_per_block(),
                blocks: loaded.blocks,
                state: None,
            });
        };
        let wanted = if layout.has_kv() { state.blocks } else { 0 };
        if !layout.has_state() || lookup.blocks.len() != wanted {
            return Err(Error::invalid(format!(
                "a lookup of {} blocks with state after {} blocks under layout `{}`: it was not made by this engine's lookup",
                lookup.blocks.len(),
                state.blocks,
                layout.digest()
            )));
        }
        bump(&self.state_counters.restores);
        let blob = match self.checkpoint_blob(&state, &layout)? {
            Some(b) => b,
            None => {
                bump(&self.state_counters.restore_misses);
                return Ok(Restored::default());
            }
        };
        let loaded = self.load(lookup)?;
        if !loaded.complete || loaded.blocks.len() != wanted {
            bump(&self.state_counters.restore_misses);
            return Ok(Restored::default());
        }
        Ok(Restored {
            blocks: loaded.blocks,
            state: Some(blob),
            tokens: state.blocks * layout.tokens_per_block(),
        })
    }

    /// The checkpoint `state` names, from the checkpoint bucket or the fastest tier below
    /// that keeps it (promoted into the bucket), if it has exactly the layout's size.
    fn checkpoint_blob(&self, state: &StateRef, layout: &Layout) -> Result<Option<Bytes>> {
        let want = layout.state_bytes();
        if let Some(blob) = self.checkpoints.get(&state.key) {
            return Ok((blob.len() as u64 == want).then_some(blob));
        }
        for slot in self.stack.slots().iter() {
            let Some(store) = slot.tier.snapshots() else {
                continue;
            };
            if let Some(blob) = store.get_snapshot(&state.key)? {
                if blob.len() as u64 != want {
                    return Ok(None);
                }
                let ram = &self.ram;
                let tokens = (state.blocks * layout.tokens_per_block()) as u64;
                self.checkpoints
                    .put(state.key, layout.digest(), blob.clone(), tokens, &|n| {
                        ram.evict_bytes(n)
                    });
                return Ok(Some(blob));
            }
        }
        Ok(None)
    }
}

fn round_to_blocks(tokens: usize, layout: &Layout) -> usize {
    let tpb = layout.tokens_per_block();
    tokens.div_ceil(tpb).max(1) * tpb
}
