#!/usr/bin/env bash
# Backend x persistence-mode benchmark: registrations/s and
# pushes/s over HTTPS keep-alive (wrk -t2 -c64, the scripts of
# bench-core.sh), and RSS per device, for SQLite, PostgreSQL and MariaDB in
# memory, write-through and write-back modes, same load, same run.
#
# Usage: scripts/bench-backends.sh [-r runs] [-d seconds] [-n rss-devices]
# PostgreSQL and MariaDB: the local servers on 127.0.0.1:5432 (user postgres,
# trust) and 127.0.0.1:3306 (root, no password); a fresh database per case.
set -euo pipefail
runs=3 dur=5 rssn=20000
while getopts r:d:n: o; do
  case $o in r) runs=$OPTARG;; d) dur=$OPTARG;; n) rssn=$OPTARG;; *) exit 2;; esac
done
export PATH=$PATH:/usr/local/go/bin
top=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/drover-backends.XXXXXX)
# Capacity runs: wrk pushes each token in a loop, which per-device quotas
# (docs/operations.md) would refuse.
noquota="--quota-push-rate 0 --quota-history-samples 0 --quota-history-bytes 0"
pid=
cleanup() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
freeport() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
waitport() { for _ in $(seq 300); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; return 1; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
(cd "$top" && go build -o "$work/drover" ./cmd/drover && go build -o "$work/benchprep" ./tools/benchprep)

fresh_db() { # backend case -> DSN
  local name=drover_bench_$2
  case $1 in
    sqlite) echo "sqlite:$work/$2/drover.db" ;;
    postgres) psql -qX -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS $name" -c "CREATE DATABASE $name" >/dev/null
              echo "postgres://postgres@127.0.0.1:5432/$name?sslmode=disable" ;;
    mariadb) mariadb -h 127.0.0.1 -uroot -e "DROP DATABASE IF EXISTS $name; CREATE DATABASE $name" ; echo "mysql://root@tcp(127.0.0.1:3306)/$name" ;;
  esac
}
serve() { # dsn mode dir
  port=$(freeport)
  "$work/drover" serve $noquota --data-dir "$3" --db "$1" --persistence "$2" --listen 127.0.0.1:$port --log-level warn >/dev/null 2>>"$work/serve.log" &
  pid=$!; waitport $port
  secret=$(python3 -c "import json;print(json.load(open('$3/secrets.json'))['enrollment_secret'])")
}
stop() { kill $pid; wait $pid 2>/dev/null || true; pid=; }
rate() { awk '/Requests\/sec/ {print $2}'; }

echo "| backend | mode | registrations/s (runs) | median | pushes/s (runs) | median | RSS bytes/device ($rssn devices) |"
echo "|---|---|---|---:|---|---:|---:|"
for backend in sqlite postgres mariadb; do
  for mode in memory write-through write-back; do
    [ "$backend" != sqlite ] && [ "$mode" = memory ] && continue # memory mode opens no database
    case_=${backend}_${mode//-/_}
    mkdir -p "$work/$case_"
    dsn=$(fresh_db $backend $case_)
    serve "$dsn" $mode "$work/$case_"
    regs="" pushes=""
    "$work/benchprep" -url https://127.0.0.1:$port -secret "$secret" -n 10000 -out "$work/tokens.txt" -prefix p 2>/dev/null
    for i in $(seq $runs); do
      regs+="$(SECRET=$secret RUN=$case_$i wrk -t2 -c64 -d${dur}s -s "$top/scripts/wrk/register.lua" https://127.0.0.1:$port | rate) "
      pushes+="$(TOKENS=$work/tokens.txt WRK_THREADS=2 wrk -t2 -c64 -d${dur}s -s "$top/scripts/wrk/push.lua" https://127.0.0.1:$port | rate) "
    done
    stop
    # RSS per device: a fresh database, rssn devices registered with one push each.
    dsn=$(fresh_db $backend ${case_}_rss); rm -rf "$work/$case_"; mkdir -p "$work/$case_"
    serve "$dsn" $mode "$work/$case_"
    "$work/benchprep" -url https://127.0.0.1:$port -secret "$secret" -n $rssn -out "$work/tokens2.txt" -prefix r 2>/dev/null
    sleep 1
    rss=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
    stop
    printf '| %s | %s | %s | %.0f | %s | %.0f | %.0f |\n' $backend $mode "$(echo $regs | sed 's/ /, /g')" "$(echo $regs | median)" \
      "$(echo $pushes | sed 's/ /, /g')" "$(echo $pushes | median)" "$(echo "$rss * 1024 / $rssn" | bc -l)"
  done
done
echo
echo "server log warnings/errors: $(grep -cE 'level=(WARN|ERROR)' "$work/serve.log" || true)"
