#!/usr/bin/env bash
# Server-core benchmark (issue 2): pushes/s and registrations/s of `drover
# serve` (SQLite, write-through) measured with wrk next to nginx `return 200`
# and a bare Go net/http handler, on the same machine in the same run; then
# RSS per device with N registered devices that each pushed once.
#
# Usage: scripts/bench-core.sh [-r runs] [-d seconds] [-c connections] [-n rss-devices]
# Needs: go, wrk, nginx (Debian packages wrk nginx-light).
set -euo pipefail
runs=3 dur=10 conns=64 rssn=100000 threads=2
while getopts r:d:c:n: o; do
  case $o in r) runs=$OPTARG;; d) dur=$OPTARG;; c) conns=$OPTARG;; n) rssn=$OPTARG;; *) exit 2;; esac
done
export PATH=$PATH:/usr/local/go/bin
top=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/drover-bench.XXXXXX)
# Capacity runs: wrk pushes each token in a loop, which per-device quotas
# (docs/operations.md) would refuse.
noquota="--quota-push-rate 0 --quota-history-samples 0 --quota-history-bytes 0"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

freeport() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
waitport() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

echo "building..." >&2
(cd "$top" && go build -o "$work/drover" ./cmd/drover && go build -o "$work/barehttp" ./tools/barehttp && go build -o "$work/benchprep" ./tools/benchprep)

# Drover, zero configuration apart from the ports.
dport=$(freeport); dhport=$(freeport)
"$work/drover" serve $noquota --data-dir "$work/data" --listen 127.0.0.1:$dport --http-listen 127.0.0.1:$dhport --log-level warn >"$work/serve.out" 2>"$work/serve.log" &
dpid=$!; pids+=($dpid); waitport $dport
secret=$(python3 -c "import json;print(json.load(open('$work/data/secrets.json'))['enrollment_secret'])")
cert=$work/data/tls/cert.pem key=$work/data/tls/key.pem

# nginx with a `return 200` location, HTTP and HTTPS, same certificate.
nport=$(freeport); nsport=$(freeport)
mkdir -p "$work/nginx/logs"
cat >"$work/nginx/nginx.conf" <<CONF
worker_processes auto;
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$nport;
    listen 127.0.0.1:$nsport ssl;
    ssl_certificate $cert;
    ssl_certificate_key $key;
    location / { return 200 '{"push_interval":200}\n'; }
  }
}
CONF
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" & pids+=($!); waitport $nport

# Bare Go net/http.
gport=$(freeport); gsport=$(freeport)
"$work/barehttp" -http 127.0.0.1:$gport -https 127.0.0.1:$gsport -cert "$cert" -key "$key" & pids+=($!); waitport $gsport

echo "registering 10000 devices for the push runs..." >&2
"$work/benchprep" -url https://127.0.0.1:$dport -secret "$secret" -n 10000 -out "$work/tokens.txt" -prefix pushbench 2>&2

rate() { # wrk output -> requests/s and non-2xx count
  awk '/Requests\/sec/ {r=$2} /Non-2xx/ {e=$5} /Socket errors/ {s=$0} END {printf "%s %s\n", r, (e==""?0:e)}'
}
declare -A results
run() { # name, then wrk arguments
  local name=$1; shift
  local out; out=$(wrk -t$threads -c$conns -d${dur}s --latency "$@" 2>&1)
  echo "$out" >>"$work/wrk.log"
  local r; r=$(echo "$out" | rate)
  results[$name]+="${r%% *} "
  printf '  %-34s %10s req/s  non-2xx %s\n' "$name" "${r%% *}" "${r##* }" >&2
}
for i in $(seq "$runs"); do
  echo "run $i/$runs" >&2
  run "nginx return 200, http"            http://127.0.0.1:$nport/
  run "nginx return 200, https"           https://127.0.0.1:$nsport/
  run "go net/http bare, http"            http://127.0.0.1:$gport/
  run "go net/http bare, https"           https://127.0.0.1:$gsport/
  TOKENS=$work/tokens.txt WRK_THREADS=$threads run "drover push, http"  -s "$top/scripts/wrk/push.lua" http://127.0.0.1:$dhport
  TOKENS=$work/tokens.txt WRK_THREADS=$threads run "drover push, https" -s "$top/scripts/wrk/push.lua" https://127.0.0.1:$dport
  SECRET=$secret RUN=r$i run "drover register, https" -s "$top/scripts/wrk/register.lua" https://127.0.0.1:$dport
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo
echo "## Throughput (wrk -t$threads -c$conns -d${dur}s keep-alive, median of $runs; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo
echo "| target | runs (req/s) | median req/s |"
echo "|---|---|---:|"
for name in "nginx return 200, http" "nginx return 200, https" "go net/http bare, http" "go net/http bare, https" "drover push, http" "drover push, https" "drover register, https"; do
  m=$(echo "${results[$name]}" | median)
  printf '| %s | %s | %.0f |\n' "$name" "$(echo ${results[$name]} | sed 's/ /, /g')" "$m"
  eval "med_$(echo "$name" | tr -c 'a-z0-9' '_')=$m"
done
echo
awk -v a="$med_drover_push__https_" -v b="$med_nginx_return_200__https_" -v c="$med_go_net_http_bare__https_" -v d="$med_drover_push__http_" -v e="$med_nginx_return_200__http_" \
  'BEGIN {printf "drover push / nginx (https): %.2f; drover push / bare Go (https): %.2f; drover push / nginx (http): %.2f\n", a/b, a/c, d/e}'

kill $dpid; wait $dpid 2>/dev/null || true
echo
echo "## Memory: RSS with $rssn registered devices, each with one pushed state (write-through, SQLite)"
rm -rf "$work/data2"
dport=$(freeport)
"$work/drover" serve $noquota --data-dir "$work/data2" --listen 127.0.0.1:$dport --log-level warn >/dev/null 2>"$work/serve2.log" &
dpid=$!; pids+=($dpid); waitport $dport
secret=$(python3 -c "import json;print(json.load(open('$work/data2/secrets.json'))['enrollment_secret'])")
rss() { awk '/VmRSS/ {print $2}' /proc/$1/status; }
sleep 1; base=$(rss $dpid)
"$work/benchprep" -url https://127.0.0.1:$dport -secret "$secret" -n "$rssn" -out "$work/tokens2.txt" -prefix rss 2>&2
sleep 2; after=$(rss $dpid)
kill $dpid; wait $dpid 2>/dev/null || true
# Restarted server: the same fleet loaded from SQLite, no request garbage.
"$work/drover" serve $noquota --data-dir "$work/data2" --listen 127.0.0.1:$dport --log-level warn >/dev/null 2>>"$work/serve2.log" &
dpid=$!; pids+=($dpid); waitport $dport; sleep 2
loaded=$(rss $dpid)
awk -v b="$base" -v a="$after" -v l="$loaded" -v n="$rssn" 'BEGIN {
  printf "RSS empty server: %.1f MiB; after %d registrations+pushes: %.1f MiB (%.0f bytes/device total, %.0f bytes/device increase)\n", b/1024, n, a/1024, a*1024/n, (a-b)*1024/n
  printf "RSS after restart with the %d devices loaded: %.1f MiB (%.0f bytes/device total)\n", n, l/1024, l*1024/n }'
echo "warnings/errors in server log: $(grep -cE 'level=(WARN|ERROR)' "$work/serve.log" "$work/serve2.log" | paste -sd' ')"
