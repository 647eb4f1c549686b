//! The descriptor budget: how many connections the open-file limit leaves room for.
//!
//! Every connection holds a descriptor. Should idle sockets use up the descriptors before
//! the connection cap acts, `accept` fails with `EMFILE` and the listener stops admitting
//! anyone — the cap's promise (an idle connection makes room for a client with a request)
//! never gets a chance. Measured before this module: `kvtier gateway` under the usual
//! systemd limits (soft 1,024, hard far higher) with the default cap of 1,024 and 1,100
//! idle sockets: a GET timed out after 3 s. So at start a front end calls
//! [`connection_budget`], which:
//!
//! 1. raises the soft `RLIMIT_NOFILE` to the hard limit (an unprivileged process may; a
//!    descriptor costs nothing until it is opened — Go's runtime does the same at start);
//! 2. counts the descriptors already open (the store's segments and index logs, the log,
//!    the runtime's own);
//! 3. keeps a reserve for files opened later — new segments and their index logs (up to
//!    three descriptors each), the remote tier's and etcd's client sockets, directory
//!    syncs: a quarter of what remains, at least [`MIN_RESERVE`];
//! 4. answers the configured cap, or what is left after the reserve if that is less,
//!    logging a warning when it lowers the cap.
//!
//! Under the usual limits (a hard limit of tens of thousands or more) nothing is clamped:
//! the soft limit is raised and the configured cap stands.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// The least number of descriptors kept for the process's own files.
pub const MIN_RESERVE: u64 = 64;

/// What [`connection_budget`] found and decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The soft limit before the call (`None`: unlimited).
    pub soft_before: Option<u64>,
    /// The soft limit after it (raised when the hard limit allowed).
    pub soft: Option<u64>,
    /// The hard limit (`None`: unlimited).
    pub hard: Option<u64>,
    /// Descriptors open at the time of the call.
    pub open: u64,
    /// Descriptors kept for files the process opens later.
    pub reserve: u64,
    /// The connection cap to use: the configured one, or less when the limit leaves less
    /// room (at least 1).
    pub connections: usize,
}

impl Budget {
    /// Whether the configured cap was lowered.
    pub fn clamped(&self, configured: usize) -> bool {
        self.connections < configured
    }
}

/// Raises the soft open-file limit as far as allowed and answers how many of the
/// `configured` connections fit beside the descriptors open now and a reserve; logs a
/// warning (once per call) when that is fewer than configured. Call it once per listener,
/// after the store is open (so its files are counted) and before accepting.
pub fn connection_budget(configured: usize) -> Budget {
    let configured = configured.max(1);
    let limit = getrlimit(Resource::Nofile);
    let soft_before = limit.current;
    let soft = raise(limit);
    let open = open_descriptors();
    let (reserve, connections) = fit(configured, soft, open);
    let budget = Budget {
        soft_before,
        soft,
        hard: limit.maximum,
        open,
        reserve,
        connections,
    };
    if soft != soft_before {
        tracing::debug!(?soft_before, ?soft, "raised the open-file limit");
    }
    if budget.clamped(configured) {
        tracing::warn!(
            configured,
            connections,
            open_file_limit = soft.unwrap_or(u64::MAX),
            hard_limit = limit.maximum.unwrap_or(u64::MAX),
            open,
            reserve,
            "max_connections lowered to what the open-file limit leaves room for (raise the hard limit, `ulimit -Hn` or systemd's LimitNOFILE, to serve more)"
        );
    }
    budget
}

/// Sets the soft limit to the hard one (or, with no hard limit, to the kernel's ceiling);
/// returns the soft limit in force afterwards.
fn raise(limit: Rlimit) -> Option<u64> {
    let soft = limit.current?;
    let target = limit.maximum.unwrap_or_else(kernel_ceiling);
    if target <= soft {
        return Some(soft);
    }
    let raised = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(target),
            maximum: limit.maximum,
        },
    );
    match raised {
        Ok(()) => Some(target),
        Err(e) => {
            tracing::debug!(error = %e, soft, target, "cannot raise the open-file limit");
            Some(soft)
        }
    }
}

/// The most descriptors a process may have (`/proc/sys/fs/nr_open`, 1,048,576 by default).
fn kernel_ceiling() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20)
}

/// Descriptors open now (`/proc/self/fd`, less the one reading it); [`MIN_RESERVE`] when
/// that cannot be read, which the reserve then covers twice.
fn open_descriptors() -> u64 {
    match std::fs::read_dir("/proc/self/fd") {
        Ok(entries) => (entries.count() as u64).saturating_sub(1),
        Err(_) => MIN_RESERVE,
    }
}

/// `(reserve, connections)` for `configured` connections under the soft limit `soft` with
/// `open` descriptors open.
fn fit(configured: usize, soft: Option<u64>, open: u64) -> (u64, usize) {
    let Some(soft) = soft else {
        return (0, configured);
    };
    let left = soft.saturating_sub(open);
    let reserve = (left / 4).max(MIN_RESERVE);
    let room = usize::try_from(left.saturating_sub(reserve)).unwrap_or(usize::MAX);
    (reserve, configured.min(room).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_stands_when_the_limit_has_room_and_is_clamped_below_what_remains_otherwise() {
        // The usual shape after raising: plenty of room.
        assert_eq!(fit(1024, Some(20_000), 30).1, 1024);
        // A hard limit of 1,024 that cannot be raised: a quarter of what remains is kept.
        let (reserve, n) = fit(1024, Some(1024), 24);
        assert_eq!(reserve, 250);
        assert_eq!(n, 750);
        // A small limit: the reserve's floor applies.
        let (reserve, n) = fit(1024, Some(256), 20);
        assert_eq!(reserve, MIN_RESERVE);
        assert_eq!(n, 256 - 20 - 64);
        // Nothing left: still one connection (the listener must be able to answer).
        assert_eq!(fit(1024, Some(50), 40).1, 1);
        assert_eq!(fit(1024, Some(10), 40).1, 1);
        // Unlimited.
        assert_eq!(fit(7, None, 1_000_000), (0, 7));
    }

    #[test]
    fn raising_reaches_the_hard_limit_and_leaves_a_higher_soft_limit_alone() {
        assert_eq!(
            raise(Rlimit {
                current: Some(5000),
                maximum: Some(4000),
            }),
            Some(5000)
        );
        assert_eq!(
            raise(Rlimit {
                current: None,
                maximum: None,
            }),
            None
        );
        // This process's own limit: raising to a finite hard limit is always allowed.
        let now = getrlimit(Resource::Nofile);
        if let (Some(_), Some(hard)) = (now.current, now.maximum) {
            assert_eq!(raise(now), Some(hard));
            assert_eq!(getrlimit(Resource::Nofile).current, Some(hard));
        }
    }

    #[test]
    fn open_descriptors_counts_files_opened() {
        let before = open_descriptors();
        let files: Vec<_> = (0..50)
            .filter_map(|_| std::fs::File::open("/proc/self/status").ok())
            .collect();
        assert_eq!(files.len(), 50);
        // (Other tests of this binary may close a few descriptors meanwhile.)
        assert!(open_descriptors() >= before + 40);
    }
}
