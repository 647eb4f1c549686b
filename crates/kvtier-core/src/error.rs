//! The one public error type of kvtier-core.
//!
//! Expected outcomes are values, not errors: a miss is an empty [`crate::Lookup`], a block
//! that vanished between lookup and load ends the load early. `Error` is for calls that
//! cannot be carried out; its [`ErrorKind`] tells the caller what to do about it, and the
//! network edge maps it once to an HTTP status.

use std::fmt;

/// What the caller should do about an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request itself is wrong (bad layout value, wrong payload size, too many tokens,
    /// unknown layout). Retrying the same request fails the same way.
    Invalid,
    /// The store cannot hold the data (capacity smaller than one block, budget full of
    /// blocks that may not be evicted). Nothing was stored.
    NoSpace,
    /// Stored bytes failed verification. They are never returned.
    Corrupt,
    /// A backing device or service is unavailable; retrying later may succeed.
    Unavailable,
    /// The engine or tier has been shut down.
    Closed,
    /// A bug: an invariant inside kvtier did not hold.
    Internal,
}

/// An error from kvtier-core, with a message that names the offending value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// Creates an error of `kind` with a message carrying context.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// Shorthand for an [`ErrorKind::Invalid`] error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }

    /// Shorthand for an [`ErrorKind::NoSpace`] error.
    pub fn no_space(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NoSpace, message)
    }

    /// What the caller should do about this error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ErrorKind::Invalid => "invalid request",
            ErrorKind::NoSpace => "no space",
            ErrorKind::Corrupt => "corrupt data",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Closed => "closed",
            ErrorKind::Internal => "internal error",
        };
        write!(f, "{kind}: {}", self.message)
    }
}

impl std::error::Error for Error {}

/// The result type of kvtier-core.
pub type Result<T, E = Error> = std::result::Result<T, E>;
