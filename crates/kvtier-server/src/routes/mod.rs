//! The router: data endpoints (optionally behind the data token or a tenant's token),
//! admin endpoints (behind the admin token), health; every request timed into the latency
//! histograms.

mod admin;
pub(crate) mod auth;
mod batch;
mod data;
pub(crate) mod input;
mod load_stream;
mod ops;
mod raw_store;
mod rejections;
mod state;
mod upload;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{delete, get, post, put};

use self::auth::{Guard, authorize};
use crate::error::ApiError;
use crate::state::AppState;

// Shared with the shared arena's socket (`crate::shm`): a prompt and a layout are read the
// same way from either.
pub(crate) use data::prompt_of;
pub(crate) use input::known_layout;

async fn timed(State(app): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let start = Instant::now();
    let resp = next.run(req).await;
    app.metrics
        .observe(endpoint, resp.status().as_u16(), start.elapsed());
    resp
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_such_endpoint",
        "no such endpoint (see docs/API.md)",
    )
}

/// All routes over `app`.
pub fn router(app: Arc<AppState>) -> Router {
    let (data_guard, counters_guard, admin_guard) = {
        let auth = &app.node.settings.read().auth;
        (
            Guard::data(auth, true),
            Guard::data(auth, false),
            Guard::admin(auth),
        )
    };
    let data = Router::new()
        .route("/v1/layouts", post(data::register_layout))
        .route("/v1/layouts/{layout}", delete(data::delete_layout))
        .route("/v1/lookup", post(data::lookup))
        .route("/v1/lookup/batch", post(batch::lookup_batch))
        .route("/v1/load", post(data::load))
        .route("/v1/store", post(data::store))
        .route("/v1/store/raw", post(raw_store::store_raw))
        .route("/v1/store/batch", post(batch::store_batch))
        .route("/v1/snapshot", put(data::snapshot_put))
        .route("/v1/snapshot/get", post(data::snapshot_get))
        .route("/v1/checkpoint", put(state::checkpoint_put))
        .route("/v1/restore", post(state::restore))
        .route_layer(middleware::from_fn_with_state(data_guard, authorize));
    // Every tenant's counters: the all-tenants scope only.
    let counters = Router::new()
        .route("/v1/stats", get(data::stats))
        .route("/metrics", get(ops::metrics))
        .route_layer(middleware::from_fn_with_state(counters_guard, authorize));
    let admin = Router::new()
        .route("/admin/ssd", post(admin::ssd))
        .route("/admin/flush", post(admin::flush))
        .route("/admin/cluster/withdraw", post(admin::cluster_withdraw))
        .route_layer(middleware::from_fn_with_state(admin_guard, authorize));
    Router::new()
        .merge(data)
        .merge(counters)
        .merge(admin)
        .route("/health", get(ops::health))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .fallback(not_found)
        .route_layer(middleware::from_fn_with_state(app.clone(), timed))
        .layer(middleware::from_fn(rejections::json_errors))
        .with_state(app)
}
