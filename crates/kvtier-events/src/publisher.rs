//! [`KvEventPublisher`]: the sockets, the engine observer that feeds them, and the listing
//! that opens every epoch.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use crossbeam_channel::{Sender, bounded};
use kvtier_core::clock::Clock;
use kvtier_core::events::{ObserverHandle, ResidencyEvent, ResidencyObserver};
use kvtier_core::layout::LayoutDigest;
use kvtier_core::stats::Counter;
use kvtier_core::stats::CounterKind::{Counter as C, Gauge as G};
use kvtier_core::tier::TierKind;
use kvtier_core::{Engine, Error, ErrorKind, Result};
use parking_lot::Mutex;

use crate::access::{self, Zap};
use crate::config::KvEventsConfig;
use crate::sockets::{Shared, SocketLoop, next_epoch};
use crate::translate::Translator;
use crate::wire::WireEvent;
use crate::zmq::{self, Context, Socket, ZmqError};

/// Events in one published batch, at most (a listing of a large index spans many).
const MAX_BATCH_EVENTS: usize = 1024;

/// Batches waiting for the sockets' thread; when it falls behind, the engine's queue for
/// the observer fills and the publisher re-lists.
const SOCKET_QUEUE: usize = 1024;

/// How long closing waits for queued messages to leave.
const LINGER_MS: i32 = 200;

/// Publishes an engine's residency changes as vLLM KV events (see the crate docs).
/// Dropping it stops publishing: the observer is unregistered, what it queued is sent,
/// the sockets close.
pub struct KvEventPublisher {
    shared: Arc<Shared>,
    observer: Option<ObserverHandle>,
    thread: Option<JoinHandle<()>>,
    endpoint: String,
    replay_endpoint: Option<String>,
}

impl std::fmt::Debug for KvEventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvEventPublisher")
            .field("endpoint", &self.endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .field("epoch", &self.epoch())
            .finish()
    }
}

/// A publisher's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherStats {
    /// The current epoch (a sequence number shifted right by [`crate::EPOCH_SHIFT`]).
    pub epoch: u64,
    /// Batches published.
    pub batches: u64,
    /// Events in them.
    pub events: u64,
    /// Batches the PUB socket refused (they are still kept for replay).
    pub send_failures: u64,
    /// Replay requests answered.
    pub replay_requests: u64,
    /// Batches sent in answers.
    pub replayed_batches: u64,
    /// Malformed replay requests (not answered).
    pub bad_replay_requests: u64,
    /// Residency events the engine dropped because the publisher fell behind.
    pub missed: u64,
    /// Listings sent (one per epoch, plus one after every miss).
    pub relistings: u64,
    /// Empty batches sent because a subscriber subscribed (so it learns the sequence).
    pub welcomes: u64,
    /// CURVE handshakes refused: a client whose key is not allowed.
    pub refused_clients: u64,
}

impl PublisherStats {
    /// Every counter of the publisher, declared once: flat name `kv_events_{name}` in
    /// `/v1/stats`, family `kv_events_{name}` in `/metrics` (`_total` for a counter). The
    /// epoch is a level (it is replaced at every restart of publishing); the rest count.
    #[rustfmt::skip]
    pub const COUNTERS: &'static [Counter<PublisherStats>] = &[
        Counter { name: "epoch", family: "kv_events_epoch", label: None, help: "The current epoch of the KV-event sequence", kind: G, read: |s| s.epoch },
        Counter { name: "batches", family: "kv_events_batches", label: None, help: "KV-event batches published", kind: C, read: |s| s.batches },
        Counter { name: "events", family: "kv_events_events", label: None, help: "KV events in the published batches", kind: C, read: |s| s.events },
        Counter { name: "send_failures", family: "kv_events_send_failures", label: None, help: "Batches the PUB socket refused (still kept for replay)", kind: C, read: |s| s.send_failures },
        Counter { name: "replay_requests", family: "kv_events_replay_requests", label: None, help: "Replay requests answered", kind: C, read: |s| s.replay_requests },
        Counter { name: "replayed_batches", family: "kv_events_replayed_batches", label: None, help: "Batches sent in replay answers", kind: C, read: |s| s.replayed_batches },
        Counter { name: "bad_replay_requests", family: "kv_events_bad_replay_requests", label: None, help: "Malformed replay requests (not answered)", kind: C, read: |s| s.bad_replay_requests },
        Counter { name: "missed", family: "kv_events_missed", label: None, help: "Residency events the engine dropped because the publisher fell behind", kind: C, read: |s| s.missed },
        Counter { name: "relistings", family: "kv_events_relistings", label: None, help: "Listings sent (one per epoch, one after every miss)", kind: C, read: |s| s.relistings },
        Counter { name: "welcomes", family: "kv_events_welcomes", label: None, help: "Empty batches sent to teach a new subscriber the sequence", kind: C, read: |s| s.welcomes },
        Counter { name: "refused_clients", family: "kv_events_refused_clients", label: None, help: "CURVE handshakes refused: the client's key is not allowed", kind: C, read: |s| s.refused_clients },
    ];

    /// Every counter as registry samples (`kvtier_core::registry`), from [`Self::COUNTERS`].
    pub fn samples(&self) -> kvtier_core::registry::Samples {
        let mut out = kvtier_core::registry::Samples::default();
        out.table(Self::COUNTERS, "kv_events", self, &[]);
        out
    }
}

fn socket_error(what: String) -> impl FnOnce(ZmqError) -> Error {
    move |e| Error::new(ErrorKind::Invalid, what).with_source(e)
}

/// The sockets of a publisher, bound (or connected) and not yet publishing: binding comes
/// first so that a taken port fails a start before anything is opened.
pub struct BoundSockets {
    publisher: Socket,
    replay: Option<Socket>,
    /// Declared after the sockets it authenticates: dropped after them.
    zap: Option<Zap>,
    endpoint: String,
    replay_endpoint: Option<String>,
    config: KvEventsConfig,
}

impl std::fmt::Debug for BoundSockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundSockets")
            .field("endpoint", &self.endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .finish_non_exhaustive()
    }
}

impl KvEventPublisher {
    /// Binds (or connects) the sockets `config` names.
    pub fn bind(config: &KvEventsConfig) -> Result<BoundSockets> {
        if config.endpoint.is_empty() {
            return Err(Error::invalid("the KV-event endpoint is empty"));
        }
        if config.buffer_steps == 0 || config.queue_len == 0 {
            return Err(Error::invalid(
                "KV events need buffer_steps and queue_len of at least 1",
            ));
        }
        if config.hwm < 0 {
            return Err(Error::invalid("the KV-event high-water mark must be ≥ 0"));
        }
        access::check(config)?;
        let ctx = Context::new().map_err(socket_error("cannot start ZeroMQ".into()))?;
        // The ZAP handler first: a CURVE socket never exists without it.
        let zap = match &config.curve {
            None => None,
            Some(curve) => Some(Zap::bind(&ctx, &curve.clients).map_err(socket_error(
                "cannot start the KV events' authentication handler".into(),
            ))?),
        };
        let secure = |socket: &Socket| match &config.curve {
            None => Ok(()),
            Some(curve) => socket.set_curve_server(&curve.secret_key, access::ZAP_DOMAIN),
        };
        // XPUB: on the wire a PUB socket, but it also hands up each new subscription, which
        // is answered with an empty batch (see `SocketLoop`).
        let publisher = ctx
            .socket(zmq::XPUB)
            .map_err(socket_error("cannot create the KV-event socket".into()))?;
        publisher
            .set_sndhwm(config.hwm)
            .and_then(|()| publisher.set_xpub_verbose(true))
            .and_then(|()| publisher.set_linger(LINGER_MS))
            .and_then(|()| secure(&publisher))
            .map_err(socket_error("cannot configure the KV-event socket".into()))?;
        let endpoint = if config.connect {
            publisher
                .connect(&config.endpoint)
                .map_err(socket_error(format!(
                    "cannot connect KV events to {}",
                    config.endpoint
                )))?;
            config.endpoint.clone()
        } else {
            bind(&publisher, &config.endpoint)?
        };
        let (replay, replay_endpoint) = match &config.replay_endpoint {
            None => (None, None),
            Some(at) => {
                let replay = ctx.socket(zmq::ROUTER).map_err(socket_error(
                    "cannot create the KV-event replay socket".into(),
                ))?;
                // Room for a whole buffer per requester, and an error (not a silent drop)
                // when a requester is gone.
                let room = i32::try_from(config.buffer_steps.saturating_add(2)).unwrap_or(i32::MAX);
                replay
                    .set_sndhwm(room)
                    .and_then(|()| replay.set_router_mandatory(true))
                    .and_then(|()| replay.set_linger(LINGER_MS))
                    .and_then(|()| secure(&replay))
                    .map_err(socket_error(
                        "cannot configure the KV-event replay socket".into(),
                    ))?;
                let bound = bind(&replay, at)?;
                (Some(replay), Some(bound))
            }
        };
        Ok(BoundSockets {
            publisher,
            replay,
            zap,
            endpoint,
            replay_endpoint,
            config: config.clone(),
        })
    }

    /// Starts publishing `engine`'s residency changes on `sockets`, opening the first epoch
    /// with `AllBlocksCleared` and a listing of every block the engine holds now. `clock`
    /// stamps batches and epochs.
    pub fn start(
        engine: &Arc<Engine>,
        sockets: BoundSockets,
        clock: Arc<dyn Clock>,
    ) -> Result<KvEventPublisher> {
        let BoundSockets {
            publisher,
            replay,
            zap,
            endpoint,
            replay_endpoint,
            config,
        } = sockets;
        let shared = Arc::new(Shared::default());
        shared
            .epoch
            .store(next_epoch(clock.as_ref()), Ordering::Relaxed);
        let (tx, rx) = bounded::<Vec<WireEvent>>(SOCKET_QUEUE);
        let sockets = SocketLoop {
            publisher,
            replay,
            zap,
            topic: config.topic.as_bytes().to_vec(),
            buffer_steps: config.buffer_steps,
            clock,
            shared: shared.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("kvtier-kv-events".into())
            .spawn(move || sockets.run(&rx))
            .map_err(|e| {
                Error::new(ErrorKind::Unavailable, "cannot start the KV-event thread")
                    .with_source(e)
            })?;

        let observer = Arc::new(EventObserver {
            engine: Arc::downgrade(engine),
            translator: Mutex::new(Translator::default()),
            tx,
            shared: shared.clone(),
        });
        // Registered before the listing, under the translator's lock: whatever happens
        // meanwhile waits in the queue and is applied after the listing, which is at least
        // as new as anything before it (applying those events again changes nothing).
        let handle = {
            let mut t = observer.translator.lock();
            let handle = engine.observe("kv_events", observer.clone(), config.queue_len)?;
            observer.list_all(engine, &mut t);
            handle
        };
        tracing::info!(endpoint = %endpoint, replay = ?replay_endpoint, "publishing KV events");
        Ok(KvEventPublisher {
            shared,
            observer: Some(handle),
            thread: Some(thread),
            endpoint,
            replay_endpoint,
        })
    }

    /// Where the PUB socket is bound (the port filled in) or connected.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Where the replay socket is bound, if there is one.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// The current epoch (a sequence number shifted right by [`crate::EPOCH_SHIFT`]).
    pub fn epoch(&self) -> u64 {
        self.shared.epoch.load(Ordering::Relaxed)
    }

    /// The counters.
    pub fn stats(&self) -> PublisherStats {
        self.stats_reader().read()
    }

    /// A reader of the counters for a metrics collector (it outlives the publisher; its
    /// counters then stay as they were).
    pub fn stats_reader(&self) -> StatsReader {
        StatsReader(self.shared.clone())
    }
}

/// Reads a publisher's counters ([`KvEventPublisher::stats_reader`]).
#[derive(Debug, Clone)]
pub struct StatsReader(Arc<Shared>);

impl StatsReader {
    /// The counters now.
    pub fn read(&self) -> PublisherStats {
        let s = &self.0;
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        PublisherStats {
            epoch: get(&s.epoch),
            batches: get(&s.batches),
            events: get(&s.events),
            send_failures: get(&s.send_failures),
            replay_requests: get(&s.replay_requests),
            replayed_batches: get(&s.replayed_batches),
            bad_replay_requests: get(&s.bad_replay_requests),
            missed: get(&s.missed),
            relistings: get(&s.relistings),
            welcomes: get(&s.welcomes),
            refused_clients: get(&s.refused_clients),
        }
    }
}

impl Drop for KvEventPublisher {
    fn drop(&mut self) {
        // Unregistering ends the observer's thread once its queue is handed over; its
        // sender goes with it, and the sockets' thread ends when it has sent everything.
        self.observer.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Binds `socket` to `at` and says where it is bound (a port of 0 or `*` filled in).
fn bind(socket: &Socket, at: &str) -> Result<String> {
    socket
        .bind(at)
        .map_err(socket_error(format!("cannot bind KV events to {at}")))?;
    Ok(socket.last_endpoint().unwrap_or_else(|_| at.to_string()))
}

/// The engine observer: residency events → wire events → the sockets' thread.
struct EventObserver {
    /// Weak: the engine holds its observers.
    engine: Weak<Engine>,
    translator: Mutex<Translator>,
    tx: Sender<Vec<WireEvent>>,
    shared: Arc<Shared>,
}

impl EventObserver {
    fn block_size(engine: &Engine, layout: LayoutDigest) -> Option<u32> {
        engine
            .layout(layout)
            .ok()
            .and_then(|l| u32::try_from(l.tokens_per_block()).ok())
    }

    fn send(&self, t: &mut Translator) {
        if t.len() > 0 {
            // Fails only when the sockets' thread is gone (shutting down).
            let _ = self.tx.send(t.take());
        }
    }

    /// `AllBlocksCleared`, then every block the index holds, in every tier holding it.
    fn list_all(&self, engine: &Engine, t: &mut Translator) {
        let sizes = |l| Self::block_size(engine, l);
        self.send(t);
        t.cleared();
        for (block, tiers) in engine.index().entries() {
            for tier in TierKind::ALL {
                if tiers & tier.bit() != 0 {
                    t.stored(tier, &block, &sizes);
                    if t.len() >= MAX_BATCH_EVENTS {
                        self.send(t);
                    }
                }
            }
        }
        self.send(t);
        self.shared.relistings.fetch_add(1, Ordering::Relaxed);
    }
}

impl ResidencyObserver for EventObserver {
    fn observe(&self, events: &[ResidencyEvent]) {
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        let mut t = self.translator.lock();
        if self.shared.relist.swap(false, Ordering::Relaxed) {
            self.list_all(&engine, &mut t);
        }
        let sizes = |l| Self::block_size(&engine, l);
        let index = engine.index();
        let held = |tier: TierKind, b: &kvtier_core::tier::BlockMeta| {
            index.tiers_of(&b.hash) & tier.bit() != 0
        };
        for e in events {
            t.push(e, &held, &sizes);
            if t.len() >= MAX_BATCH_EVENTS {
                self.send(&mut t);
            }
        }
        self.send(&mut t);
    }

    fn missed(&self, count: u64) {
        self.shared.missed.fetch_add(count, Ordering::Relaxed);
        self.shared.relist.store(true, Ordering::Relaxed);
    }
}
