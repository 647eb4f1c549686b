//! Health and metrics.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kvtier_client::wire::Health;

use crate::state::AppState;

/// `GET /health`.
pub async fn health(State(app): State<Arc<AppState>>) -> Json<Health> {
    let mut tiers = vec!["ram".to_string()];
    if let Some(t) = app.engine.persistent() {
        tiers.push(t.kind().name().to_string());
    }
    let ssd_write_failures = app
        .engine
        .persistent()
        .map(|t| {
            let s = t.stats();
            s.io_errors + s.rejected_no_space
        })
        .unwrap_or(0);
    Json(Health {
        status: "ok".into(),
        tiers,
        previous_shutdown_clean: app.node.previous_shutdown_clean,
        ssd_write_failures,
    })
}

/// `GET /metrics`.
pub async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    match app.metrics.render() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
