//! Hit accounting: what lookups promised and what loads delivered.
//!
//! A lookup promises the blocks it matched; a later load of those blocks delivers them
//! from some tier, or ends early. The gap between the two — a hit that turned out hollow —
//! is counted by the reason the load ended: the block went away since the lookup
//! (`evicted`), a tier's read failed verification (`corrupt`), or a tier's read failed
//! otherwise (`failed`: a deadline passed, the tier was unavailable or refused). These are
//! the counters a wrong or hollow hit shows up in; the other counters only see tiers.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ErrorKind;
use crate::stats::HitStats;
use crate::tier::TierKind;

const KINDS: usize = TierKind::ALL.len();

/// Lock-free hit counters, bumped on every lookup and load.
#[derive(Debug, Default)]
pub(super) struct HitCounters {
    tokens_asked: AtomicU64,
    tokens_promised: AtomicU64,
    blocks_promised: AtomicU64,
    blocks_asked_to_load: AtomicU64,
    delivered: [AtomicU64; KINDS],
    undelivered_evicted: AtomicU64,
    undelivered_corrupt: AtomicU64,
    undelivered_failed: AtomicU64,
}

impl HitCounters {
    /// Counts one lookup of `asked` tokens that matched `blocks` blocks covering
    /// `promised` tokens.
    pub fn lookup(&self, asked: usize, promised: usize, blocks: usize) {
        self.tokens_asked.fetch_add(asked as u64, Ordering::Relaxed);
        self.tokens_promised
            .fetch_add(promised as u64, Ordering::Relaxed);
        self.blocks_promised
            .fetch_add(blocks as u64, Ordering::Relaxed);
    }

    /// Counts one load of `asked` blocks that delivered `served[kind]` blocks from each
    /// tier, and ended with `error` (or `None` when it returned).
    pub fn load(&self, asked: usize, served: &[u64; KINDS], error: Option<ErrorKind>) {
        self.blocks_asked_to_load
            .fetch_add(asked as u64, Ordering::Relaxed);
        let mut delivered = 0;
        for (counter, &n) in self.delivered.iter().zip(served) {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
                delivered += n;
            }
        }
        let missing = (asked as u64).saturating_sub(delivered);
        if missing == 0 {
            return;
        }
        let reason = match error {
            None => &self.undelivered_evicted,
            Some(ErrorKind::Corrupt) => &self.undelivered_corrupt,
            Some(_) => &self.undelivered_failed,
        };
        reason.fetch_add(missing, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn read(&self) -> HitStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let tier = |k: TierKind| get(&self.delivered[k as usize]);
        HitStats {
            lookup_tokens_asked: get(&self.tokens_asked),
            lookup_tokens_promised: get(&self.tokens_promised),
            lookup_blocks_promised: get(&self.blocks_promised),
            load_blocks_asked: get(&self.blocks_asked_to_load),
            load_blocks_delivered_ram: tier(TierKind::Ram),
            load_blocks_delivered_ssd: tier(TierKind::Ssd),
            load_blocks_delivered_remote: tier(TierKind::Remote),
            load_blocks_undelivered_evicted: get(&self.undelivered_evicted),
            load_blocks_undelivered_corrupt: get(&self.undelivered_corrupt),
            load_blocks_undelivered_failed: get(&self.undelivered_failed),
        }
    }
}
