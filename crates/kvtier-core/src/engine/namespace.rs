//! Deleting a namespace: every block and recurrent state of one layout, in every tier.

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
    /// is queued for them, and every snapshot and checkpoint of it; a tier's tombstones
    /// are made durable before this returns, and a shared store the tier may delete from
    /// directly loses the layout's objects too, whoever wrote them (a cluster's go through
    /// its GC). Returns how many distinct blocks were removed. The layout stays
    /// registered. Stores that race with the delete may survive it; the caller quiesces its
    /// own traffic first.
    pub fn delete_namespace(&self, layout: LayoutDigest) -> Result<u64> {
        self.layout(layout)?;
        self.delete_layout(layout, true)
    }

    /// Drops every block, snapshot and checkpoint of `layout` from this engine's own
    /// tiers — RAM and SSD; what the remote tier serves of it is forgotten here — without
    /// asking any shared store to delete: what a replica does when another replica deleted
    /// the layout (the cluster's delete marker; the cluster's GC deletes the shared
    /// objects). The layout need not be registered here. Returns how many blocks went.
    pub fn drop_namespace_locally(&self, layout: LayoutDigest) -> Result<u64> {
        self.delete_layout(layout, false)
    }

    fn delete_layout(&self, layout: LayoutDigest, shared_too: bool) -> Result<u64> {
        self.poison.check()?;
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
        // The layout's recurrent states (snapshots and checkpoints), in RAM and below.
        self.snapshots.remove_layout(layout);
        self.checkpoints.remove_layout(layout);
        for slot in slots.iter() {
            if let Some(store) = slot.tier.snapshots() {
                store.remove_layout_snapshots(layout)?;
            }
            // What a shared store holds of the layout beyond the blocks known here.
            if shared_too {
                slot.tier.remove_layout(layout)?;
            }
            // Tombstones written, made durable: nothing comes back after a crash.
            slot.tier.make_durable()?;
        }
        Ok(removed)
    }
}
