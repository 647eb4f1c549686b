//! kvtier's errors as Python exceptions. The classes live in Python
//! (`kvtier/errors.py`): `KvtierError` with a `kind` attribute — the same names the HTTP
//! server answers with (`invalid`, `no_space`, `corrupt`, `unavailable`, `closed`,
//! `internal`) — and one subclass per kind, the invalid one also a `ValueError`.

use kvtier_core::{Error, ErrorKind};
use pyo3::prelude::*;

/// The server's name for `kind`.
pub(crate) fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Invalid => "invalid",
        ErrorKind::NoSpace => "no_space",
        ErrorKind::Corrupt => "corrupt",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::Closed => "closed",
        _ => "internal",
    }
}

/// A Python exception of the class for `kind` with `message`.
pub(crate) fn raise(kind: &str, message: impl Into<String>) -> PyErr {
    raise_with_code(kind, message, None)
}

/// [`raise`] with the server's error code (`unknown_layout`, `bad_json`, …) as `code`.
pub(crate) fn raise_with_code(
    kind: &str,
    message: impl Into<String>,
    code: Option<String>,
) -> PyErr {
    let message = message.into();
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

/// `e` as a Python exception (its whole source chain in the message).
pub(crate) fn from_core(e: Error) -> PyErr {
    raise(kind_name(e.kind()), e.to_string())
}

/// An `invalid` error: the request itself is wrong.
pub(crate) fn invalid(message: impl Into<String>) -> PyErr {
    raise("invalid", message)
}
