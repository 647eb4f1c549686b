#!/usr/bin/env bash
# Builds kvtier's Python wheel (one abi3 wheel for CPython 3.11 and later) into
# target/wheels (or $KVTIER_WHEEL_OUT): the `kvtier` package and the `kvtier` binary, which
# pip installs on the environment's PATH beside `python` — so `pip install kvtier-*.whl`
# then `kvtier serve` works on a machine with no Rust toolchain.
#
#   scripts/build-wheel.sh           # release build: the wheel users install
#   scripts/build-wheel.sh --debug   # debug build (quick to build, slow to run): the tests'
#
# The binary is stripped of debug information on its way into the wheel (a release
# build's line tables are most of its size).
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
# pyproject.toml's `data`: files under scripts/ are installed into the environment's bin.
data=crates/kvtier-py/wheel-data
rm -rf "$data"
mkdir -p "$data/scripts"
strip --strip-debug -o "$data/scripts/kvtier" "$target/$profile/kvtier"
.venv/bin/maturin build "${release[@]}" -m crates/kvtier-py/Cargo.toml -o "$out" "$@"
rm -rf "$data"
