package transport

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Gate, the accept gate, keeps a saturated server working at its capacity. A
// connection is busy from its accept until its request is answered (and again
// for each request on a kept-alive connection); when its limit of connections is busy the
// listeners stop accepting, and new connections wait in the kernel's accept
// queue (somaxconn long), then as SYNs the clients retransmit with growing
// back-off. Waiting there costs the server nothing: without the gate it
// would accept them all, spend CPU reading requests it cannot serve in time,
// and answer them after their clients gave up — throughput falls as the
// load rises. Idle keep-alive connections, held 429s (Tarpit) and
// hijacked ones (persistent device connections) are not busy.
type Gate struct {
	limit int64
	busy  atomic.Int64
	mu    sync.Mutex
	cond  *sync.Cond // signalled when busy falls below limit or a listener closes
	// held counts accepts that waited, and for how long.
	held     prometheus.Counter
	heldTime prometheus.Counter
}

// NewGate makes a gate for limit busy connections; held and heldTime
// count the accepts that waited and their seconds.
func NewGate(limit int, held, heldTime prometheus.Counter) *Gate {
	g := &Gate{limit: int64(limit), held: held, heldTime: heldTime}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// wait returns when fewer than limit connections are busy, or closed
// reports true.
func (g *Gate) wait(closed *atomic.Bool) {
	if g.busy.Load() < g.limit {
		return
	}
	start := time.Now()
	g.mu.Lock()
	for g.busy.Load() >= g.limit && !closed.Load() {
		g.cond.Wait()
	}
	g.mu.Unlock()
	g.held.Inc()
	g.heldTime.Add(time.Since(start).Seconds())
}

func (g *Gate) release() {
	if g.busy.Add(-1) == g.limit-1 {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	}
}

// gatedListener accepts through the gate.
type gatedListener struct {
	net.Listener
	g      *Gate
	closed atomic.Bool
}

func (l *gatedListener) Accept() (net.Conn, error) {
	l.g.wait(&l.closed)
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	gc := &GatedConn{Conn: c, g: l.g}
	gc.SetBusy(true)
	return gc, nil
}

func (l *gatedListener) Close() error {
	l.closed.Store(true)
	l.g.mu.Lock()
	l.g.cond.Broadcast()
	l.g.mu.Unlock()
	return l.Listener.Close()
}

// GatedConn is a connection the gate counts while it is busy.
type GatedConn struct {
	net.Conn
	g    *Gate
	busy atomic.Bool
}

func (c *GatedConn) SetBusy(busy bool) {
	if c.busy.CompareAndSwap(!busy, busy) {
		if busy {
			c.g.busy.Add(1)
		} else {
			c.g.release()
		}
	}
}

func (c *GatedConn) Close() error {
	c.SetBusy(false)
	return c.Conn.Close()
}

// GatedOf returns the gate's record of a connection net/http serves (plain,
// or TLS over it); nil when it did not come through a gate.
func GatedOf(c net.Conn) *GatedConn {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	gc, _ := c.(*GatedConn)
	return gc
}

// TrackBusy is the servers' ConnState: a connection is busy while a request
// is read or answered.
func TrackBusy(c net.Conn, st http.ConnState) {
	gc := GatedOf(c)
	if gc == nil {
		return
	}
	switch st {
	case http.StateNew, http.StateActive:
		gc.SetBusy(true)
	case http.StateIdle, http.StateHijacked, http.StateClosed:
		gc.SetBusy(false)
	}
}

// Listener returns ln accepting through the gate: each connection it
// accepts is a *GatedConn.
func (g *Gate) Listener(ln net.Listener) net.Listener {
	return &gatedListener{Listener: ln, g: g}
}

// Busy is the number of busy connections.
func (g *Gate) Busy() int64 { return g.busy.Load() }

// Conn is what the server remembers about one connection: whether its
// last push was refused for its quota (the tarpit), and its record in the
// accept gate.
type Conn struct {
	// Refused: the last push on this connection was over quota.
	Refused atomic.Bool
	// gated is the accept gate's record of the connection; nil when it
	// did not come through a gate.
	gated *GatedConn
}

type connKey struct{}

// WithConn is the servers' ConnContext: it gives each connection its Conn.
func WithConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, &Conn{gated: GatedOf(c)})
}

// ConnOf is the Conn of the connection ctx's request came on; nil when the
// server set none.
func ConnOf(ctx context.Context) *Conn {
	c, _ := ctx.Value(connKey{}).(*Conn)
	return c
}

// NotBusy takes r's connection out of the gate's count until its next
// request, for answers paced by the client rather than the server's CPU: a
// firmware download at the device's link speed, a held 429 (Tarpit).
// Counted, a rollout's thousand concurrent downloads would hold the gate
// shut against every push.
func NotBusy(r *http.Request) {
	if c := ConnOf(r.Context()); c != nil && c.gated != nil {
		c.gated.SetBusy(false)
	}
}
