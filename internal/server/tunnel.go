package server

// Port forwarding (docs/remote-access.md). An operator's
// GET /api/v1/devices/{id}/tunnel?to=HOST:PORT with "Upgrade:
// drover-tunnel" becomes, after 101, a byte stream to HOST:PORT as seen
// from the device. The server carries it on the device's tunnel link: a
// yamux session over a WebSocket the agent opens (GET /api/v1/tunnel) when
// the server asks on its persistent connection ({"type":"tunnel"}); one
// link per device, one yamux stream per forwarded connection, closed a
// minute after its last stream. The server only opens streams: a stream
// the device opens ends the link. The agent decides from its own
// allow-list what it reaches. Sessions are limited (per device, in total,
// idle time, total time) and each is written to the audit log when it
// opens, when it is refused and when it ends.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/drover/drover/internal/tunnel"
	"github.com/hashicorp/yamux"
	"github.com/prometheus/client_golang/prometheus"
)

// TunnelLimits bound port forwarding sessions (docs/remote-access.md).
type TunnelLimits struct {
	PerDevice   int           // open sessions per device
	Total       int           // open sessions on this server
	Idle        time.Duration // a session with no byte either way for this long ends
	MaxDuration time.Duration // a session ends after this, busy or not
	// Open is how long the device has to open its link when asked, and
	// its agent to answer a stream's request.
	Open time.Duration
}

// DefaultTunnelLimits are serve's defaults.
func DefaultTunnelLimits() TunnelLimits {
	return TunnelLimits{PerDevice: 8, Total: 256, Idle: 30 * time.Minute, MaxDuration: 8 * time.Hour, Open: 15 * time.Second}
}

// check validates the limits.
func (l TunnelLimits) check() error {
	if l.PerDevice < 1 || l.Total < 1 {
		return errors.New("-tunnel-max-per-device and -tunnel-max-total must be at least 1")
	}
	if l.Idle < time.Second || l.MaxDuration < time.Second || l.Open < time.Second {
		return errors.New("-tunnel-idle-timeout, -tunnel-max-duration and -tunnel-open-timeout must be at least 1s")
	}
	return nil
}

// tunnelLinkIdle is how long a link without streams stays open.
var tunnelLinkIdle = time.Minute

// tunnels holds the devices' links and the open sessions.
type tunnels struct {
	lim       TunnelLimits
	opt       RemoteOptions
	hub       *hub
	mu        sync.Mutex
	links     map[uint64]*tunnelLink
	waits     map[uint64]*linkWait
	perDevice map[uint64]int
	total     int
	open      map[uint64]func() // session ID → ends it (server stopping)
	m         tunnelMetrics
	// ended is done when every tracked session's end is in the audit log.
	ended   sync.WaitGroup
	stopped bool
	nextID  atomic.Uint64

	// Devices asked to connect in their next push answer (until when),
	// how many, and the sessions waiting for their connection.
	asks      map[uint64]time.Time
	asking    atomic.Int64
	connWaits map[uint64]chan struct{}
	// onAsk passes an ask on to the other nodes of a cluster; nil: none.
	onAsk func(dev uint64, until time.Time)
}

// tunnelMetrics are the tunnels' counters (docs/operations.md#metrics).
type tunnelMetrics struct {
	ended   *prometheus.CounterVec // sessions ended, by reason
	refused *prometheus.CounterVec // tunnels refused, by error code
	bytes   *prometheus.CounterVec // bytes carried, by direction
}

// register adds the tunnels' metrics to reg.
func (t *tunnels) register(reg prometheus.Registerer) {
	t.m = tunnelMetrics{
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_tunnel_sessions_ended_total",
			Help: "Port forwarding sessions ended, by reason."}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_tunnel_refused_total",
			Help: "Port forwarding sessions refused, by error code."}, []string{"code"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_tunnel_bytes_total",
			Help: "Bytes carried by port forwarding sessions: to_device, from_device."}, []string{"direction"}),
	}
	for _, r := range []string{tunnelClosed, tunnelIdle, tunnelMaxDuration, tunnelLinkLost, tunnelStopping} {
		t.m.ended.WithLabelValues(r)
	}
	t.m.bytes.WithLabelValues("to_device")
	t.m.bytes.WithLabelValues("from_device")
	reg.MustRegister(t.m.ended, t.m.refused, t.m.bytes,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "drover_tunnel_sessions", Help: "Port forwarding sessions open."},
			func() float64 { return float64(t.openSessions()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "drover_tunnel_links", Help: "Devices' tunnel links open."},
			func() float64 {
				t.mu.Lock()
				defer t.mu.Unlock()
				return float64(len(t.links))
			}))
}

// tunnelLink is one device's yamux session.
type tunnelLink struct {
	dev     uint64
	sess    *yamux.Session
	streams int // open streams (under tunnels.mu)
	idle    *time.Timer
}

// linkWait is a request for a device's link: done is closed when the link
// arrived (link) or the request failed (err).
type linkWait struct {
	done    chan struct{}
	link    *tunnelLink
	err     error
	expires time.Time
}

func newTunnels(lim TunnelLimits, h *hub) *tunnels {
	return &tunnels{lim: lim, hub: h, links: map[uint64]*tunnelLink{}, waits: map[uint64]*linkWait{},
		perDevice: map[uint64]int{}, open: map[uint64]func(){}, asks: map[uint64]time.Time{}, connWaits: map[uint64]chan struct{}{}}
}

var (
	errTunnelLimit = func(msg string) error {
		return &apiError{status: http.StatusTooManyRequests, code: "tunnel_limit", msg: msg, retryAfter: 10}
	}
	errNotConnected = &apiError{status: http.StatusConflict, code: "device_not_connected",
		msg: "the device holds no persistent connection (its agent runs without --connect, or is offline): no tunnel can reach it"}
	errNoLink = func(d time.Duration) error {
		return &apiError{status: http.StatusGatewayTimeout, code: "device_no_tunnel",
			msg: fmt.Sprintf("the device did not open its tunnel link within %v: its agent may not support tunnels (drover-agent before tunnels, or the shell agent)", d)}
	}
	errTunnelStopping = &apiError{status: http.StatusServiceUnavailable, code: "unavailable", msg: "the server is stopping", retryAfter: 10}
	errNotRequested   = &apiError{status: http.StatusConflict, code: "tunnel_not_requested", msg: "the server did not ask this device for a tunnel link"}
	errBadTunnel      = &apiError{status: http.StatusBadRequest, code: "invalid_upgrade",
		msg: "a tunnel is opened with Connection: Upgrade and Upgrade: " + tunnel.UpgradeToken + " over HTTP/1.1 (drover tunnel); without them the request only checks"}
)

// reserve takes a session slot for device dev; release gives it back.
func (t *tunnels) reserve(dev uint64) (id uint64, release func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.stopped:
		return 0, nil, errTunnelStopping
	case t.total >= t.lim.Total:
		return 0, nil, errTunnelLimit(fmt.Sprintf("this server has %d tunnel sessions open, its limit (-tunnel-max-total)", t.total))
	case t.perDevice[dev] >= t.lim.PerDevice:
		return 0, nil, errTunnelLimit(fmt.Sprintf("device %d has %d tunnel sessions open, the limit per device (-tunnel-max-per-device)", dev, t.perDevice[dev]))
	}
	t.total++
	t.perDevice[dev]++
	var once sync.Once
	return t.nextID.Add(1), func() {
		once.Do(func() {
			t.mu.Lock()
			t.total--
			if t.perDevice[dev]--; t.perDevice[dev] == 0 {
				delete(t.perDevice, dev)
			}
			t.mu.Unlock()
		})
	}, nil
}

// link is device dev's link, asking the device for one when it has none.
func (t *tunnels) link(ctx context.Context, dev uint64) (*tunnelLink, error) {
	t.mu.Lock()
	if l := t.links[dev]; l != nil && !l.sess.IsClosed() {
		t.mu.Unlock()
		return l, nil
	}
	w := t.waits[dev]
	ask := w == nil || time.Now().After(w.expires)
	if ask {
		w = &linkWait{done: make(chan struct{}), expires: time.Now().Add(t.lim.Open)}
		t.waits[dev] = w
	}
	t.mu.Unlock()
	if ask && !t.hub.ask(dev, tunnel.LinkMessage) {
		t.mu.Lock()
		if t.waits[dev] == w {
			delete(t.waits, dev)
		}
		t.mu.Unlock()
		w.err = errNotConnected
		close(w.done)
	}
	timer := time.NewTimer(time.Until(w.expires))
	defer timer.Stop()
	select {
	case <-w.done:
		if w.err != nil {
			return nil, w.err
		}
		return w.link, nil
	case <-timer.C:
		return nil, errNoLink(t.lim.Open)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// connectHold is how long, in seconds, a device asked to connect in a
// push answer holds its persistent connection.
const connectHold = 300

// askConnect asks dev to connect in the answer to its next push, until
// until; the other nodes of a cluster are told too.
func (t *tunnels) askConnect(dev uint64, until time.Time, tell bool) {
	t.mu.Lock()
	if len(t.asks) > 1000 { // devices that never pushed since
		now := time.Now()
		for d, u := range t.asks {
			if now.After(u) {
				delete(t.asks, d)
			}
		}
	}
	if until.After(t.asks[dev]) {
		t.asks[dev] = until
	}
	t.asking.Store(int64(len(t.asks)))
	t.mu.Unlock()
	if tell && t.onAsk != nil {
		t.onAsk(dev, until)
	}
}

// connectWanted says whether dev is to be asked to connect.
func (t *tunnels) connectWanted(dev uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	until, ok := t.asks[dev]
	if ok && time.Now().After(until) {
		delete(t.asks, dev)
		t.asking.Store(int64(len(t.asks)))
		ok = false
	}
	return ok
}

// connected is told of each device's new persistent connection: an ask is
// answered, sessions waiting for it go on.
func (t *tunnels) connected(dev uint64) {
	t.mu.Lock()
	delete(t.asks, dev)
	t.asking.Store(int64(len(t.asks)))
	if c := t.connWaits[dev]; c != nil {
		close(c)
		delete(t.connWaits, dev)
	}
	t.mu.Unlock()
}

// connWait is closed when dev connects.
func (t *tunnels) connWait(dev uint64) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.connWaits[dev]
	if c == nil {
		c = make(chan struct{})
		t.connWaits[dev] = c
	}
	return c
}

// hasLink says whether dev's tunnel link is open.
func (t *tunnels) hasLink(dev uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.links[dev]
	return l != nil && !l.sess.IsClosed()
}

// expected says whether the server asked dev for a link.
func (t *tunnels) expected(dev uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.waits[dev]
	return w != nil && !t.stopped
}

// arrive registers dev's new link and hands it to those waiting.
func (t *tunnels) arrive(dev uint64, sess *yamux.Session) *tunnelLink {
	l := &tunnelLink{dev: dev, sess: sess}
	t.mu.Lock()
	if t.stopped {
		t.mu.Unlock()
		sess.Close()
		return nil
	}
	old := t.links[dev]
	t.links[dev] = l
	w := t.waits[dev]
	delete(t.waits, dev)
	l.idle = time.AfterFunc(tunnelLinkIdle, func() { t.closeIdle(l) })
	t.mu.Unlock()
	if old != nil {
		old.sess.Close()
	}
	if w != nil {
		w.link = l
		close(w.done)
	}
	return l
}

// gone forgets l once its session ended.
func (t *tunnels) gone(l *tunnelLink) {
	t.mu.Lock()
	if t.links[l.dev] == l {
		delete(t.links, l.dev)
	}
	t.mu.Unlock()
	l.idle.Stop()
}

// closeIdle closes l if it has no stream.
func (t *tunnels) closeIdle(l *tunnelLink) {
	t.mu.Lock()
	idle := l.streams == 0
	t.mu.Unlock()
	if idle {
		l.sess.Close()
	}
}

// openStream opens a stream on l.
func (t *tunnels) openStream(l *tunnelLink) (*yamux.Stream, error) {
	t.mu.Lock()
	l.streams++
	l.idle.Stop()
	t.mu.Unlock()
	st, err := l.sess.OpenStream()
	if err != nil {
		t.streamDone(l)
		return nil, err
	}
	return st, nil
}

func (t *tunnels) streamDone(l *tunnelLink) {
	t.mu.Lock()
	if l.streams--; l.streams == 0 {
		l.idle.Reset(tunnelLinkIdle)
	}
	t.mu.Unlock()
}

// track registers an open session's end func; false when stopping.
func (t *tunnels) track(id uint64, end func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	t.open[id] = end
	t.ended.Add(1)
	return true
}

// untrack forgets a tracked session once its end is recorded.
func (t *tunnels) untrack(id uint64) {
	t.mu.Lock()
	delete(t.open, id)
	t.mu.Unlock()
	t.ended.Done()
}

// close ends every session and link (server shutdown).
func (t *tunnels) close() {
	t.mu.Lock()
	t.stopped = true
	ends := make([]func(), 0, len(t.open))
	for _, e := range t.open {
		ends = append(ends, e)
	}
	links := make([]*tunnelLink, 0, len(t.links))
	for _, l := range t.links {
		links = append(links, l)
	}
	t.mu.Unlock()
	for _, e := range ends {
		e()
	}
	for _, l := range links {
		l.sess.Close()
	}
	// The sessions' last audit rows are written before the store closes
	// (bounded: a row that cannot be written is logged).
	done := make(chan struct{})
	go func() {
		t.ended.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
}

// openSessions is how many sessions are open.
func (t *tunnels) openSessions() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}

// tunnelLinkHandler is the device's GET /api/v1/tunnel: a WebSocket
// carrying the yamux session, accepted only when the server asked.
func (a *api) tunnelLinkHandler() http.Handler {
	if a.tunnels == nil {
		return nil
	}
	return http.HandlerFunc(a.tunnelLink)
}

func (a *api) tunnelLink(w http.ResponseWriter, r *http.Request) {
	rt := &route{endpoint: "tunnel_link"}
	token, ok := bearer(r)
	if !ok {
		a.fail(w, rt, errNoBearer)
		return
	}
	dev, err := a.fleet.Authenticate(r.Context(), token)
	if err != nil {
		a.fail(w, rt, err)
		return
	}
	if !a.tunnels.expected(dev) {
		a.fail(w, rt, errNotRequested)
		return
	}
	// The link outlives the server's read and write timeouts.
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Time{})
	rc.SetWriteDeadline(time.Time{})
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return // answered by Accept
	}
	ws.SetReadLimit(tunnel.MaxMessage)
	ctx, cancel := context.WithCancel(context.Background())
	nc := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	sess, err := yamux.Client(nc, tunnel.SessionConfig())
	if err != nil {
		cancel()
		nc.Close()
		return
	}
	l := a.tunnels.arrive(dev, sess)
	if l == nil {
		cancel()
		return
	}
	go func() {
		defer cancel()
		defer a.tunnels.gone(l)
		defer sess.Close()
		// The device side opens nothing toward the operator: a stream it
		// opens ends the link.
		if st, err := sess.AcceptStream(); err == nil {
			st.Close()
			a.log.Info("tunnel link closed: the device opened a stream", "device_id", dev)
		}
	}()
}

// tunnelSession is one operator session's audit record.
type tunnelSession struct {
	Session uint64 `json:"session"`
	// Kind is tunnel, shell or file (remote.go).
	Kind        string `json:"kind"`
	Via         string `json:"via,omitempty"`         // the cluster node that relayed the request
	Destination string `json:"destination,omitempty"` // tunnel
	Command     string `json:"command,omitempty"`     // shell: the command line run instead of a shell
	Recording   string `json:"recording,omitempty"`   // shell: its recording's file name
	ExitStatus  *int   `json:"exit_status,omitempty"` // shell
	Path        string `json:"path,omitempty"`        // file
	Direction   string `json:"direction,omitempty"`   // file: put or get
	SHA256      string `json:"sha256,omitempty"`      // file put: of the file written

	StartedAt  time.Time `json:"started_at"`
	EndedAt    time.Time `json:"ended_at,omitzero"`
	ToDevice   int64     `json:"bytes_to_device"`
	FromDevice int64     `json:"bytes_from_device"`
	EndReason  string    `json:"end_reason,omitempty"`
}

// Why a session ended, as the audit log says.
const (
	tunnelClosed      = "closed"       // either end closed its connection
	tunnelIdle        = "idle_timeout" // -tunnel-idle-timeout
	tunnelMaxDuration = "max_duration" // -tunnel-max-duration
	tunnelLinkLost    = "link_lost"    // the device's link ended
	tunnelStopping    = "server_stopping"
)

// tunnelHandler is the operator's GET /api/v1/devices/{id}/tunnel.
func (a *api) tunnelHandler() http.Handler {
	if a.tunnels == nil {
		return nil
	}
	return http.HandlerFunc(a.openTunnel)
}

func (a *api) openTunnel(w http.ResponseWriter, r *http.Request) {
	rt := &route{endpoint: "tunnel"}
	who, _ := actorOf(r)
	if _, err := pathID(r); err != nil {
		a.fail(w, rt, err)
		return
	}
	dest := r.URL.Query().Get("to")
	if _, _, err := tunnel.SplitDestination(dest); err != nil {
		a.fail(w, rt, badField("to: "+err.Error()))
		return
	}
	upgrade := headerHas(r.Header, "Connection", "upgrade")
	if upgrade && (!headerHas(r.Header, "Upgrade", tunnel.UpgradeToken) || r.ProtoMajor != 1) {
		a.fail(w, rt, errBadTunnel)
		return
	}
	op, err := a.startRemote(r, rt, kindTunnel, who, upgrade)
	if err != nil {
		a.fail(w, rt, err)
		return
	}
	if a.relay(w, r, op) {
		return
	}
	op.rec.Destination = dest
	if _, err := op.open(tunnel.Request{To: dest, Check: !upgrade}); err != nil {
		op.refuse(w, err)
		return
	}
	defer op.end()
	if !upgrade {
		writeJSON(w, http.StatusOK, map[string]any{"device_id": strconv.FormatUint(op.dev, 10), "to": dest, "allowed": true})
		return
	}
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		a.fail(w, rt, err)
		return
	}
	nc.SetDeadline(time.Time{})
	var opc net.Conn = nc
	if n := brw.Reader.Buffered(); n > 0 { // the client's first bytes, sent early
		opc = &bufferedConn{Conn: nc, r: brw.Reader}
	}
	id := op.rec.Session
	answer := "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + tunnel.UpgradeToken + "\r\n" +
		"X-Drover-Tunnel-Session: " + strconv.FormatUint(id, 10) + "\r\n"
	if a.node != nil {
		answer += "X-Drover-Node: " + a.node[0] + "\r\n"
	}
	if _, err := nc.Write([]byte(answer + "\r\n")); err != nil {
		nc.Close()
		return
	}
	st := op.st
	run := op.run(func() {
		opc.Close()
		st.Close()
	})
	err = tunnel.Pipe(opc, st, run.up, run.down)
	run.stop()
	op.rec.EndReason = op.endReason(&run.why, err)
	op.finish(run)
}

// agentRefusal is the API error of an agent's refusal of a stream of kind.
func agentRefusal(kind string, ans tunnel.Answer) error {
	msg := "the device refused: " + ans.Message
	if kind != "" {
		switch ans.Error {
		case tunnel.CodeNotAllowed, tunnel.CodeOff, tunnel.CodeUnreachable:
			// An agent from before terminals and files took the request
			// for a tunnel.
			return &apiError{status: http.StatusNotImplemented, code: "not_supported",
				msg: "the device's agent does not support remote terminals and file transfer: update it (drover agent, drover-agent)"}
		}
	}
	switch ans.Error {
	case tunnel.CodeNotAllowed, tunnel.CodeOff:
		return &apiError{status: http.StatusForbidden, code: "destination_not_allowed", msg: msg}
	case tunnel.CodeUnreachable:
		return &apiError{status: http.StatusBadGateway, code: "destination_unreachable", msg: "the device could not connect: " + ans.Message}
	case tunnel.CodeShellOff:
		return &apiError{status: http.StatusForbidden, code: "shell_not_allowed", msg: msg}
	case tunnel.CodeFilesOff, tunnel.CodePathNotAllowed:
		return &apiError{status: http.StatusForbidden, code: "path_not_allowed", msg: msg}
	case tunnel.CodeTooLarge:
		return &apiError{status: http.StatusRequestEntityTooLarge, code: "file_too_large", msg: msg}
	case tunnel.CodeNotFound:
		return &apiError{status: http.StatusNotFound, code: "file_not_found", msg: msg}
	case tunnel.CodeFailed:
		return &apiError{status: http.StatusBadGateway, code: "device_failed", msg: "the device failed: " + ans.Message}
	}
	return &apiError{status: http.StatusBadRequest, code: "invalid_field", msg: "the device refused the request: " + ans.Message}
}

// bufferedConn reads the bytes already buffered first.
type bufferedConn struct {
	net.Conn
	r interface{ Read([]byte) (int, error) }
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
