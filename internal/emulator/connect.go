package emulator

// Connect mode (docs/emulator.md#connect-mode): every device of the shard
// registers (or has credentials), opens its persistent connection
// (WebSocket at /api/v1/connect, as `drover agent --connect`) and holds it
// for the run. With CommandRate, the process sends commands through the
// operator API to random connected devices of its shard and records, per
// command, the time from sending it until the device is told over its
// connection ({"type":"push"}): op "command". The device then pushes at
// once (op "push", its latency from the nudge until the answer carrying
// the command). Op "connect" is each connection's handshake; "lost" counts
// connections the server ended during the run.

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/drover/drover/internal/protocol"
)

// connState is the connect mode's state per engine.
type connState struct {
	hc      *http.Client // WebSocket handshakes, from the source addresses
	api     *http.Client // commands through the operator API
	wsURL   string
	mu      sync.Mutex
	up      []int          // indexes into e.devs of connected devices
	sent    []atomic.Int64 // per device: unix ns a command was sent, 0 none
	held    atomic.Int64
	lost    atomic.Int64
	srcNext atomic.Uint64
}

func newConnState(e *engine, tlsConf *tls.Config) *connState {
	cs := &connState{sent: make([]atomic.Int64, len(e.devs))}
	u := e.cfg.Target
	cs.wsURL = "wss://" + strings.TrimPrefix(strings.TrimSuffix(u, "/"), "https://") + protocol.PathConnect
	if rest, ok := strings.CutPrefix(strings.TrimSuffix(u, "/"), "http://"); ok {
		cs.wsURL = "ws://" + rest + protocol.PathConnect
	}
	sources := e.cfg.SourceAddrs
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: e.cfg.Timeout}
		if len(sources) > 0 {
			d.LocalAddr = &net.TCPAddr{IP: sources[cs.srcNext.Add(1)%uint64(len(sources))]}
		}
		return d.DialContext(ctx, network, addr)
	}
	// One connection per device: no idle pool, HTTP/1.1 (the upgrade).
	cs.hc = &http.Client{Transport: &http.Transport{DialContext: dial, TLSClientConfig: tlsConf,
		MaxIdleConnsPerHost: -1, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}}
	cs.api = &http.Client{Timeout: e.cfg.Timeout, Transport: &http.Transport{DialContext: dial, TLSClientConfig: tlsConf, MaxIdleConnsPerHost: 16}}
	return cs
}

func (e *engine) runConnect(ctx context.Context) error {
	e.registerPhase(ctx, e.cfg.Workers)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	cs := e.conns
	e.phase.Store("connect")
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(e.cfg.Workers, 1)) // handshakes at once
	for i, d := range e.devs {
		if d.token == "" {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.holdConn(ctx, cs, i, d, sem)
		}()
	}
	e.phase.Store("hold")
	if e.cfg.CommandRate > 0 {
		e.sendCommands(ctx, cs)
	}
	<-ctx.Done()
	e.cfg.Logf("connect: %d connections held at the end, %d lost during the run", cs.held.Load(), cs.lost.Load())
	wg.Wait()
	return ctx.Err()
}

// holdConn opens device i's connection and holds it until ctx ends.
func (e *engine) holdConn(ctx context.Context, cs *connState, i int, d *device, sem chan struct{}) {
	st := e.conn
	start := time.Now()
	st.begin(start.UnixNano())
	hctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	ws, resp, err := websocket.Dial(hctx, cs.wsURL, &websocket.DialOptions{HTTPClient: cs.hc,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + d.token}, "User-Agent": {"drover-emulator"}}})
	cancel()
	<-sem
	done := time.Now()
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			e.rejected(st, resp.StatusCode, 0, done.Sub(start), done)
		} else {
			e.dropped(ctx, st, err, done)
		}
		return
	}
	defer ws.CloseNow()
	st.lat.record(i, done.Sub(start))
	st.accept(nil)
	st.end(done.UnixNano())
	cs.held.Add(1)
	cs.mu.Lock()
	cs.up = append(cs.up, i)
	cs.mu.Unlock()
	defer cs.held.Add(-1)
	s := e.getScratch()
	defer e.putScratch(s)
	for {
		_, msg, err := ws.Read(ctx)
		if err != nil {
			if ctx.Err() == nil {
				cs.lost.Add(1)
				e.warnOnce("lost", fmt.Sprintf("a connection ended during the run: %v", err))
			}
			return
		}
		now := time.Now()
		if !bytes.Contains(msg, []byte(`"push"`)) {
			continue
		}
		if t0 := cs.sent[i].Swap(0); t0 != 0 {
			e.cmd.lat.record(i, now.Sub(time.Unix(0, t0)))
			e.cmd.accept(nil)
			e.cmd.end(now.UnixNano())
		}
		e.pushDevice(ctx, d, s, now, false)
	}
}

// sendCommands posts commands at CommandRate (this shard's share) to
// random connected devices until ctx ends.
func (e *engine) sendCommands(ctx context.Context, cs *connState) {
	rate := e.cfg.CommandRate * float64(len(e.devs)) / float64(e.cfg.Devices)
	if rate <= 0 {
		return
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	url := strings.TrimSuffix(e.cfg.Target, "/") + "/api/v1/commands"
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cs.mu.Lock()
		n := len(cs.up)
		i := -1
		if n > 0 {
			i = cs.up[rand.IntN(n)]
		}
		cs.mu.Unlock()
		if i < 0 || cs.sent[i].Load() != 0 {
			e.cmd.skipped.Add(1) // none connected, or one still on its way
			continue
		}
		go e.sendCommand(ctx, cs, url, i)
	}
}

func (e *engine) sendCommand(ctx context.Context, cs *connState, url string, i int) {
	st := e.cmd
	body := `{"kind":"reboot","device_id":"` + e.devs[i].deviceID + `"}`
	req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.cfg.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	st.begin(start.UnixNano())
	cs.sent[i].Store(start.UnixNano())
	resp, err := cs.api.Do(req)
	if err != nil {
		cs.sent[i].Store(0)
		e.dropped(ctx, st, err, time.Now())
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		cs.sent[i].Store(0)
		e.rejected(st, resp.StatusCode, i, time.Since(start), time.Now())
	}
}
