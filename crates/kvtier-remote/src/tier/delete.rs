//! A layout's delete on the shared store: every run object under `PREFIX/LAYOUT/` and every
//! state object under `PREFIX/state/LAYOUT/`, on every endpoint — what this replica wrote
//! and what others did — so that no listing brings them back after a restart.
//!
//! Only for a tier whose catalog lets it delete objects itself ([`Catalog::deletes_directly`]:
//! the listing catalog of one replica or several that restart now and then). A cluster's
//! objects are advertised, and go through its two-phase GC instead.
//!
//! [`Catalog::deletes_directly`]: crate::catalog::Catalog::deletes_directly

use kvtier_core::layout::LayoutDigest;
use kvtier_core::{Error, ErrorKind, Result};
use object_store::ObjectStoreExt;
use object_store::path::Path;

use super::RemoteTier;
use crate::catalog::ObjectName;
use crate::object::manifest_of;

impl RemoteTier {
    /// Whether this tier's catalog lets it delete objects from the store itself.
    pub fn deletes_directly(&self) -> bool {
        self.catalog.deletes_directly()
    }

    /// Deletes every run object of `layout` from the store (manifest first, then data)
    /// and forgets its blocks; returns how many objects were deleted. An endpoint that
    /// cannot be listed or an object that cannot be deleted is an error (`Unavailable`),
    /// after the others were tried: a retry finishes the job.
    pub fn delete_layout_objects(&self, layout: LayoutDigest) -> Result<u64> {
        if !self.deletes_directly() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "this remote tier's objects are the cluster's: they are deleted through its GC",
            ));
        }
        let prefix = format!("{}/{}/", self.config.prefix, layout.to_hex());
        let listed = self.list_under(&prefix);
        let manifests: std::collections::HashSet<(usize, &str)> = listed
            .iter()
            .filter(|o| o.name.ends_with(".kvm"))
            .map(|o| (o.endpoint, o.name.as_str()))
            .collect();
        let mut deleted = 0;
        let mut failed = None;
        for &(endpoint, manifest) in &manifests {
            let name = ObjectName {
                endpoint,
                manifest: manifest.to_owned(),
            };
            // Manifest first, then its data (`RemoteTier::delete`).
            match self.delete(&name) {
                Ok(_) => deleted += 1,
                Err(e) => failed = Some(e),
            }
        }
        // Data objects whose manifest was already gone (a delete cut short): served by
        // nobody, but they take space.
        for o in listed.iter().filter(|o| o.name.ends_with(".kvo")) {
            let orphan =
                manifest_of(&o.name).is_none_or(|m| !manifests.contains(&(o.endpoint, m.as_str())));
            if orphan {
                let store = self.store(o.endpoint);
                let path = Path::from(o.name.as_str());
                let _ = self.call(async move { store.delete(&path).await });
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(deleted),
        }
    }

    /// Deletes every state object of `layout` (snapshots and checkpoints), listed on every
    /// endpoint, and stops serving them; returns how many.
    pub fn delete_layout_states(&self, layout: LayoutDigest) -> Result<u64> {
        if !self.deletes_directly() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "this remote tier's state objects are the cluster's: they are deleted through \
                 its GC",
            ));
        }
        let mut deleted = 0;
        let mut failed = None;
        let prefix = format!("{}/state/{}/", self.config.prefix, layout.to_hex());
        let listed = self.list_under(&prefix);
        let states = listed
            .iter()
            .filter_map(|o| self.state_of(o))
            .filter(|s| s.layout == layout);
        for state in states {
            match self.delete_state(&state) {
                Ok(()) => deleted += 1,
                Err(e) => failed = Some(e),
            }
        }
        // Served from memory but not listed (listing lags, or another endpoint): forgotten.
        self.states().write().retain(|_, s| s.layout != layout);
        match failed {
            Some(e) => Err(e),
            None => Ok(deleted),
        }
    }
}
