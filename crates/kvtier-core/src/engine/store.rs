//! Storing the blocks of a prompt.
//!
//! A store always puts its blocks in RAM. What its `Ok` promises beyond that is its
//! [`Ack`] level: `Queued` returns once the blocks are queued for the tiers below RAM;
//! `Written` and `Synced` write every kept block the persistent tier lacks on the caller's
//! thread (one batch) and, for `Synced`, then wait for a sync that covers them — shared with
//! every other store waiting at the same time (group commit), so durability costs each
//! store a sync's latency, not the disk a sync per store.
//!
//! Payloads arrive borrowed ([`Engine::store`]: each is copied once, into a buffer of its
//! own) or owned ([`Engine::store_owned`]: each buffer is kept as it is — a server that read
//! an upload straight into per-block buffers stores without any copy). Both take the same
//! path below; only where a block's bytes come from differs.

use std::sync::Arc;

use bytes::Bytes;

use super::Ack;
use super::Engine;
use crate::arena::Arena;
use crate::error::{Error, ErrorKind, Result};
use crate::index::Prompt;
use crate::tier::writer::Enqueued;
use crate::tier::{BlockMeta, PutOutcome, RejectReason, Tier};

/// What a store did, block by block from the start of the prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreReport {
    /// Blocks newly kept.
    pub stored: usize,
    /// Blocks already held (refreshed, not copied).
    pub duplicates: usize,
    /// Blocks RAM refused but the persistent tier holds or has queued.
    pub stored_lower_only: usize,
    /// Why the store stopped before the last payload, if it did. Blocks after a refused
    /// block are not kept either: they would be unreachable without it.
    pub stopped: Option<RejectReason>,
    /// What the kept blocks survive now (see [`Ack`]).
    pub ack: Ack,
}

/// Per-call options of [`Engine::store_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// Acknowledge only once the blocks are at least this durable. The engine's default
    /// (the persistent tier's [`crate::PersistConfig::ack`]) applies when it is stronger.
    /// Default: `None`, the engine's default.
    pub ack: Option<Ack>,
    /// The prompt's block the first payload is (default 0). Blocks before it are not
    /// stored by this call: block `first_block - 1` must be held already (by any tier), or
    /// the store keeps nothing and stops at once (`parent_missing`). A long prompt is stored in pieces this way
    /// (`kvtier serve`'s shared arena: as much as a client's staging memory holds at once).
    pub first_block: usize,
}

impl Engine {
    /// Stores `payloads[i]` as block `i` of `prompt`, from block 0 on. Every payload must
    /// be exactly one block of the prompt's layout and there may be no more payloads than
    /// whole blocks; otherwise nothing is stored and an [`crate::ErrorKind::Invalid`] error
    /// names the first offending payload. Payload bytes are copied once.
    pub fn store(&self, prompt: &Prompt, payloads: &[&[u8]]) -> Result<StoreReport> {
        self.store_with(prompt, payloads, StoreOptions::default())
    }

    /// [`Engine::store`] with options. With an [`Ack`] above `Queued`, `Ok` means every kept
    /// block is on the persistent tier at that level; if that cannot be done (no persistent
    /// tier attached, a full disk, an I/O error) the blocks stay in RAM and the call
    /// returns an error saying so (kind `Unavailable` or `NoSpace`): never an `Ok` that
    /// promises more than happened.
    pub fn store_with(
        &self,
        prompt: &Prompt,
        payloads: &[&[u8]],
        options: StoreOptions,
    ) -> Result<StoreReport> {
        self.poison.check()?;
        self.store_from(prompt, Payloads::Borrowed(payloads), options)
    }

    /// [`Engine::store_with`] of buffers the caller hands over: each is kept as it is, not
    /// copied (the RAM tier holds these very buffers). Give each block a buffer of its own:
    /// a block that is a slice of a larger allocation keeps all of it alive while the
    /// block is held, and the RAM budget counts only the block.
    pub fn store_owned(
        &self,
        prompt: &Prompt,
        payloads: Vec<Bytes>,
        options: StoreOptions,
    ) -> Result<StoreReport> {
        self.store_from(prompt, Payloads::Owned(payloads), options)
    }

    fn store_from(
        &self,
        prompt: &Prompt,
        payloads: Payloads<'_>,
        options: StoreOptions,
    ) -> Result<StoreReport> {
        let layout = prompt.layout();
        self.layout(layout.digest())?;
        let first = options.first_block;
        if first.saturating_add(payloads.len()) > prompt.num_blocks() {
            let from = match first {
                0 => String::new(),
                n => format!(" from block {n} on,"),
            };
            return Err(Error::invalid(format!(
                "{} payloads{from} for a prompt of {} whole blocks ({} tokens, {} per block)",
                payloads.len(),
                prompt.num_blocks(),
                prompt.tokens().len(),
                layout.tokens_per_block()
            )));
        }
        if !layout.has_kv() {
            return Err(Error::invalid(format!(
                "layout `{}` has no attention layers, so it has no KV blocks to store; \
                 keep its recurrent state with checkpoint_put or snapshot_put",
                layout.digest()
            )));
        }
        let want = layout.block_bytes();
        if let Some((i, p)) = (0..payloads.len())
            .map(|i| (first + i, payloads.get(i)))
            .find(|(_, p)| p.len() as u64 != want)
        {
            return Err(Error::invalid(format!(
                "payload of block {i} is {} bytes; layout `{}` needs exactly {want}",
                p.len(),
                layout.digest()
            )));
        }
        let mut report = StoreReport::default();
        if first > 0 && self.index.meta_of(&prompt.hashes()[first - 1]).is_none() {
            report.stopped = Some(RejectReason::ParentMissing);
            return Ok(report);
        }
        // Not across a reattach (see `Engine::admission`).
        let _admitted = self.admission.read();
        let slots = self.stack.slots();
        let persistent = slots.iter().find(|s| s.policy.takes_acks);
        let ack = options
            .ack
            .unwrap_or_default()
            .max(persistent.map_or(Ack::Queued, |p| p.policy.ack));
        let durable = ack > Ack::Queued;
        if durable && persistent.is_none() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "a store acknowledged as `{}` needs a persistent tier, and none is attached",
                    ack.name()
                ),
            ));
        }
        // Kept blocks the persistent tier must hold before a durable acknowledgement.
        let mut must_persist: Vec<(BlockMeta, Bytes)> = Vec::new();
        // One run per tier that stores runs (see `TierPolicy::runs`).
        let mut runs: Vec<Vec<(BlockMeta, Bytes)>> = vec![Vec::new(); slots.len()];
        let is_persistent = |at: usize| persistent.is_some_and(|p| Arc::ptr_eq(p, &slots[at]));
        for (p, i) in (first..first + payloads.len()).enumerate() {
            let hash = prompt.hashes()[i];
            // The write-through tiers that lack the block (neither held nor queued), as a bit
            // per slot: no allocation per block on the store path.
            let lacking: u32 = (0..slots.len())
                .filter(|&at| slots[at].write_through() && !slots[at].holds_or_queued(&hash))
                .fold(0, |m, at| m | 1 << at);
            let lacks = |at: usize| lacking & (1 << at) != 0;
            // Already in RAM: refresh it, copy it only for the tiers that lack it.
            let per_block_lacking = (0..slots.len()).any(|at| lacks(at) && !slots[at].policy.runs);
            if !per_block_lacking && self.ram.touch(&hash) {
                let meta = prompt.block_meta(i);
                let lacking_durable =
                    durable && persistent.is_some_and(|p| !p.tier.contains(&hash));
                if lacking != 0 || lacking_durable {
                    let bytes = payloads.bytes(p, &self.arena);
                    for at in (0..slots.len()).filter(|&at| lacks(at)) {
                        runs[at].push((meta.clone(), bytes.clone()));
                    }
                    if lacking_durable {
                        must_persist.push((meta, bytes));
                    }
                }
                report.duplicates += 1;
                continue;
            }
            let meta = prompt.block_meta(i);
            let bytes = payloads.bytes(p, &self.arena);
            let in_ram = self.ram.put(&meta, bytes.clone())?;
            // Every write-through tier gets a block it lacks, and in either mode a tier
            // gets a block RAM refused (a chain longer than RAM, or a parent RAM no longer
            // holds): it keeps the chain reachable from there.
            let refused = matches!(in_ram, PutOutcome::Rejected(_));
            let mut kept_below = false;
            for (at, slot) in slots.iter().enumerate() {
                if durable && is_persistent(at) {
                    // Written below on this thread, not queued.
                    if !slot.tier.contains(&hash) {
                        must_persist.push((meta.clone(), bytes.clone()));
                    }
                    kept_below = true;
                    continue;
                }
                let wants =
                    lacks(at) || (refused && !slot.policy.runs && !slot.holds_or_queued(&hash));
                if !wants {
                    kept_below |= !slot.policy.runs && slot.holds_or_queued(&hash);
                    continue;
                }
                if slot.policy.runs {
                    // Fire and forget: a run lands as one object, or not at all.
                    runs[at].push((meta.clone(), bytes.clone()));
                    continue;
                }
                kept_below |= matches!(
                    slot.writer.enqueue(meta.clone(), bytes.clone()),
                    Enqueued::Queued
                        | Enqueued::AlreadyPending
                        | Enqueued::WrittenInline(Ok(PutOutcome::Stored | PutOutcome::Duplicate))
                );
            }
            match in_ram {
                PutOutcome::Stored => report.stored += 1,
                PutOutcome::Duplicate => report.duplicates += 1,
                PutOutcome::Rejected(_) if kept_below => report.stored_lower_only += 1,
                PutOutcome::Rejected(why) => {
                    report.stopped = Some(why);
                    break;
                }
            }
        }
        // One job per run-storing tier: the run becomes one object.
        for (slot, run) in slots.iter().zip(runs) {
            if !run.is_empty() {
                slot.writer.enqueue_run(run);
            }
        }
        if let Some(p) = persistent.filter(|_| durable) {
            persist(p.tier.as_ref(), &must_persist, ack)?;
        }
        report.ack = ack;
        Ok(report)
    }
}

/// A store's payloads: borrowed from the caller (copied once each, when kept) or handed
/// over (kept as they are).
enum Payloads<'a> {
    Borrowed(&'a [&'a [u8]]),
    Owned(Vec<Bytes>),
}

impl Payloads<'_> {
    fn len(&self) -> usize {
        match self {
            Payloads::Borrowed(p) => p.len(),
            Payloads::Owned(p) => p.len(),
        }
    }

    /// Block `i`'s bytes, without copying them.
    fn get(&self, i: usize) -> &[u8] {
        match self {
            Payloads::Borrowed(p) => p[i],
            Payloads::Owned(p) => &p[i],
        }
    }

    /// Block `i`'s bytes as a buffer a tier may keep: a copy of a borrowed payload into
    /// the arena, the caller's own buffer otherwise.
    fn bytes(&self, i: usize, arena: &Arena) -> Bytes {
        match self {
            Payloads::Borrowed(p) => arena.copy(p[i]),
            Payloads::Owned(p) => p[i].clone(),
        }
    }
}

/// Writes `items` to the persistent tier on this thread and, for [`Ack::Synced`], waits
/// for a sync covering them. An error names what could not be made durable.
fn persist(tier: &dyn Tier, items: &[(BlockMeta, Bytes)], ack: Ack) -> Result<()> {
    let mut refused = None;
    let outcomes: Vec<Result<PutOutcome>> = items
        .iter()
        .map(|(meta, payload)| {
            if ack == Ack::Synced {
                tier.put_to_sync(meta, payload.clone())
            } else {
                tier.put_for_caller(meta, payload.clone())
            }
        })
        .collect();
    for (outcome, (meta, _)) in outcomes.into_iter().zip(items) {
        match outcome {
            Ok(PutOutcome::Stored | PutOutcome::Duplicate) => {}
            Ok(PutOutcome::Rejected(why)) => {
                refused.get_or_insert((meta.position, format!("{why:?}"), why));
            }
            Err(e) => {
                let kind = e.kind();
                return Err(Error::new(
                    kind,
                    format!(
                        "block {} is in RAM but could not be written to the {} tier",
                        meta.position,
                        tier.kind().name()
                    ),
                )
                .with_source(e));
            }
        }
    }
    if let Some((position, why, reason)) = refused {
        let kind = if reason == RejectReason::NoSpace {
            ErrorKind::NoSpace
        } else {
            ErrorKind::Unavailable
        };
        return Err(Error::new(
            kind,
            format!(
                "block {position} is in RAM but the {} tier refused it ({why}): not acknowledged as `{}`",
                tier.kind().name(),
                ack.name()
            ),
        ));
    }
    if ack == Ack::Synced {
        tier.make_durable()?;
    }
    Ok(())
}
