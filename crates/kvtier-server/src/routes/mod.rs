//! The router: data endpoints (optionally behind the data token), admin endpoints (behind
//! the admin token), health; every request timed into the latency histograms.

mod admin;
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
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};

use crate::error::ApiError;
use crate::state::AppState;

// Shared with the shared arena's socket (`crate::shm`): a prompt and a layout are read the
// same way from either.
pub(crate) use data::prompt_of;
pub(crate) use input::known_layout;

/// What a group of routes requires: the data routes a token if one is configured; the
/// admin routes the admin token, and are disabled without one. Tokens are fixed for the
/// server's life, so they are read once, when the router is built.
#[derive(Clone)]
enum Guard {
    Open,
    Token(Arc<str>),
    Disabled,
}

/// Compares in time independent of where the strings differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn authorize(State(guard): State<Guard>, req: Request, next: Next) -> Response {
    let wanted = match &guard {
        Guard::Open => return next.run(req).await,
        Guard::Token(t) => t,
        Guard::Disabled => {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "admin_disabled",
                "admin endpoints are disabled: no admin token is configured (admin_token)",
            )
            .into_response();
        }
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(t) if same(t.as_bytes(), wanted.as_bytes()) => next.run(req).await,
        Some(_) => ApiError::new(
            StatusCode::FORBIDDEN,
            "bad_token",
            "the bearer token is not valid here",
        )
        .into_response(),
        None => {
            let mut resp = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "token_required",
                "this endpoint requires `Authorization: Bearer <token>`",
            )
            .into_response();
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
            resp
        }
    }
}

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
    let (data_guard, admin_guard) = {
        let auth = &app.node.settings.read().auth;
        let data = auth
            .data_token
            .as_deref()
            .map_or(Guard::Open, |t| Guard::Token(t.into()));
        let admin = auth
            .admin_token
            .as_deref()
            .map_or(Guard::Disabled, |t| Guard::Token(t.into()));
        (data, admin)
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
        .route("/v1/stats", get(data::stats))
        .route("/metrics", get(ops::metrics))
        .route_layer(middleware::from_fn_with_state(data_guard, authorize));
    let admin = Router::new()
        .route("/admin/ssd", post(admin::ssd))
        .route("/admin/flush", post(admin::flush))
        .route("/admin/cluster/withdraw", post(admin::cluster_withdraw))
        .route_layer(middleware::from_fn_with_state(admin_guard, authorize));
    Router::new()
        .merge(data)
        .merge(admin)
        .route("/health", get(ops::health))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .fallback(not_found)
        .route_layer(middleware::from_fn_with_state(app.clone(), timed))
        .layer(middleware::from_fn(rejections::json_errors))
        .with_state(app)
}
