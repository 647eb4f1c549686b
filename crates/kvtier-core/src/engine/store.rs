//! Storing the blocks of a prompt.

use super::Engine;
use crate::error::{Error, Result};
use crate::index::Prompt;
use crate::tier::{BlockMeta, PutOutcome, RejectReason, Tier, copy_payload};

/// What a store did, block by block from the start of the prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreReport {
    /// Blocks newly kept.
    pub stored: usize,
    /// Blocks already held (refreshed, not copied).
    pub duplicates: usize,
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
        for (i, payload) in payloads.iter().enumerate() {
            let hash = prompt.hashes()[i];
            if self.ram.touch(&hash) {
                report.duplicates += 1;
                continue;
            }
            let meta = BlockMeta {
                layout: layout.digest(),
                hash,
                parent: prompt.parent_of(i),
                position: i as u32,
                tokens: prompt.block_tokens(i).into(),
                extra_tag: prompt.extra_tag(i),
            };
            match self.ram.put(&meta, copy_payload(payload))? {
                PutOutcome::Stored => report.stored += 1,
                PutOutcome::Duplicate => report.duplicates += 1,
                PutOutcome::Rejected(why) => {
                    report.stopped = Some(why);
                    break;
                }
            }
        }
        Ok(report)
    }
}
