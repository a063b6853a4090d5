#!/usr/bin/env bash
# The emulator's own CPU per push: two emulator builds, the
# commit BASE (default main's merge base before the lean dialer, 3cedf0e)
# and the work tree, alternated in one run against a cheap reference server
# (tools/barehttp: Go net/http answering every request with a fixed body),
# in fleet mode (open loop, a new connection per push) over plain HTTP,
# HTTPS with a full handshake and HTTPS with a resumed session.
# CPU is the emulator process's user + system time (wait4 rusage, the same
# counters as utime + stime in /proc/PID/stat), per 10,000 pushes; medians
# of the runs, and the after/before ratio of each pair.
#
# Usage: scripts/bench-emulator-cpu.sh [-b BASE] [-r runs] [-d seconds] [-p pushes/s]
# Needs: go, python3, openssl, /usr/bin/time (Debian: time).
set -euo pipefail
base=3cedf0e runs=3 dur=8 rate=2000
while getopts b:r:d:p: o; do
  case $o in b) base=$OPTARG;; r) runs=$OPTARG;; d) dur=$OPTARG;; p) rate=$OPTARG;; *) exit 2;; esac
done
export PATH=$PATH:/usr/local/go/bin
for tool in go python3 openssl; do command -v $tool >/dev/null || { echo "missing $tool" >&2; exit 1; }; done
[ -x /usr/bin/time ] || { echo "missing /usr/bin/time (Debian: apt-get install time)" >&2; exit 1; }
top=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/drover-emucpu.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
freeport() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
waitport() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

echo "building $base and the work tree..." >&2
mkdir -p "$work/before"
git -C "$top" archive "$base" | tar -x -C "$work/before"
(cd "$work/before" && go build -o "$work/drover.before" ./cmd/drover)
(cd "$top" && go build -o "$work/drover.after" ./cmd/drover && go build -o "$work/barehttp" ./tools/barehttp)
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$work/key.pem" -out "$work/cert.pem" \
  -days 2 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 2>/dev/null
hp=$(freeport) sp=$(freeport)
"$work/barehttp" -http 127.0.0.1:$hp -https 127.0.0.1:$sp -cert "$work/cert.pem" -key "$work/key.pem" 2>"$work/bare.log" &
pids+=($!); waitport $sp

# Every device pushes once in the run: devices = rate × duration, interval = duration.
devices=$((rate * dur))
common=(--secret x --devices "$devices" --credentials "$work/creds.jsonl" --progress none --ca-cert "$work/cert.pem")
"$work/drover.after" emulate --target http://127.0.0.1:$hp "${common[@]}" --mode benchmark --loops 0 --workers 16 \
  --conn keepalive --out "" >"$work/register.log" 2>&1

one() { # binary url conn: prints "CPU-seconds-per-10k accepted-of-sent"
  local out
  out=$( /usr/bin/time -f 'CPUTIME %U %S' "$work/drover.$1" emulate --target "$2" "${common[@]}" --conn "$3" \
    --interval "${dur}s" --duration "${dur}s" --source-addrs 127.0.0.1-127.0.0.8 --out "$work/emu.jsonl" 2>&1 )
  echo "$out" >>"$work/emu.log"
  local cpu; cpu=$(echo "$out" | awk '/^CPUTIME/ {print $2+$3}')
  python3 - "$work/emu.jsonl" "$cpu" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["type"] == "summary":
        p = r["ops"].get("push", {})
        acc = p.get("accepted", 0)
        print("%.3f %d" % (float(sys.argv[2]) * 10000 / max(acc, 1), acc))
PY
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

declare -A res
cases=("http, new connection|http://127.0.0.1:$hp|new" "https, full handshake|https://127.0.0.1:$sp|new" "https, resumed session|https://127.0.0.1:$sp|resume")
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for i in $(seq "$runs"); do
  for c in "${cases[@]}"; do
    IFS='|' read -r name url conn <<<"$c"
    read -r b ba <<<"$(one before "$url" "$conn")"
    read -r a aa <<<"$(one after "$url" "$conn")"
    res["b $name"]+="$b " res["a $name"]+="$a "
    res["r $name"]+="$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", a/b}') "
    printf '  run %d %-24s before %6.3f s (%d accepted)  after %6.3f s (%d accepted)  load %s\n' "$i" "$name" "$b" "$ba" "$a" "$aa" "$(cut -d' ' -f1 /proc/loadavg)" >&2
  done
done
echo
echo "## Emulator CPU-seconds per 10,000 pushes ($rate pushes/s offered for ${dur}s, fleet mode; $base vs work tree; median of $runs)"
echo
echo "| case | before runs | after runs | before median | after median | after / before (median of pairs) |"
echo "|---|---|---|---:|---:|---:|"
for c in "${cases[@]}"; do
  name=${c%%|*}
  printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "$(echo ${res["b $name"]} | sed 's/ /, /g')" "$(echo ${res["a $name"]} | sed 's/ /, /g')" \
    "$(echo "${res["b $name"]}" | median)" "$(echo "${res["a $name"]}" | median)" "$(echo "${res["r $name"]}" | median)"
done
echo
echo "Load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores."
