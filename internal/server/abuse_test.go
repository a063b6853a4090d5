package server_test

// The abuse test and benchmark: one device token pushing at full
// speed on several keep-alive connections while an emulated fleet pushes on
// its interval. The fleet and the attacker run in processes of their own (this
// test binary again, TestAbuseLoadProcess), so that the test process is the
// server and its CPU time is the server's. The test runs a few seconds; the
// benchmark, run with
//
//	DROVER_ABUSE_BENCH=60s go test -count=1 -run TestAbuseBenchmark -v -timeout 30m ./internal/server/
//
// runs the fleet that long without (A) and with (B) the attacker, A/B/A/B,
// and logs each run's figures and the medians (docs/performance.md).

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator"
	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

type abuseRun struct {
	devices      int
	interval     time.Duration
	duration     time.Duration // the fleet's, on its interval; with loops: how long the attacker ran
	loops        int           // >0: each device pushes this many times back to back (counts, not timing)
	attackConns  int           // 0: no attacker
	fleetOK      int64
	fleetErrors  int64
	p50, p99     time.Duration
	attackOK     int64
	attack429    int64
	attackOther  int64
	attackStored int   // the attacker's history samples
	dbBytes      int64 // the database's files after the server stopped
	// CPU time of the server (this process), of the fleet's process and of
	// the attacker's, over the pushes.
	serverCPU, fleetCPU, attackCPU time.Duration
}

// abuseLoad is what a load process reports.
type abuseLoad struct {
	OK, Errors, Refused, Other int64
	P50, P99                   time.Duration
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

func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadProcess starts this test binary as a load process of role; ready
// closes when it prints "ready".
func loadProcess(t *testing.T, role string, env map[string]string) (cmd *exec.Cmd, stdin io.WriteCloser, out string, ready <-chan struct{}) {
	t.Helper()
	out = filepath.Join(t.TempDir(), role+".json")
	cmd = exec.Command(os.Args[0], "-test.run=^TestAbuseLoadProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "DROVER_ABUSE_ROLE="+role, "DROVER_ABUSE_OUT="+out)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := make(chan struct{})
	var once sync.Once
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				once.Do(func() { close(r) })
			} else {
				fmt.Fprintln(os.Stderr, sc.Text())
			}
		}
	}()
	return cmd, stdin, out, r
}

// waitLoad waits for a load process and reads its report.
func waitLoad(t *testing.T, cmd *exec.Cmd, out string) (abuseLoad, time.Duration) {
	t.Helper()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("load process %v: %v", cmd.Args, err)
	}
	var l abuseLoad
	b, err := os.ReadFile(out)
	if err == nil {
		err = json.Unmarshal(b, &l)
	}
	if err != nil {
		t.Fatalf("load process report: %v", err)
	}
	return l, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
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
	// Register the fleet first, so that every run measures pushes only.
	cfg.Mode, cfg.Devices, cfg.Loops, cfg.Workers = emulator.ModeBenchmark, r.devices, 0, 8
	cfg.CredentialsFile = filepath.Join(t.TempDir(), "creds.jsonl")
	if _, err := emulator.Run(context.Background(), cfg, nil); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, srv.CACertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DROVER_ABUSE_URL": srv.URL, "DROVER_ABUSE_CA": ca, "DROVER_ABUSE_SECRET": srv.EnrollmentSecret,
		"DROVER_ABUSE_CREDS": cfg.CredentialsFile, "DROVER_ABUSE_DEVICES": strconv.Itoa(r.devices),
		"DROVER_ABUSE_INTERVAL": r.interval.String(), "DROVER_ABUSE_DURATION": r.duration.String(),
		"DROVER_ABUSE_TOKEN": token, "DROVER_ABUSE_CONNS": strconv.Itoa(r.attackConns), "DROVER_ABUSE_LOOPS": strconv.Itoa(r.loops)}

	cpu0 := processCPU()
	var attacker *exec.Cmd
	var stopAttack io.WriteCloser
	var attackOut string
	attackStart := time.Now()
	if r.attackConns > 0 {
		var ready <-chan struct{}
		attacker, stopAttack, attackOut, ready = loadProcess(t, "attacker", env)
		select { // the attacker is over its quota
		case <-ready:
		case <-time.After(time.Minute):
			t.Fatal("the attacker process did not start")
		}
	}
	fleet, stdin, fleetOut, _ := loadProcess(t, "fleet", env)
	stdin.Close()
	fl, fleetCPU := waitLoad(t, fleet, fleetOut)
	r.fleetOK, r.fleetErrors, r.p50, r.p99, r.fleetCPU = fl.OK, fl.Errors, fl.P50, fl.P99, fleetCPU
	if attacker != nil {
		stopAttack.Close()
		if r.loops > 0 {
			r.duration = time.Since(attackStart)
		}
		al, attackCPU := waitLoad(t, attacker, attackOut)
		r.attackOK, r.attack429, r.attackOther, r.attackCPU = al.OK, al.Refused, al.Other, attackCPU
	}
	r.serverCPU = processCPU() - cpu0

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

// TestAbuseLoadProcess is the fleet or the attacker of runAbuse, in a process
// of its own.
func TestAbuseLoadProcess(t *testing.T) {
	role := os.Getenv("DROVER_ABUSE_ROLE")
	if role == "" {
		t.Skip("a load process of the abuse test, started by it")
	}
	env := func(k string) string { return os.Getenv("DROVER_ABUSE_" + k) }
	dur := func(k string) time.Duration {
		d, err := time.ParseDuration(env(k))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	caPEM, err := os.ReadFile(env("CA"))
	if err != nil {
		t.Fatal(err)
	}
	var l abuseLoad
	switch role {
	case "fleet":
		cfg := emulator.DefaultConfig()
		cfg.Target, cfg.EnrollmentSecret, cfg.CACertPEM, cfg.Seed = env("URL"), env("SECRET"), caPEM, "abuse-fleet"
		cfg.Mode, cfg.Interval, cfg.Duration, cfg.Timeout = emulator.ModeFleet, dur("INTERVAL"), dur("DURATION"), 30*time.Second
		cfg.Devices, _ = strconv.Atoi(env("DEVICES"))
		if cfg.Loops, _ = strconv.Atoi(env("LOOPS")); cfg.Loops > 0 {
			cfg.Mode, cfg.Workers, cfg.Duration = emulator.ModeBenchmark, 8, 0
		}
		cfg.CredentialsFile = env("CREDS")
		sum, err := emulator.Run(context.Background(), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		push := sum.Op(results.OpPush)
		l = abuseLoad{OK: push.Accepted, Errors: push.Errors(), P50: push.Latency.Quantile(0.5), P99: push.Latency.Quantile(0.99)}
	case "attacker":
		l = attack(t, env("URL"), caPEM, env("TOKEN"), env("CONNS"))
	}
	b, _ := json.Marshal(l)
	if err := os.WriteFile(env("OUT"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// attack pushes with one token as fast as the server answers on conns
// keep-alive connections, until stdin closes; it prints "ready" after its
// first 429. Each push carries 64 extra
// values of 250 bytes.
func attack(t *testing.T, url string, caPEM []byte, token, conns string) abuseLoad {
	n, _ := strconv.Atoi(conns)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	ctx, stop := context.WithCancel(context.Background())
	go func() {
		io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		stop()
	}()
	body := `{"seq":%d,"config_version":0,"state":{"uptime":1,"cpu":5,"firmware":"6.3.5","extra":{` +
		strings.TrimSuffix(strings.Repeat(`"k%d":"`+strings.Repeat("x", 250)+`",`, 64), ",") + `}}}`
	keys := make([]any, 64)
	for i := range keys {
		keys[i] = i
	}
	extra := fmt.Sprintf(body[strings.Index(body, `"extra"`):], keys...)
	var wg sync.WaitGroup
	var ok, quota, other atomic.Int64
	var once sync.Once
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One keep-alive connection per attacker goroutine.
			tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}
			cl := &http.Client{Transport: tr}
			defer tr.CloseIdleConnections()
			for i := 0; ctx.Err() == nil; i++ {
				b := `{"seq":` + strconv.Itoa(w*1_000_000+i) + `,"config_version":0,"state":{"uptime":1,"cpu":5,"firmware":"6.3.5",` + extra
				req, _ := http.NewRequestWithContext(ctx, "POST", url+"/api/v1/push", strings.NewReader(b))
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
					once.Do(func() { fmt.Println("ready") })
				default:
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return abuseLoad{OK: ok.Load(), Refused: quota.Load(), Other: other.Load()}
}

func (r abuseRun) String() string {
	return fmt.Sprintf("fleet %d devices every %v for %v: %d pushes accepted, %d errors, latency p50 %v p99 %v; "+
		"attacker on %d connections: %d accepted, %d refused with 429, %d other, %d history samples; database %d bytes after the run; "+
		"CPU server %v (%.0f µs per fleet push), fleet %v, attacker %v",
		r.devices, r.interval, r.duration, r.fleetOK, r.fleetErrors, r.p50, r.p99,
		r.attackConns, r.attackOK, r.attack429, r.attackOther, r.attackStored, r.dbBytes,
		r.serverCPU.Round(time.Millisecond), r.cpuPerPush(), r.fleetCPU.Round(time.Millisecond), r.attackCPU.Round(time.Millisecond))
}

// cpuPerPush is the server's CPU time per accepted fleet push, in µs.
func (r abuseRun) cpuPerPush() float64 {
	return float64(r.serverCPU) / float64(time.Microsecond) / float64(max(r.fleetOK, 1))
}

// periods is how many quota refills a run spans, rounded up generously.
func (r abuseRun) periods() int64 { return int64(r.duration/r.interval) + 2 }

// checkAbuse asserts what the quota promises for a run with an attacker,
// against a run without: the fleet's pushes are all accepted, no fewer than
// without the attacker, and the database grew by no more than the
// attacker's quota allows.
func checkAbuse(t *testing.T, without, with abuseRun) {
	t.Helper()
	wantFleet := int64(with.devices) * int64(with.duration/with.interval)
	if with.loops > 0 {
		wantFleet = int64(with.devices * with.loops)
	}
	if with.fleetOK != wantFleet || with.fleetErrors != 0 || with.fleetOK < without.fleetOK {
		t.Errorf("fleet: %d accepted (want %d, %d without the attacker), %d errors", with.fleetOK, wantFleet, without.fleetOK, with.fleetErrors)
	}
	if with.attack429 == 0 || with.attackOther != 0 {
		t.Errorf("attacker: %d refused with 429, %d other answers", with.attack429, with.attackOther)
	}
	// Default quotas: 2 pushes per interval after a burst of 6, and at
	// most 2 history samples per interval.
	if maxOK := 6 + 2*with.periods(); with.attackOK > maxOK {
		t.Errorf("attacker: %d pushes accepted, quota allows %d", with.attackOK, maxOK)
	}
	maxSamples := 1 + 2*int(with.periods())
	if with.attackStored > maxSamples {
		t.Errorf("attacker: %d history samples stored, quota allows %d", with.attackStored, maxSamples)
	}
	// The quota allows the samples, one current state of at most one
	// push body, and a few pages of slack.
	allowed := int64(maxSamples)*fleet.SampleBytes + protocol.MaxBodyBytes + 16*4096
	if grown := with.dbBytes - without.dbBytes; grown > allowed {
		t.Errorf("database: %d bytes more with the attacker, the quota allows %d", grown, allowed)
	}
}

// The short form: the fleet pushes a fixed number of times, so that what is
// asserted is counted, not timed.
func TestAbuseOneTokenCannotHurtTheFleet(t *testing.T) {
	base := abuseRun{devices: 200, interval: 2 * time.Second, loops: 3}
	without := runAbuse(t, base)
	t.Log("without attacker: ", without)
	base.attackConns = 4
	with := runAbuse(t, base)
	t.Log("with attacker:    ", with)
	checkAbuse(t, without, with)
}

// median of the runs' values.
func median[T int64 | time.Duration | float64](runs []abuseRun, f func(abuseRun) T) T {
	v := make([]T, len(runs))
	for i, r := range runs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
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
	rounds := 2
	if v := os.Getenv("DROVER_ABUSE_ROUNDS"); v != "" {
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			t.Fatalf("DROVER_ABUSE_ROUNDS=%q", v)
		}
	}
	// A/B/A/B…: the machine's load drifts alike over both.
	var without, with []abuseRun
	for i := range rounds {
		a := runAbuse(t, abuseRun{devices: 2000, interval: 10 * time.Second, duration: dur})
		t.Logf("round %d without attacker: %v", i+1, a)
		b := runAbuse(t, abuseRun{devices: 2000, interval: 10 * time.Second, duration: dur, attackConns: 4})
		t.Logf("round %d with attacker:    %v", i+1, b)
		checkAbuse(t, a, b)
		without, with = append(without, a), append(with, b)
	}
	ratio := func(f func(abuseRun) float64) float64 { return median(with, f) / median(without, f) }
	t.Logf("medians of %d rounds, with/without the attacker: fleet accepted %.3f; latency p50 %.2f, p99 %.2f; "+
		"server CPU per fleet push %.0f → %.0f µs (%.2f); database %+d bytes",
		rounds, ratio(func(r abuseRun) float64 { return float64(r.fleetOK) }),
		ratio(func(r abuseRun) float64 { return float64(r.p50) }), ratio(func(r abuseRun) float64 { return float64(r.p99) }),
		median(without, abuseRun.cpuPerPush), median(with, abuseRun.cpuPerPush), ratio(abuseRun.cpuPerPush),
		median(with, func(r abuseRun) int64 { return r.dbBytes })-median(without, func(r abuseRun) int64 { return r.dbBytes }))
}
