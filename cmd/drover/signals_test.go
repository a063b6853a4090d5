package main

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/testwait"
)

// writeCert writes a fresh self-signed certificate for 127.0.0.1 and
// returns it.
func writeCert(t *testing.T, certFile, keyFile string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "drover-e2e-" + serial.String()},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	// Written beside and renamed, as an operator's tooling would.
	os.WriteFile(keyFile+".tmp", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	os.WriteFile(certFile+".tmp", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.Rename(keyFile+".tmp", keyFile)
	os.Rename(certFile+".tmp", certFile)
	c, _ := x509.ParseCertificate(der)
	return c
}

// logWatch collects a process's stderr lines and waits for one.
type logWatch struct {
	mu    sync.Mutex
	lines []string
	added chan struct{}
}

// watchStderr makes cmd's standard error a pipe of the test's own and
// watches it; call it before cmd.Start and closeWrite after. Unlike
// StderrPipe, Wait does not close the reading end: every line the process
// wrote before it exited is read.
func watchStderr(t *testing.T, cmd *exec.Cmd) (w *logWatch, closeWrite func()) {
	t.Helper()
	r, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = wr
	t.Cleanup(func() { r.Close() })
	return watchLog(r), func() { wr.Close() }
}

func watchLog(r io.Reader) *logWatch {
	w := &logWatch{added: make(chan struct{}, 1)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			w.mu.Unlock()
			select {
			case w.added <- struct{}{}:
			default:
			}
		}
	}()
	return w
}

// wait returns the first line after the first skip lines that contains
// every part, waiting up to a minute.
func (w *logWatch) wait(t *testing.T, skip int, parts ...string) (string, int) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		w.mu.Lock()
		for i := skip; i < len(w.lines); i++ {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(w.lines[i], p)
			}
			if ok {
				w.mu.Unlock()
				return w.lines[i], i + 1
			}
		}
		all := strings.Join(w.lines, "\n")
		w.mu.Unlock()
		select {
		case <-w.added:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no log line with %q; log:\n%s", parts, all)
		}
	}
}

// servedSerial is the serial of the certificate the server presents.
func servedSerial(t *testing.T, addr string) *big.Int {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber
}

// SIGHUP under traffic: the server keeps serving, serves the new
// certificate, changes its log level, keeps the old certificate when the
// new files are bad, and SIGTERM still drains and exits 0.
func TestSIGHUPReloadsUnderTraffic(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	old := writeCert(t, certFile, keyFile)
	conf := filepath.Join(dir, "drover.toml")
	os.WriteFile(conf, []byte(fmt.Sprintf("tls-cert = %q\ntls-key = %q\nlog-level = \"info\"\nenrollment-secret = \"e2e-secret\"\n", certFile, keyFile)), 0o600)
	cmd := exec.Command(droverBin, "serve", "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0", "--config", conf)
	log, started := watchStderr(t, cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	started()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	line, seen := log.wait(t, 0, "msg=listening", "proto=https")
	addr := listening.FindStringSubmatch(line)[1]
	if got := servedSerial(t, addr); got.Cmp(old.SerialNumber) != 0 {
		t.Fatalf("served serial %v, want %v", got, old.SerialNumber)
	}

	// Traffic: registrations over new connections, trusting either
	// certificate, until stopped; every one must succeed.
	var ok, failed atomic.Int64
	var lastErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf(`{"machine_id":"hup-%d-%d","device_type":"t","firmware":"1","enrollment_secret":"e2e-secret"}`, w, i%50)
				resp, err := c.Post("https://"+addr+"/api/v1/register", "application/json", strings.NewReader(body))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					failed.Add(1)
					lastErr.Store(err.Error())
				} else {
					ok.Add(1)
				}
			}
		}()
	}
	testwait.For(t, 60*time.Second, "20 registrations before SIGHUP", func() bool { return ok.Load() >= 20 })

	// A new certificate and a new log level.
	next := writeCert(t, certFile, keyFile)
	os.WriteFile(conf, []byte(fmt.Sprintf("tls-cert = %q\ntls-key = %q\nlog-level = \"debug\"\nenrollment-secret = \"e2e-secret\"\n", certFile, keyFile)), 0o600)
	cmd.Process.Signal(syscall.SIGHUP)
	_, s1 := log.wait(t, seen, "reload: TLS certificate", next.Subject.CommonName)
	_, s2 := log.wait(t, seen, "SIGHUP: log level", "level=DEBUG")
	seen = max(s1, s2)
	if got := servedSerial(t, addr); got.Cmp(next.SerialNumber) != 0 {
		t.Fatalf("after SIGHUP: served serial %v, want %v", got, next.SerialNumber)
	}
	before := ok.Load()
	testwait.For(t, 60*time.Second, "20 more registrations after SIGHUP", func() bool { return ok.Load() >= before+20 })

	// Broken files: the reload fails, says so, and the certificate stays.
	os.WriteFile(certFile, []byte("not a certificate"), 0o644)
	cmd.Process.Signal(syscall.SIGHUP)
	_, seen = log.wait(t, seen, "reload failed", "old TLS certificate stays")
	if got := servedSerial(t, addr); got.Cmp(next.SerialNumber) != 0 {
		t.Fatalf("after a failed reload: served serial %v, want %v", got, next.SerialNumber)
	}
	before = ok.Load()
	testwait.For(t, 60*time.Second, "20 more registrations after the failed reload", func() bool { return ok.Load() >= before+20 })
	close(stop)
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d registrations failed around SIGHUP, last: %v", n, n+ok.Load(), lastErr.Load())
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no exit within 60 s of SIGTERM")
	}
	log.wait(t, seen, "msg=stopped")
}

// The agents do not die on SIGHUP: they log it, keep running and still
// stop cleanly on SIGTERM.
func TestAgentsSurviveSIGHUP(t *testing.T) {
	t.Parallel()
	agentBin := agentBinary(t)
	for _, argv := range [][]string{{droverBin, "agent"}, {agentBin}} {
		t.Run(filepath.Base(argv[0]), func(t *testing.T) {
			// A server that is not there: the agent waits and retries.
			cmd := exec.Command(argv[0], append(argv[1:], "--server", "https://127.0.0.1:1", "--enroll-secret", "s",
				"--state-dir", t.TempDir(), "--root", "../../internal/agent/testdata/root")...)
			log, started := watchStderr(t, cmd)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			started()
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() { cmd.Process.Kill() })
			_, seen := log.wait(t, 0, "level=")
			cmd.Process.Signal(syscall.SIGHUP)
			_, seen = log.wait(t, seen, "SIGHUP")
			select {
			case err := <-exited:
				t.Fatalf("the agent exited on SIGHUP: %v", err)
			default:
			}
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-exited:
				if err != nil {
					t.Fatalf("exit after SIGTERM: %v", err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("no exit within 60 s of SIGTERM")
			}
		})
	}
}

// TestSIGTERMWhileLoadingExitsZero: a SIGTERM while the node loads its
// fleet stops it with exit code 0, as a SIGTERM while serving does.
func TestSIGTERMWhileLoadingExitsZero(t *testing.T) {
	dir := t.TempDir()
	gate := filepath.Join(dir, "load-gate")
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	cmd := exec.Command(droverBin, "serve", "--data-dir", filepath.Join(dir, "data"), "--listen", addr)
	cmd.Env = append(os.Environ(), "DROVER_TEST_LOAD_GATE="+gate)
	var log lockedBuf
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 5 * time.Second}
	if !testwait.Until(30*time.Second, func() bool {
		resp, err := c.Get("https://" + addr + "/readyz")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(body), "loading the fleet")
	}) {
		t.Fatalf("not answering while loading within 30 s\n%s", log.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The gate holds the load until it is opened; the load then sees the
	// cancelled start. O_RDWR: a FIFO's open that never blocks.
	w, err := os.OpenFile(gate, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM while loading: %v\n%s", err, log.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no exit within 30 s of SIGTERM while loading\n%s", log.String())
	}
	if !strings.Contains(log.String(), `msg="stopped before serving"`) {
		t.Errorf("log lacks the stop while loading:\n%s", log.String())
	}
}
