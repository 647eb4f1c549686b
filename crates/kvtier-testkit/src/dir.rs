//! Temporary directories that outlive a failed test: when the test panics (or
//! [`KEEP_ENV`] is set) the directory is kept and its path printed, so the store a
//! failing test left behind can be inspected (`kvtier inspect DIR`).

use std::path::Path;

use crate::{Error, Result};

/// Set (to anything) to keep every [`TestDir`], passed or failed.
pub const KEEP_ENV: &str = "KVTIER_KEEP_TEST_DIRS";

/// A fresh directory under the system's temporary directory, removed when dropped unless
/// the test is failing.
#[derive(Debug)]
pub struct TestDir {
    dir: Option<tempfile::TempDir>,
}

/// Creates a [`TestDir`] named `kvtier-{name}-…` (the name says which test left it).
pub fn test_dir(name: &str) -> Result<TestDir> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("kvtier-{name}-"))
        .tempdir()
        .map_err(|e| Error::io(format!("cannot create a temporary directory for {name}"), e))?;
    Ok(TestDir { dir: Some(dir) })
}

impl TestDir {
    /// The directory.
    pub fn path(&self) -> &Path {
        // Only `drop` takes the directory out.
        self.dir.as_ref().map_or(Path::new(""), |d| d.path())
    }
}

impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        self.path()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let failing = std::thread::panicking();
        if !failing && std::env::var_os(KEEP_ENV).is_none() {
            return;
        }
        if let Some(dir) = self.dir.take() {
            let path = dir.keep();
            let why = if failing { "the test failed" } else { KEEP_ENV };
            eprintln!("kept {} ({why})", path.display());
        }
    }
}
