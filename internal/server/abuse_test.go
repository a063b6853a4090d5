package server_test

// The abuse test and benchmark (issue 19): one device token pushing at full
// speed on several keep-alive connections while an emulated fleet pushes on
// its interval. The test runs a few seconds; the benchmark, run with
//
//	DROVER_ABUSE_BENCH=60s go test -count=1 -run TestAbuseBenchmark -v ./internal/server/
//
// runs the fleet that long without and then with the attacker and logs
// both runs' figures (docs/performance.md).

import (
	"context"
	"encoding/json"
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

	"github.com/drover/drover/internal/emulator"
	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

type abuseRun struct {
	devices      int
	interval     time.Duration
	duration     time.Duration
	attackConns  int // 0: no attacker
	fleetOK      int64
	fleetErrors  int64
	p50, p99     time.Duration
	attackOK     int64
	attack429    int64
	attackOther  int64
	attackStored int   // the attacker's history samples
	dbBytes      int64 // the database's files after the server stopped
}

func dirBytes(t testing.TB, dir string) int64 {
	var n int64
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() && strings.Contains(filepath.Base(p), ".db") {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// runAbuse runs one fleet (and attacker) against a server on the default
// quotas, with the profile interval equal to the fleet's.
func runAbuse(t *testing.T, r abuseRun) abuseRun {
	t.Helper()
	dir := t.TempDir()
	srv := servertest.Start(t, servertest.Options{DataDir: dir, Quotas: true, Configure: func(c *server.Config) {
		c.PushInterval = int(r.interval / time.Second)
	}})
	c := &client{t: t, s: srv, url: srv.URL}
	attackerID, token := c.register("attacker")

	cfg := emulator.DefaultConfig()
	cfg.Target, cfg.EnrollmentSecret, cfg.CACertPEM, cfg.Seed = srv.URL, srv.EnrollmentSecret, srv.CACertPEM, "abuse-fleet"
	cfg.Mode, cfg.Devices, cfg.Interval, cfg.Duration, cfg.Timeout = emulator.ModeFleet, r.devices, r.interval, r.duration, 30*time.Second
	// Register the fleet first, so that both runs measure pushes only.
	reg := cfg
	reg.Mode, reg.Loops, reg.Workers = emulator.ModeBenchmark, 0, 8
	reg.CredentialsFile = filepath.Join(t.TempDir(), "creds.jsonl")
	if _, err := emulator.Run(context.Background(), reg, nil); err != nil {
		t.Fatal(err)
	}
	cfg.CredentialsFile = reg.CredentialsFile

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ok, quota, other atomic.Int64
	body := `{"seq":%d,"config_version":0,"state":{"uptime":1,"cpu":5,"firmware":"6.3.5","extra":{` +
		strings.TrimSuffix(strings.Repeat(`"k%d":"`+strings.Repeat("x", 250)+`",`, 64), ",") + `}}}`
	keys := make([]any, 64)
	for i := range keys {
		keys[i] = i
	}
	extra := fmt.Sprintf(body[strings.Index(body, `"extra"`):], keys...)
	for w := range r.attackConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One keep-alive connection per attacker goroutine.
			tr := srv.Client().Transport.(*http.Transport).Clone()
			tr.MaxConnsPerHost = 1
			cl := &http.Client{Transport: tr}
			defer tr.CloseIdleConnections()
			for n := 0; ctx.Err() == nil; n++ {
				b := `{"seq":` + fmt.Sprint(w*1_000_000+n) + `,"config_version":0,"state":{"uptime":1,"cpu":5,"firmware":"6.3.5",` + extra
				req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/api/v1/push", strings.NewReader(b))
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := cl.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					ok.Add(1)
				case 429:
					quota.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	sum, err := emulator.Run(context.Background(), cfg, nil)
	stop()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	push := sum.Op(results.OpPush)
	r.fleetOK, r.fleetErrors = push.Accepted, push.Errors()
	r.p50, r.p99 = push.Latency.Quantile(0.5), push.Latency.Quantile(0.99)
	r.attackOK, r.attack429, r.attackOther = ok.Load(), quota.Load(), other.Load()
	_, _, hist := c.do("GET", "/api/v1/devices/"+attackerID+"/history?limit=10000", srv.AdminToken, nil)
	raw, _ := json.Marshal(hist["samples"])
	var samples []any
	json.Unmarshal(raw, &samples)
	r.attackStored = len(samples)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	r.dbBytes = dirBytes(t, dir)
	return r
}

func (r abuseRun) String() string {
	return fmt.Sprintf("fleet %d devices every %v for %v: %d pushes accepted, %d errors, latency p50 %v p99 %v; "+
		"attacker on %d connections: %d accepted, %d refused with 429, %d other, %d history samples; database %d bytes after the run",
		r.devices, r.interval, r.duration, r.fleetOK, r.fleetErrors, r.p50, r.p99,
		r.attackConns, r.attackOK, r.attack429, r.attackOther, r.attackStored, r.dbBytes)
}

// checkAbuse asserts what the quota promises for a run with an attacker.
func checkAbuse(t *testing.T, r abuseRun) {
	t.Helper()
	wantFleet := int64(r.devices) * int64(r.duration/r.interval)
	if r.fleetOK != wantFleet || r.fleetErrors != 0 {
		t.Errorf("fleet: %d accepted (want %d), %d errors", r.fleetOK, wantFleet, r.fleetErrors)
	}
	if r.attack429 == 0 || r.attackOther != 0 {
		t.Errorf("attacker: %d refused with 429, %d other answers", r.attack429, r.attackOther)
	}
	// Default quotas: 2 pushes per interval after a burst of 6, and at
	// most 2 history samples per interval.
	periods := int64(r.duration/r.interval) + 2
	if maxOK := 6 + 2*periods; r.attackOK > maxOK {
		t.Errorf("attacker: %d pushes accepted, quota allows %d", r.attackOK, maxOK)
	}
	if maxSamples := 1 + 2*int(periods); r.attackStored > maxSamples {
		t.Errorf("attacker: %d history samples stored, quota allows %d", r.attackStored, maxSamples)
	}
}

func TestAbuseOneTokenCannotHurtTheFleet(t *testing.T) {
	r := runAbuse(t, abuseRun{devices: 200, interval: 2 * time.Second, duration: 6 * time.Second, attackConns: 4})
	t.Log(r)
	checkAbuse(t, r)
}

func TestAbuseBenchmark(t *testing.T) {
	d := os.Getenv("DROVER_ABUSE_BENCH")
	if d == "" {
		t.Skip("set DROVER_ABUSE_BENCH=60s to run the benchmark")
	}
	dur, err := time.ParseDuration(d)
	if err != nil {
		t.Fatal(err)
	}
	base := abuseRun{devices: 2000, interval: 10 * time.Second, duration: dur}
	without := runAbuse(t, base)
	t.Log("without attacker: ", without)
	base.attackConns = 4
	with := runAbuse(t, base)
	t.Log("with attacker:    ", with)
	checkAbuse(t, with)
	t.Logf("fleet accepted with/without %.3f; p50 with/without %.2f; p99 with/without %.2f; database with minus without %d bytes",
		float64(with.fleetOK)/float64(without.fleetOK), float64(with.p50)/float64(without.p50),
		float64(with.p99)/float64(without.p99), with.dbBytes-without.dbBytes)
}
