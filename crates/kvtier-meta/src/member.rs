//! Membership and fencing: a leased member key (liveness only) and a generation counter
//! bumped on every registration. Every publish and delete compares both in its
//! transaction, so a replica that lost its lease — a partition, a long stall — cannot
//! write under its old identity when it comes back; it registers again with a new
//! generation first.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use parking_lot::RwLock;

use crate::keys::Keys;
use crate::record::{Member, RECORD_VERSION};
use crate::stats::{ClusterStats, bump};

/// Who this replica is right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The generation of the current registration.
    pub generation: u64,
    /// The lease its member key is attached to.
    pub lease: i64,
}

/// This replica's membership: the current identity (none until registered, and none
/// again once the lease is known lost).
#[derive(Debug)]
pub struct Membership {
    pub(crate) replica: String,
    pub(crate) keys: Keys,
    ttl: Duration,
    current: RwLock<Option<Identity>>,
    stats: Arc<ClusterStats>,
}

impl Membership {
    pub(crate) fn new(replica: &str, keys: Keys, ttl: Duration, stats: Arc<ClusterStats>) -> Self {
        Self {
            replica: replica.to_string(),
            keys,
            ttl,
            current: RwLock::new(None),
            stats,
        }
    }

    /// The current identity, if registered.
    pub fn identity(&self) -> Option<Identity> {
        *self.current.read()
    }

    /// The conditions every write of this replica carries: its generation is still the
    /// current one and its member key still holds its lease.
    pub(crate) fn fence(&self, id: Identity) -> Vec<Compare> {
        vec![
            Compare::value(
                self.keys.generation(&self.replica),
                CompareOp::Equal,
                id.generation.to_string(),
            ),
            Compare::lease(self.keys.member(&self.replica), CompareOp::Equal, id.lease),
        ]
    }

    /// Forgets the identity (the lease is gone, or a write was fenced): the next write
    /// waits for a new registration.
    pub(crate) fn lost(&self, id: Identity) {
        let mut cur = self.current.write();
        if *cur == Some(id) {
            *cur = None;
        }
    }

    /// Registers: a new lease, the generation counter bumped and the member key written
    /// under the lease, in one transaction (retried if another registration of the same
    /// replica raced it).
    pub(crate) async fn register(
        &self,
        client: &mut Client,
        now_ms: u64,
    ) -> Result<Identity, etcd_client::Error> {
        let lease = client
            .lease_grant(self.ttl.as_secs().max(2) as i64, None)
            .await?
            .id();
        let gen_key = self.keys.generation(&self.replica);
        loop {
            let got = client.get(gen_key.as_str(), None).await?;
            let (current, revision) = match got.kvs().first() {
                Some(kv) => (
                    kv.value_str()
                        .ok()
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0),
                    kv.mod_revision(),
                ),
                None => (0, 0),
            };
            let generation = current + 1;
            let member = serde_json::to_string(&Member {
                v: RECORD_VERSION,
                replica: self.replica.clone(),
                generation,
                since_ms: now_ms,
            })
            .unwrap_or_default();
            let txn = Txn::new()
                .when(vec![Compare::mod_revision(
                    gen_key.as_str(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then(vec![
                    TxnOp::put(gen_key.as_str(), generation.to_string(), None),
                    TxnOp::put(
                        self.keys.member(&self.replica),
                        member,
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                ]);
            if client.txn(txn).await?.succeeded() {
                let id = Identity { generation, lease };
                *self.current.write() = Some(id);
                bump(&self.stats.registrations);
                tracing::info!(replica = %self.replica, generation, "registered in the cluster");
                return Ok(id);
            }
        }
    }

    /// Keeps the lease alive; returns when it is lost (expired, revoked, or etcd
    /// unreachable for longer than the TTL), after forgetting the identity.
    pub(crate) async fn keep(&self, client: &mut Client, id: Identity) {
        let why = keep_alive(client, id.lease, self.ttl).await;
        tracing::warn!(replica = %self.replica, generation = id.generation, reason = why, "cluster lease lost; registering again");
        self.lost(id);
    }

    /// Whether a failed transaction's `or_else` reads (the generation key and the member
    /// key, first) show that this replica was fenced off.
    pub(crate) fn was_fenced(id: Identity, responses: &[TxnOpResponse]) -> bool {
        let value_of = |i: usize| match responses.get(i) {
            Some(TxnOpResponse::Get(g)) => {
                g.kvs().first().map(|kv| (kv.value().to_vec(), kv.lease()))
            }
            _ => None,
        };
        let generation_ok =
            value_of(0).is_some_and(|(v, _)| v == id.generation.to_string().into_bytes());
        let lease_ok = value_of(1).is_some_and(|(_, lease)| lease == id.lease);
        !(generation_ok && lease_ok)
    }
}

/// Renews `lease` (granted with `ttl`) until it is lost; returns why: it expired, or etcd
/// did not confirm a renewal for a whole TTL (the lease must be presumed gone).
pub(crate) async fn keep_alive(client: &mut Client, lease: i64, ttl: Duration) -> &'static str {
    let every = (ttl / 3).max(Duration::from_millis(500));
    let mut last_ok = tokio::time::Instant::now();
    loop {
        let renewed = async {
            let (mut keeper, mut stream) = client.lease_keep_alive(lease).await?;
            keeper.keep_alive().await?;
            Ok::<_, etcd_client::Error>(stream.message().await?.map(|r| r.ttl()))
        };
        match tokio::time::timeout(every, renewed).await {
            Ok(Ok(Some(left))) if left > 0 => last_ok = tokio::time::Instant::now(),
            Ok(Ok(_)) => return "expired",
            _ => {
                if last_ok.elapsed() >= ttl {
                    return "not renewed within its TTL";
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}
