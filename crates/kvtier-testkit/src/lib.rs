//! kvtier-testkit: what kvtier's tests need to run real things, written once.
//!
//! The tests use real processes where users would (`kvtier serve`, `kvtier gateway`,
//! moto's S3 server, a writer killed mid-write), and each used to carry its own copy of
//! "start it, wait until it listens, kill it at the end". This crate is that copy, shared
//! by every crate's tests; the `kvtier` binary links it too, for the one bench group that
//! starts a real process of its own (the cluster rows' etcd member).
//!
//! - [`Process`]: a child process started with a [`Ready`] condition (a line it prints,
//!   a port that accepts, or nothing), its stdout and stderr captured to files so a
//!   failure can show them, stopped by PID with [`Process::kill_hard`] (SIGKILL) or
//!   [`Process::terminate`] (SIGTERM, waited for within a bound), and killed when dropped;
//!   [`with_nofile_limit`] starts one under a given open-file limit.
//! - [`free_port`], [`wait_for_port`]: for programs that must be told a port rather than
//!   announcing the one they bound.
//! - [`EtcdCluster`]: real etcd members on free ports; [`Host`]: a network namespace
//!   joined by links the test can take down (a partition the kernel makes).
//! - [`time_panic_reports`], [`first_error_after_panic`]: a deadline after a panic on
//!   another thread, counted from when the panic hook finished printing it.
//! - [`TestDir`]: a temporary directory that is kept, and its path printed, when the test
//!   using it fails.
//! - [`thread_sched`], [`threads_of`]: a thread's scheduling policy and `nice` value as
//!   the kernel reports them.
//!
//! Errors are values ([`Error`]); a test turns them into a failure with `unwrap` and
//! gets the process's name, what was waited for and its captured output in the message.

mod dir;
mod error;
mod etcd;
mod net;
mod netns;
mod output;
mod panic_clock;
mod process;
mod sched;

pub use dir::{KEEP_ENV, TestDir, test_dir};
pub use error::{Error, Result};
pub use etcd::{EtcdCluster, TlsFiles};
pub use net::{Cuttable, free_port, wait_for_port};
pub use netns::{Host, Link};
pub use panic_clock::{first_error_after_panic, last_panic_reported, time_panic_reports};
pub use process::{Process, Ready, with_nofile_limit};
pub use rustix::process::Signal;
pub use sched::{SCHED_IDLE, SCHED_OTHER, ThreadSched, thread_sched, threads_of};
