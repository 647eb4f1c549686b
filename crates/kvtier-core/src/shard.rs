//! A hash map keyed by [`BlockHash`], split into independently locked shards.
//!
//! Block hashes are uniformly distributed already, so the map uses their low bits directly
//! (no second hash) and picks the shard from the high bits of the same word. Readers of
//! different shards never touch a shared cache line; readers of the same shard share an
//! uncontended reader lock.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::hash::BlockHash;

const SHARD_BITS: u32 = 6;
const SHARDS: usize = 1 << SHARD_BITS;

/// A hasher for keys that are already uniform hashes: it passes their bits through.
#[derive(Debug, Default, Clone, Copy)]
pub struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by `BlockHash` (which writes one u64); fold anything else in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = word;
    }
}

/// The map type of one shard.
pub type ShardMap<V> = HashMap<BlockHash, V, BuildHasherDefault<PassThroughHasher>>;

/// A [`BlockHash`]-keyed map in 64 shards.
#[derive(Debug)]
pub struct ShardedMap<V> {
    shards: Box<[RwLock<ShardMap<V>>]>,
}

impl<V> Default for ShardedMap<V> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| RwLock::new(ShardMap::default())).collect(),
        }
    }
}

impl<V> ShardedMap<V> {
    fn shard(&self, key: &BlockHash) -> &RwLock<ShardMap<V>> {
        &self.shards[shard_of(key)]
    }

    /// A read guard on the shard holding `key`.
    pub fn read(&self, key: &BlockHash) -> RwLockReadGuard<'_, ShardMap<V>> {
        self.shard(key).read()
    }

    /// A write guard on the shard holding `key`.
    pub fn write(&self, key: &BlockHash) -> RwLockWriteGuard<'_, ShardMap<V>> {
        self.shard(key).write()
    }

    /// Read guards on every shard at once, for a long walk that would otherwise lock and
    /// unlock a shard per key. Writers wait until the guards are dropped.
    pub fn read_all(&self) -> AllShards<'_, V> {
        AllShards {
            guards: self.shards.iter().map(|s| s.read()).collect(),
        }
    }

    /// Entries in all shards (not atomic across shards).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    /// True when every shard is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn shard_of(key: &BlockHash) -> usize {
    (key.0[0] as usize) & (SHARDS - 1)
}

/// Read guards on all shards of a [`ShardedMap`].
pub struct AllShards<'a, V> {
    guards: Vec<RwLockReadGuard<'a, ShardMap<V>>>,
}

impl<V> AllShards<'_, V> {
    /// The value under `key`.
    pub fn get(&self, key: &BlockHash) -> Option<&V> {
        self.guards[shard_of(key)].get(key)
    }
}
