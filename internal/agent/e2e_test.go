package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/testwait"
)

// deviceView is the part of the operator API's device the tests read.
type deviceView struct {
	ID             string          `json:"id"`
	MachineID      string          `json:"machine_id"`
	Seq            uint64          `json:"seq"`
	SyncState      string          `json:"sync_state"`
	AppliedVersion int64           `json:"applied_version"`
	DesiredVersion int64           `json:"desired_version"`
	ConfigError    string          `json:"config_error"`
	ProfileID      uint64          `json:"profile_id,string"`
	LastSeen       *time.Time      `json:"last_seen"`
	State          json.RawMessage `json:"state"`
}

// realServer is a servertest server plus operator calls.
type realServer struct {
	t      testing.TB
	s      *servertest.Server
	caFile string
}

// startServer starts a real server with a 1 s push interval; addr and
// dataDir let a test restart it in place.
func startServer(t testing.TB, dataDir, addr string) *realServer {
	t.Helper()
	s := servertest.Start(t, servertest.Options{DataDir: dataDir, Configure: func(c *server.Config) {
		c.PushInterval = 1
		if addr != "" {
			c.Listen = addr
		}
	}})
	ca := filepath.Join(s.Config.DataDir, "agent-ca.pem")
	if err := os.WriteFile(ca, s.CACertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return &realServer{t: t, s: s, caFile: ca}
}

func (r *realServer) call(method, path, token string, body any, out any) int {
	r.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, r.s.URL+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := r.s.Client().Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == 200 {
		if err := json.Unmarshal(raw, out); err != nil {
			r.t.Fatalf("%s %s: %v: %s", method, path, err, raw)
		}
	}
	return resp.StatusCode
}

func (r *realServer) device(id string) deviceView {
	r.t.Helper()
	var d deviceView
	if st := r.call("GET", "/api/v1/devices/"+id, r.s.AdminToken, nil, &d); st != 200 {
		r.t.Fatalf("GET device %s: %d", id, st)
	}
	return d
}

func (r *realServer) setConfig(profileID uint64, config string) {
	r.t.Helper()
	body := map[string]json.RawMessage{"config": json.RawMessage(config)}
	if st := r.call("PUT", fmt.Sprintf("/api/v1/profiles/%d", profileID), r.s.AdminToken, body, nil); st != 200 {
		r.t.Fatalf("PUT profile %d: %d", profileID, st)
	}
}

// register registers machineID with the device's key, as the agent would,
// which gives the device a new token and so invalidates the agent's. With
// the enrollment secret alone it must not (docs/protocol.md#admission).
func (r *realServer) register(machineID, deviceType, firmware, deviceKey string) protocol.RegisterResponse {
	r.t.Helper()
	var out protocol.RegisterResponse
	req := protocol.RegisterRequest{MachineID: machineID, DeviceType: deviceType, Firmware: firmware, EnrollmentSecret: r.s.EnrollmentSecret}
	if st := r.call("POST", protocol.PathRegister, "", req, nil); st != 202 {
		r.t.Fatalf("register with the enrollment secret alone: %d, want 202", st)
	}
	req.DeviceKey = deviceKey
	if st := r.call("POST", protocol.PathRegister, "", req, &out); st != 200 {
		r.t.Fatalf("register with the device key: %d", st)
	}
	// The agent's own re-registration settles the request left above.
	return out
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, timeout, what, cond)
}

// countingListener stands in for a server that is down: it accepts TCP
// connections and closes them at once, counting them.
func countingListener(t testing.TB, addr string) (stop func() int64) {
	t.Helper()
	var ln net.Listener
	var err error
	// The old server's socket may take a moment to go.
	if !testwait.Until(time.Second, func() bool { ln, err = net.Listen("tcp", addr); return err == nil }) {
		t.Fatal(err)
	}
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return func() int64 {
		ln.Close()
		<-done
		return n.Load()
	}
}

// hookScript applies a configuration by copying it to out, and refuses any
// containing "fail".
func hookScript(out string) string {
	return fmt.Sprintf(`cat > %[1]s; if grep -q fail %[1]s; then echo "checking" ; echo "modem refused the APN" >&2; exit 3; fi`, out)
}

func TestEndToEndGoAgent(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "", "")
	dir := t.TempDir()
	applied := filepath.Join(dir, "applied.json")
	cfg := DefaultConfig()
	cfg.Server, cfg.EnrollSecret, cfg.StateDir = srv.s.URL, srv.s.EnrollmentSecret, filepath.Join(dir, "state")
	cfg.TLS.CACert = srv.caFile
	cfg.Hook = hookScript(applied)
	cfg.CPUWindow = 100 * time.Millisecond
	cfg.MinBackoff, cfg.MaxBackoff = 200*time.Millisecond, time.Second
	cfg.RequestTimeout = 5 * time.Second
	a, err := New(cfg) // reads the real /proc and /sys of this machine
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		a.Close()
	}()

	var id string
	waitFor(t, 20*time.Second, "registration", func() bool {
		st, _ := loadState(cfg.StateDir)
		id = st.DeviceID
		return id != ""
	})
	waitFor(t, 20*time.Second, "two pushes", func() bool { return srv.device(id).Seq >= 2 })
	d := srv.device(id)
	if d.MachineID != a.MachineID() || d.SyncState != "synchronized" {
		t.Fatalf("device after pushes: %+v", d)
	}
	var st protocol.State
	if err := json.Unmarshal(d.State, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uptime == nil || st.MemTotal == nil || st.DiskTotal == nil || st.Load1 == nil || st.CPU == nil || st.Firmware == "" {
		t.Fatalf("state read from this machine lacks values: %s", d.State)
	}

	// Configuration: applied, refused, applied again.
	srv.setConfig(d.ProfileID, `{"apn":"internet","servers":["a","b"]}`)
	waitFor(t, 20*time.Second, "synchronized at version 1", func() bool {
		d = srv.device(id)
		return d.SyncState == "synchronized" && d.AppliedVersion == 1
	})
	if b, _ := os.ReadFile(applied); strings.TrimSpace(string(b)) != `{"apn":"internet","servers":["a","b"]}` {
		t.Fatalf("hook applied %q", b)
	}
	srv.setConfig(d.ProfileID, `{"apn":"fail"}`)
	waitFor(t, 20*time.Second, "sync_error", func() bool {
		d = srv.device(id)
		return d.SyncState == "sync_error"
	})
	if d.ConfigError != "modem refused the APN" || d.AppliedVersion != 1 || d.DesiredVersion != 2 {
		t.Fatalf("after a failing hook: %+v", d)
	}
	srv.setConfig(d.ProfileID, `{"apn":"internet2"}`)
	waitFor(t, 20*time.Second, "synchronized at version 3", func() bool {
		d = srv.device(id)
		return d.SyncState == "synchronized" && d.AppliedVersion == 3 && d.ConfigError == ""
	})

	// 401: another registration of the machine ID replaces the token.
	old, _ := loadState(cfg.StateDir)
	if old.DeviceKey == "" {
		t.Fatal("the agent kept no device key")
	}
	stolen := srv.register(a.MachineID(), a.identity.DeviceType, a.identity.Firmware, old.DeviceKey)
	if stolen.DeviceID != id {
		t.Fatalf("re-registration gave device %s, want %s", stolen.DeviceID, id)
	}
	seqBefore := srv.device(id).Seq
	waitFor(t, 20*time.Second, "agent to register again after 401", func() bool {
		now, _ := loadState(cfg.StateDir)
		return now.Token != old.Token && now.Token != stolen.Token && srv.device(id).Seq > seqBefore
	})
	if now, _ := loadState(cfg.StateDir); now.DeviceID != id {
		t.Fatalf("device ID changed from %s to %s", id, now.DeviceID)
	}

	// Outage: the server goes away; the agent retries with backoff, not in
	// a loop, and comes back when the server does.
	addr := srv.s.Srv.HTTPSAddr()
	dataDir := srv.s.Config.DataDir
	if err := srv.s.Stop(); err != nil {
		t.Fatal(err)
	}
	seqBefore = d.Seq
	stop := countingListener(t, addr)
	// The outage's length is what the attempts are counted over: a wait
	// for a condition would not bound them.
	time.Sleep(3 * time.Second)
	attempts := stop()
	// Delays of at least 0.1, 0.2, 0.4, 0.5, 0.5 … s: at most about 8 in 3 s.
	if attempts < 2 || attempts > 12 {
		t.Fatalf("%d connection attempts in 3 s of outage", attempts)
	}
	srv2 := startServer(t, dataDir, addr)
	waitFor(t, 20*time.Second, "pushes to the restarted server", func() bool {
		d = srv2.device(id)
		return d.Seq > seqBefore && d.LastSeen != nil && time.Since(*d.LastSeen) < 2*time.Second
	})
	var count struct {
		Devices int `json:"devices"`
	}
	srv2.call("GET", "/api/v1/stats", srv2.s.AdminToken, nil, &count)
	if count.Devices != 1 || d.AppliedVersion != 3 {
		t.Fatalf("after the restart: %d devices, applied version %d", count.Devices, d.AppliedVersion)
	}
	t.Logf("outage of 3 s: %d connection attempts", attempts)
}
