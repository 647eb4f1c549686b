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
# Every step runs even when one before it failed (and cargo runs every test binary, not
# stopping at the first that fails), so the summary at the end always comes and counts
# everything; the exit status is the first failure's.
status=0
step() {
    local rc=0
    "$@" 2>&1 | tee -a "$log" || rc=$?
    if [ "$status" -eq 0 ]; then status=$rc; fi
}
step cargo test --workspace --doc --no-fail-fast
step cargo test --workspace --all-targets --no-fail-fast "$@"
# The model tests through `kvtier serve` need the `models` feature of the kvtier crate
# (kvtier-candle does not depend on the server, so they cannot live there).
step cargo test -p kvtier --features models --test models_served --no-fail-fast
# The Python package (crates/kvtier-py): pytest against the extension and the kvtier
# binary built above (the client tests start `kvtier serve`).
if stage=$(scripts/python-stage.sh); then
    KVTIER_BIN="$(realpath "${CARGO_TARGET_DIR:-target}/debug/kvtier")" PYTHONPATH="$stage" \
        step .venv/bin/python -m pytest -q -p no:cacheprovider crates/kvtier-py/tests
else
    echo "test.sh: the Python package did not build; its tests did not run" | tee -a "$log"
    if [ "$status" -eq 0 ]; then status=1; fi
fi
awk '
    # cargo: "test result: ok. 21 passed; 0 failed; 2 ignored; 0 measured; ..."
    /^test result:/ { passed += $4; failed += $6; skipped += $8 }
    # pytest: "5 passed, 1 failed, 2 skipped in 3.2s" (with or without = borders)
    !/^test result:/ && /[0-9]+ (passed|failed|skipped|errors?).* in [0-9.]+s/ {
        for (i = 1; i < NF; i++) {
            if ($(i + 1) ~ /^passed/) passed += $i
            if ($(i + 1) ~ /^failed/ || $(i + 1) ~ /^errors?/) failed += $i
            if ($(i + 1) ~ /^skipped/ || $(i + 1) ~ /^xfailed/) skipped += $i
        }
    }
    END { printf "%d passed, %d failed, %d skipped or ignored\n", passed, failed, skipped }' "$log"
exit "$status"
