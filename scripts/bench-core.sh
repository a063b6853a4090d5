#!/usr/bin/env bash
# Server-core benchmark: pushes/s and registrations/s of
# `drover serve` measured next to nginx `return 200` (same certificate) and a
# bare Go net/http handler, on the same machine in the same run, medians of
# the runs, interleaved:
#   - keep-alive (wrk): Drover write-through (SQLite) and memory mode against
#     nginx HTTPS (the keep-alive targets: at least 0.6x and 0.8x), nginx and the
#     bare servers (net/http, fasthttp) sent the very push requests Drover
#     gets (rows "push requests"), and, for reference, a bodiless GET;
#   - a new connection per push (the emulator, closed loop, the same client
#     for every target): Drover HTTPS with a full TLS handshake per push
#     against nginx's full-handshake rate (the new-connection target: at least 0.9x), and with
#     resumed TLS sessions against full handshakes (at least 1.5x), once per
#     TLS key exchange of -K (the emulator's --tls-key-exchange; nginx and
#     Drover accept each);
# then RSS per device with N registered devices that each pushed once.
#
# Usage: scripts/bench-core.sh [-r runs] [-d seconds] [-c connections] [-n rss-devices] [-K kx,...] [-b drover-binary] [-N] [-W] [-M]
#   -b  another drover binary (an older build) run next to this tree's in the keep-alive rows
#       ("(base)" rows, write-through and memory), for before/after ratios in one run
#   -K  key exchanges of the new-connection runs, e.g. classic,p256,hybrid,tls12 (default: classic;
#       tls12: classic at TLS 1.2 on the devices' side, where resumption skips the key exchange;
#       tls12-p256 and the like: that key exchange at TLS 1.2;
#       not x25519 alone: nginx/OpenSSL refuses a client whose groups lack its
#       certificate's P-256, and classic has the X25519 key share anyway)
#   -N  skip the new-connection runs   -W  skip the keep-alive (wrk) runs   -M  skip the memory (RSS) part
# Needs: go, python3, wrk, nginx (Debian packages wrk nginx-light: installed
# on demand when missing and running as root).
set -euo pipefail
runs=3 dur=10 conns=64 rssn=100000 threads=2 newconn=1 keepalive=1 mem=1 kxs=classic base=
while getopts r:d:c:n:K:b:NWM o; do
  case $o in r) runs=$OPTARG;; d) dur=$OPTARG;; c) conns=$OPTARG;; n) rssn=$OPTARG;; K) kxs=$OPTARG;; b) base=$(realpath "$OPTARG");; N) newconn=0;; W) keepalive=0;; M) mem=0;; *) exit 2;; esac
done
IFS=, read -r -a kxlist <<<"$kxs"
# The server's default (classic) accepts X25519, P-256 and P-384; hybrid
# ones need --tls-key-exchange hybrid, which accepts the classic ones too.
serverkx=classic
case ",$kxs," in *hybrid*|*mlkem*) serverkx=hybrid;; esac
export PATH=$PATH:/usr/local/go/bin
if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing nginx-light and wrk..." >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light wrk >/dev/null
  else
    echo "missing nginx or wrk (Debian: apt-get install nginx-light wrk)" >&2; exit 1
  fi
fi
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
"$work/drover" serve $noquota --tls-key-exchange $serverkx --data-dir "$work/data" --listen 127.0.0.1:$dport --http-listen 127.0.0.1:$dhport --log-level warn >"$work/serve.out" 2>"$work/serve.log" &
dpid=$!; pids+=($dpid); waitport $dport
secret=$(python3 -c "import json;print(json.load(open('$work/data/secrets.json'))['enrollment_secret'])")
cert=$work/data/tls/cert.pem key=$work/data/tls/key.pem

# nginx with a `return 200` location, HTTP and HTTPS, same certificate and
# TLS versions.
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
    # TLS 1.3 as Drover (nginx before 1.23.4 speaks only up to TLS 1.2 by
    # default, whose resumption skips the key exchange TLS 1.3's keeps).
    ssl_protocols TLSv1.2 TLSv1.3;
    location / { return 200 '{"push_interval":200}\n'; }
  }
}
CONF
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" & pids+=($!); waitport $nport

# Drover in memory mode (nothing written), for the keep-alive ratio.
mport=$(freeport)
"$work/drover" serve $noquota --persistence memory --data-dir "$work/datam" --listen 127.0.0.1:$mport --http-listen= --log-level warn >/dev/null 2>"$work/servem.log" &
pids+=($!); waitport $mport
msecret=$(python3 -c "import json;print(json.load(open('$work/datam/secrets.json'))['enrollment_secret'])")

# The base binary (-b): write-through and memory mode again.
if [ -n "$base" ]; then
  bport=$(freeport); bmport=$(freeport)
  "$base" serve $noquota --tls-key-exchange $serverkx --data-dir "$work/datab" --listen 127.0.0.1:$bport --http-listen= --log-level warn >/dev/null 2>"$work/serveb.log" &
  pids+=($!); waitport $bport
  "$base" serve $noquota --persistence memory --data-dir "$work/databm" --listen 127.0.0.1:$bmport --http-listen= --log-level warn >/dev/null 2>"$work/servebm.log" &
  pids+=($!); waitport $bmport
fi

# Bare Go net/http, and bare fasthttp over HTTPS.
gport=$(freeport); gsport=$(freeport); fsport=$(freeport)
"$work/barehttp" -http 127.0.0.1:$gport -https 127.0.0.1:$gsport -fasthttps 127.0.0.1:$fsport -cert "$cert" -key "$key" 2>/dev/null & pids+=($!); waitport $gsport; waitport $fsport

if [ "$keepalive" = 1 ]; then
  echo "registering 10000 devices for the push runs..." >&2
  "$work/benchprep" -url https://127.0.0.1:$dport -secret "$secret" -n 10000 -out "$work/tokens.txt" -prefix pushbench 2>&2
  "$work/benchprep" -url https://127.0.0.1:$mport -secret "$msecret" -n 10000 -out "$work/tokensm.txt" -prefix pushbench 2>&2
  if [ -n "$base" ]; then
    for p in b bm; do
      s=$(python3 -c "import json;print(json.load(open('$work/data$p/secrets.json'))['enrollment_secret'])")
      port=$bport; [ $p = bm ] && port=$bmport
      "$work/benchprep" -url https://127.0.0.1:$port -secret "$s" -n 10000 -out "$work/tokens$p.txt" -prefix pushbench 2>&2
    done
  fi
fi
if [ "$newconn" = 1 ]; then
  # The emulator's fleet, registered once with the write-through server; the
  # same credentials go to nginx (which ignores them) and to the memory-mode
  # server, which registers them on their first push.
  "$work/drover" emulate --target https://127.0.0.1:$dport --server-dir "$work/data" --credentials "$work/creds.jsonl" \
    --devices 10000 --mode benchmark --loops 0 --workers 32 --conn keepalive --progress none --out "" >"$work/register.log" 2>&1
fi

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
emu() { # name, URL, connection mode, key exchange: the emulator pushes back to back on $conns workers for $dur s
  local name=$1 url=$2 mode=$3 kx=$4 r ver=1.3
  # tls12: the classic key exchange at TLS 1.2 (a resumed session has none);
  # tls12-KX: key exchange KX at TLS 1.2.
  case $kx in tls12) kx=classic ver=1.2;; tls12-*) kx=${kx#tls12-} ver=1.2;; esac
  "$work/drover" emulate --tls-max-version $ver --target "$url" --ca-cert "$cert" --secret "$secret" --credentials "$work/creds.jsonl" \
    --devices 10000 --mode benchmark --loops 1000000 --workers "$conns" --duration "${dur}s" --conn "$mode" --tls-key-exchange "$kx" \
    --source-addrs 127.0.0.1-127.0.0.8 --progress none --out "$work/emu.jsonl" >>"$work/emu.log" 2>&1 || true
  r=$(python3 - "$work/emu.jsonl" <<'PY'
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
        acc = p.get("accepted", 0)
        bad = sum(p.get("rejected", {}).values()) + sum(p.get("dropped", {}).values())
        el = (t(p["last"]) - t(p["first"])).total_seconds() if acc else 1
        c = r.get("conns", {})
        print("%.0f %d %d %d" % (acc / el, bad, c.get("tls_full", 0), c.get("tls_resumed", 0)))
PY
)
  read -r rate bad full resumed <<<"$r"
  results[$name]+="$rate "
  printf '  %-40s %10s req/s  errors %s  TLS full %s resumed %s\n' "$name" "$rate" "$bad" "$full" "$resumed" >&2
}
for i in $(seq "$runs"); do
  echo "run $i/$runs (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  if [ "$keepalive" = 1 ]; then
  run "nginx return 200, http"            http://127.0.0.1:$nport/
  run "nginx return 200, https"           https://127.0.0.1:$nsport/
  run "go net/http bare, http"            http://127.0.0.1:$gport/
  run "go net/http bare, https"           https://127.0.0.1:$gsport/
  TOKENS=$work/tokensm.txt WRK_THREADS=$threads run "nginx return 200, https, push requests" -s "$top/scripts/wrk/push.lua" https://127.0.0.1:$nsport
  TOKENS=$work/tokensm.txt WRK_THREADS=$threads run "go net/http bare, https, push requests" -s "$top/scripts/wrk/push.lua" https://127.0.0.1:$gsport
  TOKENS=$work/tokensm.txt WRK_THREADS=$threads run "fasthttp bare, https, push requests" -s "$top/scripts/wrk/push.lua" https://127.0.0.1:$fsport
  TOKENS=$work/tokens.txt WRK_THREADS=$threads run "drover push, http"  -s "$top/scripts/wrk/push.lua" http://127.0.0.1:$dhport
  TOKENS=$work/tokens.txt WRK_THREADS=$threads run "drover push, https" -s "$top/scripts/wrk/push.lua" https://127.0.0.1:$dport
  TOKENS=$work/tokensm.txt WRK_THREADS=$threads run "drover push, https, memory" -s "$top/scripts/wrk/push.lua" https://127.0.0.1:$mport
  if [ -n "$base" ]; then
  TOKENS=$work/tokensb.txt WRK_THREADS=$threads run "drover push, https (base)" -s "$top/scripts/wrk/push.lua" https://127.0.0.1:$bport
  TOKENS=$work/tokensbm.txt WRK_THREADS=$threads run "drover push, https, memory (base)" -s "$top/scripts/wrk/push.lua" https://127.0.0.1:$bmport
  fi
  SECRET=$secret RUN=r$i run "drover register, https" -s "$top/scripts/wrk/register.lua" https://127.0.0.1:$dport
  fi
  if [ "$newconn" = 1 ]; then
    for kx in "${kxlist[@]}"; do
      emu "nginx return 200, https, new connection, $kx" https://127.0.0.1:$nsport new "$kx"
      emu "drover push, https, new connection, $kx" https://127.0.0.1:$dport new "$kx"
      emu "drover push, https, resumed session, $kx" https://127.0.0.1:$dport resume "$kx"
      emu "nginx return 200, https, resumed session, $kx" https://127.0.0.1:$nsport resume "$kx"
    done
  fi
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo
echo "## Throughput (wrk -t$threads -c$conns -d${dur}s keep-alive, median of $runs; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo
echo "| target | runs (req/s) | median req/s |"
echo "|---|---|---:|"
names=()
if [ "$keepalive" = 1 ]; then
  names+=("nginx return 200, http" "nginx return 200, https" "go net/http bare, http" "go net/http bare, https"
    "nginx return 200, https, push requests" "go net/http bare, https, push requests" "fasthttp bare, https, push requests" "drover push, http" "drover push, https" "drover push, https, memory" "drover register, https")
  [ -n "$base" ] && names+=("drover push, https (base)" "drover push, https, memory (base)")
fi
if [ "$newconn" = 1 ]; then
  for kx in "${kxlist[@]}"; do
    names+=("nginx return 200, https, new connection, $kx" "drover push, https, new connection, $kx" "drover push, https, resumed session, $kx" "nginx return 200, https, resumed session, $kx")
  done
fi
declare -A med
for name in "${names[@]}"; do
  m=$(echo "${results[$name]}" | median)
  printf '| %s | %s | %.0f |\n' "$name" "$(echo ${results[$name]} | sed 's/ /, /g')" "$m"
  med[$name]=$m
done
echo
echo "(new connection and resumed rows: drover emulate --mode benchmark --workers $conns --conn new|resume --tls-key-exchange <the row's>, ${dur}s; drover serve --tls-key-exchange $serverkx; nginx: OpenSSL's default groups)"
echo
[ "$keepalive" = 1 ] && awk -v a="${med[drover push, https]}" -v b="${med[nginx return 200, https, push requests]}" -v g="${med[nginx return 200, https]}" \
  -v c="${med[go net/http bare, https, push requests]}" -v f="${med[fasthttp bare, https, push requests]}" -v d="${med[drover push, http]}" -v e="${med[nginx return 200, http]}" \
  -v m="${med[drover push, https, memory]}" \
  'BEGIN {printf "keep-alive, nginx sent the same push requests: drover push write-through / nginx (https): %.2f (target: >= 0.6); memory / nginx (https): %.2f (>= 0.8)\n", a/b, m/b
          printf "  bare net/http / nginx: %.2f; bare fasthttp / nginx: %.2f (https, push requests)\n", c/b, f/b
          printf "against nginx answering a bodiless GET: write-through %.2f, memory %.2f (https); drover push / nginx (http): %.2f\n", a/g, m/g, d/e
          printf "against bare net/http given the same push requests (https): write-through %.2f, memory %.2f\n", a/c, m/c}'
[ "$keepalive" = 1 ] && [ -n "$base" ] && awk -v a="${med[drover push, https (base)]}" -v m="${med[drover push, https, memory (base)]}" -v c="${med[go net/http bare, https, push requests]}" \
  -v na="${med[drover push, https]}" -v nm="${med[drover push, https, memory]}" \
  'BEGIN {printf "base binary against bare net/http (https, push requests): write-through %.2f, memory %.2f; this tree / base: write-through %.2f, memory %.2f\n", a/c, m/c, na/a, nm/m}'
if [ "$newconn" = 1 ]; then
  for kx in "${kxlist[@]}"; do
    awk -v kx="$kx" -v n="${med[drover push, https, new connection, $kx]}" -v g="${med[nginx return 200, https, new connection, $kx]}" \
      -v r="${med[drover push, https, resumed session, $kx]}" -v gr="${med[nginx return 200, https, resumed session, $kx]}" \
      'function q(a, b) { return b > 0 ? a / b : 0 }
       BEGIN {printf "new connection, %s: drover full handshake / nginx full handshake: %.2f (target: >= 0.9); drover resumed / drover full: %.2f (>= 1.5); nginx resumed / nginx full: %.2f\n", kx, q(n, g), q(r, n), q(gr, g)}'
  done
fi
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
[ "$mem" = 1 ] || exit 0

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
