package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/drover/drover/internal/testwait"
)

// seamClient talks to one drover serve over HTTPS as the operator (the
// admin token) or as a device (its token).
type seamClient struct {
	t     *testing.T
	c     *http.Client
	base  string
	admin string
}

// newSeamClient trusts the certificate in dataDir/tls and uses the admin
// token in dataDir/secrets.json.
func newSeamClient(t *testing.T, dataDir, addr string) *seamClient {
	t.Helper()
	return &seamClient{t: t, c: trustingClient(t, dataDir, 30*time.Second), base: "https://" + addr, admin: readSecrets(t, dataDir).Admin}
}

// do sends method path with body (JSON of any value, raw []byte, or nil)
// and token; it returns the status and the raw answer.
func (s *seamClient) do(method, path, token string, body any) (int, []byte) {
	s.t.Helper()
	var rd io.Reader
	ct := ""
	switch b := body.(type) {
	case nil:
	case []byte:
		rd, ct = bytes.NewReader(b), "application/octet-stream"
	default:
		j, err := json.Marshal(b)
		if err != nil {
			s.t.Fatal(err)
		}
		rd, ct = bytes.NewReader(j), "application/json"
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.c.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode, out
}

// must sends a request that must answer want, decoding the answer into
// into (unless nil).
func (s *seamClient) must(want int, method, path, token string, body, into any) {
	s.t.Helper()
	st, out := s.do(method, path, token, body)
	if st != want {
		s.t.Fatalf("%s %s: %d %s, want %d", method, path, st, out, want)
	}
	if into != nil {
		if err := json.Unmarshal(out, into); err != nil {
			s.t.Fatalf("%s %s: %v: %s", method, path, err, out)
		}
	}
}

// A server holding every kind of data (devices, pushed history, profiles
// with revisions, labels, an alert rule and its alert, users, API tokens,
// audit entries, commands with results, stored and linked firmware, a
// rollout devices are downloading) is backed up while it runs with
// `drover backup`, restored with `drover restore` into an empty data
// directory and started on another port: every API listing answers the
// same, every firmware file downloads byte for byte, the devices' tokens
// and the operator's admin token work, and the rollout goes on.
func TestSeamBackupRestoresEveryKindOfData(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	p := startServe(t, src, "--quota-push-rate", "0")
	s := newSeamClient(t, src, p.addr)
	var secret struct {
		E string `json:"enrollment_secret"`
	}
	raw, _ := os.ReadFile(filepath.Join(src, "secrets.json"))
	json.Unmarshal(raw, &secret)

	// An alert rule first, so that the pushes raise an alert.
	s.must(201, "POST", "/api/v1/alerts/rules", s.admin, map[string]any{"name": "hot", "kind": "cpu_above", "threshold": 80, "pushes": 1}, nil)

	// Devices of two types, each pushing history.
	type device struct{ ID, Token, Type string }
	var devs []device
	for i, typ := range []string{"ICR-3241", "ICR-3241", "ICR-3241", "RUT-955"} {
		var reg struct {
			DeviceID string `json:"device_id"`
			Token    string `json:"token"`
		}
		s.must(200, "POST", "/api/v1/register", "", map[string]any{"machine_id": fmt.Sprintf("seam-%d", i), "device_type": typ,
			"firmware": "6.3.5", "enrollment_secret": secret.E}, &reg)
		devs = append(devs, device{reg.DeviceID, reg.Token, typ})
	}
	seq := map[string]int{}
	push := func(d device, extra map[string]any) map[string]any {
		t.Helper()
		seq[d.ID]++
		body := map[string]any{"seq": seq[d.ID], "config_version": 0, "state": map[string]any{"cpu": min(10+30*seq[d.ID], 100), "uptime": 100 * seq[d.ID]}}
		for k, v := range extra {
			body[k] = v
		}
		var ans map[string]any
		s.must(200, "POST", "/api/v1/push", d.Token, body, &ans)
		return ans
	}
	for _, d := range devs {
		for range 3 {
			push(d, nil) // the third push, at 100 % CPU, raises the alert
		}
	}

	// Profiles: the registrations made them; two revisions more on each.
	var profiles struct {
		Profiles []struct {
			ID json.Number `json:"id"`
		} `json:"profiles"`
	}
	s.must(200, "GET", "/api/v1/profiles", s.admin, nil, &profiles)
	if len(profiles.Profiles) < 2 {
		t.Fatalf("profiles: %+v", profiles)
	}
	for _, pr := range profiles.Profiles {
		s.must(200, "PUT", "/api/v1/profiles/"+pr.ID.String(), s.admin, map[string]any{"config": map[string]any{"apn": "a"}}, nil)
		s.must(200, "PUT", "/api/v1/profiles/"+pr.ID.String(), s.admin, map[string]any{"config": map[string]any{"apn": "b"}, "push_interval": 300}, nil)
	}

	// A label, a user and a token of theirs.
	s.must(200, "POST", "/api/v1/labels/assign", s.admin, map[string]any{"label": "north", "filter": map[string]any{"q": "seam-1"}}, nil)
	s.must(201, "POST", "/api/v1/users", s.admin, map[string]any{"name": "ops", "role": "operator", "password": "correct horse battery"}, nil)
	var tok struct {
		Token string `json:"token"`
	}
	s.must(201, "POST", "/api/v1/tokens", s.admin, map[string]any{"user": "ops", "name": "ci"}, &tok)
	if tok.Token == "" {
		t.Fatal("no API token")
	}

	// Commands: one run with its result, one waiting for its device.
	var cmd struct {
		ID json.Number `json:"id"`
	}
	s.must(201, "POST", "/api/v1/commands", tok.Token, map[string]any{"kind": "reboot", "device_id": devs[1].ID}, &cmd)
	ans := push(devs[1], nil)
	if cmds, _ := ans["commands"].([]any); len(cmds) != 1 {
		t.Fatalf("the command was not delivered: %v", ans)
	}
	id, _ := cmd.ID.Int64()
	now := time.Now().Unix()
	push(devs[1], map[string]any{"results": []any{map[string]any{"id": id, "exit_code": 0, "output": []string{"rebooting"}, "started_at": now, "finished_at": now}}})
	s.must(201, "POST", "/api/v1/commands", s.admin, map[string]any{"kind": "reboot", "device_id": devs[2].ID}, nil)

	// Firmware: two stored files (one larger than a SQLite page run, one
	// small) and one kept elsewhere.
	files := map[string][]byte{}
	upload := func(typ, version string, size int) string {
		t.Helper()
		b := make([]byte, size)
		rand.Read(b)
		var fw struct {
			ID string `json:"id"`
		}
		s.must(201, "POST", "/api/v1/firmware?device_type="+typ+"&version="+version, s.admin, b, &fw)
		files[fw.ID] = b
		return fw.ID
	}
	big := upload("ICR-3241", "6.4.0", 3<<20+17)
	upload("RUT-955", "7.1", 4096)
	sum := sha256.Sum256([]byte("elsewhere"))
	s.must(201, "POST", "/api/v1/firmware", s.admin, map[string]any{"device_type": "ICR-3241", "version": "6.5.0",
		"sha256": hex.EncodeToString(sum[:]), "size": 9, "url": "https://firmware.example/icr-6.5.0.bin"}, nil)

	// A rollout of the large one, which the first device starts to
	// download.
	var ro struct {
		ID json.Number `json:"id"`
	}
	s.must(201, "POST", "/api/v1/rollouts", s.admin, map[string]any{"firmware_id": big, "waves": []string{"100%"}}, &ro)
	rollout, _ := ro.ID.Int64()
	if !testwait.Until(20*time.Second, func() bool { return push(devs[0], nil)["firmware_update"] != nil }) {
		t.Fatal("the rollout offered no firmware within 20 s")
	}
	push(devs[0], map[string]any{"firmware_update": map[string]any{"rollout": rollout, "state": "downloading", "progress": 4096}})
	// Rollout progress is written at the rollout's next turn
	// (--rollout-interval): wait until the database has it.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(src, "drover.db")+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var state string
	var progress int64
	if !testwait.Until(20*time.Second, func() bool {
		db.QueryRow(`SELECT state, progress FROM rollout_devices WHERE device_id = ?`, devs[0].ID).Scan(&state, &progress)
		// The device may be stored as downloading (the download started)
		// a turn before its reported progress is.
		return state == "downloading" && progress == 4096
	}) {
		t.Fatalf("the download's progress was not stored within 20 s (state %q, progress %d)", state, progress)
	}

	// Back up the running server; restore into a directory that does not
	// exist yet.
	backupDir := filepath.Join(t.TempDir(), "backup")
	out, err := exec.Command(droverBin, "backup", "--data-dir", src, backupDir).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "2 firmware files") {
		t.Fatalf("drover backup: %v %s", err, out)
	}
	st, err := os.Stat(backupDir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("backup directory: %v %v, want mode 0700", err, st)
	}
	filepath.WalkDir(backupDir, func(path string, d os.DirEntry, err error) error {
		if info, ierr := d.Info(); err == nil && ierr == nil && !d.IsDir() && info.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600 (the backup holds credentials)", path, info.Mode().Perm())
		}
		return nil
	})
	dst := filepath.Join(t.TempDir(), "restored")
	out, err = exec.Command(droverBin, "restore", "--data-dir", dst, backupDir).CombinedOutput()
	if err != nil {
		t.Fatalf("drover restore: %v %s", err, out)
	}
	t.Logf("%s", out)

	// Every listing of the running source, then of the restored server.
	listings := func(s *seamClient) map[string]any {
		t.Helper()
		paths := []string{"/api/v1/devices", "/api/v1/profiles", "/api/v1/labels", "/api/v1/alerts", "/api/v1/alerts/rules",
			"/api/v1/users", "/api/v1/tokens", "/api/v1/audit?limit=1000", "/api/v1/commands", "/api/v1/firmware", "/api/v1/rollouts",
			"/api/v1/rollouts/" + ro.ID.String() + "/devices", "/api/v1/commands/" + cmd.ID.String() + "/devices"}
		for _, d := range devs {
			paths = append(paths, "/api/v1/devices/"+d.ID, "/api/v1/devices/"+d.ID+"/history", "/api/v1/devices/"+d.ID+"/commands")
		}
		for _, pr := range profiles.Profiles {
			paths = append(paths, "/api/v1/profiles/"+pr.ID.String(), "/api/v1/profiles/"+pr.ID.String()+"/history")
		}
		got := map[string]any{}
		for _, path := range paths {
			var v any
			s.must(200, "GET", path, s.admin, nil, &v)
			got[path] = v
		}
		return got
	}
	before := listings(s)
	// Each kind is there to be compared (not an empty list on both sides).
	for path, key := range map[string]string{"/api/v1/alerts": "alerts", "/api/v1/users": "users", "/api/v1/tokens": "tokens",
		"/api/v1/commands": "jobs", "/api/v1/firmware": "firmware", "/api/v1/rollouts": "rollouts", "/api/v1/labels": "labels"} {
		if l, _ := before[path].(map[string]any)[key].([]any); len(l) == 0 {
			t.Fatalf("%s lists no %s: %v", path, key, before[path])
		}
	}
	if h, _ := before["/api/v1/profiles/"+profiles.Profiles[0].ID.String()+"/history"].(map[string]any)["revisions"].([]any); len(h) < 3 {
		t.Fatalf("profile history: %v", before["/api/v1/profiles/"+profiles.Profiles[0].ID.String()+"/history"])
	}
	p.stop(t)

	r := startServe(t, dst)
	if r.addr == p.addr {
		t.Fatalf("the restored server listens where the source did: %s", r.addr)
	}
	rs := newSeamClient(t, dst, r.addr)
	if rs.admin != s.admin {
		t.Fatal("the restored server has another admin token")
	}
	after := listings(rs)
	for path, want := range before {
		if !reflect.DeepEqual(after[path], want) {
			a, _ := json.Marshal(after[path])
			b, _ := json.Marshal(want)
			t.Errorf("GET %s after the restore:\n%s\nbefore the backup:\n%s", path, a, b)
		}
	}
	// Every stored firmware file, byte for byte: with the device's token
	// (of its type) and the operator's.
	for id, want := range files {
		token := rs.admin
		if id == big {
			token = devs[0].Token
		}
		st, got := rs.do("GET", "/api/v1/firmware/"+id+"/file", token, nil)
		if st != 200 || !bytes.Equal(got, want) {
			t.Errorf("firmware %s after the restore: %d, %d bytes, want %d bytes", id, st, len(got), len(want))
		}
	}
	// The rollout goes on: the device's progress is taken and the offer
	// stands.
	seq[devs[0].ID] += 10
	ans = func() map[string]any {
		var a map[string]any
		rs.must(200, "POST", "/api/v1/push", devs[0].Token, map[string]any{"seq": seq[devs[0].ID], "config_version": 0, "state": map[string]any{},
			"firmware_update": map[string]any{"rollout": rollout, "state": "installing", "progress": len(files[big])}}, &a)
		return a
	}()
	var rd struct {
		Devices []struct {
			State string `json:"state"`
		} `json:"devices"`
	}
	rs.must(200, "GET", "/api/v1/rollouts/"+ro.ID.String()+"/devices", rs.admin, nil, &rd)
	if len(rd.Devices) == 0 || rd.Devices[0].State != "installing" {
		t.Errorf("the rollout did not go on after the restore: %+v (push answered %v)", rd, ans)
	}
	for _, l := range r.logged() {
		if strings.Contains(l, "firmware files missing") {
			t.Errorf("the restored server warns: %s", l)
		}
	}
	r.stop(t)
}

// drover restore refuses a backup that lacks a firmware file, or has a
// byte changed, naming the file; it writes nothing. A server started on
// such a directory warns at start that firmware files are missing.
func TestSeamBackupRestoreRefusesAnIncompleteBackup(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	p := startServe(t, src)
	s := newSeamClient(t, src, p.addr)
	fw := map[string]string{} // version -> SHA-256
	for _, v := range []string{"1.0", "2.0"} {
		b := make([]byte, 70000)
		rand.Read(b)
		var f struct {
			SHA256 string `json:"sha256"`
		}
		s.must(201, "POST", "/api/v1/firmware?device_type=ICR-3241&version="+v, s.admin, b, &f)
		fw[v] = f.SHA256
	}
	good := filepath.Join(t.TempDir(), "good")
	if out, err := exec.Command(droverBin, "backup", "--data-dir", src, good).CombinedOutput(); err != nil {
		t.Fatalf("drover backup: %v %s", err, out)
	}
	p.stop(t)
	if out, err := exec.Command(droverBin, "restore", "--check", good).CombinedOutput(); err != nil || !strings.Contains(string(out), "is complete") {
		t.Fatalf("drover restore --check of a complete backup: %v %s", err, out)
	}

	copyDir := func(name string) string {
		t.Helper()
		to := filepath.Join(t.TempDir(), name)
		if out, err := exec.Command("cp", "-a", good, to).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		return to
	}
	missing := copyDir("missing")
	os.Remove(filepath.Join(missing, "firmware", fw["1.0"]+".bin"))
	flipped := copyDir("flipped")
	path := filepath.Join(flipped, "firmware", fw["2.0"]+".bin")
	b, _ := os.ReadFile(path)
	b[len(b)/2] ^= 1
	os.WriteFile(path, b, 0o600)
	noManifest := copyDir("nomanifest")
	os.Remove(filepath.Join(noManifest, "manifest.json"))
	flippedDB := copyDir("flippeddb")
	path = filepath.Join(flippedDB, "drover.db")
	b, _ = os.ReadFile(path)
	b[len(b)-1] ^= 1
	os.WriteFile(path, b, 0o600)

	for _, c := range []struct{ dir, want string }{
		{missing, "missing: firmware/" + fw["1.0"] + ".bin"},
		{flipped, "corrupt: firmware/" + fw["2.0"] + ".bin"},
		{noManifest, "manifest.json is missing"},
		{flippedDB, "corrupt: drover.db"},
	} {
		for _, check := range []bool{true, false} {
			dst := filepath.Join(t.TempDir(), "data")
			args := []string{"restore", "--data-dir", dst, c.dir}
			if check {
				args = []string{"restore", "--check", c.dir}
			}
			out, err := exec.Command(droverBin, args...).CombinedOutput()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), c.want) {
				t.Errorf("drover %v: %v %s, want exit 1 naming %q", args, err, out, c.want)
			}
			if _, err := os.Stat(dst); !os.IsNotExist(err) {
				t.Errorf("drover %v wrote %s: %v", args, dst, err)
			}
		}
	}
	// The manifest itself edited to leave the file out: the database
	// still lists it.
	edited := copyDir("edited")
	var m struct {
		Files []map[string]any `json:"files"`
	}
	raw, _ := os.ReadFile(filepath.Join(edited, "manifest.json"))
	var whole map[string]any
	json.Unmarshal(raw, &whole)
	json.Unmarshal(raw, &m)
	var kept []map[string]any
	for _, f := range m.Files {
		if f["path"] != "firmware/"+fw["1.0"]+".bin" {
			kept = append(kept, f)
		}
	}
	whole["files"] = kept
	raw, _ = json.Marshal(whole)
	os.WriteFile(filepath.Join(edited, "manifest.json"), raw, 0o600)
	os.Remove(filepath.Join(edited, "firmware", fw["1.0"]+".bin"))
	if out, err := exec.Command(droverBin, "restore", "--check", edited).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "missing: firmware/"+fw["1.0"]+".bin (firmware 1, ICR-3241 1.0), which drover.db lists") {
		t.Errorf("drover restore --check of a backup without a file its database lists: %v %s", err, out)
	}
	// Restore never overwrites a data directory.
	if out, err := exec.Command(droverBin, "restore", "--data-dir", src, good).CombinedOutput(); err == nil || !strings.Contains(string(out), "exists") {
		t.Errorf("drover restore over a data directory: %v %s", err, out)
	}

	// Started on the incomplete copy as a data directory, the server says
	// which firmware has no file.
	q := startServe(t, missing)
	warned := false
	for _, l := range q.logged() {
		warned = warned || strings.Contains(l, "firmware files missing") && strings.Contains(l, fw["1.0"]+".bin") && !strings.Contains(l, fw["2.0"])
	}
	if !warned {
		t.Errorf("no warning of the missing firmware file at start:\n%s", strings.Join(q.logged(), "\n"))
	}
	q.stop(t)
}
