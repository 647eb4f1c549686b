//! The GC leader: one replica at a time, elected through etcd's election API on a short
//! lease, sweeps the shared tier every [`crate::ClusterConfig::gc_interval`]:
//!
//! - **due tombstones**: withdrawn objects whose grace window passed are deleted (their
//!   deleter may have died before finishing);
//! - **orphans**: objects whose owner has had no member key for
//!   [`crate::ClusterConfig::orphan_after`] are withdrawn (the transaction re-checks that
//!   the owner is still gone);
//! - **budgets**: a namespace over its byte budget is shrunk oldest first; pinned objects
//!   are never chosen;
//! - **deleted layouts**: every run and state object of a layout whose delete marker
//!   (`ROOT/deleted/LAYOUT`) is newer than its advertisement is withdrawn, pinned or not;
//!   markers older than [`crate::record::DELETE_MARKER_TTL`] are dropped.
//!
//! Run objects and state objects (recurrent-state snapshots and checkpoints) are weighed
//! together: both kinds of advertisement carry an owner, a namespace, a priority, an age
//! and a size, and both are withdrawn and deleted the same two-phase way.
//!
//! Every action is a transaction that compares the leader's election key and the
//! record's revision, and finishing a tombstone is idempotent: a leader that dies
//! mid-sweep leaves nothing half done that its successor cannot finish, and a deposed
//! leader's late actions fail.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, LeaderKey, Txn, TxnOp};
use kvtier_remote::RemoteTier;

use crate::config::ClusterConfig;
use crate::gc::{self, Authority, Reason, Withdrawal};
use crate::keys::prefix_end;
use crate::member::{Membership, keep_alive};
use crate::record::{DELETE_MARKER_TTL, LayoutDeleted, Priority, Tombstone};
use crate::stats::{ClusterStats, bump};
use crate::status::read_pages;
use crate::view::{Seen, View};

/// What one leadership term remembers between sweeps.
#[derive(Default)]
struct Term {
    /// Since when (wall ms) each absent owner has been seen absent.
    absent: HashMap<String, u64>,
    /// Records withdrawn by this term, by key, with the revision withdrawn.
    withdrawn: HashMap<Vec<u8>, i64>,
}

/// A task aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The leader's state.
pub(crate) struct Leader {
    pub(crate) tier: Weak<RemoteTier>,
    pub(crate) member: Arc<Membership>,
    pub(crate) view: Arc<View>,
    pub(crate) stats: Arc<ClusterStats>,
    pub(crate) config: ClusterConfig,
    pub(crate) wall_ms: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// True once each follower's (runs', states') first full read is applied: before
    /// that the view is partial, and judging budgets or orphans from it could pick the
    /// wrong objects.
    pub(crate) ready: [Arc<AtomicBool>; 2],
}

impl Leader {
    /// Stands for election and sweeps while leader, until the tier is dropped.
    pub(crate) async fn run(self, mut client: Client) {
        let election = self.member.keys.election();
        while self.tier.strong_count() > 0 {
            let lease = match client
                .lease_grant(self.config.leader_ttl.as_secs().max(2) as i64, None)
                .await
            {
                Ok(l) => l.id(),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            let alive = Arc::new(AtomicBool::new(true));
            // Aborted with this task: a leader stopped (or crashed) stops renewing.
            let keeper = AbortOnDrop({
                let (mut c, alive, ttl) = (client.clone(), alive.clone(), self.config.leader_ttl);
                tokio::spawn(async move {
                    keep_alive(&mut c, lease, ttl).await;
                    alive.store(false, Ordering::SeqCst);
                })
            });
            if let Some(key) = self.campaign(&mut client, &election, lease, &alive).await {
                bump(&self.stats.leader_changes);
                self.stats.is_leader.store(1, Ordering::Relaxed);
                tracing::info!(replica = %self.member.replica, "became the cluster's GC leader");
                let mut term = Term::default();
                while alive.load(Ordering::SeqCst) && self.tier.strong_count() > 0 {
                    self.sweep(&mut client, &key, &mut term).await;
                    tokio::time::sleep(self.config.gc_interval).await;
                }
                self.stats.is_leader.store(0, Ordering::Relaxed);
                tracing::warn!(replica = %self.member.replica, "no longer the cluster's GC leader");
            }
            drop(keeper);
            let _ = client.lease_revoke(lease).await;
        }
    }

    /// Campaigns with `lease` until elected (or the lease is lost).
    async fn campaign(
        &self,
        client: &mut Client,
        election: &str,
        lease: i64,
        alive: &AtomicBool,
    ) -> Option<LeaderKey> {
        while alive.load(Ordering::SeqCst) && self.tier.strong_count() > 0 {
            // A campaign blocks until elected; the client's request timeout ends it now
            // and then (the candidacy is withdrawn and made again).
            match client
                .campaign(election, self.member.replica.as_str(), lease)
                .await
            {
                Ok(r) => match r.leader() {
                    Some(key) => return Some(key.clone()),
                    None => tokio::time::sleep(Duration::from_millis(100)).await,
                },
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        None
    }

    /// One sweep: due tombstones, orphans, budgets.
    async fn sweep(&self, client: &mut Client, key: &LeaderKey, term: &mut Term) {
        let Some(tier) = self.tier.upgrade() else {
            return;
        };
        if !self.ready.iter().all(|r| r.load(Ordering::SeqCst)) {
            return;
        }
        let authority = Authority::Leader {
            key: key.key().to_vec(),
            revision: key.rev(),
        };
        if let Err(e) = self.finish_due(client, &tier).await {
            tracing::debug!(error = %e, "GC sweep: cannot read tombstones");
        }
        if let Err(e) = self
            .sweep_deleted(client, &authority, &mut term.withdrawn)
            .await
        {
            tracing::debug!(error = %e, "GC sweep: cannot read delete markers");
        }
        // Withdrawals of earlier sweeps that this replica's watch has not applied yet are
        // still in the view: they must not count toward a budget again (that would
        // withdraw more than needed) nor be tried twice.
        term.withdrawn.retain(|k, revision| {
            self.view
                .get(k)
                .is_some_and(|seen| seen.revision == *revision)
        });
        let (withdrawn, absent) = (&mut term.withdrawn, &mut term.absent);
        if let Ok(live) = self.live_members(client).await {
            let now = (self.wall_ms)();
            absent.retain(|owner, _| !live.contains(owner));
            // Only the records of absent owners are copied out of the view.
            let orphans = self
                .view
                .select(|k, s| !live.contains(s.advert.owner()) && !withdrawn.contains_key(k));
            for (k, seen) in &orphans {
                let since = *absent.entry(seen.advert.owner().to_owned()).or_insert(now);
                if now.saturating_sub(since) >= self.config.orphan_after.as_millis() as u64
                    && self
                        .withdraw(client, &authority, k, seen, Reason::Orphan)
                        .await
                {
                    bump(&self.stats.orphans_reclaimed);
                    withdrawn.insert(k.clone(), seen.revision);
                }
            }
        }
        for (namespace, budget) in &self.config.budgets {
            let counted = |k: &[u8], s: &Seen| {
                s.advert.namespace() == namespace && !withdrawn.contains_key(k)
            };
            let mut total = self.view.bytes(counted);
            if total <= *budget {
                continue;
            }
            // Over budget: the candidates, oldest first (pinned objects never are).
            let mut candidates = self
                .view
                .select(|k, s| counted(k, s) && s.advert.priority() != Priority::Pinned);
            candidates.sort_by(|a, b| (a.1.advert.ts_ms(), &a.0).cmp(&(b.1.advert.ts_ms(), &b.0)));
            for (k, seen) in &candidates {
                if total <= *budget {
                    break;
                }
                if self
                    .withdraw(client, &authority, k, seen, Reason::Budget)
                    .await
                {
                    bump(&self.stats.budget_evictions);
                    withdrawn.insert(k.clone(), seen.revision);
                    total = total.saturating_sub(seen.advert.bytes());
                }
            }
        }
    }

    /// Withdraws every advertisement older than its layout's delete marker; drops markers
    /// past their time.
    async fn sweep_deleted(
        &self,
        client: &mut Client,
        authority: &Authority,
        withdrawn: &mut HashMap<Vec<u8>, i64>,
    ) -> Result<(), etcd_client::Error> {
        let now = (self.wall_ms)();
        let keys = &self.member.keys;
        let prefix = keys.deletes();
        let mut markers = Vec::new();
        read_pages(client, &prefix, |kvs| {
            for kv in kvs {
                let (Ok(key), Ok(marker)) = (
                    kv.key_str(),
                    keys.open::<LayoutDeleted>(kv.key(), kv.value()),
                ) else {
                    continue;
                };
                if let Some(layout) = key.strip_prefix(prefix.as_str()) {
                    markers.push((key.to_owned(), layout.to_owned(), marker, kv.mod_revision()));
                }
            }
        })
        .await?;
        let ttl = DELETE_MARKER_TTL.as_millis() as u64;
        for (key, layout, marker, revision) in markers {
            if now.saturating_sub(marker.at_ms) > ttl {
                // Only if no newer delete replaced it meanwhile.
                let txn = Txn::new()
                    .when(vec![Compare::mod_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        revision,
                    )])
                    .and_then(vec![TxnOp::delete(key.as_str(), None)]);
                client.txn(txn).await?;
                continue;
            }
            let [runs, states] = self.member.keys.of_layout(&layout);
            let doomed = self.view.select(|k, s| {
                (k.starts_with(runs.as_bytes()) || k.starts_with(states.as_bytes()))
                    && s.revision < revision
                    && !withdrawn.contains_key(k)
            });
            for (k, seen) in &doomed {
                if self
                    .withdraw(client, authority, k, seen, Reason::Deleted)
                    .await
                {
                    bump(&self.stats.deleted_withdrawn);
                    withdrawn.insert(k.clone(), seen.revision);
                }
            }
        }
        Ok(())
    }

    /// Withdraws one record as leader; true if it was.
    async fn withdraw(
        &self,
        client: &mut Client,
        authority: &Authority,
        key: &[u8],
        seen: &Seen,
        reason: Reason,
    ) -> bool {
        let key = String::from_utf8_lossy(key);
        match gc::withdraw(
            client,
            &self.member,
            authority,
            &key,
            seen,
            reason,
            (self.wall_ms)(),
        )
        .await
        {
            Ok(Withdrawal::Withdrawn(_)) => {
                bump(&self.stats.gc_tombstones);
                true
            }
            Ok(Withdrawal::Fenced) => {
                bump(&self.stats.fenced);
                false
            }
            Ok(_) => false,
            Err(e) => {
                tracing::debug!(error = %e, "GC sweep: a withdrawal failed; the next sweep retries");
                false
            }
        }
    }

    /// Deletes every object whose tombstone's grace window has passed.
    async fn finish_due(
        &self,
        client: &mut Client,
        tier: &Arc<RemoteTier>,
    ) -> Result<(), etcd_client::Error> {
        let now = (self.wall_ms)();
        let grace = self.config.gc_grace.as_millis() as u64;
        let mut due = Vec::new();
        let keys = &self.member.keys;
        read_pages(client, &keys.tombstones(), |kvs| {
            for kv in kvs {
                if let Ok(t) = keys.open::<Tombstone>(kv.key(), kv.value())
                    && now >= t.at_ms.saturating_add(grace)
                {
                    due.push((
                        kv.key_str().unwrap_or_default().to_owned(),
                        t,
                        kv.mod_revision(),
                    ));
                }
            }
        })
        .await?;
        for (key, t, revision) in due {
            if let Err(why) = gc::finish(client, tier, &self.stats, &key, &t, revision).await {
                tracing::warn!(object = %t.of.object(), reason = %why, "GC sweep: cannot delete a withdrawn object yet");
            }
        }
        Ok(())
    }

    /// The replicas with a member key now.
    async fn live_members(
        &self,
        client: &mut Client,
    ) -> Result<HashSet<String>, etcd_client::Error> {
        let prefix = self.member.keys.members();
        let got = client
            .get(
                prefix.as_str(),
                Some(
                    GetOptions::new()
                        .with_range(prefix_end(&prefix))
                        .with_keys_only(),
                ),
            )
            .await?;
        Ok(got
            .kvs()
            .iter()
            .filter_map(|kv| {
                kv.key_str()
                    .ok()
                    .and_then(|k| k.strip_prefix(prefix.as_str()))
                    .map(str::to_owned)
            })
            .collect())
    }
}
