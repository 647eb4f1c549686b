//! How the remote tier learns of objects it did not write itself, and tells others of the
//! objects it writes and deletes.
//!
//! Objects in the shared store are written by many replicas. Which of them a replica may
//! serve is a question for a catalog: listing the bucket at start ([`ListCatalog`], one
//! replica or several that restart now and then) or a shared index that announces objects
//! as they are written (the etcd plane). Whatever the catalog, the tier itself decides
//! what it serves: [`crate::RemoteTier::adopt`] reads an object's manifest and checks it
//! against the object's name before any of its blocks is known — a catalog can only point,
//! never vouch — and [`crate::RemoteTier::forget`] / [`crate::RemoteTier::delete`] are the
//! only ways blocks leave it besides a failed read.

use std::fmt::Debug;

use kvtier_core::hash::BlockHash;
use kvtier_core::layout::LayoutDigest;

use crate::RemoteTier;

/// An object of the remote store, by where it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectName {
    /// Which of the tier's endpoints holds it (an index into
    /// [`crate::RemoteConfig::endpoints`]).
    pub endpoint: usize,
    /// The name of its manifest (`<prefix>/<layout>/<first>-<last>.kvm`); the data object
    /// is the same name with `.kvo`.
    pub manifest: String,
}

/// An object as a catalog describes it to others: enough to index its blocks without
/// reading anything (the tier wrote it, or a cluster record names it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Where it is.
    pub name: ObjectName,
    /// The layout its blocks were computed under.
    pub layout: LayoutDigest,
    /// The chain position of its first block.
    pub first_position: u32,
    /// The parent of its first block (the layout's chain root at position 0).
    pub first_parent: BlockHash,
    /// Its blocks' hashes in chain order: a reader may use any leading part.
    pub blocks: Vec<BlockHash>,
    /// Bytes per block, decoded. Where each block is in the data object (its blocks may
    /// be encoded) only the manifest says: it is read before any byte is served.
    pub block_bytes: u64,
    /// SHA-256 of its manifest: a reader that learned of the object from a record checks
    /// the manifest it reads against this before serving any byte.
    pub manifest_digest: [u8; 32],
}

/// An object found by listing a store ([`crate::RemoteTier::list_objects`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Which endpoint holds it.
    pub endpoint: usize,
    /// Its name.
    pub name: String,
    /// When it was last written, Unix milliseconds.
    pub modified_ms: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// What [`crate::RemoteTier::adopt`] came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adopted {
    /// The manifest checked out; this many of its blocks were new to the tier.
    Blocks(usize),
    /// The manifest is not one the tier may serve from (unreadable, not a chain, or not
    /// the object its name says); nothing was adopted.
    Refused(String),
    /// The manifest could not be read (gone, or the endpoint did not answer in time).
    Unreachable(String),
}

/// Where a remote tier learns of objects, and whom it tells of its own writes and deletes.
///
/// Implementations must be quick in [`Catalog::wrote`] and [`Catalog::deleted`] (they run
/// on the thread that wrote or deleted): hand the work to a thread of their own.
pub trait Catalog: Send + Sync + Debug + 'static {
    /// The objects to adopt when the tier opens. The tier adopts each through
    /// [`crate::RemoteTier::adopt`], so a wrong name costs a refused adoption, not a
    /// wrong block.
    fn at_open(&self, tier: &RemoteTier) -> Vec<ObjectName>;

    /// The writer's tag for the object about to be written, part of its name (`[a-z0-9._-]`,
    /// see [`crate::object::valid_writer_tag`]); `None` names objects by content alone.
    /// A cluster catalog names the replica, its generation and a sequence number, so
    /// objects of two replicas never share a name.
    fn writer_tag(&self) -> Option<String> {
        None
    }

    /// The tier wrote `object` (data, then manifest: it is complete).
    fn wrote(&self, object: &ObjectInfo) {
        let _ = object;
    }

    /// The tier deleted `object` from the store.
    fn deleted(&self, object: &ObjectName) {
        let _ = object;
    }

    /// Whether the tier may delete objects from the store itself (a layout's delete): yes
    /// for a catalog that only lists; a cluster's objects are advertised and deleted
    /// through its two-phase GC, so it says no.
    fn deletes_directly(&self) -> bool {
        true
    }

    /// Asks every replica to delete `layout` (a catalog that does not delete directly:
    /// the cluster writes a delete marker; its GC withdraws the objects, and each
    /// replica drops its own copies). Returns once the request is recorded; an error
    /// (`Unavailable`) when it could not be. Default: nothing to ask.
    fn delete_layout(&self, layout: LayoutDigest) -> kvtier_core::Result<()> {
        let _ = layout;
        Ok(())
    }

    /// The tier wrote the state object `state`, of `bytes` bytes of state (one PUT: it
    /// is complete). State objects are listed at every open whatever the catalog; a
    /// cluster catalog also advertises them, so other replicas find them at once.
    fn wrote_state(&self, state: &crate::StateName, bytes: u64) {
        let _ = (state, bytes);
    }
}

/// The catalog of a tier on its own: at open, every manifest listed under the prefix on
/// every endpoint; nothing learned afterwards (another replica's writes are seen at the
/// next start).
#[derive(Debug, Default, Clone, Copy)]
pub struct ListCatalog;

impl Catalog for ListCatalog {
    fn at_open(&self, tier: &RemoteTier) -> Vec<ObjectName> {
        tier.list_manifests()
    }
}
