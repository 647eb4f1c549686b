//! State objects in the cluster: the remote tier reports each snapshot or checkpoint it
//! wrote ([`kvtier_remote::Catalog::wrote_state`]); a task advertises it under
//! `ROOT/states/LAYOUT/KEY` so every replica serves it at once, without listing the
//! bucket. The follower of that prefix ([`crate::follow`]) adopts what others advertise.
//!
//! A state object is named by its key alone (its content decides nothing about the name
//! but the prefix it was computed after), so two replicas that write the same key write
//! the same name: the first advertisement stands and later ones find it there. The
//! object verifies itself on every read, so the record only points; fencing guards the
//! owner field, which says who may delete it while alive.
//!
//! States are aged out like runs: their records carry the writer's namespace and priority,
//! the GC leader weighs them in the same budgets and orphan rule, and a withdrawal leaves
//! a tombstone under `ROOT/tombstones/states/` until the object is deleted. While that
//! tombstone stands no replica advertises the key again: the object under its name is
//! about to go, whoever wrote it last.

use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use kvtier_remote::{RemoteTier, StateName};
use tokio::sync::mpsc;

use crate::member::Membership;
use crate::record::{Priority, StateAdvert};
use crate::stats::{ClusterStats, bump};

/// A state object written by this replica: what it is, its bytes, when.
pub(crate) type Written = (StateName, u64, u64);

/// The state publishing task.
pub(crate) struct StatePublisher {
    pub(crate) tier: Weak<RemoteTier>,
    pub(crate) member: Arc<Membership>,
    pub(crate) stats: Arc<ClusterStats>,
    /// Written into every record (budgets are per namespace).
    pub(crate) namespace: String,
    /// Written into every record.
    pub(crate) priority: Priority,
}

impl StatePublisher {
    /// Advertises what arrives on `rx`, in order, until the queue closes.
    pub(crate) async fn run(self, mut rx: mpsc::Receiver<Written>, mut client: Client) {
        while let Some(written) = rx.recv().await {
            self.publish(&mut client, written).await;
        }
    }

    /// Advertises one state object, retrying until it is in etcd (ours or an equal
    /// record of another replica) or the tier is gone.
    async fn publish(&self, client: &mut Client, (state, bytes, ts_ms): Written) {
        let mut backoff = Duration::from_millis(50);
        // A record already under the key that does not name this object (damaged, or of
        // a build that named it otherwise) is replaced, compared by its revision.
        let mut replace: Option<i64> = None;
        loop {
            let Some(tier) = self.tier.upgrade() else {
                return;
            };
            let (Some(endpoint), Some(id)) =
                (tier.endpoint_id(state.endpoint), self.member.identity())
            else {
                // Not registered yet (etcd away at start, or the lease was lost): wait.
                drop(tier);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            };
            drop(tier);
            let key = self.member.keys.state(&state.layout, &state.key);
            let Some(tombstone_key) = self.member.keys.tombstone_of(&key) else {
                return;
            };
            let mut advert = StateAdvert::of(
                &state,
                endpoint,
                bytes,
                &self.member.replica,
                id.generation,
                &self.namespace,
                ts_ms,
            );
            advert.priority = self.priority;
            let value = self.member.keys.seal(&key, &advert);
            let mut when = self.member.fence(id);
            when.push(match replace {
                Some(revision) => Compare::mod_revision(key.as_str(), CompareOp::Equal, revision),
                None => Compare::version(key.as_str(), CompareOp::Equal, 0),
            });
            when.push(Compare::version(
                tombstone_key.as_str(),
                CompareOp::Equal,
                0,
            ));
            let txn = Txn::new()
                .when(when)
                .and_then(vec![TxnOp::put(key.as_str(), value, None)])
                .or_else(vec![
                    TxnOp::get(key.as_str(), None),
                    TxnOp::get(tombstone_key.as_str(), None),
                ]);
            match client.txn(txn).await {
                Ok(r) if r.succeeded() => {
                    bump(&self.stats.states_published);
                    return;
                }
                Ok(r) => {
                    let reads = r.op_responses();
                    let tombstoned = matches!(
                        reads.get(1),
                        Some(etcd_client::TxnOpResponse::Get(g)) if !g.kvs().is_empty()
                    );
                    if tombstoned {
                        // Withdrawn and due for deletion: the object under this name
                        // goes with it, so this replica stops serving it too.
                        if let Some(tier) = self.tier.upgrade() {
                            tier.forget_state(&state.key);
                        }
                        bump(&self.stats.publish_lost);
                        return;
                    }
                    let held = reads.into_iter().take(1).find_map(|op| match op {
                        etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| {
                            let same = self
                                .member
                                .keys
                                .open::<StateAdvert>(kv.key(), kv.value())
                                .is_ok_and(|a| {
                                    a.object == advert.object && a.endpoint == advert.endpoint
                                });
                            (same, kv.mod_revision())
                        }),
                        _ => None,
                    });
                    match held {
                        // Another replica advertised the same object first.
                        Some((true, _)) => return,
                        Some((false, revision)) if replace != Some(revision) => {
                            replace = Some(revision);
                            continue;
                        }
                        // The record being replaced went away meanwhile: create it.
                        None if replace.is_some() => {
                            replace = None;
                            continue;
                        }
                        _ => {
                            // Fenced: this replica registers again, then retries.
                            bump(&self.stats.fenced);
                            self.member.lost(id);
                        }
                    }
                }
                Err(e) => {
                    bump(&self.stats.publish_retries);
                    tracing::debug!(error = %e, "cannot advertise a state object yet; retrying");
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
}
