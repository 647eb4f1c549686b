//! Every error answer in the documented shape, and every refusal logged without flooding.
//!
//! The handlers answer their own errors as `{"error": {"code", "message"}}`, but axum
//! answers some requests before any handler runs: a known path with the wrong method
//! (405, empty body), and — should a route ever use axum's extractors — 400, 413 and 415
//! as plain text. This layer, around the whole router, turns any error answer that is
//! not JSON into the documented shape with a stable code, keeping its status and its
//! `Allow` header, and logs every 4xx answer through the rate-limited refusal log.

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ErrorCode};
use crate::listen::refusals::{Level, REFUSALS};

/// Longest plain-text rejection body kept as the message.
const TEXT_LIMIT: usize = 4096;

/// The code for an answer axum made itself.
fn code_for(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::NOT_FOUND => "no_such_endpoint",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::REQUEST_TIMEOUT => "body_timeout",
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UNPROCESSABLE_ENTITY => "invalid",
        s if s.is_server_error() => "internal",
        _ => "rejected",
    }
}

fn is_json(resp: &Response) -> bool {
    resp.headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"))
}

/// The layer: see the module doc.
pub async fn json_errors(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let resp = if is_json(&resp) {
        resp
    } else {
        let allow = resp.headers().get(header::ALLOW).cloned();
        let text = axum::body::to_bytes(resp.into_body(), TEXT_LIMIT)
            .await
            .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
            .unwrap_or_default();
        // (axum sets the `Allow` header of a 405 outside this layer, so it is usually
        // not here to quote.)
        let message = match (status, &allow) {
            (StatusCode::METHOD_NOT_ALLOWED, Some(a)) => format!(
                "{method} is not allowed on {path} (allowed: {})",
                a.to_str().unwrap_or("?")
            ),
            (StatusCode::METHOD_NOT_ALLOWED, None) => format!(
                "{method} is not allowed on {path} (the Allow header lists the methods that are)"
            ),
            _ if text.is_empty() => format!(
                "{} {} for {method} {path}",
                status.as_u16(),
                status.canonical_reason().unwrap_or("error")
            ),
            _ => text,
        };
        let mut out = ApiError::new(status, code_for(status), message).into_response();
        if let Some(a) = allow {
            out.headers_mut().insert(header::ALLOW, a);
        }
        out
    };
    if status.is_client_error() {
        let code = resp
            .extensions()
            .get::<ErrorCode>()
            .map_or("rejected", |c| c.0);
        REFUSALS.note(
            Level::Info,
            code,
            &format_args!("{method} {path}: {} {code}", status.as_u16()),
        );
    }
    resp
}
