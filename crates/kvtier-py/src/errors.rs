//! kvtier's errors as Python exceptions. The classes live in Python
//! (`kvtier/errors.py`): `KvtierError` with a `kind` attribute — the core's names for its
//! error kinds (`ErrorKind::name`: `invalid`, `no_space`, `corrupt`, `unavailable`,
//! `closed`, `internal`), which the HTTP server answers with too — and one subclass per
//! kind, the invalid one also a `ValueError`.

use kvtier_client::ClientError;
use kvtier_core::{Error, ErrorKind};
use pyo3::prelude::*;

/// A Python exception of the class for `kind` with `message`, and the server's error code
/// (`unknown_layout`, `bad_json`, …) as `code` when a server answered with one.
fn raise(kind: ErrorKind, message: String, code: Option<String>) -> PyErr {
    let kind = kind.name();
    Python::attach(|py| {
        let made = py
            .import("kvtier.errors")
            .and_then(|m| m.getattr("error_for"))
            .and_then(|f| f.call1((kind, message.as_str(), code)));
        match made {
            Ok(value) => PyErr::from_value(value),
            // The package is not importable (the module used on its own): still an error.
            Err(_) => pyo3::exceptions::PyRuntimeError::new_err(format!("{kind}: {message}")),
        }
    })
}

/// `e` as a Python exception of its kind (its whole source chain in the message; the
/// server's code when the error came from a `kvtier serve`).
pub(crate) fn from_core(e: Error) -> PyErr {
    let mut code = None;
    let mut link: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(cause) = link {
        if let Some(client) = cause.downcast_ref::<ClientError>() {
            code = client.code().map(str::to_owned);
            break;
        }
        link = cause.source();
    }
    raise(e.kind(), e.to_string(), code)
}

/// `e` as a Python exception with the server's error `code` for it (an error found
/// before anything was sent, which a server would have answered with that code).
pub(crate) fn with_code(e: Error, code: &str) -> PyErr {
    raise(e.kind(), e.to_string(), Some(code.to_owned()))
}

/// An `invalid` error: the request itself is wrong.
pub(crate) fn invalid(message: impl Into<String>) -> PyErr {
    raise(ErrorKind::Invalid, message.into(), None)
}

/// A `closed` error: the cache was closed.
pub(crate) fn closed() -> PyErr {
    raise(ErrorKind::Closed, "the cache is closed".into(), None)
}
