//! Deleting a namespace: every block of one layout, in every tier.

use std::time::Duration;

use super::Engine;
use crate::error::Result;
use crate::layout::LayoutDigest;
use crate::tier::Tier;

/// How long a namespace delete waits for blocks already queued for the persistent tier
/// (written first, then deleted, so none comes back after the delete).
const DRAIN_BEFORE_DELETE: Duration = Duration::from_secs(10);

impl Engine {
    /// Removes every block of `layout` from RAM and the persistent tier, after writing what
    /// is queued for it. Returns how many distinct blocks were removed. The layout stays
    /// registered; snapshots are kept (they age out by their own TTL). Stores that race
    /// with the delete may survive it; the caller quiesces its own traffic first.
    pub fn delete_namespace(&self, layout: LayoutDigest) -> Result<u64> {
        self.layout(layout)?;
        let lower = self.lower();
        if let Some(lower) = &lower
            && !lower.writer.flush(DRAIN_BEFORE_DELETE)
        {
            tracing::warn!(
                layout = %layout,
                "the writer did not drain before a namespace delete; queued blocks may survive it"
            );
        }
        let mut removed = 0;
        for hash in self.index.hashes_of_layout(layout) {
            let mut any = self.ram.remove(&hash)?;
            if let Some(lower) = &lower {
                any |= lower.tier.remove(&hash)?;
            }
            removed += u64::from(any);
        }
        Ok(removed)
    }
}
