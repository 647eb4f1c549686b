#!/usr/bin/env bash
# Runs a command with reads from the disk under DIR capped at RATE bytes per second, so a
# row measured "where the disk is the limit" can be measured on a machine whose disk is
# faster than its cores decode (issue 40's `ssd.load.2MiB.effective`). The cap is the
# kernel's block-I/O throttle of a cgroup (v1 blkio or v2 io.max), so every read the
# command and its threads make — cached, read ahead or O_DIRECT, ours and the baseline's
# alike — is held to it. Needs root; removes its cgroup when the command ends.
#
# The throttle grants reads by time slices (100 ms on a disk that calls itself rotational)
# and lets a reader spend an idle spell's allowance at once, so a run must be long
# against a slice to measure the rate (`--ssd-mib 1024`; BENCHMARKS.md, issue 40).
#
#   scripts/slow-disk.sh 250000000 /work/bench-ssd -- target/release/kvtier bench \
#       --filter 2MiB.effective --ssd-mib 1024 --ssd-dir /work/bench-ssd
set -euo pipefail

if [[ $# -lt 4 || $3 != "--" ]]; then
    echo "usage: $0 RATE_BYTES_PER_S DIR -- COMMAND..." >&2
    exit 2
fi
rate=$1
dir=$2
shift 3
[[ $rate =~ ^[0-9]+$ ]] || { echo "slow-disk: RATE must be bytes per second, got '$rate'" >&2; exit 2; }
mkdir -p "$dir"

# The whole disk under DIR (a throttle applies to disks, not partitions).
source=$(findmnt -no SOURCE --target "$dir")
disk=$(lsblk -no PKNAME "$source" 2>/dev/null | head -1)
[[ -n $disk ]] || disk=$(basename "$source")
majmin=$(lsblk -dno MAJ:MIN "/dev/$disk" | tr -d ' ')
[[ -n $majmin ]] || { echo "slow-disk: no block device found under $dir ($source)" >&2; exit 1; }

name="kvtier-slowdisk-$$"
if [[ -d /sys/fs/cgroup/blkio ]]; then
    group=/sys/fs/cgroup/blkio/$name
    mkdir "$group"
    echo "$majmin $rate" > "$group/blkio.throttle.read_bps_device"
elif [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    # (This branch is not exercised on the project's machine, which has cgroup v1.)
    grep -qw io /sys/fs/cgroup/cgroup.subtree_control ||
        echo +io > /sys/fs/cgroup/cgroup.subtree_control
    group=/sys/fs/cgroup/$name
    mkdir "$group"
    echo "$majmin rbps=$rate" > "$group/io.max"
else
    echo "slow-disk: no cgroup block-I/O throttle on this machine" >&2
    exit 1
fi
cleanup() { rmdir "$group" 2>/dev/null || true; }
trap cleanup EXIT

echo "slow-disk: reads from /dev/$disk ($majmin) capped at $rate B/s" >&2
# The command runs in a child shell moved into the group first, so it and every thread
# it starts are throttled; this script stays outside, to remove the group after.
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' slow-disk "$group" "$@"
