//! The admin control plane: `POST /admin/ssd` and `POST /admin/flush`.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use kvtier_client::wire::{FlushAnswer, SsdAdmin, SsdAdminAnswer, TierFlushAnswer};

use super::input::{self, blocking, read_body};
use crate::config::SsdSettings;
use crate::error::ApiError;
use crate::state::AppState;

/// Admin request bodies are small.
const ADMIN_BODY_LIMIT: u64 = 64 << 10;

/// Parses one optional setting from its wire text.
fn parse<T: serde::de::DeserializeOwned>(
    what: &str,
    v: &Option<String>,
) -> Result<Option<T>, ApiError> {
    v.as_ref()
        .map(|s| {
            serde_json::from_value(serde_json::Value::String(s.clone()))
                .map_err(|e| ApiError::bad("bad_setting", format!("{what} `{s}`: {e}")))
        })
        .transpose()
}

/// The SSD settings `req` asks for, starting from `current`.
fn next_settings(current: &SsdSettings, req: &SsdAdmin) -> Result<SsdSettings, ApiError> {
    let mut next = current.clone();
    next.enabled = match req.action.as_str() {
        "enable" | "reconfigure" => true,
        "disable" => false,
        other => {
            return Err(ApiError::bad(
                "bad_action",
                format!("unknown action `{other}` (enable, disable, reconfigure)"),
            ));
        }
    };
    if let Some(dir) = &req.dir {
        next.dir = Some(dir.into());
    }
    if let Some(v) = parse("capacity", &req.capacity)? {
        next.capacity = v;
    }
    if let Some(v) = parse("mode", &req.mode)? {
        next.mode = v;
    }
    if let Some(v) = parse("durability", &req.durability)? {
        next.durability = v;
    }
    if let Some(v) = parse("ttl", &req.ttl)? {
        next.ttl = v;
    }
    Ok(next)
}

/// `POST /admin/ssd`: quiesce, drain and close the SSD tier, then reattach it with the
/// changes asked for (or leave it detached). Data requests keep being served; during the
/// swap, blocks only the SSD held load as lost (recompute) and layer loads of them answer
/// 503 (retry).
pub async fn ssd(
    State(app): State<Arc<AppState>>,
    body: Body,
) -> Result<Json<SsdAdminAnswer>, ApiError> {
    let req: SsdAdmin = input::json(&app, &read_body(body, ADMIN_BODY_LIMIT).await?)?;
    let _one_at_a_time = app.admin.lock().await;
    let next = next_settings(&app.node.settings.read().ssd, &req)?;
    let worker = app.clone();
    let done = blocking(move || {
        // The status and code follow the error's kind, as for every engine error
        // (`ApiError::from`): a damaged store is 500 `corrupt`, a directory that cannot
        // be used 503 `unavailable`, settings that cannot work 422 `invalid`.
        worker.node.reattach_ssd(next).map_err(|e| {
            ApiError::from(
                kvtier_core::Error::new(e.kind(), "cannot reattach the SSD tier").with_source(e),
            )
        })
    })
    .await?;
    let ssd = {
        let s = app.node.settings.read();
        s.ssd.enabled.then(|| {
            let mut shown = serde_json::to_value(&s.ssd).unwrap_or_default();
            if let Some(obj) = shown.as_object_mut() {
                obj.insert(
                    "dir".into(),
                    serde_json::Value::String(s.ssd_dir().display().to_string()),
                );
            }
            shown
        })
    };
    Ok(Json(SsdAdminAnswer {
        drained_clean: done.drained_clean,
        left_in_queue: done.left_in_queue,
        detached_blocks: done.detached_blocks,
        attached: done.attached,
        attached_blocks: done.attached_blocks,
        ssd,
    }))
}

/// `POST /admin/flush`: waits until everything queued for the tiers below RAM is written
/// and synced. `drained` is true only if every queue emptied, every tier synced and no
/// write failed since the previous flush; `unwritten` counts what did not reach its tier.
pub async fn flush(State(app): State<Arc<AppState>>) -> Result<Json<FlushAnswer>, ApiError> {
    let timeout = app.node.settings.read().ssd.drain_timeout.0;
    let engine = app.engine.clone();
    let report = blocking(move || Ok(engine.flush_report(timeout))).await?;
    let tiers = report
        .tiers
        .iter()
        .map(|t| {
            let answer = TierFlushAnswer {
                drained: t.drained,
                synced: t.synced,
                unwritten: t.unwritten,
            };
            (t.kind.name().to_owned(), answer)
        })
        .collect();
    Ok(Json(FlushAnswer {
        drained: report.clean(),
        unwritten: report.unwritten(),
        tiers,
    }))
}

/// `POST /admin/cluster/withdraw {"object": MANIFEST}`: deletes one of this replica's
/// objects from the shared tier in two phases (docs/cluster.md, "Deleting"): the
/// advertisement is withdrawn now, the object deleted after the grace window. 200 when
/// withdrawn; 403 when another replica owns it (nothing changes); 404 when no
/// advertisement names it; 409 when this replica's registration is not current or the
/// record changed meanwhile; 400 outside cluster mode.
pub async fn cluster_withdraw(
    State(app): State<Arc<AppState>>,
    body: Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Request {
        object: String,
    }
    let req: Request = input::json(&app, &read_body(body, ADMIN_BODY_LIMIT).await?)?;
    let cluster = app
        .node
        .cluster
        .clone()
        .ok_or_else(|| ApiError::bad("not_clustered", "this replica is not in cluster mode"))?;
    let outcome = cluster
        .withdraw(&req.object)
        .await
        .map_err(ApiError::unavailable)?;
    use axum::http::StatusCode;
    use kvtier_meta::Withdrawal;
    match outcome {
        Withdrawal::Withdrawn(t) => Ok(Json(serde_json::json!({
            "withdrawn": req.object,
            "at_ms": t.at_ms,
            "grace_ms": cluster.config().gc_grace.as_millis() as u64,
        }))),
        Withdrawal::NotOwner(owner) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "not_owner",
            format!(
                "`{}` belongs to replica `{owner}`: only its owner deletes it",
                req.object
            ),
        )),
        Withdrawal::Unknown => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_advertised",
            format!("no advertisement names `{}`", req.object),
        )),
        Withdrawal::Fenced => Err(ApiError::new(
            StatusCode::CONFLICT,
            "fenced",
            "this replica's registration is not current; it registers again, then retry",
        )),
        Withdrawal::Changed => Err(ApiError::new(
            StatusCode::CONFLICT,
            "changed",
            "the advertisement changed meanwhile; retry",
        )),
    }
}
