//! Hit accounting: what lookups promised and what loads delivered, in tokens.
//!
//! A lookup promises the tokens of the blocks it matched; a later load of those blocks
//! delivers them from some tier, or ends early. The gap between the two — a hit that turned
//! out hollow — is counted by the reason the load ended: the block went away since the
//! lookup (`evicted`), a tier's read failed verification (`corrupt`), a tier's read ran out
//! of its deadline (`deadline`), a tier's read failed otherwise (`failed`: the tier was
//! unreachable or its store refused), or the engine refused the load itself (`refused`: a
//! closed engine, a layer range or layout it does not know). These are the counters a wrong or hollow
//! hit shows up in; the other counters only see tiers.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ErrorKind;
use crate::stats::HitStats;
use crate::tier::{ShortRead, TierKind};

const KINDS: usize = TierKind::ALL.len();

/// How a load ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// It returned: with every block, or short of one for the reason given.
    Short(Option<ShortRead>),
    /// It failed with an error of this kind.
    Error(ErrorKind),
}

/// Why promised tokens were not delivered: the `reason` label's values, in counter order.
#[derive(Debug, Clone, Copy)]
enum Reason {
    Evicted,
    Corrupt,
    Deadline,
    Failed,
    Refused,
}

impl Ended {
    /// Why the load fell short, or `None` when it did not end early.
    fn reason(self) -> Option<Reason> {
        Some(match self {
            Ended::Short(None) => return None,
            Ended::Short(Some(ShortRead::NotHeld)) => Reason::Evicted,
            Ended::Short(Some(ShortRead::Corrupt)) | Ended::Error(ErrorKind::Corrupt) => {
                Reason::Corrupt
            }
            Ended::Short(Some(ShortRead::Deadline)) => Reason::Deadline,
            Ended::Short(Some(ShortRead::Failed))
            | Ended::Error(ErrorKind::Unavailable | ErrorKind::Internal | ErrorKind::NoSpace) => {
                Reason::Failed
            }
            Ended::Error(_) => Reason::Refused,
        })
    }
}

/// Lock-free hit counters, bumped on every lookup and load.
#[derive(Debug, Default)]
pub(super) struct HitCounters {
    tokens_asked: AtomicU64,
    tokens_promised: AtomicU64,
    blocks_promised: AtomicU64,
    load_tokens_asked: AtomicU64,
    delivered: [AtomicU64; KINDS],
    undelivered: [AtomicU64; 5],
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

    /// Counts one load of `asked` blocks of `tokens_per_block` tokens that delivered
    /// `served[kind]` blocks from each tier and ended as `ended`.
    pub fn load(&self, tokens_per_block: u64, asked: usize, served: &[u64; KINDS], ended: Ended) {
        let tokens = |blocks: u64| blocks * tokens_per_block;
        self.load_tokens_asked
            .fetch_add(tokens(asked as u64), Ordering::Relaxed);
        let mut delivered = 0;
        for (counter, &n) in self.delivered.iter().zip(served) {
            if n > 0 {
                counter.fetch_add(tokens(n), Ordering::Relaxed);
                delivered += n;
            }
        }
        let missing = (asked as u64).saturating_sub(delivered);
        if missing == 0 {
            return;
        }
        // A load that returned short without saying why (it cannot happen: the engine
        // stops only at a block no tier delivered) is counted as evicted, never lost.
        let reason = ended.reason().unwrap_or(Reason::Evicted);
        self.undelivered[reason as usize].fetch_add(tokens(missing), Ordering::Relaxed);
    }

    /// The counters now.
    pub fn read(&self) -> HitStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let tier = |k: TierKind| get(&self.delivered[k as usize]);
        let lost = |r: Reason| get(&self.undelivered[r as usize]);
        HitStats {
            lookup_tokens_asked: get(&self.tokens_asked),
            lookup_tokens_promised: get(&self.tokens_promised),
            lookup_blocks_promised: get(&self.blocks_promised),
            load_tokens_asked: get(&self.load_tokens_asked),
            load_tokens_delivered_ram: tier(TierKind::Ram),
            load_tokens_delivered_ssd: tier(TierKind::Ssd),
            load_tokens_delivered_remote: tier(TierKind::Remote),
            load_tokens_undelivered_evicted: lost(Reason::Evicted),
            load_tokens_undelivered_corrupt: lost(Reason::Corrupt),
            load_tokens_undelivered_deadline: lost(Reason::Deadline),
            load_tokens_undelivered_failed: lost(Reason::Failed),
            load_tokens_undelivered_refused: lost(Reason::Refused),
        }
    }
}
