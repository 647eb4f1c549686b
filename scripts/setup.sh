#!/usr/bin/env bash
# Installs what kvtier's build and tests need beyond a Rust toolchain, on a fresh machine.
# Safe to run again: it only installs what is missing.
#
# Today: python3 (the hash-chain tests run an independent reference implementation).
set -euo pipefail

need_apt=()
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)

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
