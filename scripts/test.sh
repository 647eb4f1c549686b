#!/usr/bin/env bash
# README's test command: installs what the tests need, then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace --all-targets "$@"
cargo test --workspace --doc
