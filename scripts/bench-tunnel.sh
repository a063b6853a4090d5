#!/bin/sh
# Port forwarding measured with the real binaries (docs/performance.md#port-forwarding):
# 100 MB each way through a tunnel as a ratio to the same transfer directly on loopback,
# added latency p50/p99 of small requests, 100 concurrent tunnels, server memory per
# open tunnel. One run; the figures are ratios taken in that run.
set -eu
cd "$(dirname "$0")/.."
DROVER_TUNNEL_PERF=1 exec go test -count=1 -run '^TestTunnelPerf$' -v ./cmd/drover/ "$@"
