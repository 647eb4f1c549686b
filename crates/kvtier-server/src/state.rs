//! What every request handler shares: the node (engine and settings), the metrics.

use std::sync::Arc;

use kvtier_core::Engine;
use kvtier_node::{Node, Settings};

use crate::metrics::Metrics;

/// Shared by all handlers.
pub struct AppState {
    /// The engine (the node's, kept here for the handlers' convenience).
    pub engine: Arc<Engine>,
    /// The node: engine, settings in force, SSD recovery report.
    pub node: Arc<Node>,
    /// Request metrics.
    pub metrics: Metrics,
    /// One admin change at a time.
    pub admin: tokio::sync::Mutex<()>,
}

impl AppState {
    /// Assembles the node (see [`Node::open`]) and the metrics over it.
    pub fn open(settings: Settings) -> Result<Arc<Self>, kvtier_core::Error> {
        let node = Node::open(settings)?;
        let metrics = Metrics::new();
        metrics.attach(
            &node.engine,
            node.recovery.clone(),
            node.cluster.as_ref().map(|c| c.stats().clone()),
            node.kv_events.as_ref().map(|k| k.stats_reader()),
        );
        Ok(Arc::new(Self {
            engine: node.engine.clone(),
            node,
            metrics,
            admin: tokio::sync::Mutex::new(()),
        }))
    }
}
