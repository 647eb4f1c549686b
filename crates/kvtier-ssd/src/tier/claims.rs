//! One writer per key: the rule that keeps a tombstone from deleting a key a later store
//! wrote (ADR 0016).
//!
//! Recovery lets the newest copy of a key decide, and a tombstone on that copy deletes the
//! key. So the tier must never write a copy of a key and then tombstone it while an older
//! copy is the one it serves: that tombstone, being on the newest copy, would delete the
//! key at the next open. Two writers of one key at a time is how that happened — a queued
//! write and a durable store's inline write of the same block both appended a record, and
//! the loser tombstoned its own (possibly newer) copy.
//!
//! Every path that appends a copy of a key (a store, a snapshot put, compaction moving a
//! record) first claims the key here and holds the claim until the copy is published or
//! given up. A second writer of the same key waits for the first to finish and then finds
//! the key held (a duplicate: nothing written) or not (it writes). So for every key, copies
//! are appended one at a time, each after the previous one was published or abandoned, and
//! a copy is only ever tombstoned by the writer that holds the key's claim, or as the copy
//! the tier serves.

use std::collections::HashSet;

use parking_lot::{Condvar, Mutex};

/// The keys being written now.
#[derive(Debug, Default)]
pub(super) struct Claims {
    writing: Mutex<HashSet<[u8; 32]>>,
    released: Condvar,
}

/// A held claim; released when dropped (also on an error or a panic of its holder).
#[derive(Debug)]
pub(super) struct Claim<'a> {
    claims: &'a Claims,
    key: [u8; 32],
}

impl Claims {
    /// Claims `key`, waiting while another writer holds it. Writers of one key finish in
    /// the time of one record write, so the wait is bounded by that.
    pub(super) fn claim(&self, key: [u8; 32]) -> Claim<'_> {
        let mut writing = self.writing.lock();
        while writing.contains(&key) {
            self.released.wait(&mut writing);
        }
        writing.insert(key);
        Claim { claims: self, key }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.claims.writing.lock().remove(&self.key);
        self.claims.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn one_holder_per_key_at_a_time() {
        let claims = Arc::new(Claims::default());
        let inside = Arc::new(AtomicU32::new(0));
        let most = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (claims, inside, most) = (claims.clone(), inside.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let _c = claims.claim([7; 32]);
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn other_keys_do_not_wait() {
        let claims = Claims::default();
        let _a = claims.claim([1; 32]);
        // Would deadlock if claims of different keys excluded each other.
        let _b = claims.claim([2; 32]);
    }
}
