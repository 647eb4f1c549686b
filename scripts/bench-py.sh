#!/usr/bin/env bash
# The Python bench rows (py.*): an optimised build of the extension module, then
# crates/kvtier-py/bench/bench_py.py with the given arguments (--json FILE, --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
stage=$(scripts/python-stage.sh --release)
PYTHONPATH="$stage" exec .venv/bin/python crates/kvtier-py/bench/bench_py.py "$@"
