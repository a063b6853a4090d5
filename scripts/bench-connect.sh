#!/usr/bin/env bash
# Persistent connections (docs/performance.md#persistent-connections): server
# memory per idle WebSocket and command delivery latency to 1, 1,000 and all
# connected devices; then, for comparison, the memory per idle MQTT
# subscriber over TLS of Mosquitto and of NATS's MQTT listener (the same
# certificate), and Mosquitto's publish latency to one subscriber. Connections come
# from several connload processes, each from its own loopback source
# address and below the 20,000 open files a process may have here.
# Usage: scripts/bench-connect.sh [-p processes] [-n connections per process]
#   [-N nodes] [-b brokers: any of mosquitto,nats or none; default mosquitto,nats] [-L: no latency runs]
#   (DROVER=path uses that drover binary instead of building one)
# -N 2 or more: that many `drover serve --cluster` nodes on a fresh database of the
# local PostgreSQL and the local NATS (docs/cluster.md), each below the 20,000 files
# a process may open; connection process p connects to node p mod N, commands are
# sent to node 1, so most reach their devices through another node. Figures are
# summed over the nodes.
#   scripts/bench-connect.sh -N 7 -p 7 -n 14300 -b none    # 100,100 connections
set -euo pipefail
procs=3 per=5000 brokers=mosquitto,nats lat=1 nodes=1 fail=0 singles=${SINGLES:-40}
while getopts p:n:N:b:L o; do
  case $o in p) procs=$OPTARG;; n) per=$OPTARG;; N) nodes=$OPTARG;; b) brokers=$OPTARG;; L) lat=0;; *) exit 2;; esac
done
total=$((procs * per))
export PATH=$PATH:/usr/local/go/bin
top=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/drover-connect.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; if [ -n "${KEEP:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi; }
trap cleanup EXIT
freeport() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
waitport() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; return 1; }
rss() { awk '/VmRSS/ {print $2}' /proc/$1/status; } # KiB
now() { date +%s%N; }

# DROVER=binary measures a server built elsewhere (e.g. an older commit).
(cd "$top" && if [ -n "${DROVER:-}" ]; then cp "$DROVER" "$work/drover"; else go build -o "$work/drover" ./cmd/drover; fi && go build -o "$work/benchprep" ./tools/benchprep && go build -o "$work/connload" ./tools/connload)
port=$(freeport) dport=$(freeport)
noquota="--quota-push-rate 0 --quota-history-samples 0 --quota-history-bytes 0"
cluster=() spids=() urls=()
if [ "$nodes" -gt 1 ]; then
  psql -qX -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS drover_connect" -c "CREATE DATABASE drover_connect" >/dev/null
  cluster=(--cluster --db "postgres://postgres@127.0.0.1:5432/drover_connect?sslmode=disable" --nats-url nats://127.0.0.1:4222 --node-name n1)
fi
"$work/drover" serve --debug-listen 127.0.0.1:$dport $noquota --data-dir "$work/data" "${cluster[@]}" \
  --listen 127.0.0.1:$port --log-level warn >"$work/serve.out" 2>"$work/serve.log" &
spid=$!; pids+=($spid) spids+=($spid) urls+=(https://127.0.0.1:$port) dports=($dport); waitport $port
secret=$(python3 -c "import json;print(json.load(open('$work/data/secrets.json'))['enrollment_secret'])")
admin=$(python3 -c "import json;print(json.load(open('$work/data/secrets.json'))['admin_token'])")
url=https://127.0.0.1:$port ca=$work/data/tls/cert.pem
for n in $(seq 2 "$nodes"); do
  nport=$(freeport) ndport=$(freeport); dports+=($ndport)
  cluster[${#cluster[@]}-1]=n$n
  "$work/drover" serve --debug-listen 127.0.0.1:$ndport $noquota --data-dir "$work/data$n" "${cluster[@]}" --tls-cert $ca --tls-key "$work/data/tls/key.pem" \
    --enrollment-secret "$secret" --admin-token "$admin" --listen 127.0.0.1:$nport --log-level warn >"$work/serve$n.out" 2>"$work/serve$n.log" &
  pids+=($!) spids+=($!) urls+=(https://127.0.0.1:$nport); waitport $nport
done
"$work/benchprep" -url $url -secret "$secret" -n 1000 -out "$work/k.txt" -prefix k 2>/dev/null
"$work/benchprep" -url $url -secret "$secret" -n $((total - 1000)) -out "$work/a.txt" -prefix a 2>/dev/null
cat "$work/k.txt" "$work/a.txt" >"$work/tokens.txt"
api() { curl -s --cacert $ca -H "Authorization: Bearer $admin" "$@"; }
api $url/api/v1/labels/assign -d '{"label":"k","filter":{"q":"k-"}}' >/dev/null
conns() { for u in "${urls[@]}"; do api $u/metrics | awk '/^drover_device_connections / {print $2}'; done | awk '{s+=$1} END {print s+0}'; }
gostat() { for u in "${urls[@]}"; do api $u/metrics; done | awk '/^go_goroutines / {g+=$2} /^go_memstats_heap_inuse_bytes / {h+=$2} /^go_memstats_stack_inuse_bytes / {s+=$2} END {printf "%d %.0f %.0f\n", g, h, s}'; }
# Connections the nodes ended, summed, by reason (drover_device_connections_ended_total).
endedall() { for u in "${urls[@]}"; do api $u/metrics; done | awk -F'[{}" ]+' '/^drover_device_connections_ended_total/ {s[$3]+=$NF} END {for (r in s) if (s[r] > 0) printf "%s %d, ", r, s[r]; print "(others 0)"}'; }
rssall() { local t=0; for p in "${spids[@]}"; do t=$((t + $(rss $p))); done; echo $t; }

sleep 2
before=$(rssall); read -r g0 h0 s0 <<<"$(gostat)"
for p in $(seq 0 $((procs - 1))); do
  "$work/connload" -url "${urls[$((p % nodes))]}" -ca $ca -tokens "$work/tokens.txt" -from $((p * per)) -n $per -source 127.0.0.$((p + 2)) \
    >"$work/got.$p" 2>"$work/load.$p" & pids+=($!)
done
for _ in $(seq 600); do [ "$(conns)" = "$total" ] && break; sleep 1; done
sleep 5
after=$(rssall); read -r g1 h1 s1 <<<"$(gostat)"
held=$(conns)
echo "connections: $held of $total over $procs processes (127.0.0.2..127.0.0.$((procs + 1))) to $nodes server process(es)"
echo "held per node: $(for u in "${urls[@]}"; do api $u/metrics | awk '/^drover_device_connections / {printf "%d ", $2}'; done)"
# connload's last line: connections open, and connections that ended (dialled again).
echo "clients (open/ended per process): $(for p in $(seq 0 $((procs - 1))); do grep '^up ' "$work/load.$p" | tail -1 | awk '{printf "%d/%d ", $2, $4}'; done)"
echo "connections the nodes ended: $(endedall)"
[ "$held" = "$total" ] || { echo "FAIL: the nodes hold $held of $total connections"; fail=1; }
echo "server RSS: $before KiB before, $after KiB after: $(( (after - before) * 1024 / held )) bytes per idle connection"
echo "server Go: goroutines $g0 -> $g1; heap in use $(( (h1 - h0) / held )) B, stacks $(( (s1 - s0) / held )) B per connection"
# The handshakes' garbage is still on the heap until a collection: force
# one (the heap profile's gc=1; HEAP_OUT=file keeps the profile), then again.
curl -s "http://127.0.0.1:$dport/debug/pprof/heap?gc=1" -o "${HEAP_OUT:-$work/heap.pprof}"
for d in "${dports[@]:1}"; do curl -s "http://127.0.0.1:$d/debug/pprof/heap?gc=1" -o /dev/null; done
sleep 5; after2=$(rssall); read -r g2 h2 s2 <<<"$(gostat)"
echo "after a GC: server RSS $after2 KiB: $(( (after2 - before) * 1024 / held )) bytes per idle connection; heap in use $(( (h2 - h0) / held )) B, stacks $(( (s2 - s0) / held )) B per connection"

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
# SINGLES (default 40) single-device commands, 0.4 s apart, to devices spread
# over every connload process (so, with -N, over every node; all sent to node
# 1): each must reach its device within 10 s, and all must be delivered.
singles() {
  local k line id t0 lines=() t0s=()
  for k in $(seq 0 $((singles - 1))); do
    line=$(( (k % procs) * per + (k * 7919) % per ))
    id=$(sed -n "$((line + 1))p" "$work/tokens.txt" | cut -d. -f1)
    t0=$(now); lines+=("$line") t0s+=("$t0")
    api $url/api/v1/commands -d "{\"kind\":\"reboot\",\"device_id\":\"$id\"}" >/dev/null
    sleep 0.4
  done
  sleep 10
  for k in "${!lines[@]}"; do
    cat "$work"/got.* | awk -v i="${lines[$k]}" -v t="${t0s[$k]}" '$2 == i && $3 > t {print ($3 - t) / 1e6; exit}'
  done | sort -n | awk -v want="$singles" '{a[NR]=$1} END {printf "%d single-device commands over all connections: %d of %d delivered; ms p50 %.1f, p99 %.1f, max %.1f\n", want, NR, want, a[int(NR*0.5)+(NR*0.5>int(NR*0.5))], a[int(NR*0.99)+(NR*0.99>int(NR*0.99))], a[NR]; if (NR < want || a[NR] > 1000) exit 1}' ||
    { echo "FAIL: not every single-device command was delivered within 1 s"; fail=1; }
}
if [ $lat = 1 ]; then
latency "1 device" "{\"kind\":\"reboot\",\"device_id\":\"$first\"}" 1
singles
latency "1,000 devices (label)" '{"kind":"reboot","label":"k"}' 1000
latency "all $total devices" '{"kind":"reboot","filter":{}}' $total
fi
echo "server RSS after the commands: $(rssall) KiB; connections the nodes ended: $(endedall)"
for p in "${pids[@]:1}"; do kill $p 2>/dev/null || true; done

# The brokers, MQTT over TLS with the server's certificate, the same number
# of idle subscribers (clean session, QoS 0, keepalive 600 s).
brokerrun() { # name, pid, port
  local bpid=$2 bport=$3 up=0
  waitport "$bport"; sleep 1; local b0; b0=$(rss "$bpid")
  for p in $(seq 0 $((procs - 1))); do
    "$work/connload" -mqtt 127.0.0.1:$bport -mqtt-tls -ca $ca -from $((p * per)) -n $per -source 127.0.0.$((p + 2)) \
      >"$work/$1.got.$p" 2>"$work/$1.load.$p" & lpids+=($!)
  done
  for _ in $(seq 300); do
    up=$(for p in $(seq 0 $((procs - 1))); do tail -1 "$work/$1.load.$p" 2>/dev/null | awk '$1 == "up" {print $2}'; done | awk '{s+=$1} END {print s+0}')
    [ "$up" -ge "$total" ] && break; sleep 1
  done
  sleep 5; local b1; b1=$(rss "$bpid")
  echo "$1: $up TLS subscribers; RSS $b0 KiB before, $b1 KiB after: $(( (b1 - b0) * 1024 / (up > 0 ? up : 1) )) bytes per idle connection"
  if [ "$1" = mosquitto ] && [ $lat = 1 ]; then
    local t0; t0=$(now)
    mosquitto_pub -h 127.0.0.1 -p "$bport" --cafile $ca -t d/0 -m reboot
    sleep 1
    cat "$work"/mosquitto.got.* | awk -v t=$t0 '$3 > t {printf "mosquitto publish to 1 subscriber (mosquitto_pub start and TLS handshake included): %.1f ms\n", ($3 - t) / 1e6}'
  fi
  for p in "${lpids[@]}"; do kill "$p" 2>/dev/null || true; done
  kill "$bpid"; lpids=()
}
lpids=()
key=$work/data/tls/key.pem
if [[ $brokers == *mosquitto* ]] && command -v mosquitto >/dev/null; then
  mport=$(freeport)
  printf 'user %s\nlistener %s 127.0.0.1\ncertfile %s\nkeyfile %s\nallow_anonymous true\nmax_connections -1\npersistence false\n' "$(id -un)" $mport $ca $key >"$work/mosq.conf"
  mosquitto -c "$work/mosq.conf" 2>"$work/mosq.log" & pids+=($!)
  brokerrun mosquitto $! $mport
fi
if [[ $brokers == *nats* ]] && command -v nats-server >/dev/null; then
  nport=$(freeport) qport=$(freeport)
  cat >"$work/nats.conf" <<NATS
listen: 127.0.0.1:$nport
server_name: bench
max_connections: 1000000
jetstream { store_dir: "$work/js" }
mqtt { listen: 127.0.0.1:$qport, tls { cert_file: "$ca", key_file: "$key" } }
NATS
  nats-server -c "$work/nats.conf" >"$work/nats.log" 2>&1 & pids+=($!)
  brokerrun nats-mqtt $! $qport
fi
exit $fail
