//! Deleting a namespace: every block of one layout, in every tier.

use std::time::Duration;

use super::Engine;
use crate::error::Result;
use crate::layout::LayoutDigest;
use crate::tier::Tier;

/// How long a namespace delete waits for blocks already queued for the tiers below RAM
/// (written first, then deleted, so none comes back after the delete).
const DRAIN_BEFORE_DELETE: Duration = Duration::from_secs(10);

impl Engine {
    /// Removes every block of `layout` from RAM and every tier below it, after writing what
    /// is queued for them. Returns how many distinct blocks were removed. The layout stays
    /// registered; snapshots are kept (they age out by their own TTL). Stores that race
    /// with the delete may survive it; the caller quiesces its own traffic first.
    pub fn delete_namespace(&self, layout: LayoutDigest) -> Result<u64> {
        self.poison.check()?;
        self.layout(layout)?;
        let slots = self.stack.slots();
        for slot in slots.iter() {
            if !slot.writer.flush(DRAIN_BEFORE_DELETE) {
                tracing::warn!(
                    layout = %layout,
                    tier = slot.kind().name(),
                    "a writer did not drain before a namespace delete; queued blocks may survive it"
                );
            }
        }
        let mut removed = 0;
        for hash in self.index.hashes_of_layout(layout) {
            let mut any = self.ram.remove(&hash)?;
            for slot in slots.iter() {
                any |= slot.tier.remove(&hash)?;
            }
            removed += u64::from(any);
        }
        Ok(removed)
    }
}
