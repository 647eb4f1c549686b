//! Storing the blocks of a prompt.
//!
//! A store always puts its blocks in RAM. What its `Ok` promises beyond that is its
//! [`Ack`] level: `Queued` returns once the blocks are queued for the persistent tier;
//! `Written` and `Synced` write every kept block the persistent tier lacks on the caller's
//! thread (one batch) and, for `Synced`, then wait for a sync that covers them — shared with
//! every other store waiting at the same time (group commit), so durability costs each
//! store a sync's latency, not the disk a sync per store.

use bytes::Bytes;

use super::Engine;
use super::{Ack, PersistMode};
use crate::error::{Error, ErrorKind, Result};
use crate::index::Prompt;
use crate::tier::writer::Enqueued;
use crate::tier::{BlockMeta, PutOutcome, RejectReason, Tier, copy_payload};

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
        let layout = prompt.layout();
        self.layout(layout.digest())?;
        if payloads.len() > prompt.num_blocks() {
            return Err(Error::invalid(format!(
                "{} payloads for a prompt of {} whole blocks ({} tokens, {} per block)",
                payloads.len(),
                prompt.num_blocks(),
                prompt.tokens().len(),
                layout.tokens_per_block()
            )));
        }
        let want = layout.block_bytes();
        if let Some((i, p)) = payloads
            .iter()
            .enumerate()
            .find(|(_, p)| p.len() as u64 != want)
        {
            return Err(Error::invalid(format!(
                "payload of block {i} is {} bytes; layout `{}` needs exactly {want}",
                p.len(),
                layout.digest()
            )));
        }
        let mut report = StoreReport::default();
        // Not across a reattach (see `Engine::admission`).
        let _admitted = self.admission.read();
        let lower = self.lower();
        let ack = options
            .ack
            .unwrap_or_default()
            .max(lower.as_ref().map_or(Ack::Queued, |l| l.config.ack));
        if ack > Ack::Queued && lower.is_none() {
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
        let write_through = lower
            .as_ref()
            .filter(|l| l.config.mode == PersistMode::WriteThrough);
        let remote = self.remote.as_ref().map(|(r, _)| r);
        let mut for_remote = Vec::new();
        for (i, payload) in payloads.iter().enumerate() {
            let hash = prompt.hashes()[i];
            let held_lower = lower
                .as_ref()
                .is_some_and(|l| self.index.tiers_of(&hash) & l.tier.kind().bit() != 0);
            // The shared tier gets every block it neither holds nor has queued.
            let to_remote =
                remote.filter(|r| !r.tier.contains(&hash) && !r.writer.is_pending(&hash));
            // Held where it needs to be: refresh it, copy nothing (but for the remote
            // tier, when it lacks the block).
            if (held_lower || write_through.is_none()) && self.ram.touch(&hash) {
                if to_remote.is_some() {
                    for_remote.push((block_meta(prompt, i), copy_payload(payload)));
                }
                if ack > Ack::Queued && lower.as_ref().is_some_and(|l| !l.tier.contains(&hash)) {
                    must_persist.push((block_meta(prompt, i), copy_payload(payload)));
                }
                report.duplicates += 1;
                continue;
            }
            let meta = block_meta(prompt, i);
            let bytes = copy_payload(payload);
            if to_remote.is_some() {
                for_remote.push((meta.clone(), bytes.clone()));
            }
            let in_ram = self.ram.put(&meta, bytes.clone())?;
            // The persistent tier gets every block it does not hold yet in write-through
            // mode, and in either mode a block RAM refused (a chain longer than RAM, or a
            // parent RAM no longer holds): it keeps the chain reachable from there.
            let refused = matches!(in_ram, PutOutcome::Rejected(_));
            if ack > Ack::Queued {
                // Written below on this thread, not queued.
                let kept = !refused || lower.is_some();
                if kept && lower.as_ref().is_some_and(|l| !l.tier.contains(&hash)) {
                    must_persist.push((meta, bytes));
                }
                match in_ram {
                    PutOutcome::Stored => report.stored += 1,
                    PutOutcome::Duplicate => report.duplicates += 1,
                    PutOutcome::Rejected(_) => report.stored_lower_only += 1,
                }
                continue;
            }
            let queued = match &lower {
                Some(lower) if !held_lower && (write_through.is_some() || refused) => matches!(
                    lower.writer.enqueue(meta, bytes),
                    Enqueued::Queued
                        | Enqueued::AlreadyPending
                        | Enqueued::WrittenInline(Ok(PutOutcome::Stored | PutOutcome::Duplicate))
                ),
                _ => false,
            };
            match in_ram {
                PutOutcome::Stored => report.stored += 1,
                PutOutcome::Duplicate => report.duplicates += 1,
                PutOutcome::Rejected(_) if queued || held_lower => report.stored_lower_only += 1,
                PutOutcome::Rejected(why) => {
                    report.stopped = Some(why);
                    break;
                }
            }
        }
        // One job for the remote tier: the run becomes one object.
        if let Some(r) = remote
            && !for_remote.is_empty()
        {
            r.writer.enqueue_run(for_remote);
        }
        if let Some(lower) = lower.as_ref().filter(|_| ack > Ack::Queued) {
            persist(lower.tier.as_ref(), &must_persist, ack)?;
        }
        report.ack = ack;
        Ok(report)
    }
}

/// Writes `items` to the persistent tier on this thread and, for [`Ack::Synced`], waits
/// for a sync covering them. An error names what could not be made durable.
fn persist(tier: &dyn Tier, items: &[(BlockMeta, Bytes)], ack: Ack) -> Result<()> {
    let mut refused = None;
    let outcomes = if ack == Ack::Synced {
        items
            .iter()
            .map(|(meta, payload)| tier.put_to_sync(meta, payload.clone()))
            .collect()
    } else {
        tier.put_many(items)
    };
    for (outcome, (meta, _)) in outcomes.into_iter().zip(items) {
        match outcome {
            Ok(PutOutcome::Stored | PutOutcome::Duplicate) => {}
            Ok(PutOutcome::Rejected(why)) => {
                refused.get_or_insert((meta.position, format!("{why:?}"), why));
            }
            Err(e) => {
                return Err(Error::new(
                    e.kind(),
                    format!(
                        "block {} is in RAM but could not be written to the {} tier: {e}",
                        meta.position,
                        tier.kind().name()
                    ),
                ));
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

/// The description of block `i` of `prompt`.
fn block_meta(prompt: &Prompt, i: usize) -> BlockMeta {
    BlockMeta {
        layout: prompt.layout().digest(),
        hash: prompt.hashes()[i],
        parent: prompt.parent_of(i),
        position: i as u32,
        tokens: prompt.block_tokens(i).into(),
        extra_tag: prompt.extra_tag(i),
    }
}
