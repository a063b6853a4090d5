#!/usr/bin/env bash
# The test command: installs what a fresh Debian machine lacks (when run as
# root), then vets and runs every test. .ci/run calls this script.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
if ! command -v go >/dev/null; then
  echo "scripts/test.sh: Go is not on PATH (expected /usr/local/go/bin/go)" >&2
  exit 1
fi

# Debian packages the tests use: throwaway PostgreSQL and MariaDB servers are
# started from these binaries; the shell agent is tested under dash and busybox;
# openssl s_client checks the TLS policy.
need=()
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
{ command -v mariadbd || [ -x /usr/sbin/mariadbd ]; } >/dev/null 2>&1 || need+=(mariadb-server)
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl) # the TLS policy's real client (s_client); the shell agent's ed25519 check
command -v dash >/dev/null || need+=(dash)
command -v busybox >/dev/null || need+=(busybox)
command -v shellcheck >/dev/null || need+=(shellcheck)
command -v chromium >/dev/null || need+=(chromium)
[ -e /usr/share/fonts/truetype/dejavu ] || need+=(fonts-dejavu-core)
# deploy/: promtool checks the alerting rules, podman builds the image,
# systemd-analyze checks the unit.
command -v promtool >/dev/null || need+=(prometheus)
command -v podman >/dev/null || need+=(podman)
command -v systemd-analyze >/dev/null || need+=(systemd)
# internal/clustertest: nodes in network namespaces (ip, setpriv) behind
# HAProxy, with a throwaway NATS (internal/cluster too); deploy/: haproxy -c checks its config.
[ -x /usr/sbin/haproxy ] || need+=(haproxy)
[ -x /usr/sbin/nats-server ] || need+=(nats-server)
command -v ip >/dev/null || [ -x /usr/sbin/ip ] || need+=(iproute2)
command -v setpriv >/dev/null || need+=(util-linux)
# cmd/drover: ssh and scp reach an sshd (started on its own, never as the
# system's service) on a LAN host behind a device, through drover tunnel.
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
# internal/release: rpm reads the .rpm as distributions do (the .deb is
# installed with dpkg, the server started from it with setpriv).
command -v rpm >/dev/null || need+=(rpm)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing: ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    case " ${need[*]} " in # the tests start their own sshd
    *" openssh-server "*) systemctl disable --now ssh.service >/dev/null 2>&1 || true ;;
    esac
  else
    echo "scripts/test.sh: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
    exit 1
  fi
fi

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi
go vet ./...
# go.mod and go.sum say exactly what the code needs (direct requirements not
# marked indirect, nothing missing, nothing left over).
go mod tidy -diff
if [ -x scripts/build-agents.sh ]; then
  scripts/build-agents.sh
fi
# The drover binary the tests start as a process, built once (stamped as
# scripts/release.sh does) instead of once per package.
bindir=$(mktemp -d)
trap 'rm -rf "$bindir"' EXIT
go build -ldflags "$(scripts/version.sh)" -o "$bindir/drover" ./cmd/drover
export DROVER_TEST_BINARY=$bindir/drover
# The race detector on the concurrent core, and every other package: each
# package's tests run once (the race run already is the core's test run).
# Both runs at once: much of either is waiting (servers, timers), not CPU.
# The race run's output follows the other's.
race=$(go list ./internal/fleet/ ./internal/server/...)
rest=$(go list ./... | grep -vxF "$race")
# shellcheck disable=SC2086 # one package a word
go test -race -count=1 -timeout 20m $race >"$bindir/race.out" 2>&1 &
racepid=$!
status=0
# shellcheck disable=SC2086
go test -count=1 -timeout 20m $rest || status=$?
wait "$racepid" || status=$?
cat "$bindir/race.out"
[ "$status" = 0 ] || exit "$status"
# Agents decode with encoding/json (-tags drover_stdjson): same validation.
go test -count=1 -tags drover_stdjson ./internal/protocol/
