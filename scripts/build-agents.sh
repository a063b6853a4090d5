#!/bin/sh
# build-agents.sh: cross-compiles the agent-only binary (cmd/drover-agent)
# into static binaries for the architectures of field devices, copies the
# shell agent next to them, and prints their sizes.
#
#   scripts/build-agents.sh [dist-dir]     (default dist)
set -eu

cd "$(dirname "$0")/.."
DIST=${1:-dist}
mkdir -p "$DIST"

# name GOOS GOARCH GOARM GOMIPS
TARGETS='
drover-agent-linux-amd64   linux amd64  -  -
drover-agent-linux-arm64   linux arm64  -  -
drover-agent-linux-armv7   linux arm    7  -
drover-agent-linux-armv5   linux arm    5  -
drover-agent-linux-mips    linux mips   -  softfloat
drover-agent-linux-mipsle  linux mipsle -  softfloat
'

printf '%-28s %10s\n' binary bytes
echo "$TARGETS" | while read -r name goos goarch goarm gomips; do
	[ -n "$name" ] || continue
	[ "$goarm" != - ] || goarm=
	[ "$gomips" != - ] || gomips=
	env CGO_ENABLED=0 GOOS="$goos" GOARCH="$goarch" GOARM="$goarm" GOMIPS="$gomips" \
		go build -tags drover_stdjson -trimpath -ldflags='-s -w' -o "$DIST/$name" ./cmd/drover-agent
	# A static binary has no program interpreter.
	if od -An -c "$DIST/$name" | tr -d ' \n' | grep -q 'ld-linux\|ld-musl\|ld\.so'; then
		echo "$name is not static" >&2
		exit 1
	fi
	printf '%-28s %10d\n' "$name" "$(wc -c <"$DIST/$name")"
done
cp agent/drover-agent.sh "$DIST/drover-agent.sh"
printf '%-28s %10d\n' drover-agent.sh "$(wc -c <"$DIST/drover-agent.sh")"
