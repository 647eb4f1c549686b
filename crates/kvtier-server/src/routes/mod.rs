//! The router: data endpoints (optionally behind the data token), admin endpoints (behind
//! the admin token), health; every request timed into the latency histograms.

mod admin;
mod data;
pub(crate) mod input;
mod load_stream;
mod ops;

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

/// Which token a group of routes requires.
#[derive(Clone, Copy)]
enum Guard {
    Data,
    Admin,
}

/// Compares in time independent of where the strings differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn authorize(
    State((app, guard)): State<(Arc<AppState>, Guard)>,
    req: Request,
    next: Next,
) -> Response {
    let wanted = {
        let s = app.settings.read();
        match guard {
            Guard::Data => s.auth.data_token.clone(),
            Guard::Admin => match &s.auth.admin_token {
                Some(t) => Some(t.clone()),
                None => {
                    return ApiError::new(
                        StatusCode::FORBIDDEN,
                        "admin_disabled",
                        "admin endpoints are disabled: no admin token is configured (admin_token)",
                    )
                    .into_response();
                }
            },
        }
    };
    if let Some(wanted) = wanted {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            Some(t) if same(t.as_bytes(), wanted.as_bytes()) => {}
            Some(_) => {
                return ApiError::new(
                    StatusCode::FORBIDDEN,
                    "bad_token",
                    "the bearer token is not valid here",
                )
                .into_response();
            }
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
                return resp;
            }
        }
    }
    next.run(req).await
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
    let data = Router::new()
        .route("/v1/layouts", post(data::register_layout))
        .route("/v1/layouts/{layout}", delete(data::delete_layout))
        .route("/v1/lookup", post(data::lookup))
        .route("/v1/load", post(data::load))
        .route("/v1/store", post(data::store))
        .route("/v1/snapshot", put(data::snapshot_put))
        .route("/v1/snapshot/get", post(data::snapshot_get))
        .route("/v1/stats", get(data::stats))
        .route("/metrics", get(ops::metrics))
        .route_layer(middleware::from_fn_with_state(
            (app.clone(), Guard::Data),
            authorize,
        ));
    let admin = Router::new()
        .route("/admin/ssd", post(admin::ssd))
        .route("/admin/flush", post(admin::flush))
        .route_layer(middleware::from_fn_with_state(
            (app.clone(), Guard::Admin),
            authorize,
        ));
    Router::new()
        .merge(data)
        .merge(admin)
        .route("/health", get(ops::health))
        .fallback(not_found)
        .route_layer(middleware::from_fn_with_state(app.clone(), timed))
        .with_state(app)
}
