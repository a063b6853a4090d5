package web_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/contract"
	"github.com/drover/drover/internal/store/dbtest"
	"github.com/drover/drover/internal/store/postgres"
	"github.com/drover/drover/internal/store/sqlite"
	"github.com/drover/drover/internal/web"
)

// BenchmarkDevicesTableMillion renders the devices table over HTTP with a
// fleet of 1,000,000 devices loaded from SQLite and from PostgreSQL (when
// its binaries are installed). Run it alone, it needs ~3 GB of memory:
//
//	go test -run XXX -bench DevicesTableMillion -benchtime 10x -timeout 60m ./internal/web/
func BenchmarkDevicesTableMillion(b *testing.B) {
	const n = 1_000_000
	b.Run("sqlite", func(b *testing.B) {
		st, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "drover.db"), false)
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		benchTable(b, st, n)
	})
	b.Run("postgres", func(b *testing.B) {
		pg, err := dbtest.Start(dbtest.Postgres)
		if err != nil {
			b.Skipf("no PostgreSQL: %v", err)
		}
		defer pg.Close()
		st, err := postgres.Open(context.Background(), pg.NewDB(b))
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		benchTable(b, st, n)
	})
}

func benchTable(b *testing.B, st contract.Store, n int) {
	ctx := context.Background()
	now := time.Now().UTC()
	start := time.Now()
	seedMillion(b, st, n, now)
	b.Logf("%T: %d devices written in %v", st, n, time.Since(start).Round(time.Second))

	start = time.Now()
	wt := fleet.NewWriteThrough(st, 0, nil)
	defer wt.Close(ctx)
	fl, err := fleet.New(ctx, fleet.StoresOf(st), wt, fleet.Options{EnrollmentSecret: "s"})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("fleet loaded in %v", time.Since(start).Round(time.Millisecond))
	runtime.GC()
	if n, err := fl.AssignLabel(ctx, "north", fleet.Filter{Firmware: "6.2.1", Text: "7"}, false); err != nil || n == 0 {
		b.Fatalf("label: %d %v", n, err)
	}
	eng, err := alert.New(ctx, alert.Options{Fleet: fl, Store: st})
	if err != nil {
		b.Fatal(err)
	}
	h, err := web.New(web.Options{Fleet: fl, Alerts: eng, AdminToken: token})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	get := func(path string) string {
		resp, err := c.Get(srv.URL + path)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("%s: %d", path, resp.StatusCode)
		}
		return string(body)
	}
	login := get("/ui/login")
	resp, err := c.PostForm(srv.URL+"/ui/login", url.Values{"csrf": {csrfOfB(b, login)}, "password": {token}})
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	for _, pc := range []struct{ name, path, want string }{
		{"first-page", "/ui/devices", "1,000,000</strong> devices"},
		{"first-page-by-last-push", "/ui/devices?sort=last_seen&dir=desc", "1,000,000</strong> devices"},
		{"filter-text-one-device", "/ui/devices?q=mach-0654321", "<strong>1</strong> matching"},
		{"filter-type-liveness", "/ui/devices?device_type=ICR-4461&liveness=offline", "matching"},
		{"filter-label", "/ui/devices?label=north", "matching"},
		{"page-deep-sorted", "", ""},
	} {
		path := pc.path
		if pc.name == "page-deep-sorted" {
			// The 100th page of 50, ordered by machine ID, newest first.
			f := devicesURL{sort: "machine_id", desc: true}
			path = f.walk(b, get, 100)
		}
		b.Run(pc.name, func(b *testing.B) {
			cpu0 := processCPU()
			for b.Loop() {
				if body := get(path); pc.want != "" && !strings.Contains(body, pc.want) {
					b.Fatalf("%s lacks %q", path, pc.want)
				}
			}
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
	b.Run("overview", func(b *testing.B) {
		cpu0 := processCPU()
		for b.Loop() {
			get("/ui/")
		}
		b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
	})
}

// processCPU is the CPU time this process used (user + system): on a busy
// machine it measures the work of a page better than the wall clock.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type devicesURL struct {
	sort string
	desc bool
}

// walk follows "Next page" links and returns the URL of page n.
func (d devicesURL) walk(b *testing.B, get func(string) string, n int) string {
	path := "/ui/devices?sort=" + d.sort
	if d.desc {
		path += "&dir=desc"
	}
	for i := 1; i < n; i++ {
		body := get(path)
		j := strings.Index(body, `" id="next"`)
		if j < 0 {
			b.Fatalf("no next link on page %d", i)
		}
		k := strings.LastIndex(body[:j], `href="`)
		path = strings.ReplaceAll(body[k+6:j], "&amp;", "&")
	}
	return path
}

func csrfOfB(b *testing.B, body string) string {
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		b.Fatal("no CSRF field")
	}
	return m[1]
}

// seedMillion writes n devices with states in batches.
func seedMillion(b *testing.B, st fleet.Store, n int, now time.Time) {
	ctx := context.Background()
	pb := &fleet.Batch{}
	for i, p := range seedTypes {
		pb.Profiles = append(pb.Profiles, fleet.Profile{ID: uint64(i + 1), DeviceType: p.typ, Firmware: p.fw, Config: json.RawMessage(`{}`),
			PushInterval: 200, CreatedAt: now, UpdatedAt: now})
	}
	if err := st.Commit(ctx, pb); err != nil {
		b.Fatal(err)
	}
	const chunk = 20000
	state := json.RawMessage(`{"uptime":86400,"cpu":12.5,"temperature":44.5,"signal":{"rssi":-70}}`)
	for lo := 0; lo < n; lo += chunk {
		bt := &fleet.Batch{}
		for i := lo; i < min(lo+chunk, n); i++ {
			id := uint64(i + 1)
			p := seedTypes[i%len(seedTypes)]
			sum := sha256.Sum256([]byte(fmt.Sprint(i)))
			bt.Devices = append(bt.Devices, fleet.DeviceRecord{ID: id, MachineID: fmt.Sprintf("mach-%07d", i), DeviceType: p.typ, Firmware: p.fw,
				Serial: fmt.Sprintf("S%08d", i*13), TokenHash: sum[:], RegisteredAt: now.Add(-time.Hour)})
			ago := time.Duration(i%180) * time.Second
			if i%97 == 5 {
				ago = 3 * time.Hour
			}
			bt.States = append(bt.States, fleet.StateRecord{DeviceID: id, Firmware: p.fw, LastSeen: now.Add(-ago), Seq: 10, State: state})
		}
		if err := st.Commit(ctx, bt); err != nil {
			b.Fatal(err)
		}
	}
}
