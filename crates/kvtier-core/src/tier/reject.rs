//! Why a tier refuses a block, and the reasons' names: a leaf (it imports nothing from
//! the crate), so that the counter tables in `stats.rs`, which the tiers import, can
//! read the names without importing the tiers back.

/// Why a tier refused a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// No room could be made without breaking an invariant (the budget is held by the
    /// block's own ancestors, or the block is larger than the whole budget).
    NoSpace,
    /// The tier keeps only blocks whose parent it also holds, and the parent is absent.
    ParentMissing,
    /// The tier holds another block under the same hash (different tokens, parent or
    /// length): a hash collision or a bug. The hash is quarantined for a while.
    Collision,
    /// The hash is quarantined (after a collision or a corrupt read) and not accepted yet.
    Quarantined,
}

impl RejectReason {
    /// Every reason with its name, the one table of them (store answers, Python's store
    /// reports, the `reason` label of the tiers' rejection counters in `stats.rs`).
    pub(crate) const NAMES: [(RejectReason, &'static str); 4] = [
        (RejectReason::NoSpace, "no_space"),
        (RejectReason::ParentMissing, "parent_missing"),
        (RejectReason::Collision, "collision"),
        (RejectReason::Quarantined, "quarantined"),
    ];

    /// This reason's name (`no_space`, `parent_missing`, `collision`, `quarantined`).
    pub const fn name(self) -> &'static str {
        Self::NAMES[self as usize].1
    }
}
