#!/bin/sh
# release.sh: builds every binary of a release into a directory, with
# SHA-256 checksums:
#   drover-linux-amd64, drover-linux-arm64     the whole drover (static)
#   drover-agent-linux-*, drover-agent.sh      the agent-only builds (scripts/build-agents.sh)
#   drover_<version>_{amd64,arm64}.deb,        the server as an operating-system package
#   drover-<version>-1.{x86_64,aarch64}.rpm    (scripts/package: binary, systemd units, user)
#   SHA256SUMS                                 sha256sum -c SHA256SUMS checks them
# and the context of the container image (deploy/container/Containerfile)
# in DIST/container.
#
#   scripts/release.sh [dist-dir]      (default dist; emptied first)
#
# The version comes from git: tag the release commit (git tag v1.2.0) and
# build from a clean checkout; the Go toolchain stamps the tag and the commit
# into every binary (drover version, drover_build_info), and
# scripts/version.sh names them too for checkouts the toolchain does not read
# (git worktrees). An untagged or modified checkout gets a pseudo-version
# (v0.0.0-<time>-<commit>, +dirty).
set -eu

cd "$(dirname "$0")/.."
DIST=${1:-dist}
case $DIST in /*) ;; *) DIST=$PWD/$DIST ;; esac
rm -rf "$DIST"
mkdir -p "$DIST"

stamp=$(scripts/version.sh)
echo "release into $DIST: $stamp"

for arch in amd64 arm64; do
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -ldflags="-s -w $stamp" -o "$DIST/drover-linux-$arch" ./cmd/drover
	if od -An -c "$DIST/drover-linux-$arch" | tr -d ' \n' | grep -q 'ld-linux\|ld-musl\|ld\.so'; then
		echo "drover-linux-$arch is not static" >&2
		exit 1
	fi
done
scripts/build-agents.sh "$DIST" >/dev/null

# The .deb and .rpm of both architectures (internal/release, nfpm; its own
# command, so that drover links no packager).
version=$(echo "$stamp" | sed -n 's/.*linkVersion=\([^ ]*\).*/\1/p')
go run ./scripts/package --version "$version" --out "$DIST" \
	amd64="$DIST/drover-linux-amd64" arm64="$DIST/drover-linux-arm64" >/dev/null

# The container image's build context: the binaries of both architectures,
# the CA bundle (webhooks and SMTP over TLS), a passwd/group naming the
# unprivileged user and the (empty) data directory it owns.
ctx=$DIST/container
mkdir -p "$ctx/data"
cp deploy/container/Containerfile "$ctx/"
cp "$DIST/drover-linux-amd64" "$DIST/drover-linux-arm64" "$ctx/"
if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
	cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
else
	echo "no /etc/ssl/certs/ca-certificates.crt (Debian: apt-get install ca-certificates)" >&2
	exit 1
fi
printf 'root:x:0:0:root:/:/nonexistent\ndrover:x:65532:65532:drover:/var/lib/drover:/nonexistent\n' >"$ctx/passwd"
printf 'root:x:0:\ndrover:x:65532:\n' >"$ctx/group"

(cd "$DIST" && find . -maxdepth 1 -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
(cd "$DIST" && sha256sum -c --quiet SHA256SUMS)
printf '%-62s %10s\n' file bytes
(cd "$DIST" && for f in $(LC_ALL=C ls); do [ -f "$f" ] && printf '%-62s %10d\n' "$f" "$(wc -c <"$f")"; done)
"$DIST/drover-linux-$(go env GOARCH)" version 2>/dev/null || true
