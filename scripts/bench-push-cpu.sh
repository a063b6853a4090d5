#!/bin/bash
# Server CPU per push over plain HTTP with a new connection per push (as the fleet test):
# starts `drover serve` (SQLite write-through, --push-interval 10, default
# quotas) in a fresh data directory, registers N devices, runs the emulator's
# fleet mode (N devices, one push each per INTERVAL, for DURATION, from 16
# loopback addresses) and reads the server's utime+stime from /proc around the
# fleet run: CPU seconds per 10,000 accepted pushes, a ratio that holds on a
# loaded machine better than pushes/s. With BARE=1 it runs the same fleet
# against tools/barehttp instead (credentials of the previous run in WORK):
# the net/http floor.
#
#   scripts/bench-push-cpu.sh ./drover before 10000 10s 30s
#   BARE=1 scripts/bench-push-cpu.sh ./barehttp floor 10000 10s 30s
#
# Extra arguments after DURATION go to `drover serve`. PROFILE=15 also saves a
# 15 s CPU profile (taken 8 s into the run) as WORK/run-LABEL/cpu.pprof.
set -eu
bin=$1 label=$2 n=${3:-10000} interval=${4:-10s} dur=${5:-30s}
shift $(( $# < 5 ? $# : 5 ))
work=${WORK:-/tmp/bench-push-cpu} emu=${EMU:-$(dirname "$0")/../drover}
[ -x "$emu" ] || emu=$bin
port=$((39000 + RANDOM % 500)) dport=$((39600 + RANDOM % 200))
d=$work/run-$label
rm -rf "$d"; mkdir -p "$d"
bin=$(realpath "$bin") emu=$(realpath "$emu")
cd "$d" # the emulator writes its results file into the working directory
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
fleet() {
  "$emu" emulate --target http://127.0.0.1:$port --server-dir "$1" --devices $n --interval $interval --duration $dur \
    --conn new --source-addrs 127.0.0.1-127.0.0.16 --credentials "$2" >"$d/fleet.log" 2>&1
}
accepted() { awk '$1=="push" && $2 ~ /^[0-9]+$/ {print $3; exit}' "$d/fleet.log"; }
if [ "${BARE:-}" = 1 ]; then
  "$bin" -http 127.0.0.1:$port & pid=$!
  sleep 0.5
  c0=$(cpu $pid); fleet "$work/creds/data" "$work/creds/creds.json"; c1=$(cpu $pid)
  kill $pid; wait $pid 2>/dev/null || true
else
  "$bin" serve --data-dir "$d/data" --listen "" --http-listen 127.0.0.1:$port --debug-listen 127.0.0.1:$dport \
    --push-interval 10 "$@" >"$d/serve.log" 2>&1 & pid=$!
  for _ in $(seq 100); do curl -fs 127.0.0.1:$port/healthz >/dev/null && break; sleep 0.2; done
  "$emu" emulate --target http://127.0.0.1:$port --server-dir "$d/data" --devices $n --mode benchmark --loops 0 \
    --workers 64 --conn keepalive --credentials "$d/creds.json" >"$d/reg.log" 2>&1
  rm -rf "$work/creds"; mkdir -p "$work/creds/data"; cp "$d/creds.json" "$work/creds/"; cp -r "$d/data/secrets.json" "$d/data/tls" "$work/creds/data/" 2>/dev/null || true
  pp=
  if [ -n "${PROFILE:-}" ]; then (sleep 8; curl -s -o "$d/cpu.pprof" "127.0.0.1:$dport/debug/pprof/profile?seconds=$PROFILE") & pp=$!; fi
  c0=$(cpu $pid); fleet "$d/data" "$d/creds.json"; c1=$(cpu $pid)
  [ -n "$pp" ] && wait $pp
  rss=$(awk '/VmRSS/{print $2}' /proc/$pid/status)
  kill -TERM $pid; wait $pid || true
  echo "server RSS at the end: $rss KiB"
fi
a=$(accepted)
python3 -c "a=int('$a'); c=($c1-$c0)/100; print(f'$label: {a} pushes accepted, server CPU {c:.2f} s, {c/a*1e4:.3f} CPU-s per 10,000 pushes')"
