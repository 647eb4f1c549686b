//! The RAM tier's bookkeeping: which blocks it holds, which of them are leaves, and in what
//! order leaves were last used.
//!
//! Eviction is chain-aware: only leaves — blocks none of whose children are held — can be
//! evicted, so a held block's whole chain is always held and no unreachable block holds
//! memory. Among leaves the least recently used goes first. Recency is written by the
//! lock-free read path into each slot's atomic `last_access`; the ordered leaf set is keyed
//! by the recency seen when the block became a leaf and is corrected lazily when a victim
//! is picked (a leaf touched since is re-queued with its new time), so reads never take the
//! bookkeeping lock.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::hash::BlockHash;
use crate::tier::BlockMeta;

/// What the read path sees of a held block.
#[derive(Debug)]
pub(super) struct Slot {
    pub payload: Bytes,
    pub last_access: AtomicU64,
}

impl Slot {
    /// Records a use at `now`. A plain load and store rather than a read-modify-write: two
    /// racing readers may leave the older of their two times, which LRU order tolerates,
    /// and the common case (a block read again within the same microsecond) writes nothing.
    pub fn touch(&self, now: u64) {
        if now > self.last_access.load(Ordering::Relaxed) + 1_000 {
            self.last_access.store(now, Ordering::Relaxed);
        }
    }

    fn recency(&self) -> u64 {
        self.last_access.load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
pub(super) struct Node {
    pub meta: BlockMeta,
    pub slot: Arc<Slot>,
    /// Held children; the node is a leaf when this is empty.
    children: HashSet<BlockHash>,
    /// The node's key in the leaf set, when it is a leaf.
    leaf_key: Option<u64>,
}

impl Node {
    pub fn size(&self) -> u64 {
        self.slot.payload.len() as u64
    }
}

/// Held blocks and their leaf order. Callers hold the tier's bookkeeping mutex.
#[derive(Debug, Default)]
pub(super) struct Book {
    nodes: HashMap<BlockHash, Node>,
    leaves: BTreeSet<(u64, BlockHash)>,
}

impl Book {
    pub fn get(&self, hash: &BlockHash) -> Option<&Node> {
        self.nodes.get(hash)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    /// Whether `parent` is held (the chain root always counts as held).
    pub fn parent_held(&self, meta: &BlockMeta) -> bool {
        meta.position == 0 || self.nodes.contains_key(&meta.parent)
    }

    /// Registers `child` under its held parent before the child is admitted, so that making
    /// room for the child can never evict its own ancestors. Undo with [`Book::unpin`].
    pub fn pin_parent(&mut self, meta: &BlockMeta) {
        if meta.position == 0 {
            return;
        }
        if let Some(parent) = self.nodes.get_mut(&meta.parent) {
            parent.children.insert(meta.hash);
            if let Some(key) = parent.leaf_key.take() {
                self.leaves.remove(&(key, meta.parent));
            }
        }
    }

    /// Reverts [`Book::pin_parent`] for a child that was not admitted.
    pub fn unpin(&mut self, meta: &BlockMeta) {
        if meta.position > 0 {
            self.detach_from_parent(&meta.parent, &meta.hash);
        }
    }

    /// Adds a block as a new leaf. Its parent must have been pinned.
    pub fn insert(&mut self, meta: BlockMeta, slot: Arc<Slot>) {
        let key = slot.recency();
        let hash = meta.hash;
        self.leaves.insert((key, hash));
        self.nodes.insert(
            hash,
            Node {
                meta,
                slot,
                children: HashSet::new(),
                leaf_key: Some(key),
            },
        );
    }

    /// The least recently used leaf, or `None` if nothing is held.
    pub fn lru_leaf(&mut self) -> Option<BlockHash> {
        // Each leaf is re-queued at most once per call unless touched again meanwhile;
        // the bound keeps a storm of concurrent reads from spinning us forever.
        let mut requeues = self.leaves.len();
        loop {
            let &(key, hash) = self.leaves.first()?;
            let now = self.nodes.get(&hash).map_or(key, |n| n.slot.recency());
            if now > key && requeues > 0 {
                requeues -= 1;
                self.leaves.remove(&(key, hash));
                self.leaves.insert((now, hash));
                if let Some(n) = self.nodes.get_mut(&hash) {
                    n.leaf_key = Some(now);
                }
                continue;
            }
            return Some(hash);
        }
    }

    /// Removes `hash` and, first, every held descendant of it, deepest first. Returns the
    /// removed nodes in removal order.
    pub fn remove_subtree(&mut self, hash: &BlockHash) -> Vec<Node> {
        let mut order = Vec::new();
        let mut stack = vec![*hash];
        while let Some(h) = stack.pop() {
            if let Some(n) = self.nodes.get(&h) {
                order.push(h);
                stack.extend(n.children.iter().copied());
            }
        }
        order
            .iter()
            .rev()
            .filter_map(|h| self.remove_leaf(h))
            .collect()
    }

    /// Removes a leaf; its parent becomes a leaf if this was its last held child.
    pub fn remove_leaf(&mut self, hash: &BlockHash) -> Option<Node> {
        let node = self.nodes.get(hash)?;
        if !node.children.is_empty() {
            return None;
        }
        let node = self.nodes.remove(hash)?;
        if let Some(key) = node.leaf_key {
            self.leaves.remove(&(key, *hash));
        }
        if node.meta.position > 0 {
            self.detach_from_parent(&node.meta.parent, hash);
        }
        Some(node)
    }

    fn detach_from_parent(&mut self, parent: &BlockHash, child: &BlockHash) {
        if let Some(p) = self.nodes.get_mut(parent) {
            p.children.remove(child);
            if p.children.is_empty() && p.leaf_key.is_none() {
                let key = p.slot.recency();
                p.leaf_key = Some(key);
                self.leaves.insert((key, *parent));
            }
        }
    }

    /// Checks the book's invariants; for tests. Returns a description of the first broken one.
    pub fn check(&self) -> Result<(), String> {
        for (h, n) in &self.nodes {
            if n.meta.position > 0 {
                match self.nodes.get(&n.meta.parent) {
                    None => return Err(format!("{h} held without its parent")),
                    Some(p) if !p.children.contains(h) => {
                        return Err(format!("{h} missing from its parent's children"));
                    }
                    Some(_) => {}
                }
            }
            let is_leaf = n.children.is_empty();
            if is_leaf != n.leaf_key.is_some() {
                return Err(format!("{h} leaf flag disagrees with its children"));
            }
            if let Some(k) = n.leaf_key
                && !self.leaves.contains(&(k, *h))
            {
                return Err(format!("{h} is a leaf but not in the leaf set"));
            }
        }
        if self.leaves.len() != self.nodes.values().filter(|n| n.leaf_key.is_some()).count() {
            return Err("leaf set holds blocks that are not leaves".into());
        }
        Ok(())
    }
}
