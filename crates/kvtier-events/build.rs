//! Builds libzmq from source (zeromq-src) with CURVE, against libsodium: private KV events
//! authenticate and encrypt with CURVE (docs/kv-events.md). libsodium comes from the
//! system (Debian's libsodium-dev, which scripts/setup.sh installs), linked statically, so
//! the binary and the Python wheel need no ZeroMQ or libsodium where they run.

use std::path::{Path, PathBuf};

/// Where libsodium's static library and headers are, or `None`.
fn libsodium() -> Option<(PathBuf, PathBuf)> {
    // An explicit place first (another distribution, a build of one's own).
    if let (Ok(lib), Ok(include)) = (
        std::env::var("KVTIER_LIBSODIUM_LIB_DIR"),
        std::env::var("KVTIER_LIBSODIUM_INCLUDE_DIR"),
    ) {
        return Some((lib.into(), include.into()));
    }
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/lib/{arch}-linux-gnu");
    let libs = [
        multiarch.as_str(),
        "/usr/lib",
        "/usr/local/lib",
        "/usr/lib64",
    ];
    let lib = libs
        .iter()
        .map(Path::new)
        .find(|d| d.join("libsodium.a").is_file())?;
    let include = ["/usr/include", "/usr/local/include"]
        .iter()
        .map(Path::new)
        .find(|d| d.join("sodium.h").is_file())?;
    Some((lib.to_path_buf(), include.to_path_buf()))
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=KVTIER_LIBSODIUM_LIB_DIR");
    println!("cargo:rerun-if-env-changed=KVTIER_LIBSODIUM_INCLUDE_DIR");
    let Some((lib, include)) = libsodium() else {
        eprintln!(
            "kvtier-events needs libsodium's static library and headers (libsodium.a, \
             sodium.h) for CURVE: install them with scripts/setup.sh (Debian: apt-get install \
             libsodium-dev), or name them with KVTIER_LIBSODIUM_LIB_DIR and \
             KVTIER_LIBSODIUM_INCLUDE_DIR"
        );
        std::process::exit(1);
    };
    // zeromq-src names the directory for the linker in a form the linker may not take;
    // say it plainly too.
    println!("cargo:rustc-link-search=native={}", lib.display());
    zeromq_src::Build::new()
        .with_libsodium(Some(zeromq_src::LibLocation::new(lib, include)))
        // For ZMQ_ZAP_ENFORCE_DOMAIN: a CURVE server with no ZAP handler refuses
        // everyone instead of admitting anyone.
        .enable_draft(true)
        .build();
}
