//! Which page size local clients will map the shared arena in, for the start-up line.
//!
//! The arena asks for 2 MiB pages (`MADV_HUGEPAGE`), but for shared memory the kernel
//! grants them only where `transparent_hugepage/shmem_enabled` allows (`advise` or wider).
//! With 4 KiB pages a client's copy out of the arena walks 512 times as many page-table
//! entries and ran at 0.86–0.88× a copy between its own buffers on the VM we measured,
//! against 0.95–1.0× with `advise` (BENCHMARKS.md, issue 37). That is a host setting, so
//! the server says so when it starts rather than failing.

use std::path::Path;

/// The setting's file.
const SHMEM_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

/// A note for the operator when the arena will be in 4 KiB pages (`None` when it will be
/// in 2 MiB pages, from the pool or from transparent huge pages, or the kernel has no
/// such setting to change).
pub fn small_pages_note(huge_pool: bool) -> Option<String> {
    if huge_pool {
        return None;
    }
    let current = chosen(&std::fs::read_to_string(Path::new(SHMEM_ENABLED)).ok()?)?;
    matches!(current.as_str(), "never" | "deny").then(|| {
        format!(
            "the shared arena is in 4 KiB pages ({SHMEM_ENABLED} is `{current}`): local \
             clients read it about 10% slower than from 2 MiB pages; set it to `advise`, or \
             turn shm.huge_pages on with vm.nr_hugepages to hold the arena"
        )
    })
}

/// The bracketed choice of a sysfs setting that lists its options (`always [never] deny`).
fn chosen(listing: &str) -> Option<String> {
    let start = listing.find('[')? + 1;
    let end = start + listing[start..].find(']')?;
    Some(listing[start..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_bracketed_choice() {
        assert_eq!(
            chosen("always within_size advise [never] deny force\n").as_deref(),
            Some("never")
        );
        assert_eq!(chosen("[advise] never").as_deref(), Some("advise"));
        assert_eq!(chosen("always never"), None);
        assert_eq!(small_pages_note(true), None);
    }
}
