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
# The Python package (crates/kvtier-py): pytest against the extension and the kvtier
# binary built above (the client tests start `kvtier serve`).
stage=$(scripts/python-stage.sh)
py_status=0
KVTIER_BIN="$(realpath "${CARGO_TARGET_DIR:-target}/debug/kvtier")" PYTHONPATH="$stage" .venv/bin/python -m pytest -q -p no:cacheprovider crates/kvtier-py/tests 2>&1 |
    tee -a "$log" || py_status=$?
awk '
    /^test result:/ { passed += $4; failed += $6 }
    # pytest: "5 passed, 1 failed in 3.2s" (with or without = borders)
    !/^test result:/ && /[0-9]+ (passed|failed).* in [0-9.]+s/ {
        for (i = 1; i < NF; i++) {
            if ($(i + 1) ~ /^passed/) passed += $i
            if ($(i + 1) ~ /^failed/ || $(i + 1) ~ /^errors?/) failed += $i
        }
    }
    END { printf "%d passed, %d failed\n", passed, failed }' "$log"
exit "$py_status"
