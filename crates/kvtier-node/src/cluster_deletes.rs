//! Layout deletes other replicas asked for (the cluster's delete markers,
//! `kvtier_meta::deletes`): each is applied to this replica's own tiers once — dropping
//! the layout's blocks, snapshots and checkpoints from RAM and the SSD — and the highest
//! marker applied is remembered in the data directory, so a restart does not apply an old
//! marker again to blocks stored since.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};

use kvtier_core::Engine;
use kvtier_core::layout::LayoutDigest;
use kvtier_meta::deletes::OnLayoutDeleted;
use parking_lot::Mutex;

/// The file under the data directory holding the highest marker revision applied.
const FILE: &str = "cluster-deletes-applied";

/// The applied markers, and the engine they are applied to (set once it is built: the
/// cluster starts while the engine is still being assembled).
pub(crate) struct AppliedDeletes {
    path: PathBuf,
    applied: Mutex<i64>,
    engine: OnceLock<Weak<Engine>>,
}

impl AppliedDeletes {
    /// What `data_dir` says was applied (nothing, on a first start).
    pub(crate) fn open(data_dir: &std::path::Path) -> Arc<Self> {
        let path = data_dir.join(FILE);
        let applied = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        Arc::new(Self {
            path,
            applied: Mutex::new(applied),
            engine: OnceLock::new(),
        })
    }

    /// The engine, once built.
    pub(crate) fn attach(&self, engine: &Arc<Engine>) {
        let _ = self.engine.set(Arc::downgrade(engine));
    }

    /// The hook the cluster calls for each marker.
    pub(crate) fn hook(self: &Arc<Self>) -> OnLayoutDeleted {
        let me = self.clone();
        Arc::new(move |layout, revision| me.apply(layout, revision))
    }

    fn apply(&self, layout: LayoutDigest, revision: i64) -> Option<bool> {
        let mut applied = self.applied.lock();
        if revision <= *applied {
            return Some(false);
        }
        let engine = self.engine.get()?.upgrade()?;
        match engine.drop_namespace_locally(layout) {
            Ok(blocks) => {
                tracing::info!(%layout, blocks, "dropped a layout another replica deleted");
            }
            Err(e) => {
                tracing::warn!(%layout, error = %e, "cannot drop a deleted layout yet; retrying");
                return None;
            }
        }
        *applied = revision;
        if let Err(e) = self.remember(revision) {
            // Applied; only a restart would apply it again (dropping more, never less).
            tracing::warn!(path = %self.path.display(), error = %e, "cannot record an applied layout delete");
        }
        Some(true)
    }

    /// Writes `revision` durably: a new file, synced, renamed over the old one.
    fn remember(&self, revision: i64) -> std::io::Result<()> {
        use std::io::Write as _;
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(revision.to_string().as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}
