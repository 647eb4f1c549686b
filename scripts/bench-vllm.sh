#!/usr/bin/env bash
# The vLLM rows (engine.vllm.ttft.*): a real vLLM engine on CPU with kvtier as its KV
# connector; an optimised build of kvtier (binary and Python module) first. Arguments go
# to crates/kvtier-py/bench/bench_vllm.py (--json FILE, --pairs N).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
cargo build -q --release -p kvtier >&2
stage=$(scripts/python-stage.sh --release)
KVTIER_BIN="$(realpath "${CARGO_TARGET_DIR:-target}/release/kvtier")" PYTHONPATH="$stage" \
    exec .venv/bin/python crates/kvtier-py/bench/bench_vllm.py "$@"
