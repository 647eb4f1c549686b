//! What can go wrong running a test's helper process; every message names the process
//! and, where it ran, ends with what it printed.

use std::process::ExitStatus;
use std::time::Duration;

/// A helper process that did not do what the test needs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The program could not be started (not installed, not executable).
    #[error("cannot start {name}: {source}")]
    Spawn {
        /// The name the test gave the process.
        name: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The process did not become ready within the bound: it exited, or it is still
    /// running and was killed.
    #[error("{name} was not ready ({waited_for}) within {within:?}; {ended}{output}")]
    NotReady {
        /// The name the test gave the process.
        name: String,
        /// The readiness condition, in words.
        waited_for: String,
        /// The bound.
        within: Duration,
        /// How it ended (`exited with …` or `killed`).
        ended: String,
        /// What it printed (empty or starting with a newline).
        output: String,
    },
    /// The process did not exit within the bound after a signal; it was killed.
    #[error("{name} did not exit within {within:?} of {signal}; killed{output}")]
    NotStopped {
        /// The name the test gave the process.
        name: String,
        /// The signal it ignored.
        signal: String,
        /// The bound.
        within: Duration,
        /// What it printed (empty or starting with a newline).
        output: String,
    },
    /// A tool the kit runs to prepare a test (`openssl`) failed.
    #[error("{context}: {output}")]
    Tool {
        /// The command, in words.
        context: String,
        /// What it printed.
        output: String,
    },
    /// Signalling, waiting for or reading from the process, or a file or socket of the
    /// kit, failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
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

/// `exited with STATUS` or `killed` (a signal, no exit code).
pub(crate) fn describe(status: ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exited with code {code}"),
        None => format!("ended by a signal ({status})"),
    }
}
