//! What a publisher binds and how much it keeps.

/// How the KV-event publisher is set up. The defaults follow vLLM's publisher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// The PUB socket's ZeroMQ endpoint, e.g. `tcp://*:5557` or `ipc:///run/kvtier-events`
    /// (a TCP port of 0 or `*` takes a free port; [`crate::KvEventPublisher::endpoint`]
    /// tells which).
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
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            endpoint: "tcp://*:5557".into(),
            connect: false,
            replay_endpoint: None,
            topic: String::new(),
            buffer_steps: 10_000,
            hwm: 100_000,
            queue_len: 65_536,
        }
    }
}
