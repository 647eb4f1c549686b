#!/usr/bin/env bash
# The SGLang bench row (py.sglang.batch_exists.ms): optimised builds of the Python module
# and of `kvtier serve`, then crates/kvtier-py/bench/bench_sglang.py with the given
# arguments (--json FILE, --rounds N). SGLang's host pools come from .venv/sglang-overlay
# (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
stage=$(scripts/python-stage.sh --release)
cargo build -q --release -p kvtier >&2
PYTHONPATH="$stage" exec .venv/bin/python crates/kvtier-py/bench/bench_sglang.py "$@"
