//! Errors of the model glue: the model library's, the cache's, and our own checks.

/// What went wrong running a model with kvtier.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tensor library refused an operation (shape, dtype, file format).
    #[error("model: {0}")]
    Candle(#[from] candle_core::Error),
    /// The cache (embedded, or a server) refused a call or could not be reached.
    #[error("kvtier: {0}")]
    Engine(#[from] kvtier_core::Error),
    /// A file could not be read or written.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The weights could not be found or installed.
    #[error("weights: {0}")]
    Weights(String),
    /// Bytes handed back by the cache do not fit the model (a wrong size or shape). The
    /// caller treats this as a miss and recomputes.
    #[error("cached state does not fit the model: {0}")]
    Mismatch(String),
    /// A request the model cannot run (empty prompt, token id out of the vocabulary).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A `kvtier serve` to run turns through could not be started
    /// ([`crate::reuse::ServeLauncher`]).
    #[error("kvtier serve: {0}")]
    Serve(String),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, Error>;
