#!/bin/sh
# version.sh: prints the -ldflags -X settings that name this checkout's
# version and commit in internal/buildinfo, for builds the Go toolchain does
# not stamp itself (it does not read git worktrees). The version is the tag
# (git describe: v1.2.0, or v1.2.0-3-gabc1234 after it), else a Go-style
# pseudo-version v0.0.0-<commit time>-<commit>; +dirty for local changes.
set -eu
cd "$(dirname "$0")/.."
commit=$(git rev-parse HEAD)
when=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ)
dirty=
git diff --quiet HEAD 2>/dev/null || dirty=yes
if v=$(git describe --tags --match 'v[0-9]*' 2>/dev/null); then
	:
else
	v=v0.0.0-$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S)-$(git rev-parse --short=12 HEAD)
fi
if [ -n "$dirty" ]; then
	v=$v+dirty
	commit=$commit-dirty
fi
p=github.com/drover/drover/internal/buildinfo
echo "-X $p.linkVersion=$v -X $p.linkCommit=$commit -X $p.linkTime=$when"
