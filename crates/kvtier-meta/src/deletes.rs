//! Layout deletes across the cluster. `DELETE /v1/layouts/{layout}` on one replica writes a
//! delete marker (`ROOT/deleted/LAYOUT`, [`LayoutDeleted`]); then
//!
//! - the GC leader withdraws every run and state advertisement of the layout older than
//!   the marker (the usual two phases: tombstone, grace, delete — `leader.rs`), so no
//!   replica starts a read of them and none lists them back after a restart;
//! - every replica, the writer included, drops the layout's blocks and states from its
//!   own tiers once per marker, through the hook the assembly gives
//!   ([`crate::ClusterCatalog::on_layout_deleted`]); a replica that was away applies the
//!   markers it finds when it comes back (the hook remembers which it applied).
//!
//! Markers are read every [`POLL`]: few and small, and a poll needs no watch to resume.

use std::sync::Arc;
use std::sync::Weak;
use std::time::Duration;

use etcd_client::Client;
use kvtier_core::layout::LayoutDigest;
use kvtier_remote::RemoteTier;

use crate::keys::Keys;
use crate::record::LayoutDeleted;
use crate::stats::{ClusterStats, bump};
use crate::status::read_pages;

/// How often each replica reads the delete markers.
pub const POLL: Duration = Duration::from_secs(1);

/// What a replica does with a delete marker: drop `layout` from its own tiers, unless it
/// did for this marker (`revision`) already. `Some(true)`: dropped now; `Some(false)`:
/// done before; `None`: not possible yet (the engine is still opening, a tier failed) —
/// asked again at the next poll, and no later marker is handed over before it.
pub type OnLayoutDeleted = Arc<dyn Fn(LayoutDigest, i64) -> Option<bool> + Send + Sync>;

/// Reads the markers every [`POLL`] and hands each new one to the hook, oldest first,
/// until the tier is dropped.
pub(crate) async fn follow(
    mut client: Client,
    keys: Keys,
    tier: Weak<RemoteTier>,
    hook: OnLayoutDeleted,
    stats: Arc<ClusterStats>,
) {
    let prefix = keys.deletes();
    let mut seen: i64 = 0;
    while tier.strong_count() > 0 {
        let mut markers = Vec::new();
        let read = read_pages(&mut client, &prefix, |kvs| {
            for kv in kvs {
                let layout = kv
                    .key_str()
                    .ok()
                    .and_then(|k| k.strip_prefix(prefix.as_str()))
                    .and_then(LayoutDigest::from_hex);
                let valid = keys.open::<LayoutDeleted>(kv.key(), kv.value()).is_ok();
                if let Some(layout) = layout.filter(|_| valid) {
                    markers.push((kv.mod_revision(), layout));
                }
            }
        })
        .await;
        if read.is_ok() {
            markers.sort_unstable_by_key(|(revision, _)| *revision);
            for (revision, layout) in markers {
                if revision <= seen {
                    continue;
                }
                let hook = hook.clone();
                let applied = tokio::task::spawn_blocking(move || hook(layout, revision))
                    .await
                    .ok()
                    .flatten();
                match applied {
                    Some(true) => bump(&stats.layout_deletes_applied),
                    Some(false) => {}
                    None => break, // in order: this one again first, at the next poll
                }
                seen = revision;
            }
        }
        tokio::time::sleep(POLL).await;
    }
}
