package server_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/testwait"
)

// drover backup copies a running server's SQLite database while devices
// keep pushing and registering; a fresh server started on the copy serves
// the same fleet: same secrets and certificate, devices' tokens work, their
// history is there, and new devices get new IDs.
func TestBackupUnderWritesRestoresTheFleet(t *testing.T) {
	src := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: src, url: src.URL}
	const devices, before = 20, 3
	ids, tokens := make([]string, devices), make([]string, devices)
	for i := range devices {
		ids[i], tokens[i] = c.register(fmt.Sprintf("m-%d", i))
		for seq := 1; seq <= before; seq++ {
			if st, _, out := c.do("POST", "/api/v1/push", tokens[i], fmt.Sprintf(state, seq, 0)); st != 200 {
				t.Fatalf("push: %d %v", st, out)
			}
		}
	}

	// Writers: every device pushes on, new devices register, until the
	// backup is done.
	post := func(path, token, body string) int {
		req, _ := http.NewRequest("POST", src.URL+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := src.Client().Do(req)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	var stop atomic.Bool
	var written, failed atomic.Int64
	var wg sync.WaitGroup
	seqs := make([]int, devices)
	for i := range seqs {
		seqs[i] = before
	}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				var st int
				if w == 0 {
					st = post("/api/v1/register", "", fmt.Sprintf(`{"machine_id":"new-%d","device_type":"ICR-3241","firmware":"6.3.5","enrollment_secret":%q}`, n, src.EnrollmentSecret))
				} else {
					// Writer w owns devices w-1, w+2, ...: their seq is
					// their count of pushes.
					i := w - 1 + 3*(n%((devices-w)/3+1))
					seqs[i]++
					st = post("/api/v1/push", tokens[i], fmt.Sprintf(state, seqs[i], 0))
				}
				if st == 200 {
					written.Add(1)
				} else {
					failed.Add(1)
				}
			}
		}()
	}
	testwait.For(t, 30*time.Second, "the writers running", func() bool { return written.Load() >= 20 || failed.Load() > 0 })
	atStart := written.Load()
	dir := filepath.Join(t.TempDir(), "backup")
	res, err := server.Backup(context.Background(), src.Config, dir)
	during := written.Load() - atStart
	stop.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if failed.Load() > 0 {
		t.Fatalf("%d writes failed during the backup", failed.Load())
	}
	t.Logf("backup: %d pages, %d bytes, files %v; %d writes answered while it ran", res.Pages, res.Bytes, res.Files, during)
	if res.Pages < 1 || len(res.Database) != 2 || strings.Join(res.Files, ",") != "secrets.json,tls/cert.pem,tls/key.pem" {
		t.Fatalf("backup result %+v", res)
	}
	for _, f := range []string{"drover.db", "drover-history.db", "secrets.json", "tls/key.pem"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", f, err, st.Mode().Perm())
		}
	}
	if _, err := server.Backup(context.Background(), src.Config, dir); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("backup into an existing directory: %v", err)
	}

	// The source goes on; the copy becomes a new server's data directory.
	dst := servertest.Start(t, servertest.Options{DataDir: dir})
	if dst.EnrollmentSecret != src.EnrollmentSecret || dst.AdminToken != src.AdminToken || string(dst.CACertPEM) != string(src.CACertPEM) {
		t.Fatal("the restored server has other secrets or another certificate")
	}
	rc := &client{t: t, s: dst, url: dst.URL}
	_, _, stats := rc.do("GET", "/api/v1/stats", dst.AdminToken, nil)
	if n := stats["devices"].(float64); n < devices {
		t.Fatalf("restored server has %v devices, want at least %d", n, devices)
	}
	for i := range devices {
		_, _, dev := rc.do("GET", "/api/v1/devices/"+ids[i], dst.AdminToken, nil)
		seq := dev["seq"].(float64)
		_, _, hist := rc.do("GET", "/api/v1/devices/"+ids[i]+"/history?limit=10000", dst.AdminToken, nil)
		// One snapshot: the device's last push and its history agree.
		if n := len(hist["samples"].([]any)); seq < before || float64(n) != seq {
			t.Fatalf("device %s restored with seq %v and %d history samples, want %d or more of each, equal", ids[i], seq, n, before)
		}
		if st, _, out := rc.do("POST", "/api/v1/push", tokens[i], fmt.Sprintf(state, int(seq)+1, 0)); st != 200 {
			t.Fatalf("device %s's token on the restored server: %d %v", ids[i], st, out)
		}
	}
	id, _ := rc.register("after-restore")
	_, _, out := rc.do("GET", "/api/v1/devices?limit=1000", dst.AdminToken, nil)
	for _, d := range out["devices"].([]any) {
		if d := d.(map[string]any); d["id"] == id && d["machine_id"] != "after-restore" {
			t.Fatalf("new device got ID %s of %v", id, d["machine_id"])
		}
	}
}

func TestBackupRefusesOtherBackends(t *testing.T) {
	for dsn, tool := range map[string]string{"postgres://u@127.0.0.1/drover": "pg_dump", "mysql://u@tcp(127.0.0.1)/drover": "mariadb-dump"} {
		cfg := server.DefaultConfig()
		cfg.DataDir, cfg.DB = t.TempDir(), dsn
		dir := filepath.Join(t.TempDir(), "b")
		if _, err := server.Backup(context.Background(), cfg, dir); err == nil || !strings.Contains(err.Error(), tool) {
			t.Errorf("%s: %v, want an error naming %s", dsn, err, tool)
		}
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("%s: a failed backup left %s", dsn, dir)
		}
	}
}

// With PostgreSQL or MariaDB, drover backup --no-database holds what the
// database does not: the firmware files (outside cluster mode only in the
// firmware directory), the secrets and the TLS files, with a manifest;
// restore puts them back for a server on the restored database, and never
// into a SQLite server, which would start without a database.
func TestBackupWithoutDatabaseHoldsFirmwareAndSecrets(t *testing.T) {
	ctx := context.Background()
	cfg := server.DefaultConfig()
	cfg.DataDir, cfg.DB = t.TempDir(), "postgres://u@127.0.0.1/drover"
	image := []byte("a firmware image")
	sum := fmt.Sprintf("%x", sha256.Sum256(image))
	files := map[string][]byte{"firmware/" + sum + ".bin": image, "firmware/notes.txt": []byte("not firmware"),
		"secrets.json": []byte(`{"enrollment_secret":"e","admin_token":"a"}`), "tls/cert.pem": []byte("cert"), "tls/key.pem": []byte("key")}
	for rel, b := range files {
		os.MkdirAll(filepath.Join(cfg.DataDir, filepath.Dir(rel)), 0o700)
		if err := os.WriteFile(filepath.Join(cfg.DataDir, rel), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sqliteCfg := server.DefaultConfig()
	sqliteCfg.DataDir = cfg.DataDir
	if _, err := server.BackupWith(ctx, sqliteCfg, filepath.Join(t.TempDir(), "b"), server.BackupOptions{NoDatabase: true}); err == nil {
		t.Error("a SQLite backup without its database was written")
	}
	dir := filepath.Join(t.TempDir(), "b")
	res, err := server.BackupWith(ctx, cfg, dir, server.BackupOptions{NoDatabase: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Firmware != 1 || len(res.Database) != 0 || strings.Join(res.Files, ",") != "secrets.json,tls/cert.pem,tls/key.pem" {
		t.Fatalf("backup: %+v", res)
	}
	m, err := server.ReadBackup(ctx, dir)
	if err != nil || m.Database || m.Backend != "postgres" || len(m.Files) != 4 {
		t.Fatalf("manifest: %v %+v", err, m)
	}

	sq := server.DefaultConfig()
	sq.DataDir = filepath.Join(t.TempDir(), "sqlite")
	if _, err := server.Restore(ctx, sq, dir); err == nil || !strings.Contains(err.Error(), "holds no database") {
		t.Errorf("restore into SQLite: %v", err)
	}
	to := cfg
	to.DataDir = filepath.Join(t.TempDir(), "restored")
	if _, err := server.Restore(ctx, to, dir); err != nil {
		t.Fatal(err)
	}
	for rel, want := range files {
		got, err := os.ReadFile(filepath.Join(to.DataDir, rel))
		if rel == "firmware/notes.txt" {
			if err == nil {
				t.Errorf("%s was restored", rel)
			}
			continue
		}
		if err != nil || string(got) != string(want) {
			t.Errorf("%s restored: %v %q", rel, err, got)
		}
		if st, err := os.Stat(filepath.Join(to.DataDir, rel)); err == nil && st.Mode().Perm() != 0o600 {
			t.Errorf("%s restored with mode %v", rel, st.Mode().Perm())
		}
	}
}

// A manifest naming a file outside the backup, or one path twice, is not
// followed: restore names the entry and writes nothing.
func TestRestoreRefusesManifestPathsOutsideTheBackup(t *testing.T) {
	for _, p := range []string{"../secrets.json", "/etc/passwd", "firmware/../../x", "tls//key.pem", "manifest.json"} {
		dir := t.TempDir()
		m := fmt.Sprintf(`{"format":1,"backend":"postgres","files":[{"path":%q,"size":1,"sha256":"00"}]}`, p)
		os.WriteFile(filepath.Join(dir, server.ManifestName), []byte(m), 0o600)
		cfg := server.DefaultConfig()
		cfg.DataDir, cfg.DB = filepath.Join(t.TempDir(), "d"), "postgres://u@127.0.0.1/drover"
		_, err := server.Restore(context.Background(), cfg, dir)
		if err == nil || !strings.Contains(err.Error(), p+": not a valid manifest entry") {
			t.Errorf("manifest entry %q: %v", p, err)
		}
		if _, err := os.Stat(cfg.DataDir); err == nil {
			t.Errorf("manifest entry %q: %s written", p, cfg.DataDir)
		}
	}
}
