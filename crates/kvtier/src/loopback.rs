//! `kvtier demo` and `kvtier bench --models` run turns through `kvtier serve` on loopback.
//! kvtier-candle only defines that seam (`ServeLauncher`), so that the model crate never
//! depends on the HTTP server; this binary, which has both, fills it with the server's own
//! code on a thread of this process (`kvtier_server::LocalServer`).
//!
//! The model tests in `tests/models_served/` include this file too, to run the demo with
//! the same launcher the binary uses.

use kvtier_candle::reuse::{LoopbackServer, ServeLauncher};
use kvtier_server::LocalServer;

/// Starts each server as a [`LocalServer`] in this process.
#[derive(Debug, Clone, Copy, Default)]
pub struct InProcess;

impl ServeLauncher for InProcess {
    fn launch(
        &self,
        settings: kvtier_node::Settings,
    ) -> kvtier_candle::Result<Box<dyn LoopbackServer>> {
        let server = LocalServer::start(settings).map_err(kvtier_candle::Error::Serve)?;
        Ok(Box::new(Served(server)))
    }
}

/// A [`LocalServer`] seen through the seam.
#[derive(Debug)]
struct Served(LocalServer);

impl LoopbackServer for Served {
    fn url(&self) -> String {
        self.0.url()
    }

    fn stop(self: Box<Self>) {
        // The demo and the bench need the server gone, not its report: dropping the
        // report is fine, `LocalServer::stop` has already joined the server's thread.
        let _ = self.0.stop();
    }
}
