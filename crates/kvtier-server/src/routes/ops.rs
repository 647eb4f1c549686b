//! Health and metrics.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kvtier_client::wire::{Health, Readiness};
use kvtier_core::tier::TierKind;

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

/// `GET /healthz`: liveness — the process answers requests. 200 `{"status": "ok"}`.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

/// `GET /readyz`: readiness — every tier the settings ask for is attached (recovery is
/// done before the server listens) and, in cluster mode, the replica follows the cluster
/// (registered, advertisements replayed). 200 when all hold, 503 otherwise; the body
/// names each check: `{"ready": bool, "checks": {"ssd": bool, "remote": bool, "cluster":
/// bool}}`, with only the parts this node is configured for.
pub async fn readyz(State(app): State<Arc<AppState>>) -> Response {
    let (want_ssd, want_remote) = {
        let s = app.node.settings.read();
        (s.ssd.enabled, !s.remote.endpoints.is_empty())
    };
    let attached: Vec<TierKind> = app.engine.stats().lower.iter().map(|l| l.kind).collect();
    let mut checks = BTreeMap::new();
    if want_ssd {
        checks.insert("ssd".to_owned(), attached.contains(&TierKind::Ssd));
    }
    if want_remote {
        checks.insert("remote".to_owned(), attached.contains(&TierKind::Remote));
    }
    if let Some(cluster) = &app.node.cluster {
        checks.insert("cluster".to_owned(), cluster.following());
    }
    let ready = checks.values().all(|&ok| ok);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(Readiness { ready, checks })).into_response()
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
