//! Write-behind advertisement: the remote tier reports each object it wrote
//! ([`kvtier_remote::Catalog::wrote`]) into a bounded queue; a task publishes them, one
//! fenced transaction each, retrying while etcd is away. A store never waits on etcd.
//!
//! The transaction requires that no advertisement and no tombstone exist for the run.
//! If another replica advertised the same run first, this replica's object (never
//! advertised, named after its writer) is deleted and the winner's adopted instead.

use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use kvtier_remote::{ObjectInfo, RemoteTier};
use tokio::sync::mpsc;

use crate::member::{Identity, Membership};
use crate::record::Advert;
use crate::stats::{ClusterStats, bump};

/// How one publish ended.
#[derive(Debug)]
pub(crate) enum Published {
    /// The advertisement is in etcd (now, or it already was).
    Done,
    /// Another replica's advertisement, or a tombstone, holds the run.
    Lost,
    /// This replica's generation or lease is not current any more.
    Fenced,
}

/// One advertisement attempt under `id`.
pub(crate) async fn publish_once(
    client: &mut Client,
    member: &Membership,
    id: Identity,
    key: &str,
    tombstone_key: &str,
    advert: &Advert,
) -> Result<Published, etcd_client::Error> {
    let value = member.keys.seal(key, advert);
    let mut when = member.fence(id);
    when.push(Compare::version(key, CompareOp::Equal, 0));
    when.push(Compare::version(tombstone_key, CompareOp::Equal, 0));
    let txn = Txn::new()
        .when(when)
        .and_then(vec![TxnOp::put(key, value, None)])
        .or_else(vec![
            TxnOp::get(member.keys.generation(&member.replica), None),
            TxnOp::get(member.keys.member(&member.replica), None),
            TxnOp::get(key, None),
            TxnOp::get(tombstone_key, None),
        ]);
    let response = client.txn(txn).await?;
    if response.succeeded() {
        return Ok(Published::Done);
    }
    let reads = response.op_responses();
    if Membership::was_fenced(id, &reads) {
        return Ok(Published::Fenced);
    }
    let existing = match reads.get(2) {
        Some(TxnOpResponse::Get(g)) => g
            .kvs()
            .first()
            .and_then(|kv| member.keys.open::<Advert>(kv.key(), kv.value()).ok()),
        _ => None,
    };
    match existing {
        // Ours already (a retry after a lost answer): nothing to do.
        Some(a) if a.object == advert.object && a.endpoint == advert.endpoint => {
            Ok(Published::Done)
        }
        _ => Ok(Published::Lost),
    }
}

/// Advertisements in flight at once: each is one round trip to etcd, and runs are
/// independent (a replica never writes the same run twice: dedup comes before the PUT),
/// so a queue filled by many storing threads drains at etcd's throughput, not at one
/// transaction per round trip.
const IN_FLIGHT: usize = 128;

/// Advertisements already waiting in the queue are published together, up to this many in
/// one transaction (one raft entry instead of many); a batch whose transaction fails —
/// a run taken by another replica, a fence — is published one by one, each with its own
/// outcome. A lone advertisement waits for nobody.
const BATCH: usize = 16;

/// An object the tier wrote, and when: boxed, so the queue's slots stay small (a full
/// queue holds thousands, and its blocks are allocated as it fills).
pub(crate) type Wrote = (Box<ObjectInfo>, u64);

/// The publishing task's side of the queue.
#[derive(Clone)]
pub(crate) struct Publisher {
    pub(crate) tier: Weak<RemoteTier>,
    pub(crate) member: Arc<Membership>,
    pub(crate) stats: Arc<ClusterStats>,
    pub(crate) namespace: String,
    pub(crate) priority: crate::record::Priority,
    /// Tells the follower to index a run's winner afresh.
    pub(crate) reindex: mpsc::UnboundedSender<Vec<u8>>,
}

impl Publisher {
    /// Publishes what arrives on `rx`, up to [`IN_FLIGHT`] at once, until the queue closes
    /// (the catalog is dropped). Aborting this task aborts the ones in flight.
    pub(crate) async fn run(self, mut rx: mpsc::Receiver<Wrote>, client: Client) {
        let mut in_flight = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                next = rx.recv(), if in_flight.len() < IN_FLIGHT => match next {
                    Some(first) => {
                        let mut batch = vec![first];
                        while batch.len() < BATCH {
                            match rx.try_recv() {
                                Ok(next) => batch.push(next),
                                Err(_) => break,
                            }
                        }
                        let (this, client) = (self.clone(), client.clone());
                        in_flight.spawn(async move { this.publish_batch(client, batch).await });
                    }
                    None => break,
                },
                Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            }
        }
        while in_flight.join_next().await.is_some() {}
    }

    /// This replica's advertisement of `info`, held at `endpoint`, under `generation`.
    fn advert(&self, info: &ObjectInfo, endpoint: String, generation: u64, ts_ms: u64) -> Advert {
        let mut advert = Advert::of(
            info,
            endpoint,
            &self.member.replica,
            generation,
            &self.namespace,
            ts_ms,
        );
        advert.priority = self.priority;
        advert
    }

    /// Publishes `batch` in one transaction if it can, else one by one.
    async fn publish_batch(&self, mut client: Client, batch: Vec<Wrote>) {
        if batch.len() > 1 && self.publish_together(&mut client, &batch).await {
            bump(&self.stats.publish_transactions);
            crate::stats::add(&self.stats.published, batch.len() as u64);
            return;
        }
        for (info, ts_ms) in batch {
            self.publish(client.clone(), *info, ts_ms).await;
        }
    }

    /// One transaction for all of `batch`: the fence, and no advertisement and no
    /// tombstone for any of its runs. Whether it committed.
    async fn publish_together(&self, client: &mut Client, batch: &[Wrote]) -> bool {
        let (Some(tier), Some(id)) = (self.tier.upgrade(), self.member.identity()) else {
            return false;
        };
        let mut when = self.member.fence(id);
        let mut puts = Vec::with_capacity(batch.len());
        for (info, ts_ms) in batch {
            let (Some(endpoint), Some((key, tombstone_key))) = (
                tier.endpoint_id(info.name.endpoint),
                self.member.keys.of_object(info),
            ) else {
                return false;
            };
            when.push(Compare::version(key.as_str(), CompareOp::Equal, 0));
            when.push(Compare::version(tombstone_key, CompareOp::Equal, 0));
            let advert = self.advert(info, endpoint, id.generation, *ts_ms);
            let value = self.member.keys.seal(&key, &advert);
            puts.push(TxnOp::put(key, value, None));
        }
        let txn = Txn::new().when(when).and_then(puts);
        matches!(client.txn(txn).await, Ok(r) if r.succeeded())
    }

    /// Publishes one object, retrying until it is advertised, lost to another replica,
    /// or the tier is gone.
    async fn publish(&self, mut client: Client, info: ObjectInfo, ts_ms: u64) {
        {
            let Some(tier) = self.tier.upgrade() else {
                return;
            };
            let (Some(endpoint), Some((key, tombstone_key))) = (
                tier.endpoint_id(info.name.endpoint),
                self.member.keys.of_object(&info),
            ) else {
                return;
            };
            let mut backoff = Duration::from_millis(50);
            loop {
                let Some(id) = self.member.identity() else {
                    // Not registered (etcd away at start, or the lease was lost): wait.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                };
                let advert = self.advert(&info, endpoint.clone(), id.generation, ts_ms);
                match publish_once(&mut client, &self.member, id, &key, &tombstone_key, &advert)
                    .await
                {
                    Ok(Published::Done) => {
                        bump(&self.stats.publish_transactions);
                        bump(&self.stats.published);
                        break;
                    }
                    Ok(Published::Lost) => {
                        bump(&self.stats.publish_lost);
                        self.lost(&tier, &info, &key).await;
                        break;
                    }
                    Ok(Published::Fenced) => {
                        // Counted; the object is still ours and valid: it is advertised
                        // again under the next registration.
                        bump(&self.stats.fenced);
                        self.member.lost(id);
                    }
                    Err(e) => {
                        bump(&self.stats.publish_retries);
                        tracing::debug!(error = %e, "advertisement not published yet; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                    }
                }
            }
        }
    }

    /// Another replica holds the run (or a tombstone does): delete this replica's copy
    /// (never advertised, so nobody else reads it). The winner is served through the
    /// follower, which indexes it afresh unless its withdrawal came first.
    async fn lost(&self, tier: &Arc<RemoteTier>, ours: &ObjectInfo, key: &str) {
        let t = tier.clone();
        let name = ours.name.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Err(e) = t.delete(&name) {
                tracing::warn!(object = %name.manifest, error = %e, "cannot delete an object that lost its run to another replica");
            }
        })
        .await;
        let _ = self.reindex.send(key.as_bytes().to_vec());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

    use std::sync::Arc;
    use std::time::Duration;

    use kvtier_core::hash::BlockHash;
    use kvtier_core::layout::LayoutDigest;
    use kvtier_remote::{ObjectInfo, ObjectName};

    use super::*;
    use crate::gc::{self, Authority, Reason, Withdrawal};
    use crate::keys::Keys;
    use crate::stats::ClusterStats;

    fn object(seq: u8) -> ObjectInfo {
        ObjectInfo {
            name: ObjectName {
                endpoint: 0,
                manifest: format!("kv/x.w.b.1.{seq}.kvm"),
            },
            layout: LayoutDigest([1; 16]),
            first_position: 0,
            first_parent: BlockHash([1; 16]),
            blocks: vec![BlockHash([seq; 16])],
            block_bytes: 64,
            manifest_digest: [0; 32],
        }
    }

    /// A replica that registered again (after a partition or a stall, or a second
    /// process under the same id) fences its old identity: every publish and delete
    /// under it is refused and writes nothing.
    #[test]
    fn writes_under_an_old_generation_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let etcd = kvtier_testkit::EtcdCluster::start(dir.path(), 1).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let mut client = crate::connect_once(&etcd.endpoints()).await.unwrap();
            let keys = Keys::new("fence");
            let member = Membership::new(
                "b",
                keys.clone(),
                Duration::from_secs(5),
                Arc::new(ClusterStats::default()),
            );
            let old = member.register(&mut client, 1).await.unwrap();
            let info = object(1);
            let (key, tomb) = keys.of_object(&info).unwrap();
            let advert = Advert::of(&info, "e".into(), "b", old.generation, "default", 1);
            let done = publish_once(&mut client, &member, old, &key, &tomb, &advert).await;
            assert!(matches!(done.unwrap(), Published::Done));

            let new = member.register(&mut client, 2).await.unwrap();
            assert_eq!(new.generation, old.generation + 1);
            let info2 = object(2);
            let (key2, tomb2) = keys.of_object(&info2).unwrap();
            let stale = Advert::of(&info2, "e".into(), "b", old.generation, "default", 2);
            let refused = publish_once(&mut client, &member, old, &key2, &tomb2, &stale).await;
            assert!(matches!(refused.unwrap(), Published::Fenced));
            assert!(
                client
                    .get(key2.as_str(), None)
                    .await
                    .unwrap()
                    .kvs()
                    .is_empty()
            );

            let seen = gc::read_advert(&mut client, &keys, &key)
                .await
                .unwrap()
                .unwrap();
            let stale_delete = gc::withdraw(
                &mut client,
                &member,
                &Authority::Owner(old),
                &key,
                &seen,
                Reason::Owner,
                3,
            )
            .await
            .unwrap();
            assert_eq!(stale_delete, Withdrawal::Fenced);
            assert!(
                !client
                    .get(key.as_str(), None)
                    .await
                    .unwrap()
                    .kvs()
                    .is_empty()
            );
            assert!(
                client
                    .get(tomb.as_str(), None)
                    .await
                    .unwrap()
                    .kvs()
                    .is_empty()
            );

            // The current identity may do both.
            let fresh = Advert::of(&info2, "e".into(), "b", new.generation, "default", 4);
            let ok = publish_once(&mut client, &member, new, &key2, &tomb2, &fresh).await;
            assert!(matches!(ok.unwrap(), Published::Done));
            let deleted = gc::withdraw(
                &mut client,
                &member,
                &Authority::Owner(new),
                &key,
                &seen,
                Reason::Owner,
                5,
            )
            .await
            .unwrap();
            assert!(matches!(deleted, Withdrawal::Withdrawn(_)));
        });
        drop(etcd);
    }
}
