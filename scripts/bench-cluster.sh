#!/usr/bin/env bash
# Cluster measurement (docs/cluster.md, "Measured"): pushes/s and CPU, bytes
# and database cost per push with 1, 2 and 3 nodes behind HAProxy, each
# node on a host of its own (network namespace), PostgreSQL and NATS too,
# the emulator driving an open-loop fleet with a new TCP connection and TLS
# handshake per push. Needs root, haproxy and nats-server (scripts/test.sh
# installs them). Prints a Markdown table for docs/cluster.md: per node
# count, pushes/s, CPU per push of each node (and of PostgreSQL, HAProxy,
# NATS), bytes per push (devices, database wire, NATS, WAL), and the
# cluster's own churn per push: change-log rows written, devices the
# nodes read back, sync events (all near 0 when pushes cost other nodes
# nothing).
#
#   scripts/bench-cluster.sh                      # 6000 devices / 20 s, 40 s, 1 run
#   NODES=1,2,3 DEVICES=20000 INTERVAL=20s DURATION=60s RUNS=3 IDLE=10s scripts/bench-cluster.sh
#   CONN=new,resume,resume-tls12 NODES=3 scripts/bench-cluster.sh   # full handshakes against resumed sessions
#
# Run it on a quiet machine: it uses every core.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
export DROVER_CLUSTER_BENCH=1
export DROVER_BENCH_NODES=${NODES:-1,2,3}
export DROVER_BENCH_DEVICES=${DEVICES:-6000}
export DROVER_BENCH_INTERVAL=${INTERVAL:-20s}
export DROVER_BENCH_DURATION=${DURATION:-40s}
export DROVER_BENCH_RUNS=${RUNS:-1}
export DROVER_BENCH_IDLE=${IDLE:-10s}
export DROVER_BENCH_CONN=${CONN:-new}
log=$(mktemp /tmp/drover-bench-cluster.XXXXXX.log)
echo "uptime: $(uptime); full log: $log" >&2
if ! go test -count=1 -timeout 2h -run '^TestMeasure$' -v ./internal/clustertest/ >"$log" 2>&1; then
  tail -50 "$log" >&2
  exit 1
fi
grep -E '^\s+bench_test.go:[0-9]+: [0-9] nodes[:,] ' "$log" >&2 || true
awk '/^[0-9]+ devices, one push/{p=1} p && /^(--- |PASS|ok|FAIL|=== )/{p=0} p' "$log"
