package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

// Configuration as code against a real server: drover ctl apply of a
// directory (dry run first, which changes nothing), a second apply that
// changes nothing, an invalid description refused whole with each
// problem's file and line, and export read back by apply as no change.
func TestCtlApplyExport(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	ctl := ctlRunner(t, s)
	dev := registerDevice(t, s, "gitops-1", "router") // makes profile router/1.0

	audit := func() int {
		t.Helper()
		var page struct {
			Entries []json.RawMessage `json:"entries"`
		}
		if st := s.Admin(t, "GET", "/api/v1/audit?limit=1000", nil, &page); st != 200 {
			t.Fatalf("audit: %d", st)
		}
		return len(page.Entries)
	}
	export := func() string {
		t.Helper()
		r := ctl(s.AdminToken, "", "export")
		if r.code != 0 {
			t.Fatalf("export: exit %d %s", r.code, r.stderr)
		}
		return r.stdout
	}
	write := func(dir, name, text string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	repo := t.TempDir()
	write(repo, "policy.yaml", "apiVersion: drover/v1\nkind: ProfilePolicy\nmode: create\ncreate_limit: 5\n")
	write(filepath.Join(repo, "profiles"), "router.yaml", `apiVersion: drover/v1
kind: DeviceTypeSchema
device_type: router
schema:
  type: object
---
apiVersion: drover/v1
kind: Profile
device_type: router
firmware: "1.0"
push_interval: 120
config:
  ntp: pool.example
`)
	write(filepath.Join(repo, "groups"), "north.yaml", `apiVersion: drover/v1
kind: Label
name: north
filter: device_type=router
---
apiVersion: drover/v1
kind: LabelLayer
label: north
priority: 3
values:
  apn: internet.north
---
apiVersion: drover/v1
kind: DeviceLayer
device: "`+dev+`"
values:
  log: {level: debug}
`)
	write(repo, "alerts.yaml", `apiVersion: drover/v1
kind: AlertRule
name: hot
condition: temperature_above
threshold: 70
label: north
`)
	write(repo, "rollouts.yaml", `apiVersion: drover/v1
kind: RolloutPolicy
name: canary-first
waves: ["1", "10%", "100%"]
max_failure_pct: 2.5
window: {start: "22:00", end: "04:00"}
`)
	write(repo, "users.yaml", "apiVersion: drover/v1\nkind: User\nname: alice\nrole: operator\n")
	write(filepath.Join(repo, ".git"), "ignored.yaml", "not: a description\n")

	// Dry run: the diff of each object, and nothing changed.
	before, rows := export(), audit()
	r := ctl(s.AdminToken, "", "apply", "-f", repo, "--dry-run")
	if r.code != 0 {
		t.Fatalf("apply --dry-run: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, w := range []string{
		"+ Label north (" + filepath.Join(repo, "groups", "north.yaml") + ":2)",
		"~ Profile router/1.0 (", "+push_interval: 120", "+  ntp: pool.example",
		"~ ProfilePolicy (", "-create_limit: 10", "+create_limit: 5",
		"+ LabelLayer north", "+ DeviceLayer " + dev, "+ AlertRule hot", "+condition: temperature_above",
		"+ User alice", "+role: operator", "+ DeviceTypeSchema router",
		"+ RolloutPolicy canary-first (" + filepath.Join(repo, "rollouts.yaml") + ":2)", "+max_failure_pct: 2.5", "+stall_timeout: 3600",
		"7 to create, 2 to change, 0 unchanged",
	} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("apply --dry-run lacks %q:\n%s", w, r.stdout)
		}
	}
	if after := export(); after != before || audit() != rows {
		t.Fatalf("apply --dry-run changed the server:\n%s\n---\n%s", before, after)
	}

	// Apply, then again: nothing left to change.
	if r := ctl(s.AdminToken, "", "apply", "-f", repo); r.code != 0 || !strings.Contains(r.stdout, "applied: 7 created, 2 changed, 0 unchanged") {
		t.Fatalf("apply: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	var label struct {
		Filter  string `json:"filter"`
		Devices int    `json:"devices"`
	}
	if st := s.Admin(t, "GET", "/api/v1/labels/north", nil, &label); st != 200 || label.Filter == "" || label.Devices != 1 {
		t.Fatalf("label north after apply: %d %+v", st, label)
	}
	var rp struct {
		Waves         []string `json:"waves"`
		MaxFailurePct float64  `json:"max_failure_pct"`
		Window        *struct{ Start, End string }
	}
	if st := s.Admin(t, "GET", "/api/v1/rollout-policies/canary-first", nil, &rp); st != 200 || len(rp.Waves) != 3 || rp.MaxFailurePct != 2.5 || rp.Window == nil || rp.Window.Start != "22:00" {
		t.Fatalf("rollout policy after apply: %d %+v", st, rp)
	}
	rows = audit()
	r = ctl(s.AdminToken, "", "apply", "-f", repo)
	if r.code != 0 || !strings.Contains(r.stdout, "0 to create, 0 to change, 9 unchanged") || strings.Contains(r.stdout, "applied") {
		t.Fatalf("second apply: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if audit() != rows {
		t.Fatal("the second apply wrote audit rows")
	}
	r = ctl(s.AdminToken, "", "apply", "-f", repo, "--json")
	var plan struct {
		Unchanged int `json:"unchanged"`
		Changes   []struct {
			Kind, Action, File string
			Line               int
		} `json:"changes"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &plan) != nil || plan.Unchanged != 9 || len(plan.Changes) != 9 || plan.Changes[0].Line == 0 {
		t.Fatalf("apply --json: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// An invalid description: every problem with its file and line, exit
	// 2, and nothing applied, not even the valid change beside them.
	bad := t.TempDir()
	write(bad, "a.yaml", "apiVersion: drover/v1\nkind: User\nname: alice\nrole: viewer\n")
	write(bad, "b.yaml", `apiVersion: drover/v1
kind: AlertRule
name: hot
condition: temperature_above
threshold: 5000
---
apiVersion: drover/v1
kind: Label
name: south
filter: state.temperature >>> 3
`)
	before, rows = export(), audit()
	r = ctl(s.AdminToken, "", "apply", "-f", bad)
	if r.code != 2 {
		t.Fatalf("invalid apply: exit %d, want 2\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, re := range []string{
		regexp.QuoteMeta(filepath.Join(bad, "b.yaml")+":5: AlertRule hot: ") + `.*threshold`,
		regexp.QuoteMeta(filepath.Join(bad, "b.yaml")+":10: Label south: where: ") + `.*state\.temperature`,
		"nothing was applied",
	} {
		if !regexp.MustCompile(re).MatchString(r.stderr) {
			t.Errorf("invalid apply: stderr lacks %s:\n%s", re, r.stderr)
		}
	}
	if export() != before || audit() != rows {
		t.Fatal("an invalid description changed the server")
	}
	write(bad, "c.yaml", "apiVersion: drover/v1\nkind: Users\n")
	if r := ctl(s.AdminToken, "", "apply", "-f", bad); r.code != 2 || !strings.Contains(r.stderr, filepath.Join(bad, "c.yaml")+`:2: unknown kind "Users"`) {
		t.Fatalf("unknown kind: exit %d\n%s", r.code, r.stderr)
	}

	// Export into a directory, then apply it: no change. No secrets.
	out := t.TempDir()
	if r := ctl(s.AdminToken, "", "export", "-o", out); r.code != 0 {
		t.Fatalf("export -o: exit %d %s", r.code, r.stderr)
	}
	if rps, err := os.ReadFile(filepath.Join(out, "rollout-policies.yaml")); err != nil || !strings.Contains(string(rps), "name: canary-first") || strings.Contains(string(rps), "updated_at") {
		t.Fatalf("rollout-policies.yaml: %v\n%s", err, rps)
	}
	users, err := os.ReadFile(filepath.Join(out, "users.yaml"))
	if err != nil || !strings.Contains(string(users), "name: alice") || strings.Contains(string(users), "password") {
		t.Fatalf("users.yaml: %v\n%s", err, users)
	}
	r = ctl(s.AdminToken, "", "apply", "-f", out, "--dry-run")
	if r.code != 0 || !regexp.MustCompile(`0 to create, 0 to change, \d+ unchanged`).MatchString(r.stdout) {
		t.Fatalf("apply of the export: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// --prune deletes what the description does not name, of its kinds
	// only: the rule hot goes, the users stay.
	pruned := t.TempDir()
	write(pruned, "alerts.yaml", "apiVersion: drover/v1\nkind: AlertRule\nname: cold\ncondition: temperature_above\nthreshold: -5\n")
	r = ctl(s.AdminToken, "", "apply", "-f", pruned, "--prune", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "- AlertRule hot (server)") || !strings.Contains(r.stdout, "+ AlertRule cold") ||
		!strings.Contains(r.stdout, "1 to create, 0 to change, 1 to delete, 0 unchanged") {
		t.Fatalf("apply --prune --dry-run: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r := ctl(s.AdminToken, "", "apply", "-f", pruned, "--prune"); r.code != 0 || !strings.Contains(r.stdout, "applied: 1 created, 0 changed, 1 deleted, 0 unchanged") {
		t.Fatalf("apply --prune: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	var rules struct {
		Rules []struct{ Name string } `json:"rules"`
	}
	if st := s.Admin(t, "GET", "/api/v1/alerts/rules", nil, &rules); st != 200 || len(rules.Rules) != 1 || rules.Rules[0].Name != "cold" {
		t.Fatalf("rules after --prune: %d %+v", st, rules)
	}
	if st := s.Admin(t, "GET", "/api/v1/users/alice", nil, nil); st != 200 {
		t.Fatalf("alice after a prune of alert rules: %d", st)
	}

	// An operator's token exports everything but the users (admin only),
	// and may not apply a description naming users: exit 4. A wrong
	// token: exit 4 too.
	if st := s.Admin(t, "POST", "/api/v1/users", []byte(`{"name":"otto","role":"operator"}`), nil); st != 201 {
		t.Fatalf("create otto: %d", st)
	}
	var tok struct {
		Token string `json:"token"`
	}
	if st := s.Admin(t, "POST", "/api/v1/tokens", []byte(`{"user":"otto","name":"ci"}`), &tok); st != 201 {
		t.Fatalf("token: %d", st)
	}
	r = ctl(tok.Token, "", "export")
	if r.code != 0 || !strings.Contains(r.stderr, "users are not exported") || strings.Contains(r.stdout, "kind: User") || !strings.Contains(r.stdout, "kind: AlertRule") {
		t.Fatalf("export by an operator: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r := ctl(tok.Token, "", "apply", "-f", repo); r.code != 4 {
		t.Fatalf("apply of users by an operator: exit %d %s", r.code, r.stderr)
	}
	if r := ctl(tok.Token, "", "apply", "-f", filepath.Join(repo, "groups")); r.code != 0 || !strings.Contains(r.stdout, "0 to create, 0 to change, 3 unchanged") {
		t.Fatalf("apply by an operator: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r := ctl("no-such-token", "", "apply", "-f", repo); r.code != 4 {
		t.Fatalf("apply with a wrong token: exit %d %s", r.code, r.stderr)
	}
}
