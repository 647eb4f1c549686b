#!/usr/bin/env bash
# The GPU check (issue 37; scripts/gpu_check.py says what each row is): kvtier's path
# between its RAM tier and a paged GPU cache, beside the machine's pinned-copy limits,
# every byte moved checked. Needs an NVIDIA GPU, torch and numpy; not vLLM.
#
#   scripts/gpu-check.sh [--json rows.json]     # on a GPU machine
#   scripts/gpu-check.sh --cpu                  # the same code on CPU tensors, small (smoke)
#
# kvtier comes from, in order: an installed package (a wheel: scripts/build-wheel.sh), or
# an optimised build of this checkout (cargo; then the `kvtier` binary for the served row
# is target/release/kvtier, or KVTIER_BIN). PYTHON picks the interpreter (default: the
# project's .venv if there is one, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-}
if [[ -z $python ]]; then
    if [[ -x .venv/bin/python ]]; then python=.venv/bin/python; else python=python3; fi
fi
if ! "$python" -c "import kvtier._kvtier" 2>/dev/null; then
    stage=$(scripts/python-stage.sh --release | tail -1)
    cargo build -q --release -p kvtier >&2
    export PYTHONPATH="$stage${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$python" scripts/gpu_check.py "$@"
