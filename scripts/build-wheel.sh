#!/usr/bin/env bash
# Builds kvtier's Python wheel (one abi3 wheel for CPython 3.11 and later, release
# build) into target/wheels; `pip install target/wheels/kvtier-*.whl` installs it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/maturin build --release -m crates/kvtier-py/Cargo.toml -o "${CARGO_TARGET_DIR:-target}/wheels" "$@"
