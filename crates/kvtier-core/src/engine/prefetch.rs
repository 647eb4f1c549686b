//! Prefetch: when a lookup matches blocks only a prefetching tier below RAM holds (see
//! [`super::TierPolicy::prefetch`]), their reads start
//! at once, in the order the engine will consume them (seed 004: prefetch follows the scan
//! order), and each block read is promoted into RAM, so the load that follows finds it
//! there. One thread per engine reads in order (a block is promoted only after its parent),
//! fed by a bounded queue: a lookup never waits for it (a full queue skips the prefetch).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_channel::{Receiver, Sender, bounded};
use parking_lot::Mutex;

use super::stack::Stack;
use crate::events::{Observers, ResidencyEvent};
use crate::hash::BlockHash;
use crate::index::PrefixIndex;
use crate::tier::{PutOutcome, RamTier, Tier};

/// Prefetch counters (prefix `engine_`).
#[derive(Debug, Default)]
pub(super) struct PrefetchCounters {
    /// Blocks read ahead and promoted into RAM.
    pub prefetched: AtomicU64,
    /// Prefetched blocks a load then found in RAM.
    pub used: AtomicU64,
    /// Lookups whose prefetch was skipped because the queue was full.
    pub skipped: AtomicU64,
}

/// The prefetch thread's handle.
#[derive(Debug)]
pub(super) struct Prefetcher {
    tx: Sender<Vec<BlockHash>>,
    /// Prefetched blocks not yet used by a load.
    fresh: Arc<Mutex<HashSet<BlockHash>>>,
    pub counters: Arc<PrefetchCounters>,
}

/// What the prefetch thread needs from the engine.
pub(super) struct Shared {
    pub ram: Arc<RamTier>,
    pub index: Arc<PrefixIndex>,
    pub stack: Weak<Stack>,
    pub observers: Arc<Observers>,
    /// Closed when this thread panics.
    pub poison: Arc<crate::poison::Poison>,
}

impl Prefetcher {
    /// Starts the prefetch thread; it ends when the engine (its queue sender) is dropped.
    pub fn start(shared: Shared) -> std::io::Result<Self> {
        let (tx, rx) = bounded::<Vec<BlockHash>>(64);
        let fresh = Arc::new(Mutex::new(HashSet::new()));
        let counters = Arc::new(PrefetchCounters::default());
        let (f, c) = (fresh.clone(), counters.clone());
        let poison = shared.poison.clone();
        crate::poison::spawn(
            "kvtier-prefetch".into(),
            move || run(&shared, &rx, &f, &c),
            move |reason| poison.poison(reason),
        )?;
        Ok(Self {
            tx,
            fresh,
            counters,
        })
    }

    /// Queues reads of `hashes` (in scan order); never waits.
    pub fn submit(&self, hashes: Vec<BlockHash>) {
        if self.tx.try_send(hashes).is_err() {
            self.counters.skipped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Notes that a load found `hash` in RAM: counts it if a prefetch put it there.
    /// The common case — nothing prefetched and unused — reads two counters and takes no
    /// lock, so concurrent loads do not meet here.
    pub fn note_ram_hit(&self, hash: &BlockHash) {
        let c = &self.counters;
        if c.prefetched.load(Ordering::Relaxed) <= c.used.load(Ordering::Relaxed) {
            return;
        }
        if self.fresh.lock().remove(hash) {
            c.used.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn run(
    s: &Shared,
    rx: &Receiver<Vec<BlockHash>>,
    fresh: &Mutex<HashSet<BlockHash>>,
    c: &PrefetchCounters,
) {
    while let Ok(hashes) = rx.recv() {
        let Some(stack) = s.stack.upgrade() else {
            return;
        };
        let slots = stack.slots();
        drop(stack);
        for hash in hashes {
            if s.ram.contains(&hash) {
                continue;
            }
            // The first prefetching tier that has it.
            let read = slots
                .iter()
                .filter(|slot| slot.policy.prefetch)
                .find_map(|slot| Some((slot.kind(), slot.get(&hash).ok().flatten()?)));
            let Some((from, bytes)) = read else {
                break; // gone or failing: the load will find out and recompute
            };
            let Some(meta) = s.index.meta_of(&hash) else {
                break;
            };
            match s.ram.put(&meta, bytes) {
                Ok(PutOutcome::Stored) => {
                    s.observers.publish(|| ResidencyEvent::Promoted {
                        from,
                        to: crate::tier::TierKind::Ram,
                        block: meta,
                    });
                    c.prefetched.fetch_add(1, Ordering::Relaxed);
                    let mut f = fresh.lock();
                    // Bounded: forget the oldest marks rather than grow without end.
                    if f.len() > 1 << 16 {
                        f.clear();
                    }
                    f.insert(hash);
                }
                Ok(PutOutcome::Duplicate) => {}
                _ => break, // RAM refused: the rest of the chain cannot follow
            }
        }
    }
}
