package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/protocol"
)

// lockedBuf is a process's output, read while it runs.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitLog waits until a line of p's log matches re and returns its
// submatches.
func waitLog(t *testing.T, p *proc, re *regexp.Regexp, within time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, l := range p.logged() {
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no log line matching %s within %v:\n%s", re, within, strings.Join(p.logged(), "\n"))
	return nil
}

// TestSeamUpgradeHandoverUnderLoad swaps the binary of a serving node
// (SIGUSR2: the same binary started again on the listening socket) while
// an open-loop fleet pushes over a new connection per push: no connection
// is refused, no push dropped, and every push the devices saw acknowledged
// is in the new process's history.
func TestSeamUpgradeHandoverUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("a 20 s fleet run")
	}
	const devices = 2000
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	old := startServe(t, data, "--quota-push-rate", "0", "--quota-history-samples", "0", "--quota-history-bytes", "0")
	sec := readSecrets(t, data)
	secret, admin := sec.Enroll, sec.Admin
	out, acks := filepath.Join(dir, "emulate.jsonl"), filepath.Join(dir, "acks.jsonl")
	emu := exec.Command(droverBin, "emulate", "--target", "https://"+old.addr, "--ca-cert", filepath.Join(data, "tls", "cert.pem"),
		"--secret", secret, "--devices", strconv.Itoa(devices), "--interval", "5s", "--duration", "20s", "--conn", "new",
		"--out", out, "--acks", acks, "--progress", "log", "--log-every", "5s")
	var emuLog lockedBuf
	emu.Stdout, emu.Stderr = &emuLog, &emuLog
	emu.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := emu.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Process.Kill() })
	emuDone := make(chan error, 1)
	go func() { emuDone <- emu.Wait() }()

	// The swap, once the fleet is registered and pushing.
	deadline := time.Now().Add(30 * time.Second)
	for n := 0; n < devices; time.Sleep(100 * time.Millisecond) {
		b, _ := os.ReadFile(acks)
		if n = bytes.Count(b, []byte("\n")); time.Now().After(deadline) {
			t.Fatalf("%d pushes acknowledged after 30 s\n%s", n, emuLog.String())
		}
	}
	swapAt := time.Now()
	if err := old.cmd.Process.Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	m := waitLog(t, old, regexp.MustCompile(`msg="handover: new process started" pid=(\d+)`), 10*time.Second)
	pid, _ := strconv.Atoi(m[1])
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	// The old process's exit (cmd.Wait waits for its standard output,
	// which the new process shares): its PID leaves /proc once reaped.
	waitLog(t, old, regexp.MustCompile(`msg="shutting down" reason="handed over to a new process"`), 10*time.Second)
	waitLog(t, old, regexp.MustCompile(`msg=stopped$`), 45*time.Second)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", old.cmd.Process.Pid)); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the old process did not exit after the handover")
		}
	}
	t.Logf("old process drained and exited %v after SIGUSR2", time.Since(swapAt).Round(time.Millisecond))

	select {
	case err := <-emuDone:
		if err != nil {
			t.Fatalf("drover emulate: %v\n%s", err, emuLog.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("drover emulate did not end\n%s", emuLog.String())
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var s results.Stream
	if err := s.Read(f); err != nil || len(s.Summaries) != 1 {
		t.Fatalf("result stream: %v, %d summaries", err, len(s.Summaries))
	}
	push := s.Summaries[0].Op(results.OpPush)
	reg := s.Summaries[0].Op(results.OpRegister)
	lat := push.Latency.Stats()
	t.Logf("pushes: %d accepted, rejected %v, dropped %v, retried %d (Retry-After %v); p50 %v p99 %v max %v",
		push.Accepted, push.Rejected, push.Dropped, push.Retried, push.RetryAfter, lat.P50, lat.P99, lat.Max)
	if reg.Accepted != devices || reg.RejectedTotal() != 0 || reg.DroppedTotal() != 0 {
		t.Errorf("registrations: %+v", reg.Counts)
	}
	if push.DroppedTotal() != 0 || push.RejectedTotal() != 0 || push.Aborted != 0 || push.Unregistered != 0 {
		t.Errorf("pushes not acknowledged across the swap: rejected %v, dropped %v, aborted %d, unregistered %d\n%s",
			push.Rejected, push.Dropped, push.Aborted, push.Unregistered, emuLog.String())
		for _, iv := range s.Intervals {
			if p := iv.Ops[results.OpPush]; p != nil && p.DroppedTotal() > 0 {
				t.Logf("second %s (SIGUSR2 at %s): dropped %v", time.Unix(iv.TS, 0).UTC().Format("15:04:05"), swapAt.UTC().Format("15:04:05.000"), p.Dropped)
			}
		}
		for _, l := range old.logged() {
			if !strings.Contains(l, "level=INFO") || strings.Contains(l, "handover") || strings.Contains(l, "stopped") || strings.Contains(l, "listening") || strings.Contains(l, "shutting") {
				t.Log(l)
			}
		}
	}
	if push.Accepted < 2*devices {
		t.Errorf("only %d pushes accepted; the swap did not happen under load", push.Accepted)
	}

	// Every acknowledged push is in the new process's history.
	want := map[string]map[uint64]bool{}
	b, err := os.ReadFile(acks)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	n := 0
	for sc.Scan() {
		var a struct {
			DeviceID string `json:"device_id"`
			Seq      uint64 `json:"seq"`
		}
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			t.Fatalf("acks line %q: %v", sc.Text(), err)
		}
		if want[a.DeviceID] == nil {
			want[a.DeviceID] = map[uint64]bool{}
		}
		want[a.DeviceID][a.Seq] = true
		n++
	}
	if int64(n) != push.Accepted {
		t.Errorf("%d acknowledgements written, %d pushes accepted", n, push.Accepted)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	lost := 0
	for id, seqs := range want {
		var h struct{ Samples []struct{ Seq uint64 } }
		if st := call(t, c, "https://"+old.addr+"/api/v1/devices/"+id+"/history?limit=10000", admin, "", &h); st != http.StatusOK {
			t.Fatalf("history of device %s: HTTP %d", id, st)
		}
		var stored []uint64
		for _, smp := range h.Samples {
			stored = append(stored, smp.Seq)
			delete(seqs, smp.Seq)
		}
		if len(seqs) > 0 && lost == 0 {
			t.Logf("device %s: acknowledged %v not in its history %v", id, seqs, stored)
		}
		lost += len(seqs)
	}
	if lost > 0 {
		t.Errorf("%d acknowledged pushes are not in the store after the swap", lost)
	}
	t.Logf("%d acknowledged pushes of %d devices, all in the store after the swap", n, len(want))
	syscall.Kill(pid, syscall.SIGTERM)
}

// TestServeAnswersWhileLoading holds a start in its fleet load: the node
// listens from the start, device requests get 503 with a spread
// Retry-After and the JSON error body, /healthz answers 200 and /readyz
// 503 with the reason; then the node serves.
func TestServeAnswersWhileLoading(t *testing.T) {
	dir := t.TempDir()
	gate := filepath.Join(dir, "load-gate")
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(droverBin, "serve", "--data-dir", filepath.Join(dir, "data"), "--listen", addr)
	cmd.Env = append(os.Environ(), "DROVER_TEST_LOAD_GATE="+gate)
	var log lockedBuf
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 10 * time.Second}
	get := func(path string) (*http.Response, []byte, error) {
		resp, err := c.Get("https://" + addr + path)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		return resp, buf.Bytes(), nil
	}
	// Until the socket is bound; afterwards no request may fail.
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not listening within 30 s: %v\n%s", err, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, body, err := get("/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz while loading: %v %v %s", resp, err, body)
	}
	for deadline = time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, body, err = get("/readyz")
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"reason":"`) {
			t.Fatalf("/readyz while loading: %v %v %s", resp, err, body)
		}
		if strings.Contains(string(body), `"reason":"loading the fleet (started `) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz while loading: %s", body)
		}
	}
	seen := map[string]bool{}
	for i := 0; i < 40; i++ {
		for _, req := range []struct{ method, path, body string }{
			{"POST", protocol.PathRegister, `{"machine_id":"m-1","enrollment_secret":"x"}`},
			{"POST", protocol.PathPush, `{"state":{}}`},
		} {
			r, _ := http.NewRequest(req.method, "https://"+addr+req.path, strings.NewReader(req.body))
			resp, err := c.Do(r)
			if err != nil {
				t.Fatalf("%s %s while loading: %v", req.method, req.path, err)
			}
			var e struct {
				Error struct{ Code, Message string }
			}
			json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != "unavailable" || ra < 1 || ra > 5 {
				t.Fatalf("%s %s while loading: HTTP %d, Retry-After %q, error %+v", req.method, req.path, resp.StatusCode, resp.Header.Get("Retry-After"), e.Error)
			}
			seen[resp.Header.Get("Retry-After")] = true
		}
	}
	if len(seen) < 2 {
		t.Errorf("Retry-After not spread over 80 answers: %v", seen)
	}
	// Let the load go on: the node becomes ready on the same socket.
	w, err := os.OpenFile(gate, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	for deadline = time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, body, err := get("/readyz")
		if err != nil {
			t.Fatalf("/readyz after the load: %v", err)
		}
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready 30 s after the load: %s\n%s", body, log.String())
		}
	}
	if resp, body, _ := get("/api/v1/devices"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("operator API after the load: HTTP %d %s", resp.StatusCode, body)
	}
}

// freePort is a TCP port free on loopback now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestServeTakesSystemdSocket starts the binary as systemd socket
// activation does (LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES=https): it serves
// on the socket it was given instead of binding --listen.
func TestServeTakesSystemdSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close() // the socket stays open in f
	dir := t.TempDir()
	// sh's exec keeps its PID, which LISTEN_PID must name.
	cmd := exec.Command("/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" serve --data-dir "$1" --listen 127.0.0.1:0`, droverBin, filepath.Join(dir, "data"))
	cmd.Env = append(os.Environ(), "LISTEN_FDS=1", "LISTEN_FDNAMES=https")
	cmd.ExtraFiles = []*os.File{f}
	var log lockedBuf
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 10 * time.Second}
	url := "https://" + ln.Addr().String() + "/readyz"
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := c.Get(url)
		if err != nil {
			t.Fatalf("%s: %v\n%s", url, err, log.String()) // the socket was open all along: never refused
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: HTTP %d after 30 s\n%s", url, resp.StatusCode, log.String())
		}
	}
	if !strings.Contains(log.String(), `msg="listening on an inherited socket" proto=https addr=`+ln.Addr().String()) {
		t.Errorf("no log of the inherited socket:\n%s", log.String())
	}
}
