// Package crashtest runs the real `drover serve` binary against SQLite,
// PostgreSQL and MariaDB in every persistence mode, kills it with SIGKILL
// under load or takes its database away, and checks what survived against
// what was acknowledged (docs/persistence.md).
package crashtest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/drover/drover/internal/store/dbtest"
	"github.com/drover/drover/internal/store/postgres"
	"github.com/drover/drover/internal/testwait"
)

var (
	droverBin string
	pg, my    *dbtest.Server
)

func TestMain(m *testing.M) {
	bin, dir, err := dbtest.BuildDrover("drover-crashtest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	droverBin = bin
	code := dbtest.Main(m, map[dbtest.Kind]**dbtest.Server{dbtest.Postgres: &pg, dbtest.MariaDB: &my})
	os.RemoveAll(dir)
	os.Exit(code)
}

const (
	secret     = "crash-enroll"
	adminToken = "crash-admin"
)

// backend is a database for one test: its DSN and, for servers, the
// server (to take it away).
type backend struct {
	name string
	dsn  string
	srv  *dbtest.Server
}

func backends(t *testing.T) []func(t *testing.T) backend {
	return []func(t *testing.T) backend{
		func(t *testing.T) backend {
			return backend{"sqlite", "sqlite:" + filepath.Join(t.TempDir(), "drover.db"), nil}
		},
		func(t *testing.T) backend {
			s := dbtest.Need(t, dbtest.Postgres, pg)
			return backend{"postgres", s.NewDB(t), s}
		},
		func(t *testing.T) backend {
			s := dbtest.Need(t, dbtest.MariaDB, my)
			return backend{"mariadb", s.NewDB(t), s}
		},
	}
}

var backendNames = []string{"sqlite", "postgres", "mariadb"}

// logBuf collects a process's log lines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) add(line string) {
	l.mu.Lock()
	l.b.WriteString(line)
	l.b.WriteByte('\n')
	l.mu.Unlock()
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serve is a running `drover serve`.
type serve struct {
	t      *testing.T
	cmd    *exec.Cmd
	base   string
	client *http.Client
	log    *logBuf
	exited chan error
}

var listening = regexp.MustCompile(`msg=listening proto=https addr=(\S+)`)

func startServe(t *testing.T, dataDir, dsn, mode string, flush time.Duration) *serve {
	t.Helper()
	s, err := tryStartServe(t, dataDir, dsn, mode, flush)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tryStartServe starts drover serve; an error says why it did not listen.
func tryStartServe(t *testing.T, dataDir, dsn, mode string, flush time.Duration) (*serve, error) {
	t.Helper()
	args := []string{"serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--persistence", mode, "--log-level", "debug",
		"--enrollment-secret", secret, "--admin-token", adminToken, "--shutdown-timeout", "60s", "--push-interval", "60",
		// The load pushes in a closed loop: durability is tested here, quotas in internal/server.
		"--quota-push-rate", "0", "--quota-history-samples", "0", "--quota-history-bytes", "0"}
	if dsn != "" {
		args = append(args, "--db", dsn)
	}
	if flush > 0 {
		args = append(args, "--flush-interval", flush.String())
	}
	cmd := exec.Command(droverBin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &serve{t: t, cmd: cmd, log: &logBuf{}, exited: make(chan error, 1)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			s.log.add(sc.Text())
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		io.Copy(io.Discard, stderr) // past an overlong line
	}()
	// Wait closes stderr: it comes once every log line has been read.
	go func() { <-logged; s.exited <- cmd.Wait() }()
	select {
	case a := <-addr:
		s.base = "https://" + a
	case err := <-s.exited:
		return nil, fmt.Errorf("drover serve exited early: %v\n%s", err, s.log)
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		return nil, fmt.Errorf("drover serve did not listen within 60 s\n%s", s.log)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	cert, err := os.ReadFile(filepath.Join(dataDir, "tls", "cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cert)
	s.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 64,
	}}
	return s, nil
}

// kill ends the server with SIGKILL.
func (s *serve) kill() {
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.client.CloseIdleConnections()
}

// stop ends the server with SIGTERM and wants exit status 0.
func (s *serve) stop() {
	s.t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.exited:
		if err != nil {
			s.t.Fatalf("drover serve did not exit 0 on SIGTERM: %v\n%s", err, tail(s.log.String()))
		}
	case <-time.After(90 * time.Second):
		s.t.Fatal("drover serve did not stop within 90 s of SIGTERM")
	}
	s.client.CloseIdleConnections()
}

func tail(s string) string {
	if len(s) > 3000 {
		return "…" + s[len(s)-3000:]
	}
	return s
}

// do sends one request and returns status, Retry-After and body.
func (s *serve) do(method, path, token, body string) (int, string, []byte, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		return 0, "", nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), b, err
}

// device is one emulated device and what the server acknowledged to it.
type device struct {
	machine string
	id      string
	token   string
	regAt   time.Time // when the registration's 200 arrived
	mu      sync.Mutex
	next    uint64
	acks    []ack
}

type ack struct {
	seq uint64
	at  time.Time // when the 200 arrived
}

func (d *device) lastAck(before time.Time) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var best uint64
	for _, a := range d.acks {
		if a.at.Before(before) && a.seq > best {
			best = a.seq
		}
	}
	return best
}

func (s *serve) register(machine string) (*device, error) {
	body := fmt.Sprintf(`{"machine_id":%q,"device_type":"crash-box","firmware":"1.0","enrollment_secret":%q}`, machine, secret)
	st, _, b, err := s.do("POST", "/api/v1/register", "", body)
	if err != nil {
		return nil, err
	}
	if st != 200 {
		return nil, fmt.Errorf("register %s: %d %s", machine, st, b)
	}
	var r struct {
		DeviceID string `json:"device_id"`
		Token    string `json:"token"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return &device{machine: machine, id: r.DeviceID, token: r.Token, regAt: time.Now()}, nil
}

// registerAll registers n devices from 16 clients.
func (s *serve) registerAll(prefix string, n int) []*device {
	s.t.Helper()
	devs := make([]*device, n)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 16 {
				d, err := s.register(fmt.Sprintf("%s-%d", prefix, i))
				if err != nil {
					errs <- err
					return
				}
				devs[i] = d
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		s.t.Fatal(err)
	}
	return devs
}

// outcome counts push answers.
type outcome struct {
	ok, unavailable, other, failed atomic.Int64
	noRetryAfter                   atomic.Int64
	firstOther                     atomic.Pointer[string]
}

// pushLoad pushes from workers clients, each owning a share of devs, until
// stop closes. Acknowledged pushes are recorded in their device.
func (s *serve) pushLoad(devs []*device, workers int, stop <-chan struct{}, out *outcome) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Like real devices, each pushes from one client, one push at a time.
			var own []*device
			for i := w; i < len(devs); i += workers {
				own = append(own, devs[i])
			}
			for i := 0; len(own) > 0; i++ {
				select {
				case <-stop:
					return
				default:
				}
				d := own[i%len(own)]
				d.mu.Lock()
				d.next++
				seq := d.next
				d.mu.Unlock()
				body := fmt.Sprintf(`{"seq":%d,"config_version":0,"state":{"uptime":%d,"cpu":12.5,"extra":{"w":"%d"}}}`, seq, seq, w)
				st, retryAfter, b, err := s.do("POST", "/api/v1/push", d.token, body)
				switch {
				case err != nil:
					out.failed.Add(1)
					// A device's pause before it tries again: paces the load.
					time.Sleep(10 * time.Millisecond)
				case st == 200:
					out.ok.Add(1)
					d.mu.Lock()
					d.acks = append(d.acks, ack{seq, time.Now()})
					d.mu.Unlock()
				case st == 503:
					out.unavailable.Add(1)
					if retryAfter == "" {
						out.noRetryAfter.Add(1)
					}
					// A device's pause before it tries again: paces the load.
					time.Sleep(5 * time.Millisecond)
				default:
					out.other.Add(1)
					msg := fmt.Sprintf("%d %s", st, b)
					out.firstOther.CompareAndSwap(nil, &msg)
				}
			}
		}()
	}
	return &wg
}

// stored is a device as the operator API shows it.
type stored struct {
	ID        string `json:"id"`
	MachineID string `json:"machine_id"`
	Seq       uint64 `json:"seq"`
}

// devices lists every device of the server.
func (s *serve) devices() map[string]stored {
	s.t.Helper()
	out := map[string]stored{}
	cursor := ""
	for {
		st, _, b, err := s.do("GET", "/api/v1/devices?limit=1000&cursor="+cursor, adminToken, "")
		if err != nil || st != 200 {
			s.t.Fatalf("list devices: %d %v %s", st, err, b)
		}
		var page struct {
			Devices []stored `json:"devices"`
			Next    string   `json:"next_cursor"`
		}
		if err := json.Unmarshal(b, &page); err != nil {
			s.t.Fatal(err)
		}
		for _, d := range page.Devices {
			out[d.MachineID] = d
		}
		if page.Next == "" {
			return out
		}
		cursor = page.Next
	}
}

func (s *serve) historySeqs(id string) map[uint64]bool {
	s.t.Helper()
	st, _, b, err := s.do("GET", "/api/v1/devices/"+id+"/history?limit=10000", adminToken, "")
	if err != nil || st != 200 {
		s.t.Fatalf("history of %s: %d %v %s", id, st, err, b)
	}
	var h struct {
		Samples []struct {
			Seq uint64 `json:"seq"`
		} `json:"samples"`
	}
	if err := json.Unmarshal(b, &h); err != nil {
		s.t.Fatalf("history of %s: %v: %s", id, err, b)
	}
	out := map[uint64]bool{}
	for _, m := range h.Samples {
		out[m.Seq] = true
	}
	return out
}

// TestKillUnderLoad: push from many devices, SIGKILL the server mid-load,
// restart it, and compare with what was acknowledged. Write-through must
// have every acknowledged registration, push and history sample;
// write-back may lack only what was acknowledged within its window (one
// flush interval plus the flush itself); memory keeps nothing.
func TestKillUnderLoad(t *testing.T) {
	const devices, workers, load = 200, 24, 2500 * time.Millisecond
	const flush = time.Second
	for i, mk := range backends(t) {
		t.Run(backendNames[i], func(t *testing.T) {
			// The backends at once (each its own server or file), the
			// modes of one after the other.
			t.Parallel()
			for _, mode := range []string{"write-through", "write-back"} {
				t.Run(mode, func(t *testing.T) {
					b := mk(t)
					data := t.TempDir()
					s := startServe(t, data, b.dsn, mode, flush)
					devs := s.registerAll("kill", devices)
					stop := make(chan struct{})
					var out outcome
					wg := s.pushLoad(devs, workers, stop, &out)
					// The load the kill interrupts: a time under load, not a wait.
					time.Sleep(load)
					s.kill() // mid-load: requests are in flight
					killedAt := time.Now()
					close(stop)
					wg.Wait()
					if out.ok.Load() < devices {
						t.Fatalf("only %d pushes acknowledged before the kill", out.ok.Load())
					}
					if p := out.firstOther.Load(); p != nil {
						t.Fatalf("unexpected answer during load: %s", *p)
					}

					cutoff := killedAt // write-through: everything acknowledged
					if mode == "write-back" {
						// Every flush the server completed makes durable what was
						// acknowledged before it began; the last one began at most
						// an interval plus a flush's time before the kill.
						flushes := s.flushes()
						if len(flushes) == 0 {
							t.Fatalf("%d write-back flushes logged in %v", len(flushes), load)
						}
						var longest time.Duration
						for _, f := range flushes {
							longest = max(longest, f.took)
						}
						cutoff = flushes[len(flushes)-1].swapped
						if lag, limit := killedAt.Sub(cutoff), flush+2*longest+500*time.Millisecond; lag > limit {
							t.Errorf("the last completed flush began %v before the kill; interval %v, longest flush %v", lag, flush, longest)
						}
						t.Logf("%d flushes, longest %v; the last began %v before the kill", len(flushes), longest, killedAt.Sub(cutoff).Round(time.Millisecond))
					}
					s = startServe(t, data, b.dsn, mode, flush)
					got := s.devices()
					var lostRegs, lostPushes, acked int
					for _, d := range devs {
						want := d.lastAck(cutoff)
						all := d.lastAck(killedAt)
						acked += len(d.acks)
						g, ok := got[d.machine]
						if !ok {
							if d.regAt.Before(cutoff) {
								t.Errorf("device %s (%s), registered at -%v, is gone", d.id, d.machine, killedAt.Sub(d.regAt))
							}
							lostRegs++
							continue
						}
						if g.ID != d.id {
							t.Errorf("device %s came back as %s", d.id, g.ID)
						}
						if g.Seq < want {
							t.Errorf("device %s: stored seq %d, but seq %d was acknowledged %v before the kill", d.id, g.Seq, want, killedAt.Sub(cutoff))
						}
						if g.Seq < all {
							lostPushes++
						}
					}
					t.Logf("%d pushes acknowledged (%d answered 503, %d failed in flight); after restart %d devices lack their last acknowledged push, %d registrations lost",
						acked, out.unavailable.Load(), out.failed.Load(), lostPushes, lostRegs)
					if mode == "write-through" {
						// Every acknowledged push is in the history too.
						for _, d := range devs[:20] {
							h := s.historySeqs(d.id)
							for _, a := range d.acks {
								if !h[a.seq] {
									t.Fatalf("device %s: acknowledged push %d missing from history", d.id, a.seq)
								}
							}
						}
					}
					// The restarted server takes the devices' pushes again.
					for _, d := range devs[:5] {
						if _, ok := got[d.machine]; !ok {
							continue
						}
						st, _, body, err := s.do("POST", "/api/v1/push", d.token, `{"seq":999999,"state":{}}`)
						if err != nil || st != 200 {
							t.Fatalf("push after restart: %d %v %s", st, err, body)
						}
					}
					s.stop()
				})
			}
		})
	}
	t.Run("memory", func(t *testing.T) {
		data := t.TempDir()
		s := startServe(t, data, "", "memory", 0)
		devs := s.registerAll("mem", 20)
		s.kill()
		s = startServe(t, data, "", "memory", 0)
		if n := len(s.devices()); n != 0 {
			t.Fatalf("memory mode kept %d devices across a restart", n)
		}
		st, _, _, err := s.do("POST", "/api/v1/push", devs[0].token, `{"seq":1,"state":{}}`)
		if err != nil || st != 401 {
			t.Fatalf("push with a token from before the restart: %d %v", st, err)
		}
		s.stop()
	})
}

// TestShutdownRightAfterLoad is the case where a registrar's write-back
// saved 57,813 of 200,000 registrations: register and push as fast as the
// clients can, SIGTERM at once, restart: every acknowledged write is there.
func TestShutdownRightAfterLoad(t *testing.T) {
	const devices = 3000
	for i, mk := range backends(t) {
		t.Run(backendNames[i], func(t *testing.T) {
			b := mk(t)
			data := t.TempDir()
			// No periodic flush during the test: everything waits for shutdown.
			s := startServe(t, data, b.dsn, "write-back", time.Hour)
			start := time.Now()
			devs := s.registerAll("term", devices)
			stop := make(chan struct{})
			var out outcome
			wg := s.pushLoad(devs, 16, stop, &out)
			testwait.For(t, 5*time.Minute, "a push of every device acknowledged", func() bool { return out.ok.Load() >= devices })
			close(stop)
			wg.Wait()
			took := time.Since(start)
			stopAt := time.Now()
			// Idle client connections would hold the HTTP shutdown up to
			// 5 s (net/http's rule for connections that never sent a request).
			s.client.CloseIdleConnections()
			s.stop()
			t.Logf("%d registrations and %d pushes in %v; SIGTERM to exit: %v", devices, out.ok.Load(), took.Round(time.Millisecond), time.Since(stopAt).Round(time.Millisecond))
			s = startServe(t, data, b.dsn, "write-back", time.Hour)
			got := s.devices()
			if len(got) != devices {
				t.Fatalf("%d of %d devices after the restart", len(got), devices)
			}
			for _, d := range devs {
				if g := got[d.machine]; g.Seq != d.lastAck(stopAt) {
					t.Fatalf("device %s: seq %d, last acknowledged %d", d.id, g.Seq, d.lastAck(stopAt))
				}
			}
			s.stop()
		})
	}
}

type flushed struct {
	swapped time.Time
	took    time.Duration
}

var flushedDevices = regexp.MustCompile(`msg="write-back flushed" .* devices=(\d+)`)

var flushLine = regexp.MustCompile(`msg="write-back flushed" swapped=(\S+) took=(\S+)`)

// flushes lists the write-back flushes the server logged as completed.
func (s *serve) flushes() []flushed {
	s.t.Helper()
	var out []flushed
	for _, m := range flushLine.FindAllStringSubmatch(s.log.String(), -1) {
		at, err1 := time.Parse(time.RFC3339Nano, m[1])
		took, err2 := time.ParseDuration(m[2])
		if err1 != nil || err2 != nil {
			s.t.Fatalf("flush log line %q: %v %v", m[0], err1, err2)
		}
		out = append(out, flushed{at, took})
	}
	return out
}

// metric reads one unlabelled sample of /metrics.
func (s *serve) metric(name string) (float64, bool) {
	st, _, b, err := s.do("GET", "/metrics", adminToken, "")
	if err != nil || st != 200 {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

func (s *serve) ready() int {
	st, _, _, err := s.do("GET", "/readyz", "", "")
	if err != nil {
		return 0
	}
	return st
}

// TestDatabaseOutage restarts PostgreSQL or MariaDB under load. In
// write-through mode the server stays up, answers what it cannot store with
// 503 and Retry-After (never 200), reports it in /readyz, the log and
// drover_store_up, and recovers by itself when the database is back. In
// write-back mode pushes go on being acknowledged and the failed flushes are
// retried. Afterwards every acknowledged push is stored.
func TestDatabaseOutage(t *testing.T) {
	for i, mk := range backends(t)[1:] {
		t.Run(backendNames[i+1], func(t *testing.T) {
			// Each database server is taken away by its own subtests
			// only: the backends at once, the modes of one after the
			// other.
			t.Parallel()
			for _, mode := range []string{"write-through", "write-back"} {
				t.Run(mode, func(t *testing.T) {
					b := mk(t)
					data := t.TempDir()
					s := startServe(t, data, b.dsn, mode, 500*time.Millisecond)
					devs := s.registerAll("outage", 100)
					stop := make(chan struct{})
					var out outcome
					wg := s.pushLoad(devs, 16, stop, &out)
					defer func() {
						select {
						case <-stop:
						default:
							close(stop)
							wg.Wait()
						}
					}()
					testwait.For(t, 30*time.Second, "pushes acknowledged before the outage", func() bool { return out.ok.Load() >= int64(len(devs)) })
					okBefore := out.ok.Load()
					if err := b.srv.Stop(); err != nil {
						t.Fatal(err)
					}
					downAt := time.Now()
					restarted := false
					defer func() {
						if !restarted {
							b.srv.Restart()
						}
					}()
					// The outage under test: what the server says 1 s into it.
					time.Sleep(time.Second)
					readyDown, upDown := s.ready(), -1.0
					if v, ok := s.metric("drover_store_up"); ok {
						upDown = v
					}
					unavailable := out.unavailable.Load()
					okDuring := out.ok.Load()
					// The outage under test: what is acknowledged 1 s to 1.5 s into it.
					time.Sleep(500 * time.Millisecond)
					okLate := out.ok.Load()

					if err := b.srv.Restart(); err != nil {
						t.Fatal(err)
					}
					restarted = true
					upAt := time.Now()
					// Recovery without restarting drover: commits succeed again
					// and pushes are acknowledged.
					recovered := time.Duration(0)
					okUp := out.ok.Load()
					if testwait.Until(30*time.Second, func() bool {
						up, _ := s.metric("drover_store_up")
						return up == 1 && out.ok.Load() > okUp+10 && s.ready() == 200
					}) {
						recovered = time.Since(upAt)
						// The load goes on after the recovery: those pushes are
						// checked below too.
						okRecovered := out.ok.Load()
						testwait.For(t, 30*time.Second, "pushes acknowledged after the recovery", func() bool { return out.ok.Load() >= okRecovered+int64(len(devs)) })
					}
					close(stop)
					wg.Wait()
					if recovered == 0 {
						t.Fatalf("no recovery within 30 s of the database's return\n%s", tail(s.log.String()))
					}
					if p := out.firstOther.Load(); p != nil {
						t.Fatalf("unexpected answer: %s", *p)
					}
					t.Logf("database down %v; pushes: %d ok before, %d ok while down, %d answered 503 (%d without Retry-After), %d failed; recovered %v after the database returned",
						upAt.Sub(downAt).Round(time.Millisecond), okBefore, okLate-okBefore, out.unavailable.Load(), out.noRetryAfter.Load(), out.failed.Load(), recovered.Round(time.Millisecond))
					if out.failed.Load() != 0 {
						t.Errorf("%d requests failed at the HTTP level: the server must stay up and answer", out.failed.Load())
					}
					if out.noRetryAfter.Load() != 0 {
						t.Errorf("%d answers 503 without Retry-After", out.noRetryAfter.Load())
					}
					if readyDown != 503 || upDown != 0 {
						t.Errorf("during the outage /readyz said %d and drover_store_up %v; want 503 and 0", readyDown, upDown)
					}
					if log := s.log.String(); !strings.Contains(log, "store commit failed") || !strings.Contains(log, "store commit recovered") {
						t.Errorf("log lacks the failure or the recovery:\n%s", tail(log))
					}
					switch mode {
					case "write-through":
						if unavailable == 0 {
							t.Errorf("no push was answered 503 while the database was down")
						}
						if okLate != okDuring {
							t.Errorf("%d pushes acknowledged between 1 s and 1.5 s into the outage", okLate-okDuring)
						}
					case "write-back":
						if okLate == okDuring || out.unavailable.Load() != 0 {
							t.Errorf("write-back stopped acknowledging pushes while the database was down (%d answered 503)", out.unavailable.Load())
						}
					}
					if v, ok := s.metric("drover_store_up"); !ok || v != 1 {
						t.Errorf("after recovery drover_store_up = %v (%v)", v, ok)
					}
					s.stop()
					s = startServe(t, data, b.dsn, mode, 500*time.Millisecond)
					got := s.devices()
					for _, d := range devs {
						if want := d.lastAck(time.Now()); got[d.machine].Seq < want {
							t.Errorf("device %s: stored seq %d < acknowledged %d", d.id, got[d.machine].Seq, want)
						}
					}
					s.stop()
				})
			}
		})
	}
}

// TestSecondServerRefused: a second drover serve on the same SQLite file or
// database refuses to start, naming the first (host, PID, since when); once
// the first is stopped, the second starts.
func TestSecondServerRefused(t *testing.T) {
	for i, mk := range backends(t) {
		t.Run(backendNames[i], func(t *testing.T) {
			b := mk(t)
			data := t.TempDir()
			first := startServe(t, data, b.dsn, "write-through", 0)
			other := data
			if b.srv != nil {
				other = t.TempDir() // same database, another data directory
			}
			args := []string{"serve", "--data-dir", other, "--listen", "127.0.0.1:0", "--persistence", "write-through",
				"--enrollment-secret", secret, "--admin-token", adminToken}
			if b.dsn != "" {
				args = append(args, "--db", b.dsn)
			}
			cmd := exec.Command(droverBin, args...)
			done := make(chan struct{})
			var out []byte
			var err error
			go func() {
				out, err = cmd.CombinedOutput()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				cmd.Process.Kill()
				<-done
				t.Fatalf("the second server did not exit within 60 s:\n%s", out)
			}
			host, _ := os.Hostname()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() == 0 {
				t.Fatalf("second server: %v\n%s", err, out)
			}
			for _, want := range []string{"in use by another drover serve", "PID " + strconv.Itoa(first.cmd.Process.Pid), "host " + host, "since "} {
				if !strings.Contains(string(out), want) {
					t.Errorf("the second server's message lacks %q:\n%s", want, out)
				}
			}
			// The first one goes on serving.
			if st, _, body, err := first.do("GET", "/readyz", "", ""); err != nil || st != 200 {
				t.Errorf("first server after the refusal: %d %v %s", st, err, body)
			}
			first.stop()
			second := startServe(t, other, b.dsn, "write-through", 0)
			second.stop()
		})
	}
}

// endLockSession ends the database session that holds the instance lock of
// dsn's database, as a database restart would.
func endLockSession(t *testing.T, backend, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if backend == "postgres" {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		var n int
		if err := c.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM (`+postgres.InstanceLockSessions+`) held`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("%d sessions held the instance lock, want 1", n)
		}
		return
	}
	cfg, err := mysql.ParseDSN(strings.TrimPrefix(dsn, "mysql://"))
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var id sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT IS_USED_LOCK(?)`, "drover_instance."+cfg.DBName).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if id.Valid {
		if _, err := db.ExecContext(ctx, "KILL CONNECTION "+strconv.FormatInt(id.Int64, 10)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLockTakenOver: the database ends the session holding the first
// server's instance lock and a second server takes the store before the
// first gets it back. The first must then refuse device writes (503 with
// Retry-After, /readyz 503) in either write mode, and nothing it
// acknowledged before is lost to the second.
func TestLockTakenOver(t *testing.T) {
	for i, mk := range backends(t)[1:] {
		for _, mode := range []string{"write-through", "write-back"} {
			t.Run(backendNames[i+1]+"/"+mode, func(t *testing.T) {
				b := mk(t)
				first := startServe(t, t.TempDir(), b.dsn, mode, 200*time.Millisecond)
				devs := first.registerAll("take", 10)
				if mode == "write-back" {
					// What write-back acknowledged but has not flushed may be
					// lost (as at kill -9): wait until the flushes wrote every
					// registered device.
					if !testwait.Until(30*time.Second, func() bool {
						flushed := 0
						for _, m := range flushedDevices.FindAllStringSubmatch(first.log.String(), -1) {
							n, _ := strconv.Atoi(m[1])
							flushed += n
						}
						return flushed >= len(devs)
					}) {
						t.Fatalf("no write-back flush within 30 s\n%s", tail(first.log.String()))
					}
				}
				var second *serve
				for try := 0; second == nil; try++ {
					endLockSession(t, b.name, b.dsn)
					s, err := tryStartServe(t, t.TempDir(), b.dsn, mode, 200*time.Millisecond)
					switch {
					case err == nil:
						second = s
					case !strings.Contains(err.Error(), "in use by another drover serve"):
						t.Fatal(err)
					case try == 20:
						t.Fatalf("the first server took its lock back 20 times before the second could start: %v", err)
					}
				}
				var st int
				var hdr string
				testwait.Until(30*time.Second, func() bool {
					st, hdr, _, _ = first.do("POST", "/api/v1/push", devs[0].token, `{"seq":100,"state":{}}`)
					return st == 503
				})
				if st != 503 || hdr == "" {
					t.Fatalf("push to the server that lost its lock: %d (Retry-After %q); want 503 with Retry-After\n%s", st, hdr, tail(first.log.String()))
				}
				if r := first.ready(); r != 503 {
					t.Errorf("/readyz of the server that lost its lock: %d", r)
				}
				if st, _, body, _ := first.do("POST", "/api/v1/register", "", `{"machine_id":"take-new","device_type":"t","firmware":"f","enrollment_secret":"`+secret+`"}`); st != 503 {
					t.Errorf("register on the server that lost its lock: %d %s", st, body)
				}
				got := second.devices()
				for _, d := range devs {
					if g, ok := got[d.machine]; !ok || g.ID != d.id {
						t.Errorf("device %s (%s) registered with the first server: on the second %+v, %v", d.id, d.machine, g, ok)
					}
				}
				if _, ok := got["take-new"]; ok {
					t.Error("a registration refused by the first server reached the store")
				}
				second.stop()
			})
		}
	}
}
