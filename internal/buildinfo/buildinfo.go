// Package buildinfo tells which build of Drover is running, from the build
// information the Go toolchain stamps into every binary (module version from
// the git tag, VCS revision and time).
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Set with -ldflags -X by scripts/release.sh (scripts/version.sh) from git,
// for builds the toolchain cannot stamp (a git worktree, -buildvcs=false);
// what the toolchain stamped wins.
var (
	linkVersion string
	linkCommit  string
	linkTime    string
)

// Info is what the toolchain recorded about this build.
type Info struct {
	Version   string // v1.2.3 on a tagged commit, a pseudo-version after it, "devel" when unknown
	Commit    string // VCS revision, "-dirty" appended for uncommitted changes; "unknown" when not recorded
	Time      string // commit time (RFC 3339), "" when not recorded
	GoVersion string
}

// Read returns this build's information.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "devel", Commit: "unknown", GoVersion: runtime.Version()}
	}
	return parse(bi)
}

func parse(bi *debug.BuildInfo) Info {
	in := Info{Version: bi.Main.Version, Commit: "unknown", GoVersion: bi.GoVersion}
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Commit = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if modified && in.Commit != "unknown" {
		in.Commit += "-dirty"
	}
	if in.Commit == "unknown" && linkCommit != "" {
		in.Commit, in.Time = linkCommit, linkTime
	}
	if (in.Version == "" || in.Version == "(devel)") && linkVersion != "" {
		in.Version = linkVersion
	}
	if in.Version == "" || in.Version == "(devel)" {
		// go run, go test or -buildvcs=false: no version stamped.
		in.Version = "devel"
		if c := in.Commit; c != "unknown" && len(c) >= 12 {
			in.Version = "devel-" + c[:12]
		}
	}
	if in.GoVersion == "" {
		in.GoVersion = runtime.Version()
	}
	return in
}

// Version is the module version (see Info.Version), or "devel-<commit>"
// for a build without a stamped version, or "devel".
func Version() string { return Read().Version }

// String is the one-line description `drover version` prints.
func (in Info) String() string {
	s := in.Version + " (commit " + in.Commit
	if in.Time != "" {
		s += ", " + in.Time
	}
	return s + ", " + in.GoVersion + ")"
}
