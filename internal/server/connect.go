package server

// Persistent connections (docs/protocol.md#persistent-connection): a
// device may hold one WebSocket on the HTTPS port. The server sends it
// {"type":"push"} when there is something for it (a command, a new
// configuration of its profile); the device then pushes at once and gets
// it in the push answer, through the one path every agent uses.

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/drover/drover/internal/protocol"
)

// nudgeMessage asks the device to push now.
var nudgeMessage = []byte(`{"type":"push"}`)

// connPing is how often an idle connection is pinged (keeps NAT mappings
// and finds dead peers).
const connPing = 2 * time.Minute

// hub holds the devices' connections, one per device.
type hub struct {
	mu    sync.Mutex
	conns map[uint64]*deviceConn
	done  chan struct{} // closed when the server stops
}

type deviceConn struct {
	nudge chan struct{} // buffered 1: a nudge waiting is enough
	stop  chan struct{} // closed when a newer connection replaces this one
}

func newHub() *hub { return &hub{conns: map[uint64]*deviceConn{}, done: make(chan struct{})} }

func (h *hub) add(id uint64, c *deviceConn) {
	h.mu.Lock()
	if old := h.conns[id]; old != nil {
		close(old.stop)
	}
	h.conns[id] = c
	h.mu.Unlock()
}

func (h *hub) remove(id uint64, c *deviceConn) {
	h.mu.Lock()
	if h.conns[id] == c {
		delete(h.conns, id)
	}
	h.mu.Unlock()
}

// notify tells a connected device to push; O(1), never blocks.
func (h *hub) notify(id uint64) {
	h.mu.Lock()
	c := h.conns[id]
	h.mu.Unlock()
	if c != nil {
		select {
		case c.nudge <- struct{}{}:
		default:
		}
	}
}

// notifyWhere tells every connected device for which match is true.
func (h *hub) notifyWhere(match func(id uint64) bool) {
	h.mu.Lock()
	ids := make([]uint64, 0, len(h.conns))
	for id := range h.conns {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	for _, id := range ids {
		if match(id) {
			h.notify(id)
		}
	}
}

// connected is how many devices hold a connection.
func (h *hub) connected() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

// close ends every connection (server shutdown).
func (h *hub) close() {
	select {
	case <-h.done:
	default:
		close(h.done)
	}
}

// connect upgrades a device's request to its persistent connection.
func (a *api) connect(w http.ResponseWriter, r *http.Request) {
	rt := &route{endpoint: "connect"}
	token, ok := bearer(r)
	if !ok {
		a.fail(w, rt, errNoBearer)
		return
	}
	id, err := a.fleet.Authenticate(token)
	if err != nil {
		a.fail(w, rt, err)
		return
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return // Accept has answered
	}
	defer ws.CloseNow()
	ws.SetReadLimit(protocol.MaxBodyBytes)
	c := &deviceConn{nudge: make(chan struct{}, 1), stop: make(chan struct{})}
	a.hub.add(id, c)
	defer a.hub.remove(id, c)
	a.m.connections.Inc()
	defer a.m.connections.Dec()
	if a.fleet.HasCommands(id) {
		c.nudge <- struct{}{}
	}
	ctx := ws.CloseRead(context.Background()) // devices send nothing; a close ends ctx
	ping := time.NewTicker(connPing)
	defer ping.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.hub.done:
			ws.Close(websocket.StatusGoingAway, "server stopping")
			return
		case <-c.stop:
			ws.Close(websocket.StatusPolicyViolation, "replaced by a newer connection")
			return
		case <-c.nudge:
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := ws.Write(wctx, websocket.MessageText, nudgeMessage)
			cancel()
			if err != nil {
				return
			}
		case <-ping.C:
			pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := ws.Ping(pctx)
			cancel()
			if err != nil {
				return
			}
		}
	}
}

// connectHandler is the connect route's handler; nil without a hub (tests
// that build an api by hand).
func (a *api) connectHandler() http.Handler {
	if a.hub == nil {
		return nil
	}
	return http.HandlerFunc(a.connect)
}
