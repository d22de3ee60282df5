#!/usr/bin/env bash
# Runs a command, and every process it starts, within a CPU quota: a slow CI machine on a fast one.
#
#   CPUS=0.5 bash scripts/throttled.sh .venv/bin/pytest -q tests/test_queue_e2e.py
#   make test-throttled CPUS=0.5        # the whole suite, as on a 2-core machine four times slower
#
# CI's 2-core machines have run the same suite between 1x and 4x slower than an idle one; a test that waits on a
# fixed wall-clock bound passes here and fails there. Under a quota the command gets CPUS cores' worth of time in
# every 100 ms, whatever it starts (a Spark JVM, a Dagster daemon, a browser), while the rest of the machine stays
# usable. Needs root and a writable cgroup cpu controller (v2's cpu.max or v1's cpu.cfs_quota_us).
set -euo pipefail
cpus=${CPUS:-0.5}
quota=$(awk -v c="$cpus" 'BEGIN { if (c + 0 <= 0) exit 1; printf "%d", c * 100000 }') || {
    echo "throttled.sh: CPUS must be a positive number of cores (got '$cpus')" >&2; exit 2; }
[ "$#" -gt 0 ] || { echo "throttled.sh: give the command to run" >&2; exit 2; }

if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
    root=/sys/fs/cgroup  # cgroup v2
else
    root=/sys/fs/cgroup/cpu  # cgroup v1
fi
group=$root/icemaint_throttled_$$
if ! mkdir "$group" 2>/dev/null; then
    echo "throttled.sh: cannot create a cgroup under $root (needs root and a writable cpu controller)" >&2; exit 2
fi
release() {
    echo $$ > "$root/cgroup.procs" 2>/dev/null || true
    rmdir "$group" 2>/dev/null || true
}
trap release EXIT
if [ "$root" = /sys/fs/cgroup ]; then
    echo "$quota 100000" > "$group/cpu.max"
else
    echo 100000 > "$group/cpu.cfs_period_us"
    echo "$quota" > "$group/cpu.cfs_quota_us"
fi
echo $$ > "$group/cgroup.procs"
echo "throttled.sh: at most $cpus cores for: $*" >&2
status=0
"$@" || status=$?
exit "$status"
