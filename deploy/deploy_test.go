package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
	"go.yaml.in/yaml/v3"
)

// rules reads the alerting rules file.
func rules(t *testing.T) (exprs map[string]string) {
	t.Helper()
	b, err := os.ReadFile("prometheus/drover-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	exprs = map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			exprs["rule "+r.Alert+r.Record] = r.Expr
		}
	}
	if len(exprs) == 0 {
		t.Fatal("no rules")
	}
	return exprs
}

// dashboard reads the Grafana dashboard: every panel's queries.
func dashboard(t *testing.T) (exprs map[string]string, raw map[string]any) {
	t.Helper()
	b, err := os.ReadFile("grafana/drover-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	var d struct {
		Panels []struct {
			ID      int
			Title   string
			Type    string
			Targets []struct{ Expr, RefID string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	exprs = map[string]string{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs[fmt.Sprintf("panel %q %s", p.Title, tg.RefID)] = tg.Expr
		}
	}
	return exprs, raw
}

// PromQL words that are not metric names.
var promqlWords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true,
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promBraces   = regexp.MustCompile(`\{[^{}]*\}|\[[^\[\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	grafanaVar   = regexp.MustCompile(`\$__\w+|\$\{?\w+\}?`)
)

// metricNames lists the metric names a PromQL expression selects.
func metricNames(expr string) []string {
	s := grafanaVar.ReplaceAllString(expr, "1")
	s = promString.ReplaceAllString(s, `""`)
	s = promBraces.ReplaceAllString(s, " ")
	s = promGrouping.ReplaceAllString(s, " ")
	var names []string
	for _, m := range promIdent.FindAllStringSubmatchIndex(s, -1) {
		word := s[m[0]:m[1]]
		if m[2] >= 0 { // a function call
			continue
		}
		if m[0] > 0 && (s[m[0]-1] >= '0' && s[m[0]-1] <= '9' || s[m[0]-1] == '.') {
			continue // a number's exponent or unit (1e-9)
		}
		if !promqlWords[strings.ToLower(word)] {
			names = append(names, word)
		}
	}
	return names
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string]string{
		`histogram_quantile(0.99, sum by (instance, le) (rate(drover_store_commit_duration_seconds_bucket{job="x"}[5m]))) > 1`:    "drover_store_commit_duration_seconds_bucket",
		`sum by (instance) (rate(a_total{outcome=~"a|b"}[15m])) / clamp_min(sum by (instance) (rate(b_total[15m])), 1e-9) > 0.05`: "a_total b_total",
		`up{job="drover"} == 0`: "up",
		`process_open_fds / on(instance) group_left process_max_fds`:                         "process_open_fds process_max_fds",
		`sum(rate(x_sum{instance=~"$instance"}[$__rate_interval])) / sum(rate(x_count[5m]))`: "x_sum x_count",
	} {
		if got := strings.Join(metricNames(expr), " "); got != want {
			t.Errorf("metricNames(%q) = %q, want %q", expr, got, want)
		}
	}
}

// Every metric the alerting rules and the dashboard use is exported by a
// real server (scraped in-process after some traffic, so that every labelled
// series exists); "up" is Prometheus' own.
func TestRulesAndDashboardUseExportedMetrics(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	exported := scrapeNames(t, s)
	exported["up"] = true
	ruleExprs := rules(t)
	dashExprs, _ := dashboard(t)
	used := 0
	for _, set := range []map[string]string{ruleExprs, dashExprs} {
		for where, expr := range set {
			names := metricNames(expr)
			if len(names) == 0 {
				t.Errorf("%s: no metric in %q", where, expr)
			}
			for _, n := range names {
				used++
				if !exported[n] {
					t.Errorf("%s uses %s, which the server does not export", where, n)
				}
			}
		}
	}
	t.Logf("%d rules, %d dashboard queries, %d metric uses checked against %d exported names", len(ruleExprs), len(dashExprs), used, len(exported))
}

// scrapeNames makes the server create its labelled series (a device
// registers and pushes, a request fails, an alert rule exists) and returns
// every sample name of /metrics.
func scrapeNames(t *testing.T, s *servertest.Server) map[string]bool {
	t.Helper()
	do := func(method, path, token, body string) int {
		req, _ := http.NewRequest(method, s.URL+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := do("POST", "/api/v1/alerts/rules", s.AdminToken, `{"name":"hot","kind":"temperature_above","threshold":80}`); st != 201 && st != 200 {
		t.Fatalf("create alert rule: %d", st)
	}
	if st := do("GET", "/api/v1/devices", "", ""); st != 401 {
		t.Fatalf("request without token: %d", st)
	}
	if st := do("GET", "/api/v1/stats", s.AdminToken, ""); st != 200 {
		t.Fatalf("stats: %d", st)
	}
	names := map[string]bool{}
	for _, line := range strings.Split(s.MetricsText(), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		names[name] = true
	}
	return names
}

func TestPromtoolChecksRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("no promtool on PATH (Debian: apt-get install prometheus); scripts/test.sh installs it")
	}
	out, err := exec.Command(promtool, "check", "rules", "prometheus/drover-alerts.yml").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

func TestDashboardJSON(t *testing.T) {
	exprs, raw := dashboard(t)
	if raw["title"] != "Drover" || raw["uid"] == "" || raw["schemaVersion"] == nil {
		t.Errorf("dashboard header: title %v uid %v schemaVersion %v", raw["title"], raw["uid"], raw["schemaVersion"])
	}
	b, _ := json.Marshal(raw["templating"])
	if !strings.Contains(string(b), `"name":"datasource"`) || !strings.Contains(string(b), `"name":"instance"`) {
		t.Errorf("templating lacks the datasource or instance variable: %s", b)
	}
	for where, expr := range exprs {
		if !strings.Contains(expr, `instance=~"$instance"`) {
			t.Errorf("%s ignores the instance variable: %s", where, expr)
		}
	}
}

func TestSystemdUnit(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze on PATH (Debian: systemd)")
	}
	// verify wants ExecStart's binary to exist: a copy of the unit points at
	// this test's own executable.
	b, err := os.ReadFile("systemd/drover.service")
	if err != nil {
		t.Fatal(err)
	}
	sock, err := os.ReadFile("systemd/drover.socket")
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	dir := t.TempDir()
	unit := filepath.Join(dir, "drover.service")
	os.WriteFile(unit, bytes.ReplaceAll(b, []byte("/usr/local/bin/drover"), []byte(exe)), 0o644)
	os.WriteFile(filepath.Join(dir, "drover.socket"), sock, 0o644)
	out, err := exec.Command(analyze, "verify", unit, filepath.Join(dir, "drover.socket")).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// The hardening: exposure 2.0 or less of 10 (systemd's "OK").
	out, err = exec.Command(analyze, "security", "--offline=true", "--threshold=20", unit).CombinedOutput()
	if err != nil {
		t.Errorf("systemd-analyze security: %v\n%s", err, out)
	}
	for _, opt := range []string{"DynamicUser=yes", "StateDirectory=drover", "NoNewPrivileges=yes", "ProtectSystem=strict",
		"KillSignal=SIGTERM", "TimeoutStopSec=45", "ExecReload=/bin/kill -HUP $MAINPID"} {
		if !bytes.Contains(b, []byte("\n"+opt+"\n")) {
			t.Errorf("unit lacks %s", opt)
		}
	}
}

// containerfile reads the image definition as instruction lines.
func containerfile(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("container/Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines
}

// The image definition, checked statically: an empty base, a non-root
// user that owns the data volume, a health check by the binary itself, and
// only files the release script puts in the build context.
func TestContainerfile(t *testing.T) {
	lines := containerfile(t)
	want := []string{
		"FROM scratch",
		"COPY --chown=65532:65532 data/ /var/lib/drover/",
		"USER 65532:65532",
		"ENV DROVER_DATA_DIR=/var/lib/drover",
		`VOLUME ["/var/lib/drover"]`,
		`HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 CMD ["/usr/local/bin/drover", "healthcheck"]`,
		`ENTRYPOINT ["/usr/local/bin/drover"]`,
		`CMD ["serve"]`,
	}
	for _, w := range want {
		if !slices.Contains(lines, w) {
			t.Errorf("Containerfile lacks %q", w)
		}
	}
	if n := len(slices.DeleteFunc(slices.Clone(lines), func(l string) bool { return !strings.HasPrefix(l, "FROM ") })); n != 1 {
		t.Errorf("%d FROM lines, want one stage", n)
	}
	release, err := os.ReadFile("../scripts/release.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "COPY ") {
			continue
		}
		f := strings.Fields(l)
		for _, src := range f[1 : len(f)-1] {
			if strings.HasPrefix(src, "--") {
				continue
			}
			src = strings.ReplaceAll(strings.TrimSuffix(src, "/"), "${TARGETARCH}", "$arch")
			if !bytes.Contains(release, []byte(src)) {
				t.Errorf("COPY %s: scripts/release.sh does not put it in the build context", src)
			}
		}
	}
}

// With podman (Debian: podman) the image is built from a context made as
// scripts/release.sh makes it, and inspected.
func TestContainerImageBuild(t *testing.T) {
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("no podman on PATH (Debian: apt-get install podman): the Containerfile is checked statically only")
	}
	if testing.Short() {
		t.Skip("builds drover and an image")
	}
	ctx := t.TempDir()
	os.MkdirAll(filepath.Join(ctx, "data"), 0o755)
	// As the release builds it, less -trimpath and -ldflags, which would
	// miss the build cache of the other tests.
	build := exec.Command("go", "build", "-o", filepath.Join(ctx, "drover-linux-amd64"), "../cmd/drover")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cf, _ := os.ReadFile("container/Containerfile")
	os.WriteFile(filepath.Join(ctx, "Containerfile"), cf, 0o644)
	os.WriteFile(filepath.Join(ctx, "passwd"), []byte("root:x:0:0:root:/:/nonexistent\ndrover:x:65532:65532:drover:/var/lib/drover:/nonexistent\n"), 0o644)
	os.WriteFile(filepath.Join(ctx, "group"), []byte("root:x:0:\ndrover:x:65532:\n"), 0o644)
	os.WriteFile(filepath.Join(ctx, "ca-certificates.crt"), []byte{}, 0o644)
	tag := fmt.Sprintf("localhost/drover-test:%d", os.Getpid())
	out, err := exec.Command(podman, "build", "--format", "docker", "-t", tag, ctx).CombinedOutput()
	if err != nil {
		t.Fatalf("podman build: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command(podman, "rmi", "-f", tag).Run() })
	out, err = exec.Command(podman, "image", "inspect", tag).Output()
	if err != nil {
		t.Fatal(err)
	}
	var img []struct {
		Config struct {
			User       string
			Volumes    map[string]any
			Entrypoint []string
			Cmd        []string
		}
		Healthcheck      struct{ Test []string }
		Os, Architecture string
	}
	if err := json.Unmarshal(out, &img); err != nil || len(img) != 1 {
		t.Fatalf("podman image inspect: %v %s", err, out)
	}
	c := img[0].Config
	if c.User != "65532:65532" || c.Volumes["/var/lib/drover"] == nil || strings.Join(c.Entrypoint, " ") != "/usr/local/bin/drover" ||
		strings.Join(c.Cmd, " ") != "serve" || strings.Join(img[0].Healthcheck.Test, " ") != "CMD /usr/local/bin/drover healthcheck" {
		t.Errorf("image config %+v, health check %v", c, img[0].Healthcheck.Test)
	}
	t.Logf("built %s (%s/%s)", tag, img[0].Os, img[0].Architecture)
}
