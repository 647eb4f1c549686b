//! The seam through which the demo and the bench reach a `kvtier serve` on loopback.
//!
//! Running the server's code needs the HTTP server crate; this crate stays below it (a
//! model crate that a Python package or an engine connector can use without the server).
//! So the caller that has the server — the `kvtier` binary — hands in a [`ServeLauncher`],
//! and this crate only ever sees a URL to talk to and a handle to stop.

use std::fmt::Debug;

use kvtier_node::Settings;

use crate::Result;

/// A running server reached over loopback; dropping it stops it as
/// [`LoopbackServer::stop`] does.
pub trait LoopbackServer: Send + Debug {
    /// `http://IP:PORT`, where the server listens. Callable at any time before `stop`.
    fn url(&self) -> String;

    /// Shuts the server down in order (requests in flight finish, the SSD writer drains)
    /// and returns once it has. An implementation must not return before the server has
    /// released its data directory, so a new server may open it next.
    fn stop(self: Box<Self>);
}

/// Starts servers on demand.
pub trait ServeLauncher: Send + Sync + Debug {
    /// Starts a server with `settings` and returns once it accepts connections. The
    /// caller sets `settings.listen` (port 0 for a free port) and `settings.data_dir`;
    /// an implementation must honour both and report a failure to start as an error.
    fn launch(&self, settings: Settings) -> Result<Box<dyn LoopbackServer>>;
}
