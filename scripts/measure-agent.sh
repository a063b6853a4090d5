#!/bin/sh
# measure-agent.sh: runs the agent-only build (cmd/drover-agent) against a
# local `drover serve` at a 10 s push interval and reports its resident
# memory and CPU use.
#
#   scripts/measure-agent.sh [seconds]     (default 600)
#
# Environment: INTERVAL (push interval, default 10), PORT (default 18443),
# WORK (scratch directory, default a new one under /tmp).
set -eu

DURATION=${1:-600}
INTERVAL=${INTERVAL:-10}
PORT=${PORT:-18443}
WORK=${WORK:-$(mktemp -d /tmp/drover-measure.XXXXXX)}
cd "$(dirname "$0")/.."

mkdir -p "$WORK"
echo "building into $WORK" >&2
go build -o "$WORK/drover" ./cmd/drover
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$WORK/drover-agent" ./cmd/drover-agent

SERVER_PID=
AGENT_PID=
cleanup() {
	[ -z "$AGENT_PID" ] || kill "$AGENT_PID" 2>/dev/null || true
	[ -z "$SERVER_PID" ] || kill "$SERVER_PID" 2>/dev/null || true
	wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

"$WORK/drover" serve --data-dir "$WORK/server" --listen "127.0.0.1:$PORT" --push-interval "$INTERVAL" \
	>"$WORK/server.log" 2>&1 &
SERVER_PID=$!
i=0
until [ -s "$WORK/server/secrets.json" ] && [ -s "$WORK/server/tls/cert.pem" ] &&
	curl -fsS --cacert "$WORK/server/tls/cert.pem" "https://127.0.0.1:$PORT/healthz" >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 100 ] || {
		echo "server did not start; see $WORK/server.log" >&2
		exit 1
	}
	sleep 0.1
done
secret() { sed -n "s/.*\"$1\": *\"\\([^\"]*\\)\".*/\\1/p" "$WORK/server/secrets.json"; }
secret enrollment_secret >"$WORK/enroll-secret"
ADMIN=$(secret admin_token)

"$WORK/drover-agent" --server "https://127.0.0.1:$PORT" --enroll-secret-file "$WORK/enroll-secret" \
	--ca-cert "$WORK/server/tls/cert.pem" --state-dir "$WORK/agent" --log-level warn \
	>"$WORK/agent.log" 2>&1 &
AGENT_PID=$!

HZ=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' "/proc/$AGENT_PID/stat"; }
rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$AGENT_PID/status"; }

sleep 2 # registration and the first push are part of the run, not of the baseline
t0=$(date +%s)
c0=$(ticks)
min=
max=0
sum=0
n=0
echo "measuring for $DURATION s, one sample every 10 s (seconds and KiB in $WORK/rss-samples.txt)" >&2
while [ $(($(date +%s) - t0)) -lt "$DURATION" ]; do
	kill -0 "$AGENT_PID" 2>/dev/null || {
		echo "agent died; see $WORK/agent.log" >&2
		exit 1
	}
	r=$(rss)
	echo "$(($(date +%s) - t0)) $r" >>"$WORK/rss-samples.txt"
	[ -n "$min" ] && [ "$min" -le "$r" ] || min=$r
	[ "$max" -ge "$r" ] || max=$r
	sum=$((sum + r))
	n=$((n + 1))
	sleep 10
done
t1=$(date +%s)
c1=$(ticks)
hwm=$(awk '/^VmHWM:/ { print $2 }' "/proc/$AGENT_PID/status")
id=$(sed -n 's/.*"device_id": *"\([^"]*\)".*/\1/p' "$WORK/agent/state.json")
seq=$(curl -fsS --cacert "$WORK/server/tls/cert.pem" -H "Authorization: Bearer $ADMIN" \
	"https://127.0.0.1:$PORT/api/v1/devices/$id" | sed -n 's/.*"seq": *\([0-9]*\).*/\1/p')

elapsed=$((t1 - t0))
awk -v hz="$HZ" -v c="$((c1 - c0))" -v e="$elapsed" -v min="$min" -v max="$max" -v avg="$((sum / n))" \
	-v hwm="$hwm" -v n="$n" -v seq="$seq" -v iv="$INTERVAL" -v size="$(wc -c <"$WORK/drover-agent")" \
	-v arch="$(go env GOOS)/$(go env GOARCH)" 'BEGIN {
	printf "drover-agent (%d bytes, %s) pushing every %d s for %d s:\n", size, arch, iv, e
	printf "  RSS: min %d KiB, mean %d KiB, max %d KiB (%d samples); peak (VmHWM) %d KiB\n", min, avg, max, n, hwm
	printf "  CPU: %.2f s user+system = %.3f %% of one core\n", c / hz, c / hz / e * 100
	printf "  pushes recorded by the server: seq %d\n", seq
}'
if grep -q . "$WORK/agent.log"; then
	echo "agent warnings:" >&2
	cat "$WORK/agent.log" >&2
fi
