#!/usr/bin/env bash
# Start-up time with a large fleet: how long `drover serve` takes, on a
# SQLite data directory of n devices each with a pushed state (write-through,
# the default), to answer 200 on /readyz and to accept a push, and its CPU
# time and RSS then; medians of r starts, each on a fresh copy of the seeded
# directory. With -b, the same for a build of that commit, starts
# alternating (before/after in one run).
#
# Usage: scripts/bench-startup.sh [-n devices] [-r runs] [-b commit]
# The seeded directory is kept in $WORK (default /var/tmp/drover-startup)
# and reused; MEASURE_LOCK, if set, is a file the measuring part holds
# with flock (no two measurements at once on a shared machine).
set -euo pipefail
n=1000000 runs=3 base=
while getopts n:r:b: o; do
  case $o in n) n=$OPTARG;; r) runs=$OPTARG;; b) base=$OPTARG;; *) exit 2;; esac
done
export PATH=$PATH:/usr/local/go/bin
top=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/var/tmp/drover-startup}
mkdir -p "$work"
(cd "$top" && go build -o "$work/drover" ./cmd/drover && go build -o "$work/startupbench" ./tools/startupbench)
bins=("$work/drover")
if [ -n "$base" ]; then
  rm -rf "$work/base" && mkdir -p "$work/base"
  git -C "$top" archive "$base" | tar -x -C "$work/base"
  (cd "$work/base" && go build -o "$work/drover-$base" ./cmd/drover)
  bins=("$work/drover-$base" "$work/drover")
fi
seed=$work/seed-$n
[ -d "$seed" ] || "$work/startupbench" seed -dir "$seed" -n "$n"
measure=("$work/startupbench" measure -seed "$seed" -runs "$runs" "${bins[@]}")
echo "$(date -u +%FT%TZ) $(uptime)"
if [ -n "${MEASURE_LOCK:-}" ]; then
  flock "$MEASURE_LOCK" "${measure[@]}"
else
  "${measure[@]}"
fi
echo "$(date -u +%FT%TZ) $(uptime)"
