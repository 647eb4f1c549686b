//! `kvtier serve` at the HTTP edge both front ends share (`kvtier_listen::http`: the
//! connection cap, the header, body and idle timeouts, lingering close): its routes as
//! the edge's handler, and the process's refusal log.

use std::net::SocketAddr;

use kvtier_listen::http::{Handler, Lanes, ListenSettings, TimedBody};
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use kvtier_listen::http::timed_out;

/// The process's refusal log: refused requests by error code, connections closed by a
/// limit by kind (counted for `/metrics`).
pub mod refusals {
    use std::sync::{Arc, LazyLock};

    pub use kvtier_listen::refusals::{INTERVAL, Level, Refusals};

    /// One per process, as the log itself is.
    pub static REFUSALS: LazyLock<Arc<Refusals>> =
        LazyLock::new(|| Arc::new(Refusals::new(INTERVAL)));
}

/// The routes, called once per request.
#[derive(Clone)]
struct Routes(axum::Router);

impl Handler for Routes {
    type Body = axum::body::Body;

    fn call(
        &self,
        request: axum::http::Request<TimedBody>,
        _peer: SocketAddr,
    ) -> impl Future<Output = axum::http::Response<axum::body::Body>> + Send + use<> {
        use hyper::service::Service as _;
        let svc = hyper_util::service::TowerToHyperService::new(self.0.clone());
        async move {
            match svc.call(request).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            }
        }
    }

    /// Stores and loads ([`kvtier_client::wire::is_bulk`]).
    fn is_bulk(&self, head: &[u8]) -> bool {
        kvtier_client::wire::is_bulk(head)
    }
}

/// Serves `router` on `listener` under `limits` through `lanes` until `stopping` turns
/// true (see `kvtier_listen::http::serve`).
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ListenSettings,
    lanes: Lanes,
    stopping: watch::Receiver<bool>,
) {
    let refusals = refusals::REFUSALS.clone();
    kvtier_listen::http::serve(listener, Routes(router), limits, &lanes, refusals, stopping).await;
}
