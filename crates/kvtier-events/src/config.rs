//! What a publisher binds, who may subscribe, and how much it keeps.

/// How the KV-event publisher is set up. The defaults follow vLLM's publisher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// The PUB socket's ZeroMQ endpoint, e.g. `tcp://127.0.0.1:5557` or
    /// `ipc:///run/kvtier-events`; beyond this host (`tcp://*:5557`, another address)
    /// only with [`Self::curve`]. A TCP port of 0 or `*` takes a free port;
    /// [`crate::KvEventPublisher::endpoint`] tells which.
    pub endpoint: String,
    /// Connect the PUB socket to `endpoint` (a router that binds its SUB socket, as
    /// llm-d's indexer does) instead of binding it.
    pub connect: bool,
    /// The ROUTER socket's endpoint for replay requests (always bound); `None`: no replay.
    pub replay_endpoint: Option<String>,
    /// The topic frame of every message.
    pub topic: String,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// The PUB socket's high-water mark (messages queued per subscriber before it drops).
    pub hwm: i32,
    /// Residency events the engine queues for the publisher; more are dropped, and the
    /// publisher then re-lists.
    pub queue_len: usize,
    /// CURVE on both sockets: encryption, and only the listed clients may subscribe or
    /// ask for a replay. `None`: plaintext, which only endpoints that stay on this host
    /// (loopback TCP, `ipc://`, `inproc://`) may use — the events carry every tenant's
    /// token ids.
    pub curve: Option<CurveConfig>,
}

impl KvEventsConfig {
    /// Refuses (`Invalid`) plaintext sockets that another host could reach: the events
    /// carry every tenant's token ids.
    pub fn check_access(&self) -> kvtier_core::Result<()> {
        crate::access::check(self)
    }
}

/// CURVE for the KV-event sockets: the server's secret key and the clients allowed.
#[derive(Clone, PartialEq, Eq)]
pub struct CurveConfig {
    /// The sockets' secret key (32 bytes; clients are given the public key derived
    /// from it).
    pub secret_key: [u8; 32],
    /// Public keys of the clients that may connect; anyone else's handshake is refused.
    pub clients: Vec<[u8; 32]>,
}

impl std::fmt::Debug for CurveConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CurveConfig")
            .field("secret_key", &"<redacted>")
            .field("clients", &self.clients.len())
            .finish()
    }
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            endpoint: "tcp://127.0.0.1:5557".into(),
            connect: false,
            replay_endpoint: None,
            topic: String::new(),
            buffer_steps: 10_000,
            hwm: 100_000,
            queue_len: 65_536,
            curve: None,
        }
    }
}
