//! One owner per store directory: an exclusive lock on `DIR/LOCK`.
//!
//! The lock is an advisory `flock` held for the store's lifetime (released by the kernel
//! if the process dies, so a crash never leaves a stale lock). The file also records the
//! holder's pid and host, so a second opener is told who holds it.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use kvtier_core::{Error, ErrorKind, Result};

/// The held lock; dropping it releases the directory.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Takes the lock on `dir`, or fails naming the current holder.
    pub fn acquire(dir: &Path) -> Result<Self> {
        let path = dir.join("LOCK");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io_error(&path, "open", e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "store directory `{}` is in use by another process ({})",
                        dir.display(),
                        holder.trim()
                    ),
                ));
            }
            Err(TryLockError::Error(e)) => return Err(io_error(&path, "lock", e)),
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let who = format!("pid {} on {}", std::process::id(), host.trim());
        // Who holds it is a courtesy for the next opener; the flock is what excludes. On
        // a full disk the note cannot be written, and the store must still open.
        let noted = file
            .set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(who.as_bytes()));
        if let Err(e) = noted {
            tracing::warn!(file = %path.display(), error = %e, "could not note the lock holder");
        }
        Ok(Self { _file: file })
    }
}

/// An I/O error as a kvtier error naming the file and the operation, with the I/O error
/// as its source (so a caller can still read the errno).
pub fn io_error(path: &Path, op: &str, e: std::io::Error) -> Error {
    let kind = if e.raw_os_error() == Some(28) {
        ErrorKind::NoSpace
    } else {
        ErrorKind::Unavailable
    };
    Error::new(kind, format!("{op} `{}`", path.display())).with_source(e)
}
