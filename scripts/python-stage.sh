#!/usr/bin/env bash
# Builds the extension module and the kvtier binary its client tests start (debug, in
# the workspace's target directory, sharing its build of the engine) and lays out the
# `kvtier` package beside it, ready for PYTHONPATH; prints the folder. The tests use this; scripts/build-wheel.sh makes the
# wheel users install.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build -q -p kvtier-py -p kvtier >&2
stage="$target/python"
rm -rf "$stage"
mkdir -p "$stage"
cp -r crates/kvtier-py/python/kvtier "$stage/"
cp "$target/debug/lib_kvtier.so" "$stage/kvtier/_kvtier.abi3.so"
realpath "$stage"
