#!/usr/bin/env bash
# Emulator efficiency: `drover emulate` against wrk, keep-alive,
# same connections, same request (POST /api/v1/push with a device's token
# and a router state), on the same endpoints in the same run:
#   - nginx `return 200` over HTTP (a throwaway nginx in a temp dir),
#   - Drover over HTTPS and over HTTP.
# Prints each tool's requests/s, the median of the runs, and the ratio
# emulator/wrk per endpoint (target: >= 0.8); also each tool's CPU time per
# request, which other load on the machine disturbs less than rates do.
# Then the emulator's highest pushes/s against Drover for each connection
# mode.
#
# Usage: scripts/bench-emulator-vs-wrk.sh [-r runs] [-d seconds] [-c connections] [-n devices] [-m]
#   -m  skip the connection-mode table
# Needs: go, wrk, nginx, python3 (Debian packages wrk nginx-light python3).
set -euo pipefail
runs=3 dur=10 conns=64 devices=10000 threads=2 modes=1
while getopts r:d:c:n:m o; do
  case $o in r) runs=$OPTARG;; d) dur=$OPTARG;; c) conns=$OPTARG;; n) devices=$OPTARG;; m) modes=0;; *) exit 2;; esac
done
export PATH=$PATH:/usr/local/go/bin
[ -x /usr/bin/time ] || { echo "missing /usr/bin/time (Debian: apt-get install time)" >&2; exit 1; }
for tool in go wrk nginx python3; do
  command -v $tool >/dev/null || { echo "missing $tool (Debian: apt-get install wrk nginx-light python3)" >&2; exit 1; }
done
top=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/drover-emubench.XXXXXX)
# Capacity runs: wrk pushes each token in a loop, which per-device quotas
# (docs/operations.md) would refuse.
noquota="--quota-push-rate 0 --quota-history-samples 0 --quota-history-bytes 0"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

freeport() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
waitport() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

echo "building..." >&2
(cd "$top" && go build -o "$work/drover" ./cmd/drover)

dport=$(freeport); dhport=$(freeport)
"$work/drover" serve $noquota --data-dir "$work/data" --listen 127.0.0.1:$dport --http-listen 127.0.0.1:$dhport --log-level warn >"$work/serve.out" 2>"$work/serve.log" &
pids+=($!); waitport $dport

nport=$(freeport)
mkdir -p "$work/nginx/logs"
cat >"$work/nginx/nginx.conf" <<CONF
worker_processes auto;
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$nport;
    location / { return 200 '{"push_interval":200}\n'; }
  }
}
CONF
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" & pids+=($!); waitport $nport

emu() { # target URL, extra flags...: prints requests/s, errors, CPU µs per request
  local url=$1; shift
  "$work/drover" emulate --target "$url" --server-dir "$work/data" --credentials "$work/creds.jsonl" \
    --devices "$devices" --mode benchmark --loops 1000000 --duration "${dur}s" --progress none \
    --out "$work/emu.jsonl" "$@" >>"$work/emu.log" 2>&1 || true
  python3 - "$work/emu.jsonl" <<'PY'
import json, sys, datetime
def t(s):
    s = s.rstrip("Z")
    if "." in s:
        a, b = s.split(".")
        s = a + "." + b[:6]
    return datetime.datetime.fromisoformat(s)
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["type"] == "summary":
        p = r["ops"].get("push", {})
        done = p.get("accepted", 0) + sum(p.get("rejected", {}).values()) + sum(p.get("dropped", {}).values())
        el = (t(p["last"]) - t(p["first"])).total_seconds()
        cpu = r["resources"]["cpu_seconds"]
        print("%.0f %d %.1f" % (done / el, done - p.get("accepted", 0), cpu * 1e6 / max(done, 1)))
PY
}

echo "registering $devices devices..." >&2
"$work/drover" emulate --target https://127.0.0.1:$dport --server-dir "$work/data" --credentials "$work/creds.jsonl" \
  --devices "$devices" --mode benchmark --loops 0 --workers 32 --progress none --out "" >"$work/register.log" 2>&1
python3 -c "
import json
for l in open('$work/creds.jsonl'): print(json.loads(l)['token'])" >"$work/tokens.txt"

wrkrate() { # prints requests/s, non-2xx, CPU µs per request
  local out; out=$(TOKENS=$work/tokens.txt WRK_THREADS=$threads /usr/bin/time -f 'CPUTIME %U %S' \
    wrk -t$threads -c$conns -d${dur}s -s "$top/scripts/wrk/push.lua" "$1" 2>&1)
  echo "$out" >>"$work/wrk.log"
  echo "$out" | awk '/Requests\/sec/ {r=$2} /requests in/ {n=$1} /Non-2xx/ {e=$5} /^CPUTIME/ {c=$2+$3}
    END {printf "%.0f %s %.1f\n", r, (e==""?0:e), c*1e6/(n>0?n:1)}'
}

declare -A res
targets=("nginx return 200, http|http://127.0.0.1:$nport" "drover, https|https://127.0.0.1:$dport" "drover, http|http://127.0.0.1:$dhport")
for i in $(seq "$runs"); do
  echo "run $i/$runs" >&2
  for t in "${targets[@]}"; do
    name=${t%%|*} url=${t##*|}
    read -r wr we wc <<<"$(wrkrate "$url")"; read -r er ee ec <<<"$(emu "$url" --conn keepalive --workers "$conns")"
    res["wrk $name"]+="$wr "; res["emu $name"]+="$er "; res["wrkcpu $name"]+="$wc "; res["emucpu $name"]+="$ec "
    res["ratio $name"]+="$(awk -v a="$er" -v b="$wr" 'BEGIN {printf "%.3f", a/b}') "
    printf '  %-24s wrk %7s req/s %6s µs CPU/req (non-2xx %s)   emulator %7s req/s %6s µs CPU/req (errors %s)   ratio %s   load %s\n' \
      "$name" "$wr" "$wc" "$we" "$er" "$ec" "$ee" "$(awk -v a="$er" -v b="$wr" 'BEGIN {printf "%.2f", a/b}')" "$(cut -d' ' -f1 /proc/loadavg)" >&2
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo
echo "## Emulator vs wrk (keep-alive, $conns connections, ${dur}s, median of $runs; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo
echo "| endpoint | wrk runs (req/s) | emulator runs (req/s) | wrk median | emulator median | emulator / wrk, median of the paired runs | CPU µs/req wrk | CPU µs/req emulator |"
echo "|---|---|---|---:|---:|---:|---:|---:|"
for t in "${targets[@]}"; do
  name=${t%%|*}
  wm=$(echo "${res["wrk $name"]}" | median); em=$(echo "${res["emu $name"]}" | median)
  wc=$(echo "${res["wrkcpu $name"]}" | median); ec=$(echo "${res["emucpu $name"]}" | median)
  rm=$(echo "${res["ratio $name"]}" | median)
  printf '| %s | %s | %s | %.0f | %.0f | %.2f | %.1f | %.1f |\n' "$name" "$(echo ${res["wrk $name"]} | sed 's/ /, /g')" \
    "$(echo ${res["emu $name"]} | sed 's/ /, /g')" "$wm" "$em" "$rm" "$wc" "$ec"
done
echo
echo "Load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores (other processes disturb rates; CPU per request less so)." 

if [ "$modes" = 1 ]; then
  echo
  echo "## Emulator benchmark mode against Drover: pushes/s by connection mode ($conns workers, ${dur}s, median of $runs)"
  echo
  echo "| scheme, connections | runs (pushes/s) | median |"
  echo "|---|---|---:|"
  for m in "http keepalive|http://127.0.0.1:$dhport|keepalive" "https keepalive|https://127.0.0.1:$dport|keepalive" \
           "https new connection per push|https://127.0.0.1:$dport|new" "https resumed TLS session|https://127.0.0.1:$dport|resume"; do
    IFS='|' read -r name url conn <<<"$m"
    rs=""
    for i in $(seq "$runs"); do read -r er ee ec <<<"$(emu "$url" --conn "$conn" --workers "$conns")"; rs+="$er "; done
    printf '| %s | %s | %.0f |\n' "$name" "$(echo $rs | sed 's/ /, /g')" "$(echo "$rs" | median)"
  done
fi
echo
echo "warnings/errors in server log: $(grep -cE 'level=(WARN|ERROR)' "$work/serve.log" || true)"
