//! The tier stack's life: flush, shutdown, and swapping the persistent tier on a running
//! engine (seed 000's quiesce → detach → reattach).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::Engine;
use super::policy::{TierOpener, TierPolicy};
use super::stack::Slot;
use crate::error::Result;
use crate::events::{Removal, ResidencyEvent};
use crate::tier::writer::Shutdown;
use crate::tier::{BlockMeta, PutOutcome, TierKind};

/// What [`Engine::reattach_persistent`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reattached {
    /// The old tier's writer wrote everything queued before the deadline.
    pub drained_clean: bool,
    /// Blocks still queued when the deadline passed (lost for the old tier).
    pub left_in_queue: u64,
    /// Blocks the index stopped attributing to the old tier.
    pub detached_blocks: u64,
    /// A new tier was attached.
    pub attached: bool,
    /// Blocks the new tier held when it was opened (recovered from its directory).
    pub attached_blocks: u64,
}

/// What [`Engine::flush_report`] found, per tier below RAM (slowest last).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flushed {
    /// One entry per tier.
    pub tiers: Vec<TierFlushed>,
}

impl Flushed {
    /// Every queue drained, every tier synced, nothing left unwritten.
    pub fn clean(&self) -> bool {
        self.tiers.iter().all(TierFlushed::clean)
    }

    /// Blocks and snapshots not written, over every tier.
    pub fn unwritten(&self) -> u64 {
        self.tiers.iter().map(|t| t.unwritten).sum()
    }
}

/// How one tier's flush went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierFlushed {
    /// The tier.
    pub kind: TierKind,
    /// Its queue emptied before the deadline.
    pub drained: bool,
    /// Its sync succeeded.
    pub synced: bool,
    /// Blocks and snapshots admitted for writing since the previous flush that did not
    /// reach it.
    pub unwritten: u64,
}

impl TierFlushed {
    /// Drained, synced, nothing unwritten.
    pub fn clean(&self) -> bool {
        self.drained && self.synced && self.unwritten == 0
    }
}

impl Engine {
    /// Stops the writers of every tier below RAM, slowest first: no new writes, everything
    /// queued is written (all within `timeout`). A tier in evict-only mode first receives
    /// the blocks only RAM holds — the hot set, which evict-only mode otherwise never
    /// writes — within half of `timeout` (counted: `engine_shutdown_saved_blocks`,
    /// `engine_shutdown_unsaved_blocks`; a shutdown that leaves some unsaved is recorded as
    /// partial). Each tier is then synced and told how the shutdown went. Returns the
    /// persistent tier's report, or `None` without one. The engine keeps serving reads
    /// afterwards; stores reach RAM only.
    pub fn shutdown(&self, timeout: Duration) -> Option<Shutdown> {
        let started = Instant::now();
        let persistent = self.stack.persistent();
        let mut persistent_report = None;
        for slot in self.stack.slots().iter().rev() {
            let unsaved = if slot.write_through() {
                0
            } else {
                self.save_ram_only(slot, started + timeout / 2)
            };
            let left = timeout.saturating_sub(started.elapsed());
            let mut report = slot.writer.stop(left);
            if unsaved > 0 {
                report.clean = false;
                report.partial = true;
            }
            if !report.clean {
                tracing::warn!(
                    tier = slot.kind().name(),
                    left = report.left_in_queue,
                    unsaved,
                    "a tier's queue did not drain before the shutdown deadline"
                );
            }
            if let Err(e) = slot.tier.make_durable() {
                tracing::warn!(tier = slot.kind().name(), error = %e, "could not sync a tier at shutdown");
            }
            if let Err(e) = slot.tier.record_shutdown(report.clean) {
                tracing::warn!(tier = slot.kind().name(), error = %e, "could not record how the engine shut down");
            }
            if persistent.as_ref().is_some_and(|p| Arc::ptr_eq(p, slot)) {
                persistent_report = Some(report);
            }
        }
        persistent_report
    }

    /// Writes every block RAM holds and `slot` lacks, on this thread, until `deadline`;
    /// returns how many it could not write.
    fn save_ram_only(&self, slot: &Slot, deadline: Instant) -> u64 {
        let todo: Vec<(BlockMeta, Bytes)> = self
            .ram
            .held_blocks()
            .into_iter()
            .filter(|(m, _)| !slot.holds_or_queued(&m.hash))
            .collect();
        let mut unsaved = 0;
        for (n, batch) in todo.chunks(64).enumerate() {
            if Instant::now() >= deadline {
                unsaved = (todo.len() - n * 64) as u64;
                break;
            }
            for outcome in slot.tier.put_many(batch) {
                match outcome {
                    Ok(PutOutcome::Stored | PutOutcome::Duplicate) => {
                        self.movement.shutdown_saved.fetch_add(1, Relaxed);
                    }
                    _ => unsaved += 1,
                }
            }
        }
        self.movement.shutdown_unsaved.fetch_add(unsaved, Relaxed);
        unsaved
    }

    /// How the previous run of the persistent tier ended (see
    /// [`crate::tier::Tier::previous_shutdown_clean`]); `None` without a persistent tier.
    pub fn previous_shutdown_clean(&self) -> Option<bool> {
        self.stack
            .persistent()
            .and_then(|s| s.tier.previous_shutdown_clean())
    }

    /// Waits until every block queued for every tier below RAM is written (all within
    /// `timeout`), and syncs each tier. Returns whether they all drained and synced and
    /// every write since the previous flush reached its tier; `true` without any tier.
    /// What a flush reports done survives a power loss. [`Engine::flush_report`] says
    /// what was not done.
    pub fn flush(&self, timeout: Duration) -> bool {
        self.flush_report(timeout).clean()
    }

    /// [`Engine::flush`], tier by tier: whether each queue drained and each tier synced,
    /// and how many blocks and snapshots admitted for writing since the previous flush did
    /// not reach it (a failed write, a refusal such as a full disk, a full queue's drop).
    /// Those are counted once: the next flush reports only what failed after this one.
    pub fn flush_report(&self, timeout: Duration) -> Flushed {
        let deadline = Instant::now() + timeout;
        let tiers = self
            .stack
            .slots()
            .iter()
            .map(|slot| {
                let left = deadline.saturating_duration_since(Instant::now());
                let drained = slot.writer.flush(left);
                let synced = match slot.tier.make_durable() {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(tier = slot.kind().name(), error = %e, "flush could not sync a tier");
                        false
                    }
                };
                let unwritten = slot.writer.take_unwritten();
                if unwritten > 0 {
                    tracing::warn!(
                        tier = slot.kind().name(),
                        unwritten,
                        "blocks queued since the previous flush were not written"
                    );
                }
                TierFlushed {
                    kind: slot.kind(),
                    drained,
                    synced,
                    unwritten,
                }
            })
            .collect();
        Flushed { tiers }
    }

    /// Swaps the persistent tier on a running engine (seed 000's quiesce → detach →
    /// reattach): stores in flight finish and new stores and snapshot puts wait until the
    /// swap is done (so every acknowledged write reaches the old tier or the new one); the
    /// current tier is taken out at once (loads miss on it meanwhile), its writer is
    /// drained and stopped (every acknowledged block is written, within `drain_timeout`),
    /// the index forgets what it held, and the tier is closed (its directory lock
    /// released). Then `new`, if given, is opened — it may be the same directory with
    /// other settings, another directory, or another layout's codec — and recovered blocks
    /// are reported to the index. With `None` the engine stays detached. If opening fails
    /// the engine stays detached and the error is returned.
    pub fn reattach_persistent(
        &self,
        new: Option<(super::PersistConfig, TierOpener)>,
        drain_timeout: Duration,
    ) -> Result<Reattached> {
        self.reattach_persistent_or_restore(new, None, drain_timeout)
    }

    /// [`Engine::reattach_persistent`], and if opening `new` fails, `restore` is opened in
    /// its place within the same quiesce (typically the tier that was attached, with its
    /// old settings), so no store is ever acknowledged while the engine is unexpectedly
    /// without its persistent tier. The error of `new` is still returned; whether
    /// `restore` took its place shows in [`Engine::persistent`].
    pub fn reattach_persistent_or_restore(
        &self,
        new: Option<(super::PersistConfig, TierOpener)>,
        restore: Option<(super::PersistConfig, TierOpener)>,
        drain_timeout: Duration,
    ) -> Result<Reattached> {
        self.reattach(
            |s| s.policy.takes_acks,
            new.map(|(c, o)| (c.into(), o)),
            restore.map(|(c, o)| (c.into(), o)),
            drain_timeout,
        )
    }

    /// Takes out the first tier `pick` chooses (drained, detached from the index, closed)
    /// and attaches `new` in its place, or `restore` if `new` fails to open.
    fn reattach(
        &self,
        pick: impl Fn(&Slot) -> bool,
        new: Option<(TierPolicy, TierOpener)>,
        restore: Option<(TierPolicy, TierOpener)>,
        drain_timeout: Duration,
    ) -> Result<Reattached> {
        self.poison.check()?;
        // Quiesce: wait for stores in flight; new ones wait until the swap is done.
        let _quiesced = self.admission.write();
        let old = self.stack.take(pick);
        self.sink.demote_to_first_evict_only(&self.stack);
        let mut report = Reattached {
            drained_clean: true,
            ..Reattached::default()
        };
        if let Some(old) = old {
            let drained = old.writer.stop(drain_timeout);
            report.drained_clean = drained.clean;
            report.left_in_queue = drained.left_in_queue;
            let kind = old.kind();
            let mut detached = Vec::new();
            report.detached_blocks = self.index.clear_tier_with(kind, |meta| {
                if self.observers.any() {
                    detached.push(meta.clone());
                }
            });
            for block in detached {
                self.observers.publish(|| ResidencyEvent::Removed {
                    tier: kind,
                    block,
                    cause: Removal::Detached,
                });
            }
            // A prefetch or load in flight may still hold the old tier; wait (within the
            // deadline) until it lets go, so the tier is closed — its directory lock
            // released — before a new one opens, possibly on the same directory.
            let deadline = Instant::now() + drain_timeout;
            while Arc::strong_count(&old) > 1 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let Some((policy, open)) = new else {
            return Ok(report);
        };
        match super::builder::attach(&self.stack, &self.sink, policy, open, &|| self.layouts()) {
            Ok(slot) => {
                report.attached_blocks = slot.tier.stats().resident_blocks;
                report.attached = true;
                Ok(report)
            }
            Err(e) => {
                if let Some((policy, open)) = restore {
                    match super::builder::attach(&self.stack, &self.sink, policy, open, &|| {
                        self.layouts()
                    }) {
                        Ok(_) => {
                            tracing::warn!(error = %e, "the new persistent tier did not open; the previous one is attached again");
                        }
                        Err(again) => {
                            tracing::error!(error = %e, restore_error = %again, "neither the new nor the previous persistent tier opened; running without one");
                        }
                    }
                }
                Err(e)
            }
        }
    }
}
