package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/drover/drover/internal/tunnel"
)

// perfLAN is the host on the device's LAN of the tunnel measurement: a
// connection's first byte picks what it does: 'U' reads until the end of
// input and answers the byte count (8 bytes), 'D' sends the count that
// follows (8 bytes) of zeros, 'E' echoes.
func perfLAN(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var op [1]byte
				if _, err := io.ReadFull(c, op[:]); err != nil {
					return
				}
				switch op[0] {
				case 'U':
					n, _ := io.Copy(io.Discard, c)
					binary.Write(c, binary.BigEndian, n)
				case 'D':
					var n int64
					binary.Read(c, binary.BigEndian, &n)
					io.CopyN(c, zeros{}, n)
				case 'E':
					io.Copy(c, c)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// upload sends n bytes on c and waits for the LAN host's count.
func upload(c net.Conn, n int64) (time.Duration, error) {
	start := time.Now()
	buf := make([]byte, 256<<10)
	buf[0] = 'U'
	if _, err := c.Write(buf[:1]); err != nil {
		return 0, err
	}
	clear(buf)
	for sent := int64(0); sent < n; {
		k := min(int64(len(buf)), n-sent)
		if _, err := c.Write(buf[:k]); err != nil {
			return 0, err
		}
		sent += k
	}
	c.(interface{ CloseWrite() error }).CloseWrite()
	var got int64
	if err := binary.Read(c, binary.BigEndian, &got); err != nil || got != n {
		return 0, fmt.Errorf("upload: the host got %d of %d bytes: %v", got, n, err)
	}
	return time.Since(start), nil
}

// download receives n bytes on c.
func download(c net.Conn, n int64) (time.Duration, error) {
	start := time.Now()
	req := make([]byte, 9)
	req[0] = 'D'
	binary.BigEndian.PutUint64(req[1:], uint64(n))
	if _, err := c.Write(req); err != nil {
		return 0, err
	}
	got, err := io.CopyBuffer(io.Discard, io.LimitReader(c, n), make([]byte, 256<<10))
	if err != nil || got != n {
		return 0, fmt.Errorf("download: %d of %d bytes: %v", got, n, err)
	}
	return time.Since(start), nil
}

// roundTrips sends n small requests (size bytes) on an echo connection
// and records each round trip in h (microseconds).
func roundTrips(c net.Conn, n, size int, h *hdrhistogram.Histogram) error {
	if _, err := c.Write([]byte{'E'}); err != nil {
		return err
	}
	buf, back := make([]byte, size), make([]byte, size)
	for i := 0; i < n; i++ {
		start := time.Now()
		if _, err := c.Write(buf); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, back); err != nil {
			return err
		}
		h.RecordValue(time.Since(start).Microseconds())
	}
	return nil
}

func rssKB(pid int) int64 {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n
}

// cpuOf is the CPU time (user and system) of a process so far; pid 0:
// this one.
func cpuOf(pid int) time.Duration {
	if pid == 0 {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	// The fields after the command's closing parenthesis; utime and
	// stime are the 12th and 13th, in clock ticks (100 a second).
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// TestTunnelPerf measures port forwarding with the real binaries
// (docs/performance.md#port-forwarding): 100 MB each way through a tunnel
// against the same transfer directly on loopback in the same run, the
// round trip of small requests (HdrHistogram p50/p99) through a tunnel
// and directly, 100 concurrent tunnels, and the server's memory per open
// tunnel. Run by scripts/bench-tunnel.sh; skipped unless
// DROVER_TUNNEL_PERF=1.
func TestTunnelPerf(t *testing.T) {
	if os.Getenv("DROVER_TUNNEL_PERF") == "" {
		t.Skip("a measurement: scripts/bench-tunnel.sh runs it")
	}
	const size, rtts, small, concurrent = 100 << 20, 5000, 64, 100
	lan := perfLAN(t)
	r := startTunnelRig(t, lan, "--tunnel-max-per-device", "200", "--tunnel-max-total", "400")
	pem, _ := os.ReadFile(r.caFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tc := &tunnel.Client{Server: r.base, Token: r.operator, TLS: &tls.Config{RootCAs: pool}}
	ctx := context.Background()
	report := []string{fmt.Sprintf("load average before: %s; %d CPUs", loadavg(), runtime.NumCPU())}
	direct := func() net.Conn {
		c, err := net.Dial("tcp", lan)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	tunnelled := func() net.Conn {
		c, err := tc.Dial(ctx, r.dev, lan)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// drover tunnel's local port: what a user's program connects to.
	cli := exec.Command(droverBin, "tunnel", "--server", r.base, "--token", r.operator, "--ca-cert", r.caFile, r.dev, "0:"+lan)
	out, _ := cli.StdoutPipe()
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Process.Kill(); cli.Wait() })
	line, _ := bufio.NewReader(out).ReadString('\n')
	m := regexp.MustCompile(`^forwarding (\S+) to `).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("drover tunnel: %q", line)
	}
	viaCLI := func() net.Conn {
		c, err := net.Dial("tcp", m[1])
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// 100 concurrent tunnels: opened together, each 100 round trips,
	// then held open while the server's memory is read.
	pid := r.serve.cmd.Process.Pid
	before := rssKB(pid)
	conns := make([]net.Conn, concurrent)
	h := hdrhistogram.New(1, 10_000_000, 3)
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	errs := make(chan error, concurrent)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := tc.Dial(ctx, r.dev, lan)
			if err != nil {
				errs <- err
				return
			}
			conns[i] = c
			lh := hdrhistogram.New(1, 10_000_000, 3)
			if err := roundTrips(c, 100, small, lh); err != nil {
				errs <- err
				return
			}
			mu.Lock()
			h.Merge(lh)
			mu.Unlock()
		}()
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent tunnels: %v", err)
	}
	time.Sleep(time.Second) // let the server's allocations settle before reading its RSS
	after := rssKB(pid)
	report = append(report, fmt.Sprintf("%d concurrent tunnels, opened and 100 round trips each: %v; round trip p50 %d µs, p99 %d µs",
		concurrent, took.Round(time.Millisecond), h.ValueAtQuantile(50), h.ValueAtQuantile(99)))
	report = append(report, fmt.Sprintf("server RSS: %d KiB before, %d KiB with %d tunnels open: %.1f KiB per open tunnel",
		before, after, concurrent, float64(after-before)/concurrent))
	for _, c := range conns {
		c.Close()
	}
	// Throughput, best of three each, interleaved.
	type way struct {
		name string
		dial func() net.Conn
	}
	ways := []way{{"direct", direct}, {"tunnel", tunnelled}, {"drover tunnel port", viaCLI}}
	best := map[string]time.Duration{}
	// The CPU time of every process taking part (this one is the
	// operator's client and the LAN host), summed over the transfers.
	pids := []int{0, pid, r.agent.Process.Pid, cli.Process.Pid}
	cpuNow := func() []time.Duration {
		d := make([]time.Duration, len(pids))
		for i, p := range pids {
			d[i] = cpuOf(p)
		}
		return d
	}
	cpu := map[string][]time.Duration{}
	for round := 0; round < 3; round++ {
		for _, w := range ways {
			for _, dir := range []string{"up", "down"} {
				c := w.dial()
				var d time.Duration
				var err error
				before := cpuNow()
				if dir == "up" {
					d, err = upload(c, size)
				} else {
					d, err = download(c, size)
				}
				after := cpuNow()
				if cpu[w.name] == nil {
					cpu[w.name] = make([]time.Duration, len(pids))
				}
				for i := range pids {
					cpu[w.name][i] += after[i] - before[i]
				}
				c.Close()
				if err != nil {
					t.Fatalf("%s %s: %v", w.name, dir, err)
				}
				if k := w.name + " " + dir; best[k] == 0 || d < best[k] {
					best[k] = d
				}
			}
		}
	}
	mbps := func(d time.Duration) float64 { return float64(size) / d.Seconds() / 1e6 }
	for _, w := range ways[1:] {
		for _, dir := range []string{"up", "down"} {
			report = append(report, fmt.Sprintf("100 MB %s, %s: %.0f MB/s, direct %.0f MB/s: %.2f× direct",
				dir, w.name, mbps(best[w.name+" "+dir]), mbps(best["direct "+dir]), best["direct "+dir].Seconds()/best[w.name+" "+dir].Seconds()))
		}
	}
	for _, w := range ways {
		var all time.Duration
		each := make([]string, len(pids))
		for i, d := range cpu[w.name] {
			all += d
			each[i] = (d / 6).Round(time.Millisecond).String()
		}
		report = append(report, fmt.Sprintf("CPU time per 100 MB, %s: %v (operator's client and LAN host %s, drover serve %s, drover agent %s, drover tunnel %s)",
			w.name, (all/6).Round(time.Millisecond), each[0], each[1], each[2], each[3]))
	}

	// Small requests' round trips.
	hist := map[string]*hdrhistogram.Histogram{}
	for _, w := range ways {
		h := hdrhistogram.New(1, 10_000_000, 3)
		c := w.dial()
		if err := roundTrips(c, rtts, small, h); err != nil {
			t.Fatal(err)
		}
		c.Close()
		hist[w.name] = h
	}
	for _, w := range ways[1:] {
		h, d := hist[w.name], hist["direct"]
		report = append(report, fmt.Sprintf("%d-byte round trips (%d), %s: p50 %d µs, p99 %d µs; direct p50 %d µs, p99 %d µs; added p50 %d µs, p99 %d µs",
			small, rtts, w.name, h.ValueAtQuantile(50), h.ValueAtQuantile(99), d.ValueAtQuantile(50), d.ValueAtQuantile(99),
			h.ValueAtQuantile(50)-d.ValueAtQuantile(50), h.ValueAtQuantile(99)-d.ValueAtQuantile(99)))
	}

	report = append(report, "load average after: "+loadavg())
	fmt.Println(strings.Join(report, "\n"))
}
