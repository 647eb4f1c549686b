//! Errors as answers: a status and `{"error": {"code", "message"}}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kvtier_client::wire::{ErrorBody, ErrorDetail};
use kvtier_core::ErrorKind;

/// The code of an error answer, kept in the response's extensions so that the layer
/// logging refusals can name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub &'static str);

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable code (documented in docs/API.md).
    pub code: &'static str,
    /// What was wrong.
    pub message: String,
}

impl ApiError {
    /// An error with `status` and `code`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400 with `code`.
    pub fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 503: retry later (a tier is being reattached, or the server is stopping).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Unavailable.name(),
            message,
        )
    }
}

impl From<kvtier_core::Error> for ApiError {
    fn from(e: kvtier_core::Error) -> Self {
        let status = match e.kind() {
            ErrorKind::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorKind::NoSpace => StatusCode::INSUFFICIENT_STORAGE,
            ErrorKind::Unavailable | ErrorKind::Closed => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        // A closed engine is, to a caller of the server, one that is going away: retry
        // elsewhere or later (the code every client knows for that).
        let code = match e.kind() {
            ErrorKind::Closed => ErrorKind::Unavailable.name(),
            kind => kind.name(),
        };
        // The kind is the code; the message keeps every cause (an errno's text).
        Self::new(status, code, e.full_message())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.into(),
                message: self.message,
            },
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        resp.extensions_mut().insert(ErrorCode(self.code));
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        // The rest of a timed-out or oversized body is not read: the connection cannot
        // carry another request.
        if matches!(
            self.status,
            StatusCode::REQUEST_TIMEOUT | StatusCode::PAYLOAD_TOO_LARGE
        ) {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}
