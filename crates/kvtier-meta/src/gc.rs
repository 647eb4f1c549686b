//! Two-phase deletion of shared objects, runs and state objects alike (docs/cluster.md,
//! "Deleting").
//!
//! Replicas read objects without telling anyone (no reader leases), so an object may be
//! deleted only once no read of it can still be running:
//!
//! 1. **Withdraw**: one transaction deletes the advertisement and writes a tombstone,
//!    compared against the record's revision (nothing changed since it was judged) and
//!    the deleter's authority — the owner's current generation and lease, or the GC
//!    leader's election key. Every replica's watch then forgets the object: no new read
//!    starts.
//! 2. **Grace**: wait [`crate::ClusterConfig::gc_grace`], longer than a withdrawal takes
//!    to reach the replicas plus the remote read deadline, so reads that started before
//!    the withdrawal have finished or given up.
//! 3. **Delete**: the manifest first (the commit point: without it nobody adopts the
//!    object), then the data, then the tombstone (while it exists no replica can
//!    advertise the run again). A state object is one object: it goes, then its
//!    tombstone. Anyone may finish a due tombstone — the deleter, or the
//!    leader for a deleter that died — and finishing twice is harmless.

use std::sync::Arc;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use kvtier_remote::RemoteTier;

use crate::keys::Keys;
use crate::member::{Identity, Membership};
use crate::record::{Advert, Advertised, RECORD_VERSION, Tombstone};
use crate::stats::{ClusterStats, add, bump};
use crate::view::Seen;

/// Who is deleting.
#[derive(Debug, Clone)]
pub(crate) enum Authority {
    /// The object's owner under its current registration.
    Owner(Identity),
    /// The GC leader, holding the election key `key` created at `revision`.
    Leader {
        /// The election key.
        key: Vec<u8>,
        /// Its create revision: the transaction fails once another leader holds it.
        revision: i64,
    },
}

/// How a withdrawal ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Withdrawal {
    /// The advertisement is gone and a tombstone written; the object is deleted after the
    /// grace window.
    Withdrawn(Box<Tombstone>),
    /// No advertisement of that object exists (never advertised, or already withdrawn).
    Unknown,
    /// Another replica owns the object; only it (or the GC leader, once it is gone) may
    /// delete it.
    NotOwner(String),
    /// The deleter's registration or leadership is not current: nothing was written.
    Fenced,
    /// The record changed between reading and the transaction (another deleter, or a
    /// replica that came back): nothing was written.
    Changed,
}

/// Why the deleter deletes, written into the tombstone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The owner asked.
    Owner,
    /// The owner has been gone longer than `orphan_after`.
    Orphan,
    /// Its namespace is over budget.
    Budget,
    /// Its layout was deleted (a delete marker newer than the advertisement).
    Deleted,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Self::Owner => "owner",
            Self::Orphan => "orphan",
            Self::Budget => "budget",
            Self::Deleted => "deleted",
        }
    }
}

/// Reads the run advertisement under `key`, with its revision.
pub(crate) async fn read_advert(
    client: &mut Client,
    keys: &Keys,
    key: &str,
) -> Result<Option<Seen>, etcd_client::Error> {
    let got = client.get(key, None).await?;
    Ok(got.kvs().first().and_then(|kv| {
        keys.open::<Advert>(kv.key(), kv.value())
            .ok()
            .map(|advert| Seen {
                advert: Advertised::Run(advert),
                revision: kv.mod_revision(),
            })
    }))
}

/// Withdraws the advertisement `seen` under `key` (step 1).
pub(crate) async fn withdraw(
    client: &mut Client,
    member: &Membership,
    authority: &Authority,
    key: &str,
    seen: &Seen,
    reason: Reason,
    now_ms: u64,
) -> Result<Withdrawal, etcd_client::Error> {
    let Some(tombstone_key) = member.keys.tombstone_of(key) else {
        return Ok(Withdrawal::Unknown);
    };
    let mut when = match authority {
        Authority::Owner(id) => {
            if seen.advert.owner() != member.replica {
                return Ok(Withdrawal::NotOwner(seen.advert.owner().to_owned()));
            }
            member.fence(*id)
        }
        Authority::Leader { key, revision } => {
            let mut when = vec![Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                *revision,
            )];
            if reason == Reason::Orphan {
                // The owner must still be gone when the withdrawal lands.
                when.push(Compare::version(
                    member.keys.member(seen.advert.owner()),
                    CompareOp::Equal,
                    0,
                ));
            }
            when
        }
    };
    when.push(Compare::mod_revision(key, CompareOp::Equal, seen.revision));
    when.push(Compare::version(
        tombstone_key.as_str(),
        CompareOp::Equal,
        0,
    ));
    let tombstone = Tombstone {
        v: RECORD_VERSION,
        of: seen.advert.clone(),
        by: member.replica.clone(),
        generation: match authority {
            Authority::Owner(id) => id.generation,
            Authority::Leader { .. } => member.identity().map_or(0, |i| i.generation),
        },
        at_ms: now_ms,
        reason: reason.as_str().into(),
    };
    let value = member.keys.seal(&tombstone_key, &tombstone);
    let fence_reads = match authority {
        Authority::Owner(_) => vec![
            TxnOp::get(member.keys.generation(&member.replica), None),
            TxnOp::get(member.keys.member(&member.replica), None),
        ],
        Authority::Leader { key, .. } => vec![TxnOp::get(key.clone(), None)],
    };
    let txn = Txn::new()
        .when(when)
        .and_then(vec![
            TxnOp::delete(key, None),
            TxnOp::put(tombstone_key.as_str(), value, None),
        ])
        .or_else(fence_reads);
    let response = client.txn(txn).await?;
    if response.succeeded() {
        return Ok(Withdrawal::Withdrawn(Box::new(tombstone)));
    }
    let reads = response.op_responses();
    let fenced = match authority {
        Authority::Owner(id) => Membership::was_fenced(*id, &reads),
        Authority::Leader { revision, .. } => !matches!(
            reads.first(),
            Some(TxnOpResponse::Get(g))
                if g.kvs().first().is_some_and(|kv| kv.create_revision() == *revision)
        ),
    };
    Ok(if fenced {
        Withdrawal::Fenced
    } else {
        Withdrawal::Changed
    })
}

/// Deletes a tombstoned object and then its tombstone (step 3); `revision` is the
/// tombstone's, so a tombstone rewritten meanwhile is left alone. Returns the bytes
/// deleted, or why nothing was (the object stays tombstoned: another sweep retries).
pub(crate) async fn finish(
    client: &mut Client,
    tier: &Arc<RemoteTier>,
    stats: &ClusterStats,
    tombstone_key: &str,
    tombstone: &Tombstone,
    revision: i64,
) -> Result<u64, String> {
    let t = tier.clone();
    match &tombstone.of {
        Advertised::Run(advert) => {
            let name = advert.describe(tier)?.name;
            tokio::task::spawn_blocking(move || t.delete(&name).map(drop))
        }
        Advertised::State(advert) => {
            let state = advert.describe(tier)?;
            tokio::task::spawn_blocking(move || t.delete_state(&state))
        }
    }
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    let txn = Txn::new()
        .when(vec![Compare::mod_revision(
            tombstone_key,
            CompareOp::Equal,
            revision,
        )])
        .and_then(vec![TxnOp::delete(tombstone_key, None)]);
    let done = client.txn(txn).await.map_err(|e| e.to_string())?;
    if done.succeeded() {
        let bytes = tombstone.of.bytes();
        bump(&stats.gc_deleted);
        add(&stats.gc_bytes, bytes);
        tracing::info!(object = %tombstone.of.object(), reason = %tombstone.reason, bytes, "deleted a withdrawn object");
        Ok(bytes)
    } else {
        // Someone else finished it first (the object is gone either way).
        Ok(0)
    }
}

/// Reads the tombstone under `key` with its revision.
pub(crate) async fn read_tombstone(
    client: &mut Client,
    keys: &Keys,
    key: &str,
) -> Result<Option<(Tombstone, i64)>, etcd_client::Error> {
    let got = client.get(key, None).await?;
    Ok(got.kvs().first().and_then(|kv| {
        keys.open::<Tombstone>(kv.key(), kv.value())
            .ok()
            .map(|t| (t, kv.mod_revision()))
    }))
}
