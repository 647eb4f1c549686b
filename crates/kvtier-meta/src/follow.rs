//! Following the advertisements: a full read of the prefix at one revision R (paginated,
//! [`crate::status::read_pages`]), then a watch from R+1 with progress notifications. A
//! watch cancelled because its start revision was compacted triggers a full resync that
//! diffs what this replica serves against a fresh read — objects that vanished are
//! forgotten, new ones adopted — never a silent skip. A broken stream resumes from the
//! last revision applied.
//!
//! Local tiers serve while this runs: it starts after the engine is up.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, WatchOptions};
use kvtier_core::snapshot::SnapshotKey;
use kvtier_remote::{Adopted, ObjectName, RemoteTier};

use crate::keys::Keys;
use crate::record::{Advert, Advertised, StateAdvert};
use crate::stats::{ClusterStats, bump};
use crate::status::{MAX_MESSAGE, read_pages};
use crate::view::View;

/// What the follower applied, by advertisement key.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    known: HashMap<Vec<u8>, ObjectName>,
    /// State advertisements (a state follower's only kind).
    states: HashMap<Vec<u8>, SnapshotKey>,
}

/// The follower's state.
pub(crate) struct Follower {
    pub(crate) tier: Weak<RemoteTier>,
    pub(crate) prefix: String,
    /// How records are opened (checked against the cluster's signing key).
    pub(crate) keys: Keys,
    pub(crate) stats: Arc<ClusterStats>,
    pub(crate) wall_ms: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// A test hook: each watch response is applied this much later (a slow consumer).
    pub(crate) slow_consumer: Duration,
    /// A test hook: while it holds true, no response is applied (a stalled consumer).
    pub(crate) hold: tokio::sync::watch::Receiver<bool>,
    pub(crate) applied: Applied,
    /// Every advertisement read, whether the tier could use it or not (the GC leader's
    /// view of the cluster).
    pub(crate) view: Arc<View>,
    /// Notified once the first full read was applied.
    pub(crate) replayed: Arc<tokio::sync::Notify>,
    /// Advertisement keys whose object must be indexed afresh (sent by the publisher
    /// after deleting its own copy of a run another replica won): handled in order with
    /// the watch's events, so a withdrawal already applied is never undone.
    pub(crate) reindex: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    /// True once the first full read was applied (the view is whole).
    pub(crate) ready: Arc<std::sync::atomic::AtomicBool>,
    /// Follows state advertisements ([`crate::record::StateAdvert`]) instead of runs.
    pub(crate) states: bool,
}

enum WatchEnd {
    /// The start revision was compacted away: resync.
    Compacted,
    /// The stream broke: resume from this revision (the last one applied, whose events
    /// a fragmented response may have split, or the next after a progress notification).
    Broken(i64),
    /// The tier is gone: stop.
    Stopped,
}

impl Follower {
    /// Runs until the tier is dropped.
    pub(crate) async fn run(mut self, mut client: Client) {
        let mut first = true;
        loop {
            let started = Instant::now();
            let revision = match self.full_read(&mut client, !first).await {
                Some(r) => r,
                None => {
                    if self.tier.upgrade().is_none() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            if first {
                if !self.states {
                    self.stats
                        .replay_ms
                        .store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
                self.ready.store(true, Ordering::SeqCst);
                self.replayed.notify_waiters();
                first = false;
            }
            let mut from = revision + 1;
            loop {
                match self.watch(&mut client, from).await {
                    WatchEnd::Stopped => return,
                    WatchEnd::Compacted => {
                        bump(&self.stats.resyncs_compacted);
                        tracing::warn!(
                            "cluster watch fell behind a compaction; resyncing from a full read"
                        );
                        break;
                    }
                    WatchEnd::Broken(resume) => {
                        bump(&self.stats.watch_resumes);
                        from = resume;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
    }

    /// Reads every advertisement at one revision and makes the tier serve exactly those
    /// (with `diff`, forgetting what it served that is gone). Returns the revision, or
    /// `None` if etcd could not be read.
    async fn full_read(&mut self, client: &mut Client, diff: bool) -> Option<i64> {
        let tier = self.tier.upgrade()?;
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let prefix = self.prefix.clone();
        let read = read_pages(client, &prefix, |kvs| {
            for kv in kvs {
                bump(&self.stats.replay_records);
                seen.insert(kv.key().to_vec());
                self.apply_put(&tier, kv.key(), kv.value(), kv.mod_revision(), false);
            }
        })
        .await;
        let revision = match read {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the cluster's advertisements; retrying");
                return None;
            }
        };
        if diff {
            let gone: Vec<Vec<u8>> = self
                .applied
                .known
                .keys()
                .chain(self.applied.states.keys())
                .filter(|k| !seen.contains(*k))
                .cloned()
                .collect();
            for key in gone {
                self.apply_delete(&tier, &key);
            }
            self.view
                .retain_under(self.prefix.as_bytes(), |k| seen.contains(k));
        }
        Some(revision)
    }

    async fn watch(&mut self, client: &mut Client, from: i64) -> WatchEnd {
        // Fragmented, under a decode bound well above etcd's own bound on a record: a
        // watch catching up after a gap gets up to 1,000 revisions in one response,
        // which gRPC's default bound (4 MiB) would refuse on every resume, forever.
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from)
            .with_progress_notify()
            .with_fragment();
        let mut watch = client.watch_client().max_decoding_message_size(MAX_MESSAGE);
        let mut stream = match watch.watch(self.prefix.as_str(), Some(options)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "cannot open the cluster watch; retrying");
                return WatchEnd::Broken(from);
            }
        };
        // Where to resume if the stream breaks. The last applied revision itself, not
        // the next: a fragmented response may have split its events, and applying the
        // ones already seen again changes nothing (records are idempotent).
        let mut resume = from;
        loop {
            let next = tokio::select! {
                m = stream.message() => m,
                Some(key) = self.reindex.recv() => {
                    self.reindex(&key);
                    continue;
                }
            };
            let message = match next {
                Ok(Some(m)) => m,
                Ok(None) | Err(_) => return WatchEnd::Broken(resume),
            };
            if message.canceled() {
                if message.compact_revision() > 0 {
                    return WatchEnd::Compacted;
                }
                return WatchEnd::Broken(resume);
            }
            if !self.slow_consumer.is_zero() && !message.events().is_empty() {
                tokio::time::sleep(self.slow_consumer).await;
            }
            if self.hold.wait_for(|held| !held).await.is_err() {
                return WatchEnd::Stopped;
            }
            let Some(tier) = self.tier.upgrade() else {
                return WatchEnd::Stopped;
            };
            for event in message.events() {
                let Some(kv) = event.kv() else { continue };
                match event.event_type() {
                    EventType::Put => {
                        if self.apply_put(&tier, kv.key(), kv.value(), kv.mod_revision(), true) {
                            bump(&self.stats.adverts_applied);
                        }
                    }
                    EventType::Delete => {
                        bump(&self.stats.withdrawals_applied);
                        self.apply_delete(&tier, kv.key());
                    }
                }
                resume = resume.max(kv.mod_revision());
            }
            if message.events().is_empty()
                && !message.created()
                && let Some(h) = message.header()
            {
                // A progress notification (etcd sends them only to a watcher that has
                // seen everything) moves the revision on without events. Not any other
                // header: a catch-up batch is capped at 1,000 revisions but carries the
                // store's current revision, and so does the answer that creates a watch
                // starting in the past.
                resume = resume.max(h.revision() + 1);
            }
        }
    }

    /// Adopts the object an advertisement names; with `check_now`, its manifest is
    /// checked right away on a blocking thread, so the first load is one GET.
    fn apply_put(
        &mut self,
        tier: &Arc<RemoteTier>,
        key: &[u8],
        value: &[u8],
        revision: i64,
        check_now: bool,
    ) -> bool {
        if self.states {
            return self.apply_state(tier, key, value, revision);
        }
        let advert: Advert = match self.keys.open(key, value) {
            Ok(a) => a,
            Err(e) => {
                bump(&self.stats.records_refused);
                tracing::warn!(key = %String::from_utf8_lossy(key), error = %e, "an advertisement is not a record this replica reads");
                // Whatever the key named before is no longer vouched for.
                self.apply_delete(tier, key);
                return false;
            }
        };
        let lag = (self.wall_ms)().saturating_sub(advert.ts_ms);
        // An object this replica serves already (its own, or one it checked): nothing to
        // adopt. The common case on a busy replica: it receives every record it writes.
        if let Some(endpoint) = tier.endpoint_index(&advert.endpoint) {
            let name = ObjectName {
                endpoint,
                manifest: advert.object.clone(),
            };
            if tier.serves(&name) {
                if check_now {
                    self.stats.advertise_lag_ms.store(lag, Ordering::Relaxed);
                }
                self.applied.known.insert(key.to_vec(), name);
                self.view.put(key, Advertised::Run(advert), revision);
                return true;
            }
        }
        let info = match advert.describe(tier) {
            Ok(i) => i,
            Err(why) => {
                self.view.put(key, Advertised::Run(advert), revision);
                bump(&self.stats.records_refused);
                tracing::warn!(key = %String::from_utf8_lossy(key), reason = %why, "not adopting an advertisement");
                return false;
            }
        };
        self.view.put(key, Advertised::Run(advert), revision);
        match tier.adopt_described(&info) {
            Adopted::Blocks(_) => {
                // Not served before (objects already served took the path above): its
                // manifest is checked now, so the first load is one GET.
                if check_now {
                    self.stats.advertise_lag_ms.store(lag, Ordering::Relaxed);
                    let t = tier.clone();
                    let name = info.name.clone();
                    tokio::task::spawn_blocking(move || t.check(&name));
                }
                self.applied.known.insert(key.to_vec(), info.name);
                true
            }
            Adopted::Refused(why) | Adopted::Unreachable(why) => {
                bump(&self.stats.records_refused);
                tracing::warn!(key = %String::from_utf8_lossy(key), reason = %why, "the remote tier refused an advertisement");
                false
            }
        }
    }

    /// Indexes the object advertised under `key` afresh, if this replica serves it: its
    /// blocks may still have pointed at a copy that is deleted now.
    fn reindex(&mut self, key: &[u8]) {
        let (Some(tier), Some(name)) = (self.tier.upgrade(), self.applied.known.get(key)) else {
            return;
        };
        let Some(info) = self
            .view
            .get(key)
            .and_then(|s| s.advert.run()?.describe(&tier).ok())
        else {
            return;
        };
        tier.forget(name);
        tier.adopt_described(&info);
        tokio::task::spawn_blocking(move || tier.check(&info.name));
    }

    fn apply_delete(&mut self, tier: &Arc<RemoteTier>, key: &[u8]) {
        // An unknown key is a no-op: records are idempotent.
        self.view.remove(key);
        if let Some(name) = self.applied.known.remove(key) {
            tier.forget(&name);
        }
        if let Some(state) = self.applied.states.remove(key) {
            tier.forget_state(&state);
        }
    }

    /// Serves the state object a state advertisement names (its first read verifies
    /// it); a record this build cannot use withdraws whatever the key named before. Every
    /// record that parses joins the view, served or not, so the GC weighs it.
    fn apply_state(
        &mut self,
        tier: &Arc<RemoteTier>,
        key: &[u8],
        value: &[u8],
        revision: i64,
    ) -> bool {
        let advert = match self.keys.open::<StateAdvert>(key, value) {
            Ok(a) => a,
            Err(e) => {
                bump(&self.stats.records_refused);
                tracing::warn!(key = %String::from_utf8_lossy(key), error = %e, "a state advertisement is not a record this replica reads");
                self.apply_delete(tier, key);
                return false;
            }
        };
        let state = advert.describe(tier);
        let previous = self.applied.states.remove(key);
        self.view.put(key, Advertised::State(advert), revision);
        let adopted = match state {
            Ok(state) if tier.adopt_state(&state) => Some(state.key),
            Ok(state) => {
                tracing::warn!(key = %String::from_utf8_lossy(key), object = %state.name, "the remote tier refused a state advertisement");
                None
            }
            Err(why) => {
                tracing::warn!(key = %String::from_utf8_lossy(key), reason = %why, "not adopting a state advertisement");
                None
            }
        };
        // Whatever the key named before is no longer vouched for, unless it is the same.
        if let Some(old) = previous
            && Some(old) != adopted
        {
            tier.forget_state(&old);
        }
        match adopted {
            Some(state) => {
                bump(&self.stats.states_adopted);
                self.applied.states.insert(key.to_vec(), state);
                true
            }
            None => {
                bump(&self.stats.records_refused);
                false
            }
        }
    }
}
