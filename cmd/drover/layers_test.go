package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The import rules of docs/architecture.md, checked on the real graph.
func TestImportLayers(t *testing.T) {
	t.Parallel()
	const mod = "github.com/drover/drover/"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "../../...").Output()
	if err != nil {
		t.Fatal(err)
	}
	imports := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		imports[strings.TrimPrefix(f[0], mod)] = f[1:]
	}
	local := func(p string) []string {
		var out []string
		for _, i := range imports[p] {
			if strings.HasPrefix(i, mod) {
				out = append(out, strings.TrimPrefix(i, mod))
			}
		}
		return out
	}
	// may lists, for a package, every module package it may import;
	// packages not listed have no rule beyond the two below.
	may := map[string][]string{
		"internal/protocol":          {},
		"internal/buildinfo":         {},
		"internal/fsutil":            {},
		"internal/httpclose":         {},
		"internal/render":            {},
		"internal/render/doc":        {"internal/render"},
		"internal/fleet":             {"internal/protocol"},
		"internal/agent":             {"internal/protocol", "internal/buildinfo", "internal/fsutil", "internal/tunnel"},
		"internal/tunnel":            {},
		"internal/emulator/results":  {},
		"internal/emulator":          {"internal/protocol", "internal/buildinfo", "internal/emulator/results"},
		"internal/report":            {"internal/emulator/results", "internal/render", "internal/render/doc"},
		"internal/perf":              {"internal/emulator", "internal/emulator/results", "internal/render", "internal/render/doc", "internal/hostinfo", "internal/logcat"},
		"internal/hostinfo":          {},
		"internal/logcat":            {},
		"internal/netlab":            {},
		"internal/ctl":               {}, // the operator API over HTTP only
		"internal/gitops":            {}, // configuration as code, on the operator API too
		"internal/testwait":          {},
		"internal/alert":             {"internal/fleet", "internal/protocol", "internal/alert"},
		"internal/web":               {"internal/fleet", "internal/protocol", "internal/alert", "internal/render", "internal/sessions", "internal/access", "internal/httpclose"},
		"internal/sessions":          {},
		"internal/access":            {},
		"internal/store/contract":    {"internal/fleet", "internal/alert", "internal/sessions", "internal/access"},
		"internal/cluster":           {"internal/fleet", "internal/store/contract", "internal/protocol", "internal/alert", "internal/sessions", "internal/access"},
		"cmd/internal/command":       {},
		"cmd/internal/agentcmd":      {"cmd/internal/command", "internal/agent", "internal/tunnel"},
		"cmd/drover-agent":           {"cmd/internal/command", "cmd/internal/agentcmd"},
		"internal/store/migrate":     {},
		"internal/store/dbtest":      {"internal/testwait"},
		"internal/server/servertest": {"internal/server"},
		"internal/server/transport":  {"internal/protocol"},
		"internal/release":           {}, // the packager (nfpm), linked by scripts/package only
	}
	for pkg := range imports {
		if strings.HasPrefix(pkg, "internal/") {
			if slices.Contains(imports[pkg], "flag") {
				t.Errorf("%s imports flag: libraries take config structs; flags belong in cmd/", pkg)
			}
			for _, i := range local(pkg) {
				if strings.HasPrefix(i, "cmd/") {
					t.Errorf("%s imports %s", pkg, i)
				}
			}
		}
		rule, ok := may[pkg]
		if !ok {
			continue
		}
		for _, i := range local(pkg) {
			if !slices.Contains(rule, i) {
				t.Errorf("%s imports %s; docs/architecture.md allows %v", pkg, i, rule)
			}
		}
	}
	// The store depends on nothing above it: not the dashboard (whose
	// login store is the leaf internal/sessions), the server or the cluster.
	for pkg := range imports {
		if pkg != "internal/store" && !strings.HasPrefix(pkg, "internal/store/") {
			continue
		}
		for _, i := range local(pkg) {
			for _, above := range []string{"internal/web", "internal/server", "internal/cluster"} {
				if i == above || strings.HasPrefix(i, above+"/") {
					t.Errorf("%s imports %s, above the store", pkg, i)
				}
			}
		}
	}
	// drover links no packager: nfpm and its dependencies stay in
	// scripts/package, the one importer of internal/release.
	for pkg := range imports {
		if pkg != "scripts/package" && slices.Contains(local(pkg), "internal/release") {
			t.Errorf("%s imports internal/release; only scripts/package may", pkg)
		}
	}
	droverDeps, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range strings.Fields(string(droverDeps)) {
		if d == mod+"internal/release" || strings.HasPrefix(d, "github.com/goreleaser/") {
			t.Errorf("drover links %s", d)
		}
	}
	// The agent-only binary links no server.
	deps, err := exec.Command("go", "list", "-deps", "../drover-agent").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range strings.Fields(string(deps)) {
		for _, banned := range []string{"internal/server", "internal/store", "internal/web", "internal/fleet", "internal/alert"} {
			if strings.HasPrefix(d, mod+banned) {
				t.Errorf("drover-agent links %s", d)
			}
		}
	}
}
