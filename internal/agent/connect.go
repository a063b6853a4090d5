package agent

// The persistent connection (docs/protocol.md#persistent-connection): with
// Config.Connect the agent holds a WebSocket to the server, which sends
// {"type":"push"} when it has something for the device; the agent then
// pushes at once. Pushes go on as before whether or not it is connected.

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/drover/drover/internal/protocol"
)

// connectURL is the WebSocket URL of the server.
func (c *client) connectURL() string {
	u := c.base + protocol.PathConnect
	if rest, ok := strings.CutPrefix(u, "https://"); ok {
		return "wss://" + rest
	}
	return "ws://" + strings.TrimPrefix(u, "http://")
}

// connectFor holds the connection for d, when the agent does not hold it
// all the time (Config.Connect) and the server asked in a push answer: an
// operator wants a remote session. Asked again meanwhile, it holds longer.
func (a *Agent) connectFor(d time.Duration) {
	if a.cfg.Connect || a.runCtx == nil {
		return
	}
	until := time.Now().Add(d).UnixNano()
	for {
		cur := a.onDemand.Load()
		if until <= cur || a.onDemand.CompareAndSwap(cur, until) {
			break
		}
	}
	if !a.demanding.CompareAndSwap(false, true) {
		return // held already, now until the later end
	}
	a.log.Info("persistent connection asked for by the server", "for", d)
	if a.nudges == nil { // set here, in Run's goroutine, which waits on it
		a.nudges = make(chan struct{}, 1)
	}
	ctx, cancel := context.WithCancel(a.runCtx)
	go func() {
		defer a.demanding.Store(false)
		defer cancel()
		go func() {
			for sleepCtx(ctx, time.Until(time.Unix(0, a.onDemand.Load()))) {
				if time.Now().UnixNano() >= a.onDemand.Load() {
					cancel()
					return
				}
			}
		}()
		// Tunnel links outlive the connection: they close when idle.
		a.holdConnection(ctx, a.runCtx)
		a.log.Info("persistent connection closed: asked for until now")
	}()
}

// holdConnection keeps the connection up until ctx ends, redialling with
// backoff, and signals a.nudges when the server asks for a push; tunnel
// links live until linkCtx ends.
func (a *Agent) holdConnection(ctx, linkCtx context.Context) {
	bo := backoff{min: a.cfg.MinBackoff, max: a.cfg.MaxBackoff}
	// No overall timeout: the connection lives on after the upgrade.
	hc := &http.Client{Transport: a.client.http.Transport}
	for ctx.Err() == nil {
		token, _ := a.connToken.Load().(string)
		if token == "" {
			sleepCtx(ctx, time.Second)
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, a.cfg.RequestTimeout)
		ws, _, err := websocket.Dial(dctx, a.client.connectURL(), &websocket.DialOptions{HTTPClient: hc,
			HTTPHeader: http.Header{"Authorization": {"Bearer " + token}, "User-Agent": {a.client.userAgent}}})
		cancel()
		if err != nil {
			wait := bo.next()
			a.log.Debug("persistent connection failed; pushing on schedule", "err", err, "retry_in", wait.Round(time.Millisecond))
			sleepCtx(ctx, wait)
			continue
		}
		bo.reset()
		a.log.Info("persistent connection up")
		ws.SetReadLimit(protocol.MaxBodyBytes)
		for {
			_, msg, err := ws.Read(ctx) // answers the server's pings
			if err != nil {
				a.log.Info("persistent connection lost; pushing on schedule", "err", err)
				break
			}
			var m struct{ Type string }
			if json.Unmarshal(msg, &m) != nil {
				continue
			}
			switch m.Type {
			case "push":
				select {
				case a.nudges <- struct{}{}:
				default:
				}
			case "tunnel":
				a.openLink(linkCtx)
			}
		}
		ws.CloseNow()
		sleepCtx(ctx, bo.next())
	}
}

// wait sleeps d, or less when the server asks for a push.
func (a *Agent) wait(ctx context.Context, d time.Duration) bool {
	if a.nudges == nil {
		return a.pause(ctx, d)
	}
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-a.nudges:
		a.log.Debug("server asked for a push")
	case <-a.wake: // a firmware download ended
	}
	return true
}
