//! Storing the blocks of a prompt.

use super::Engine;
use super::PersistMode;
use crate::error::{Error, Result};
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
}

impl Engine {
    /// Stores `payloads[i]` as block `i` of `prompt`, from block 0 on. Every payload must
    /// be exactly one block of the prompt's layout and there may be no more payloads than
    /// whole blocks; otherwise nothing is stored and an [`crate::ErrorKind::Invalid`] error
    /// names the first offending payload. Payload bytes are copied once.
    pub fn store(&self, prompt: &Prompt, payloads: &[&[u8]]) -> Result<StoreReport> {
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
        Ok(report)
    }
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
