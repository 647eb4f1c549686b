//! Several blocks stored at once ([`Tier::put_many`]: what the write-behind queue holds
//! when its worker comes round, `Tier::takes_batches`): helper threads encode pages ahead
//! while this thread appends the records before them.
//!
//! Block by block, a page is encoded (on every core) and then its record is appended (on
//! one, the others idle); ahead, the appends overlap the next pages' encoding. Records
//! are still appended, and their blocks published, in the order given; only where the
//! CPU work runs moves. Everything `put` checks (quarantine, duplicates, room) is checked
//! by each append as before; a page already held, or twice in the batch, is not encoded
//! ahead.

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use bytes::Bytes;
use kvtier_core::Result;
use kvtier_core::tier::{BlockMeta, PutOutcome, Tier};

use super::{Coding, SsdTier};

impl SsdTier {
    /// See the module docs. Fewer than two pages to encode, or a coder of one thread:
    /// block by block.
    pub(super) fn put_pipelined(&self, items: &[(BlockMeta, Bytes)]) -> Vec<Result<PutOutcome>> {
        // Pages worth encoding ahead: of a layout with a codec, not held already, not a
        // second copy of a block earlier in the batch (each a duplicate when appended).
        let mut seen = HashSet::with_capacity(items.len());
        let ahead: Vec<bool> = items
            .iter()
            .map(|(meta, _)| {
                seen.insert(meta.hash)
                    && self.coder.encodes(meta.layout)
                    && !self.contains(&meta.hash)
            })
            .collect();
        let helpers = self.coder.threads().min(items.len());
        if helpers < 2 || ahead.iter().filter(|a| **a).count() < 2 {
            return items
                .iter()
                .map(|(meta, page)| self.put(meta, page.clone()))
                .collect();
        }
        let next = AtomicUsize::new(0);
        let (tx, rx) = mpsc::channel::<(usize, Coding)>();
        std::thread::scope(|scope| {
            for _ in 0..helpers {
                let (tx, next, ahead) = (tx.clone(), &next, &ahead);
                scope.spawn(move || {
                    while let Some((i, (meta, page))) = {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        items.get(i).map(|item| (i, item))
                    } {
                        let coding = if ahead[i] {
                            // One thread a page: the helpers are the parallelism. A codec
                            // that panics has its page stored raw, not lost.
                            let encoded = catch_unwind(AssertUnwindSafe(|| {
                                self.coder.encode_block_on(meta.layout, page, 1)
                            }));
                            Coding::Ahead(encoded.ok().flatten())
                        } else {
                            Coding::Encode
                        };
                        if tx.send((i, coding)).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            let mut ready: Vec<Option<Coding>> = items.iter().map(|_| None).collect();
            items
                .iter()
                .enumerate()
                .map(|(i, (meta, page))| {
                    while ready[i].is_none() {
                        match rx.recv() {
                            Ok((j, coding)) => ready[j] = Some(coding),
                            // Every helper has gone: this page is encoded here.
                            Err(_) => break,
                        }
                    }
                    let coding = ready[i].take().unwrap_or(Coding::Encode);
                    self.put_as(meta, page.clone(), false, coding)
                })
                .collect()
        })
    }
}
