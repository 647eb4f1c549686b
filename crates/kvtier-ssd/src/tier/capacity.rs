//! Capacity: per-namespace byte budgets, the store's total capacity, and a TTL, enforced
//! at store time (so a budget is never exceeded) and by [`SsdTier::enforce`], which a
//! background thread calls on a time trigger ([`SsdTier::spawn_maintenance`]).
//!
//! Victims are chosen least recently used first (last store or read, on the injected
//! clock). To keep the cost of choosing amortised, room is made down to 95% of a budget,
//! not just to the byte.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use kvtier_core::Result;
use kvtier_core::hash::BlockHash;
use kvtier_core::layout::LayoutDigest;
use kvtier_core::tier::RemovalCause;

use super::SsdTier;

/// What one enforcement pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Enforced {
    /// Blocks dropped because their TTL passed.
    pub expired: u64,
    /// Blocks dropped to bring a namespace or the store under budget.
    pub evicted: u64,
}

impl SsdTier {
    /// The budget of `layout`'s namespace.
    pub fn namespace_budget(&self, layout: &LayoutDigest) -> u64 {
        self.config
            .namespace_overrides
            .get(layout)
            .copied()
            .or(self.config.namespace_bytes)
            .unwrap_or(self.config.capacity_bytes)
            .min(self.config.capacity_bytes)
    }

    /// Payload bytes `layout`'s namespace holds now.
    pub fn namespace_bytes(&self, layout: &LayoutDigest) -> u64 {
        self.counters
            .lock()
            .namespace_bytes
            .get(layout)
            .copied()
            .unwrap_or(0)
    }

    /// Makes room for `len` more bytes in `layout`'s namespace; false when the block can
    /// never fit (larger than its budget), counted as a refusal.
    pub(super) fn make_room(&self, layout: LayoutDigest, len: u64) -> Result<bool> {
        let budget = self.namespace_budget(&layout);
        if len > budget {
            self.counters.lock().rejected_no_space += 1;
            return Ok(false);
        }
        let (ns, total) = {
            let c = self.counters.lock();
            (
                c.namespace_bytes.get(&layout).copied().unwrap_or(0),
                c.resident_bytes,
            )
        };
        if ns + len > budget {
            self.evict_lru(Some(layout), (budget - len).min(budget / 20 * 19))?;
        }
        if total + len > self.config.capacity_bytes {
            let cap = self.config.capacity_bytes;
            self.evict_lru(None, (cap - len).min(cap / 20 * 19))?;
        }
        Ok(true)
    }

    /// Evicts least recently used blocks of `layout` (or of every namespace) until the
    /// bytes held there are at most `target`. Returns how many were evicted.
    fn evict_lru(&self, layout: Option<LayoutDigest>, target: u64) -> Result<u64> {
        let mut held: Vec<(u64, BlockHash, u64)> = self
            .blocks
            .read()
            .values()
            .filter(|h| layout.is_none_or(|l| h.meta.layout == l))
            .map(|h| {
                (
                    h.last_access.load(Ordering::Relaxed),
                    h.meta.hash,
                    h.loc.payload_len,
                )
            })
            .collect();
        held.sort_unstable();
        let mut bytes: u64 = match layout {
            Some(l) => self.namespace_bytes(&l),
            None => self.counters.lock().resident_bytes,
        };
        let mut evicted = 0;
        for (_, hash, len) in held {
            if bytes <= target {
                break;
            }
            if self.drop_block(&hash, RemovalCause::Budget)? {
                bytes = bytes.saturating_sub(len);
                evicted += 1;
            }
        }
        Ok(evicted)
    }

    /// Drops every block whose last access is older than the TTL, then brings every
    /// namespace and the store under budget.
    pub fn enforce(&self) -> Result<Enforced> {
        let now = self.now();
        let ttl = u64::try_from(self.config.ttl.as_nanos()).unwrap_or(u64::MAX);
        let expired: Vec<BlockHash> = self
            .blocks
            .read()
            .values()
            .filter(|h| now.saturating_sub(h.last_access.load(Ordering::Relaxed)) > ttl)
            .map(|h| h.meta.hash)
            .collect();
        let mut report = Enforced {
            expired: self.expire_snapshots(now, ttl),
            ..Enforced::default()
        };
        for hash in expired {
            if self.drop_block(&hash, RemovalCause::Ttl)? {
                report.expired += 1;
            }
        }
        let layouts: Vec<LayoutDigest> = self
            .counters
            .lock()
            .namespace_bytes
            .keys()
            .copied()
            .collect();
        for layout in layouts {
            let budget = self.namespace_budget(&layout);
            if self.namespace_bytes(&layout) > budget {
                report.evicted += self.evict_lru(Some(layout), budget)?;
            }
        }
        if self.counters.lock().resident_bytes > self.config.capacity_bytes {
            report.evicted += self.evict_lru(None, self.config.capacity_bytes)?;
        }
        // Reclaim the space those drops left, by whole segments.
        self.compact(0.5)?;
        Ok(report)
    }

    /// Runs [`SsdTier::enforce`] every `interval` on a background thread until the tier
    /// is dropped. A panic of that thread is logged.
    pub fn spawn_maintenance(tier: &Arc<Self>, interval: Duration) -> std::io::Result<()> {
        Self::spawn_maintenance_with(tier, interval, |reason| {
            tracing::error!(reason = %reason, "the SSD maintenance thread ended");
        })
    }

    /// [`SsdTier::spawn_maintenance`], telling `on_panic` (on that thread) why, if the
    /// thread dies by a panic: the assembly closes the engine with it (see
    /// `kvtier_core::poison`).
    pub fn spawn_maintenance_with(
        tier: &Arc<Self>,
        interval: Duration,
        on_panic: impl FnOnce(String) + Send + 'static,
    ) -> std::io::Result<()> {
        let weak: Weak<Self> = Arc::downgrade(tier);
        kvtier_core::poison::spawn(
            "kvtier-ssd-maintenance".into(),
            move || {
                loop {
                    std::thread::sleep(interval);
                    let Some(tier) = weak.upgrade() else {
                        return;
                    };
                    if let Err(e) = tier.enforce() {
                        tracing::warn!(error = %e, "SSD maintenance pass failed");
                    }
                }
            },
            on_panic,
        )?;
        Ok(())
    }
}
