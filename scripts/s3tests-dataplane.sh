#!/usr/bin/env bash
# Runs ceph/s3-tests' 91-test data-plane subset (bench/s3tests-dataplane.txt) against
# `kvtier gateway` and prints how many pass: the figure issue 39 compares with Ceph RGW's
# 86 of 91, on the same list.
#
#   scripts/s3tests-dataplane.sh S3TESTS_CHECKOUT      # a checkout of ceph/s3-tests
#
# The checkout is not fetched here (no network is assumed; any copy of
# github.com/ceph/s3-tests will do; the figures in BENCHMARKS.md name its commit). Its
# Python requirements go into .venv-s3tests (ignored by git) from PyPI. The gateway runs on
# a free loopback port with the key pair of s3tests.conf.SAMPLE's `[s3 main]`, which every
# section of the generated s3tests.conf uses (the gateway has one account).
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: scripts/s3tests-dataplane.sh S3TESTS_CHECKOUT}
src=$(realpath "$src")
[[ -f $src/s3tests/functional/test_s3.py ]] || {
    echo "s3tests-dataplane: $src is not a ceph/s3-tests checkout" >&2
    exit 2
}
list=bench/s3tests-dataplane.txt
access=0555b35654ad1656d804
secret='h7GhxuBLTrlhVUyxSPUKUV8r/2EI4ngqJxD7iBdBYLhwluN30JaT3Q=='

bin=${KVTIER_BIN:-}
if [[ -z $bin ]]; then
    cargo build -q --release -p kvtier
    bin=target/release/kvtier
fi
venv=.venv-s3tests
if [[ ! -x $venv/bin/pytest ]]; then
    python3 -m venv "$venv"
    PIP_NO_CACHE_DIR=1 "$venv/bin/pip" install -q --disable-pip-version-check -r "$src/requirements.txt"
fi

work=$(mktemp -d)
gateway_pid=
cleanup() {
    [[ -n $gateway_pid ]] && kill "$gateway_pid" 2>/dev/null && wait "$gateway_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
"$bin" gateway --dir "$work/s3" --listen 127.0.0.1:0 --access-key "$access" --secret-key "$secret" \
    > "$work/gateway.out" 2> "$work/gateway.err" &
gateway_pid=$!
for _ in $(seq 100); do
    grep -q "listening on" "$work/gateway.out" 2>/dev/null && break
    sleep 0.1
done
port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/gateway.out" | head -1)
[[ -n $port ]] || {
    echo "s3tests-dataplane: the gateway did not start:" >&2
    cat "$work/gateway.err" >&2
    exit 1
}

# The sample configuration, pointed at the gateway, every account's keys the gateway's.
sed -e "s/^host = .*/host = 127.0.0.1/" -e "s/^port = .*/port = $port/" \
    -e "s/^access_key = .*/access_key = $access/" -e "s|^secret_key = .*|secret_key = $secret|" \
    "$src/s3tests.conf.SAMPLE" > "$work/s3tests.conf"

mapfile -t names < <(grep -v '^#' "$list" | grep -v '^$')
tests=()
for n in "${names[@]}"; do
    tests+=("s3tests/functional/test_s3.py::$n")
done
set +e
(cd "$src" && S3TEST_CONF="$work/s3tests.conf" "$OLDPWD/$venv/bin/pytest" -q -rfE -p no:cacheprovider \
    "${tests[@]}") > "$work/pytest.log" 2>&1
set -e
passed=$(grep -Eo '[0-9]+ passed' "$work/pytest.log" | tail -1 | grep -Eo '[0-9]+' || echo 0)
grep -E '^(FAILED|ERROR) ' "$work/pytest.log" | sed 's/ - .*//' || true
echo "s3tests data-plane subset: $passed of ${#names[@]} passed (Ceph RGW 16.2: 86 of 91)"
