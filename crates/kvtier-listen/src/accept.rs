//! Accept failures.
//!
//! `accept` fails mostly for want of descriptors (`EMFILE`: the process's limit; `ENFILE`:
//! the system's). The pending connection stays in the kernel's queue and the listener stays
//! readable, so retrying at once spins — one failure, and one log line, per wake-up (530
//! warnings in 4 s were measured before this module). An accept loop therefore backs off
//! for [`BACKOFF`] after a failure, frees a descriptor when it can (closing its
//! longest-idle connection, as the connection cap does), and logs failures rate-limited.

use std::io;
use std::time::Duration;

/// How long an accept loop waits after a failed `accept` before trying again.
pub const BACKOFF: Duration = Duration::from_millis(50);

/// Whether `err` says the process (or the system) is out of file descriptors.
pub fn out_of_descriptors(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(e) if e == rustix::io::Errno::MFILE.raw_os_error()
            || e == rustix::io::Errno::NFILE.raw_os_error()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emfile_and_enfile_are_out_of_descriptors_and_nothing_else_is() {
        assert!(out_of_descriptors(&io::Error::from_raw_os_error(24)));
        assert!(out_of_descriptors(&io::Error::from_raw_os_error(23)));
        assert!(!out_of_descriptors(&io::Error::from_raw_os_error(104)));
        assert!(!out_of_descriptors(&io::Error::other("no errno")));
    }
}
