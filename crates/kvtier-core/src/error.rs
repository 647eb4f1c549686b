//! The one public error type of kvtier-core.
//!
//! Expected outcomes are values, not errors: a miss is an empty [`crate::Lookup`], a block
//! that vanished between lookup and load ends the load early. `Error` is for calls that
//! cannot be carried out; its [`ErrorKind`] tells the caller what to do about it, and the
//! network edge maps it once to an HTTP status.
//!
//! An error has three parts, each for a different reader:
//!
//! - the **kind**, for code deciding what to do (retry, give up, report a bug);
//! - the **message**, kvtier's own context naming the offending values
//!   (``"write record to `/data/0000000000000003.seg`"``);
//! - an optional **source**, the error underneath (an `std::io::Error`, an object-store
//!   error, a lower tier's `Error`), reachable through [`std::error::Error::source`] so a
//!   program can walk the chain and, say, downcast to `std::io::Error` to read the errno.
//!
//! `Display` prints the whole chain on one line — kind, message, then each source's text
//! — because logs and API answers print errors with `Display` and must not lose the
//! operating system's reason. A reporter that also walks `source()` will repeat the
//! sources' text; kvtier's own edges never do that (see docs/adr/0012).
//!
//! Errors stay `Clone` (the source is shared behind an `Arc`): one failed write is
//! reported to every block it carried. Two errors are equal when their kind and message
//! are; the source does not take part (an `std::io::Error` has no equality).

use std::fmt;
use std::sync::Arc;

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

impl ErrorKind {
    /// Every kind with its name, the one table of them: the HTTP edge answers with these
    /// names as error codes, the client reads them back, Python's exception classes carry
    /// them as `kind`.
    const NAMES: [(ErrorKind, &'static str); 6] = [
        (ErrorKind::Invalid, "invalid"),
        (ErrorKind::NoSpace, "no_space"),
        (ErrorKind::Corrupt, "corrupt"),
        (ErrorKind::Unavailable, "unavailable"),
        (ErrorKind::Closed, "closed"),
        (ErrorKind::Internal, "internal"),
    ];

    /// This kind's name (`invalid`, `no_space`, `corrupt`, `unavailable`, `closed`,
    /// `internal`).
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(k, _)| *k == self)
            .map_or("internal", |(_, n)| n)
    }

    /// The kind named `name`, if it is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(k, _)| *k)
    }

    /// Every kind's name (for bindings that mirror the kinds: Python's test holds its
    /// exception classes to this list).
    pub fn names() -> impl Iterator<Item = &'static str> {
        Self::NAMES.iter().map(|(_, n)| *n)
    }
}

/// The error underneath an [`Error`], shared so that errors stay `Clone`.
pub type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// An error from kvtier-core: a kind, a message that names the offending value, and the
/// error underneath when there is one. See the module docs.
#[derive(Debug, Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Source>,
}

impl Error {
    /// Creates an error of `kind` with a message carrying context.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
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

    /// This error, caused by `source`. The message should say what kvtier was doing; the
    /// source says why it failed, so the message need not repeat the source's text.
    pub fn with_source(self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.with_shared_source(Arc::new(source))
    }

    /// Like [`Error::with_source`], with a source already shared (one cause reported by
    /// several errors).
    pub fn with_shared_source(mut self, source: Source) -> Self {
        self.source = Some(source);
        self
    }

    /// What the caller should do about this error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// kvtier's own context, without the sources' text (see [`Error::full_message`]).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The message followed by the text of every source down the chain, `": "`-separated:
    /// what `Display` prints after the kind. For answers that carry the kind apart (the
    /// HTTP edge's `code`).
    pub fn full_message(&self) -> String {
        let mut out = self.message.clone();
        let mut next = self.source.as_deref().map(as_dyn);
        while let Some(e) = next {
            out.push_str(": ");
            match e.downcast_ref::<Error>() {
                // Our own error: its message only, its sources follow in the loop.
                Some(ours) => out.push_str(&ours.message),
                None => out.push_str(&e.to_string()),
            }
            next = e.source();
        }
        out
    }
}

/// The source as a plain `dyn Error` (what `source()` returns and `downcast_ref` takes).
fn as_dyn<'a>(
    e: &'a (dyn std::error::Error + Send + Sync + 'static),
) -> &'a (dyn std::error::Error + 'static) {
    e
}

impl PartialEq for Error {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.message == other.message
    }
}

impl Eq for Error {}

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
        write!(f, "{kind}: {}", self.full_message())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(as_dyn)
    }
}

/// The result type of kvtier-core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use std::error::Error as _;
    use std::io;

    use super::*;

    /// A lower tier's error over an I/O error, wrapped by the engine: three links.
    fn chain() -> Error {
        let disk = io::Error::from_raw_os_error(28);
        let tier = Error::no_space("write record to `/d/0001.seg`").with_source(disk);
        Error::new(ErrorKind::Unavailable, "persist block `ab12`").with_source(tier)
    }

    #[test]
    fn the_chain_can_be_walked_down_to_the_io_error() {
        let top = chain();
        let mut kinds = Vec::new();
        let mut link: Option<&(dyn std::error::Error + 'static)> = Some(&top);
        let mut errno = None;
        while let Some(e) = link {
            if let Some(ours) = e.downcast_ref::<Error>() {
                kinds.push(ours.kind());
            }
            if let Some(io) = e.downcast_ref::<io::Error>() {
                errno = io.raw_os_error();
            }
            link = e.source();
        }
        assert_eq!(kinds, [ErrorKind::Unavailable, ErrorKind::NoSpace]);
        assert_eq!(errno, Some(28));
    }

    #[test]
    fn display_prints_every_link_once() {
        let top = chain();
        let text = top.to_string();
        assert!(
            text.starts_with("unavailable: persist block `ab12`: write record to `/d/0001.seg`: "),
            "{text}"
        );
        // The lower tier's kind is a value to inspect, not text repeated mid-line.
        assert!(!text.contains("no space:"), "{text}");
        assert_eq!(text.matches("/d/0001.seg").count(), 1, "{text}");
        assert!(
            top.full_message()
                .ends_with(&io::Error::from_raw_os_error(28).to_string())
        );
        assert_eq!(top.message(), "persist block `ab12`");
    }

    #[test]
    fn every_kind_has_a_name_that_reads_back() {
        for (kind, name) in ErrorKind::NAMES {
            assert_eq!(kind.name(), name);
            assert_eq!(ErrorKind::from_name(name), Some(kind));
        }
        assert_eq!(ErrorKind::from_name("bad_json"), None);
    }

    #[test]
    fn clones_share_the_source_and_equality_ignores_it() {
        let top = chain();
        let copy = top.clone();
        assert_eq!(top, copy);
        assert!(copy.source().is_some());
        let bare = Error::new(ErrorKind::Unavailable, "persist block `ab12`");
        assert_eq!(top, bare);
        assert_ne!(top, Error::invalid("persist block `ab12`"));
    }
}
