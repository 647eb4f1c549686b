//! One byte budget shared by the RAM tier and the snapshot bucket.
//!
//! Host memory is one resource: snapshot bytes count against the same capacity as block
//! bytes (seed 003), so both reserve from one [`MemoryBudget`] before they keep anything.

use std::sync::atomic::{AtomicU64, Ordering};

/// A byte budget that reservations can never push past its capacity.
#[derive(Debug)]
pub struct MemoryBudget {
    capacity: u64,
    used: AtomicU64,
}

impl MemoryBudget {
    /// A budget of `capacity` bytes, none used.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            used: AtomicU64::new(0),
        }
    }

    /// Reserves `bytes` if they fit; returns whether they did.
    pub fn try_reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.capacity)
            })
            .is_ok()
    }

    /// Returns `bytes` reserved earlier.
    pub fn release(&self, bytes: u64) {
        let prev = self.used.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(prev >= bytes, "released more than reserved");
    }

    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// The capacity.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_exceeds_capacity() {
        let b = MemoryBudget::new(10);
        assert!(b.try_reserve(6));
        assert!(!b.try_reserve(5));
        assert!(b.try_reserve(4));
        assert!(!b.try_reserve(1));
        b.release(6);
        assert_eq!(b.used(), 4);
        assert!(!b.try_reserve(u64::MAX));
    }
}
