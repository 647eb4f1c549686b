#!/usr/bin/env bash
# Builds the extension module and the kvtier binary its client tests start (debug, in
# the workspace's target directory, sharing its build of the engine) and lays out the
# `kvtier` package beside it, ready for PYTHONPATH; prints the folder. The tests use this; scripts/build-wheel.sh makes the
# wheel users install.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
# --release: an optimised build, for the Python bench rows (scripts/bench-py.sh).
if [[ ${1:-} == --release ]]; then
    cargo build -q --release -p kvtier-py >&2
    profile=release
else
    cargo build -q -p kvtier-py -p kvtier >&2
    profile=debug
fi
stage="$target/python-$profile"
rm -rf "$stage"
mkdir -p "$stage"
cp -r crates/kvtier-py/python/kvtier "$stage/"
cp "$target/$profile/lib_kvtier.so" "$stage/kvtier/_kvtier.abi3.so"
realpath "$stage"
