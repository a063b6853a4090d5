package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestParse(t *testing.T) {
	vcs := []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
		{Key: "vcs.time", Value: "2026-11-23T10:00:00Z"},
		{Key: "vcs.modified", Value: "false"},
	}
	cases := []struct {
		name     string
		bi       debug.BuildInfo
		version  string
		commit   string
		describe string
	}{
		{"tagged", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}, Settings: vcs},
			"v1.2.3", "0123456789abcdef0123456789abcdef01234567",
			"v1.2.3 (commit 0123456789abcdef0123456789abcdef01234567, 2026-11-23T10:00:00Z, go1.26.8)"},
		{"dirty", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.4-0.20261123100000-0123456789ab+dirty"},
			Settings: append(vcs[:2:2], debug.BuildSetting{Key: "vcs.modified", Value: "true"})},
			"v1.2.4-0.20261123100000-0123456789ab+dirty", "0123456789abcdef0123456789abcdef01234567-dirty", ""},
		{"go run", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: vcs},
			"devel-0123456789ab", "0123456789abcdef0123456789abcdef01234567", ""},
		{"no vcs", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			"devel", "unknown", "devel (commit unknown, go1.26.8)"},
	}
	for _, tc := range cases {
		in := parse(&tc.bi)
		if in.Version != tc.version || in.Commit != tc.commit {
			t.Errorf("%s: got %q %q, want %q %q", tc.name, in.Version, in.Commit, tc.version, tc.commit)
		}
		if tc.describe != "" && in.String() != tc.describe {
			t.Errorf("%s: String() = %q, want %q", tc.name, in.String(), tc.describe)
		}
	}
}

// A build the toolchain did not stamp takes what scripts/version.sh set.
func TestLinkerFallback(t *testing.T) {
	defer func(v, c, w string) { linkVersion, linkCommit, linkTime = v, c, w }(linkVersion, linkCommit, linkTime)
	linkVersion, linkCommit, linkTime = "v1.2.0", "0123456789abcdef0123456789abcdef01234567", "2026-11-23T10:00:00Z"
	in := parse(&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}})
	if in.Version != "v1.2.0" || in.Commit != linkCommit || in.Time != linkTime {
		t.Errorf("unstamped build: %+v", in)
	}
	stamped := parse(&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.3.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "fedcba9876543210fedcba9876543210fedcba98"}}})
	if stamped.Version != "v1.3.0" || stamped.Commit != "fedcba9876543210fedcba9876543210fedcba98" {
		t.Errorf("the toolchain's stamp must win: %+v", stamped)
	}
}
