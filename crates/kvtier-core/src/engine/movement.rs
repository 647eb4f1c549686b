//! Movement counters: blocks moved between tiers, by source and destination.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::registry::MoveStats;
use crate::tier::TierKind;

const KINDS: usize = TierKind::ALL.len();

/// What happened to blocks on their way between two tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Moved {
    /// Read from a slower tier and put into (or queued for) a faster one.
    Promoted = 0,
    /// Evicted from a faster tier and queued for a slower one.
    DemotionQueued = 1,
    /// Evicted from a faster tier and not queued for the slower one (queue full, closing).
    DemotionDropped = 2,
}

/// Counters for every (source, destination) pair of tier kinds, and the shutdown saves.
#[derive(Debug, Default)]
pub(super) struct Movement {
    moves: [[[AtomicU64; 3]; KINDS]; KINDS],
    /// Evict-only mode: RAM-only blocks a clean shutdown wrote to a lower tier, and those
    /// it could not (deadline passed, tier refused or failed).
    pub shutdown_saved: AtomicU64,
    pub shutdown_unsaved: AtomicU64,
    /// What lookups promised and loads delivered.
    pub hits: super::hits::HitCounters,
}

impl Movement {
    /// Counts `n` blocks moved from `from` to `to`.
    pub fn count(&self, what: Moved, from: TierKind, to: TierKind, n: u64) {
        self.moves[from as usize][to as usize][what as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// The counters of every ordered pair of distinct tiers in `attached`.
    pub fn stats(&self, attached: &[TierKind]) -> Vec<MoveStats> {
        let get = |from: TierKind, to: TierKind, what: Moved| {
            self.moves[from as usize][to as usize][what as usize].load(Ordering::Relaxed)
        };
        let mut out = Vec::new();
        for &from in attached {
            for &to in attached.iter().filter(|&&to| to != from) {
                out.push(MoveStats {
                    from,
                    to,
                    promoted: get(from, to, Moved::Promoted),
                    demotions_queued: get(from, to, Moved::DemotionQueued),
                    demotions_dropped: get(from, to, Moved::DemotionDropped),
                });
            }
        }
        out
    }
}
