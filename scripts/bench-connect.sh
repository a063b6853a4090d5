#!/usr/bin/env bash
# Persistent connections (docs/performance.md#persistent-connections): server
# memory per idle WebSocket and command delivery latency to 1, 1,000 and all
# connected devices; then, for comparison, Mosquitto's memory per idle MQTT
# connection and its publish latency to one subscriber. Connections come
# from several connload processes, each from its own loopback source
# address and below the 20,000 open files a process may have here.
# Usage: scripts/bench-connect.sh [-p processes] [-n connections per process]
set -euo pipefail
procs=3 per=5000
while getopts p:n: o; do
  case $o in p) procs=$OPTARG;; n) per=$OPTARG;; *) exit 2;; esac
done
total=$((procs * per))
export PATH=$PATH:/usr/local/go/bin
top=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/drover-connect.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
freeport() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
waitport() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; return 1; }
rss() { awk '/VmRSS/ {print $2}' /proc/$1/status; } # KiB
now() { date +%s%N; }

(cd "$top" && go build -o "$work/drover" ./cmd/drover && go build -o "$work/benchprep" ./tools/benchprep && go build -o "$work/connload" ./tools/connload)
port=$(freeport)
"$work/drover" serve --quota-push-rate 0 --quota-history-samples 0 --quota-history-bytes 0 --data-dir "$work/data" \
  --listen 127.0.0.1:$port --log-level warn >"$work/serve.out" 2>"$work/serve.log" &
spid=$!; pids+=($spid); waitport $port
secret=$(python3 -c "import json;print(json.load(open('$work/data/secrets.json'))['enrollment_secret'])")
admin=$(python3 -c "import json;print(json.load(open('$work/data/secrets.json'))['admin_token'])")
url=https://127.0.0.1:$port ca=$work/data/tls/cert.pem
"$work/benchprep" -url $url -secret "$secret" -n 1000 -out "$work/k.txt" -prefix k 2>/dev/null
"$work/benchprep" -url $url -secret "$secret" -n $((total - 1000)) -out "$work/a.txt" -prefix a 2>/dev/null
cat "$work/k.txt" "$work/a.txt" >"$work/tokens.txt"
api() { curl -s --cacert $ca -H "Authorization: Bearer $admin" "$@"; }
api $url/api/v1/labels/assign -d '{"label":"k","filter":{"q":"k-"}}' >/dev/null
conns() { api $url/metrics | awk '/^drover_device_connections / {print $2}'; }

sleep 2
before=$(rss $spid)
for p in $(seq 0 $((procs - 1))); do
  "$work/connload" -url $url -ca $ca -tokens "$work/tokens.txt" -from $((p * per)) -n $per -source 127.0.0.$((p + 2)) \
    >"$work/got.$p" 2>"$work/load.$p" & pids+=($!)
done
for _ in $(seq 600); do [ "$(conns)" = "$total" ] && break; sleep 1; done
sleep 5
after=$(rss $spid)
echo "connections: $(conns) of $total over $procs processes (127.0.0.2..127.0.0.$((procs + 1)))"
echo "server RSS: $before KiB before, $after KiB after: $(( (after - before) * 1024 / total )) bytes per idle connection"

first=$(head -1 "$work/tokens.txt" | cut -d. -f1)
latency() { # name, body, expected count
  : >"$work/t0"; local t0; t0=$(now)
  api $url/api/v1/commands -d "$2" >/dev/null
  for _ in $(seq 120); do
    [ "$(cat "$work"/got.* | awk -v t=$t0 '$3 > t' | wc -l)" -ge "$3" ] && break; sleep 0.25
  done
  cat "$work"/got.* | awk -v t=$t0 '$3 > t {print ($3 - t) / 1e6}' | sort -n |
    awk -v n="$1" -v want="$3" '{a[NR]=$1} END {printf "%s: %d of %d devices have the command; ms p50 %.1f, p99 %.1f, max %.1f\n", n, NR, want, a[int(NR*0.5)+(NR*0.5>int(NR*0.5))], a[int(NR*0.99)+(NR*0.99>int(NR*0.99))], a[NR]}'
}
latency "1 device" "{\"kind\":\"reboot\",\"device_id\":\"$first\"}" 1
latency "1,000 devices (label)" '{"kind":"reboot","label":"k"}' 1000
latency "all $total devices" '{"kind":"reboot","filter":{}}' $total
echo "server RSS after the commands: $(rss $spid) KiB"
for p in "${pids[@]:1}"; do kill $p 2>/dev/null || true; done

# Mosquitto, plain TCP (no TLS), the same number of idle subscribers.
if command -v mosquitto >/dev/null; then
  mport=$(freeport)
  printf 'listener %s 127.0.0.1\nallow_anonymous true\nmax_connections -1\npersistence false\n' $mport >"$work/mosq.conf"
  mosquitto -c "$work/mosq.conf" 2>"$work/mosq.log" & mpid=$!; pids+=($mpid); waitport $mport
  sleep 1; mbefore=$(rss $mpid)
  for p in $(seq 0 $((procs - 1))); do
    "$work/connload" -mqtt 127.0.0.1:$mport -from $((p * per)) -n $per -source 127.0.0.$((p + 2)) >"$work/mgot.$p" 2>"$work/mload.$p" & pids+=($!)
  done
  for _ in $(seq 600); do
    up=$(for p in $(seq 0 $((procs - 1))); do tail -1 "$work/mload.$p" 2>/dev/null | awk '{print $2}'; done | awk '{s+=$1} END {print s+0}')
    [ "$up" -ge "$total" ] && break; sleep 1
  done
  sleep 5; mafter=$(rss $mpid)
  echo "mosquitto: $up subscribers; RSS $mbefore KiB before, $mafter KiB after: $(( (mafter - mbefore) * 1024 / total )) bytes per idle connection"
  t0=$(now); mosquitto_pub -h 127.0.0.1 -p $mport -t d/0 -m reboot
  sleep 1
  cat "$work"/mgot.* | awk -v t=$t0 '$3 > t {printf "mosquitto publish to 1 subscriber (mosquitto_pub start included): %.1f ms\n", ($3 - t) / 1e6}'
fi
