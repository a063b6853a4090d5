package tunnel_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/tunnel"
)

func TestAllowListParseAndResolve(t *testing.T) {
	l, err := tunnel.ParseAllowList(" 192.168.1.0/24:80 , router.lan:443, 10.0.0.7:8000-8100, [fd00::/8]:22, 127.0.0.1:* ")
	if err != nil {
		t.Fatal(err)
	}
	if got := l.String(); got != "192.168.1.0/24:80,router.lan:443,10.0.0.7:8000-8100,[fd00::/8]:22,127.0.0.1:*" {
		t.Fatalf("String %q", got)
	}
	lookup := func(_ context.Context, host string) ([]netip.Addr, error) {
		switch host {
		case "plc.lan":
			return []netip.Addr{netip.MustParseAddr("10.9.9.9"), netip.MustParseAddr("192.168.1.20")}, nil
		case "router.lan":
			return []netip.Addr{netip.MustParseAddr("192.168.1.1")}, nil
		case "evil.lan":
			return []netip.Addr{netip.MustParseAddr("8.8.8.8")}, nil
		}
		return nil, errors.New("no such host")
	}
	ok := map[string]string{
		"192.168.1.1:80":       "192.168.1.1:80",
		"ROUTER.lan.:443":      "ROUTER.lan.:443",
		"router.lan:443":       "router.lan:443",
		"10.0.0.7:8050":        "10.0.0.7:8050",
		"[fd12::1]:22":         "[fd12::1]:22",
		"127.0.0.1:5":          "127.0.0.1:5",
		"plc.lan:80":           "192.168.1.20:80", // the allowed address, dialled as such
		"[::ffff:127.0.0.1]:9": "127.0.0.1:9",
	}
	for dest, want := range ok {
		got, err := l.Resolve(context.Background(), dest, lookup)
		if err != nil || got != want {
			t.Errorf("Resolve(%s) = %q, %v; want %q", dest, got, err, want)
		}
	}
	for _, dest := range []string{"192.168.2.1:80", "192.168.1.1:81", "router.lan:444", "10.0.0.7:8101", "evil.lan:80",
		"[fe80::1%eth0]:22", "127.0.0.2:5", "[::1]:5"} {
		if got, err := l.Resolve(context.Background(), dest, lookup); !errors.Is(err, tunnel.ErrNotAllowed) {
			t.Errorf("Resolve(%s) = %q, %v; want not allowed", dest, got, err)
		}
	}
	for _, dest := range []string{"nohost", "a:0", "a:99999", ":80", "a b:80"} {
		if _, err := l.Resolve(context.Background(), dest, lookup); err == nil || errors.Is(err, tunnel.ErrNotAllowed) {
			t.Errorf("Resolve(%s) = %v; want a malformed destination", dest, err)
		}
	}
	if _, err := l.Resolve(context.Background(), "unknown.lan:80", lookup); err == nil || errors.Is(err, tunnel.ErrNotAllowed) {
		t.Errorf("a name that does not resolve: %v", err)
	}
	empty, _ := tunnel.ParseAllowList("")
	if _, err := empty.Resolve(context.Background(), "127.0.0.1:22", lookup); !errors.Is(err, tunnel.ErrOff) {
		t.Errorf("empty list: %v, want ErrOff", err)
	}
	for _, bad := range []string{"80", "host:", "host:0", "host:70000", "10.0.0.0/33:80", "::1:22", "a b:80", "h:9-8", "[::1:22"} {
		if _, err := tunnel.ParseAllowList(bad); err == nil {
			t.Errorf("ParseAllowList(%q) accepted", bad)
		}
	}
}

// TestTunnelRefusals: the agent refuses what its allow-list does not
// allow, and everything with none; a viewer is refused; a device without
// its persistent connection, or whose agent does not answer, gets a clear
// error.
func TestTunnelRefusals(t *testing.T) {
	echo := echoServer(t)
	_, port, _ := net.SplitHostPort(echo)
	r := startRig(t, "127.0.0.1:"+port, nil)
	ctx := context.Background()
	if err := r.operatorC.Check(ctx, r.device, echo); err != nil {
		t.Fatalf("allowed destination: %v", err)
	}
	other := "127.0.0.1:" + strconv.Itoa(otherPort(port))
	for _, dest := range []string{other, "127.0.0.2:" + port, "localhost:22"} {
		err := r.operatorC.Check(ctx, r.device, dest)
		if apiCode(err) != "destination_not_allowed" || !strings.Contains(err.Error(), "allow-list") {
			t.Errorf("check %s: %v, want destination_not_allowed", dest, err)
		}
		c, err := r.operatorC.Dial(ctx, r.device, dest)
		if apiCode(err) != "destination_not_allowed" {
			t.Errorf("dial %s: %v, want destination_not_allowed", dest, err)
			c.Close()
		}
	}
	refused := r.audit(t, "tunnel refused")
	if len(refused) != 3 || refused[0].Actor != "olga" || refused[0].After.EndReason != "refused: destination_not_allowed" ||
		refused[0].Object != "/api/v1/devices/"+r.device {
		t.Errorf("audit of refusals: %+v", refused)
	}
	if n := r.s.Metric("drover_tunnel_refused_total", map[string]string{"code": "destination_not_allowed"}); n != 3 {
		t.Errorf("drover_tunnel_refused_total{code=destination_not_allowed} %v, want 3", n)
	}
	if err := r.viewerC.Check(ctx, r.device, echo); apiCode(err) != "forbidden" {
		t.Errorf("viewer: %v, want forbidden", err)
	}
	if _, err := r.viewerC.Dial(ctx, r.device, echo); apiCode(err) != "forbidden" {
		t.Errorf("viewer dial: %v, want forbidden", err)
	}
	if err := r.adminC.Check(ctx, r.device, echo); err != nil {
		t.Errorf("admin: %v", err)
	}
	if err := r.operatorC.Check(ctx, "999", echo); apiCode(err) != "not_found" {
		t.Errorf("unknown device: %v", err)
	}
	if err := r.operatorC.Check(ctx, r.device, "nohost"); apiCode(err) != "invalid_field" {
		t.Errorf("bad destination: %v", err)
	}

	// No allow-list: nothing.
	off := startRig(t, "", nil)
	if err := off.operatorC.Check(ctx, off.device, echo); apiCode(err) != "destination_not_allowed" || !strings.Contains(err.Error(), "tunnels are off") {
		t.Errorf("no allow-list: %v", err)
	}
}

func otherPort(port string) int {
	p, _ := strconv.Atoi(port)
	if p == 65535 {
		return p - 1
	}
	return p + 1
}

// TestTunnelTransfers: 1 MB and 100 MB each way through a tunnel arrive
// byte for byte, and the audit log has the session with its bytes.
func TestTunnelTransfers(t *testing.T) {
	echo := echoServer(t)
	r := startRig(t, echo, nil)
	var total int64
	for _, size := range []int{1 << 20, 100 << 20} {
		if testing.Short() && size > 1<<20 {
			continue
		}
		c, err := r.operatorC.Dial(context.Background(), r.device, echo)
		if err != nil {
			t.Fatal(err)
		}
		sent := sha256.New()
		go func() {
			buf := make([]byte, 64<<10)
			for n := 0; n < size; n += len(buf) {
				rand.Read(buf)
				sent.Write(buf)
				if _, err := c.Write(buf); err != nil {
					t.Errorf("write: %v", err)
					return
				}
			}
			c.(interface{ CloseWrite() error }).CloseWrite()
		}()
		got := sha256.New()
		n, err := io.Copy(got, c)
		c.Close()
		if err != nil || n != int64(size) {
			t.Fatalf("%d bytes: read %d, %v", size, n, err)
		}
		if !bytes.Equal(sent.Sum(nil), got.Sum(nil)) {
			t.Fatalf("%d bytes: what came back differs from what was sent", size)
		}
		var end []auditEntry
		waitFor(t, 10*time.Second, "the audit row of the session's end", func() bool {
			end = r.audit(t, "tunnel end")
			return len(end) > 0 && end[0].After.ToDevice == int64(size)
		})
		e := end[0]
		if e.Actor != "olga" || e.After.Destination != echo || e.After.FromDevice != int64(size) || e.After.EndReason != "closed" ||
			e.After.StartedAt == "" || e.After.EndedAt == "" {
			t.Errorf("audit row: %+v", e)
		}
		if open := r.audit(t, "tunnel open"); len(open) == 0 || open[0].After.Session != e.After.Session {
			t.Errorf("no audit row for the session's opening: %+v", open)
		}
		total += int64(size)
		for _, dir := range []string{"to_device", "from_device"} {
			if n := r.s.Metric("drover_tunnel_bytes_total", map[string]string{"direction": dir}); n != float64(total) {
				t.Errorf("drover_tunnel_bytes_total{direction=%q} %v, want %d", dir, n, total)
			}
		}
	}
	if n := r.s.Metric("drover_tunnel_sessions_ended_total", map[string]string{"reason": "closed"}); n != 2 && !testing.Short() {
		t.Errorf("drover_tunnel_sessions_ended_total{reason=closed} %v, want 2", n)
	}
	if n := r.s.Metric("drover_tunnel_sessions", nil); n != 0 {
		t.Errorf("drover_tunnel_sessions %v after the sessions ended", n)
	}
}

// TestTunnelLimits: sessions per device and in total, idle and total time.
func TestTunnelLimits(t *testing.T) {
	echo := echoServer(t)
	r := startRig(t, echo, func(c *server.Config) {
		c.Tunnel.PerDevice, c.Tunnel.Total = 2, 3
		c.Tunnel.Idle, c.Tunnel.MaxDuration = time.Second, 3*time.Second
	})
	ctx := context.Background()
	a, err := r.operatorC.Dial(ctx, r.device, echo)
	if err != nil {
		t.Fatal(err)
	}
	aOpened := time.Now() // a's last activity on the server is before this
	b, err := r.operatorC.Dial(ctx, r.device, echo)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.operatorC.Dial(ctx, r.device, echo); apiCode(err) != "tunnel_limit" || !strings.Contains(err.Error(), "per device") {
		t.Fatalf("third session of the device: %v, want tunnel_limit", err)
	}
	b.Close()
	// b's slot comes back once the server has seen it end.
	var c net.Conn
	waitFor(t, 5*time.Second, "a free slot", func() bool {
		c, err = r.operatorC.Dial(ctx, r.device, echo)
		return err == nil
	})
	defer c.Close()

	// Idle: a says nothing and is closed after a second; c keeps talking
	// and is closed at the total limit.
	start := time.Now()
	aDone := make(chan time.Duration, 1)
	go func() {
		io.Copy(io.Discard, a)
		aDone <- time.Since(aOpened)
	}()
	cDone := make(chan error, 1)
	go func() {
		buf := make([]byte, 1)
		for {
			if _, err := c.Write([]byte("x")); err != nil {
				cDone <- err
				return
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				cDone <- err
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	select {
	case d := <-aDone:
		if d < 800*time.Millisecond || d > 4*time.Second {
			t.Errorf("idle session closed after %v, want about 1s", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the idle session was not closed")
	}
	select {
	case <-cDone:
		if d := time.Since(start); d < 2500*time.Millisecond {
			t.Errorf("busy session closed after %v, before the 3s limit", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the busy session was not closed at the total limit")
	}
	reasons := map[string]int{}
	waitFor(t, 5*time.Second, "the audit rows", func() bool {
		clear(reasons)
		for _, e := range r.audit(t, "tunnel end") {
			reasons[e.After.EndReason]++
		}
		return reasons["idle_timeout"] == 1 && reasons["max_duration"] == 1
	})
	if reasons["closed"] != 1 {
		t.Errorf("end reasons %v", reasons)
	}
	// The third session's refusal (and any while b's slot was not back).
	if ref := r.audit(t, "tunnel refused"); len(ref) == 0 || ref[len(ref)-1].After.EndReason != "refused: tunnel_limit" {
		t.Errorf("refusals in the audit log: %+v", ref)
	}
}

// TestTunnelTotalLimit: the server's limit over all devices.
func TestTunnelTotalLimit(t *testing.T) {
	echo := echoServer(t)
	r := startRig(t, echo, func(c *server.Config) { c.Tunnel.PerDevice, c.Tunnel.Total = 5, 1 })
	a, err := r.operatorC.Dial(context.Background(), r.device, echo)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := r.operatorC.Dial(context.Background(), r.device, echo); apiCode(err) != "tunnel_limit" || !strings.Contains(err.Error(), "-tunnel-max-total") {
		t.Fatalf("second session: %v, want the total limit", err)
	}
}

// TestTunnelServerStopEndsSessions: a stopping server ends the open
// sessions and writes their end to the audit log before its store closes.
func TestTunnelServerStopEndsSessions(t *testing.T) {
	echo := echoServer(t)
	dir := t.TempDir()
	r := startRig(t, echo, func(c *server.Config) { c.DataDir = dir })
	c, err := r.operatorC.Dial(context.Background(), r.device, echo)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if err := r.s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Logf("read after stop: %v", err)
	}
	again := servertest.Start(t, servertest.Options{DataDir: dir})
	var out struct{ Entries []auditEntry }
	if st := again.Admin(t, "GET", "/api/v1/audit?action=tunnel+end", nil, &out); st != 200 || len(out.Entries) != 1 ||
		out.Entries[0].After.EndReason != "server_stopping" || out.Entries[0].After.ToDevice != 4 || out.Entries[0].After.FromDevice != 4 {
		t.Fatalf("audit after the restart: %d %+v", st, out.Entries)
	}
}
