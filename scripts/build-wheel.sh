#!/usr/bin/env bash
# Builds kvtier's Python wheel (one abi3 wheel for CPython 3.11 and later) into
# target/wheels (or $KVTIER_WHEEL_OUT): the `kvtier` package with the `kvtier` binary inside
# it (kvtier/_bin/kvtier) and a `kvtier` command that runs it, which pip puts on the
# environment's PATH — so `pip install kvtier-*.whl` then `kvtier serve` works on a machine
# with no Rust toolchain.
#
#   scripts/build-wheel.sh           # release build: the wheel users install
#   scripts/build-wheel.sh --debug   # debug build (quick to build, slow to run): the tests'
#
# The binary is stripped of debug information on its way into the wheel (a release
# build's line tables are most of its size). It is copied into the package's source folder
# for the build (ignored by git) and removed after.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv/bin/maturin ]] || scripts/setup.sh
target=${CARGO_TARGET_DIR:-target}
out=${KVTIER_WHEEL_OUT:-$target/wheels}
if [[ ${1:-} == --debug ]]; then
    shift
    profile=debug
    release=()
else
    profile=release
    release=(--release)
fi
cargo build -q "${release[@]}" -p kvtier
bin=crates/kvtier-py/python/kvtier/_bin
trap 'rm -rf "$bin"' EXIT
rm -rf "$bin"
mkdir -p "$bin"
strip --strip-debug -o "$bin/kvtier" "$target/$profile/kvtier"
.venv/bin/maturin build "${release[@]}" -m crates/kvtier-py/Cargo.toml -o "$out" "$@"
