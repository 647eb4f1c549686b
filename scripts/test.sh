#!/usr/bin/env bash
# README's test command: installs what the tests need, then runs every test of the
# workspace and ends with one summary line ("N passed, M failed").
set -euo pipefail
cd "$(dirname "$0")/.."
# The model tests need the Gemma weights: fetch them here, before the build, so a failed
# download shows as a setup error rather than a failed test.
scripts/setup.sh --with-weights
# A --user pip install (boto3, awscli, moto) puts its commands here.
export PATH="$HOME/.local/bin:$PATH"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --doc 2>&1 | tee "$log"
cargo test --workspace --all-targets "$@" 2>&1 | tee -a "$log"
# The model tests through `kvtier serve` need the `models` feature of the kvtier crate
# (kvtier-candle does not depend on the server, so they cannot live there).
cargo test -p kvtier --features models --test models_served 2>&1 | tee -a "$log"
awk '/^test result:/ { passed += $4; failed += $6 } END { printf "%d passed, %d failed\n", passed, failed }' "$log"
