package server

// The accept gate keeps a saturated server working at its capacity. A
// connection is busy from its accept until its request is answered (and again
// for each request on a kept-alive connection); when MaxBusyConns are busy the
// listeners stop accepting, and new connections wait in the kernel's accept
// queue (somaxconn long), then as SYNs the clients retransmit with growing
// back-off. Waiting there costs the server nothing: without the gate it
// would accept them all, spend CPU reading requests it cannot serve in time,
// and answer them after their clients gave up — throughput falls as the
// load rises. Idle keep-alive connections, held 429s (tarpit.go) and
// hijacked ones (persistent device connections) are not busy.

import (
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type acceptGate struct {
	limit int64
	busy  atomic.Int64
	mu    sync.Mutex
	cond  *sync.Cond // signalled when busy falls below limit or a listener closes
	// held counts accepts that waited, and for how long.
	held     prometheus.Counter
	heldTime prometheus.Counter
}

func newAcceptGate(limit int, held, heldTime prometheus.Counter) *acceptGate {
	g := &acceptGate{limit: int64(limit), held: held, heldTime: heldTime}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// wait returns when fewer than limit connections are busy, or closed
// reports true.
func (g *acceptGate) wait(closed *atomic.Bool) {
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

func (g *acceptGate) release() {
	if g.busy.Add(-1) == g.limit-1 {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	}
}

// gatedListener accepts through the gate.
type gatedListener struct {
	net.Listener
	g      *acceptGate
	closed atomic.Bool
}

func (l *gatedListener) Accept() (net.Conn, error) {
	l.g.wait(&l.closed)
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	gc := &gatedConn{Conn: c, g: l.g}
	gc.setBusy(true)
	return gc, nil
}

func (l *gatedListener) Close() error {
	l.closed.Store(true)
	l.g.mu.Lock()
	l.g.cond.Broadcast()
	l.g.mu.Unlock()
	return l.Listener.Close()
}

// gatedConn is a connection the gate counts while it is busy.
type gatedConn struct {
	net.Conn
	g    *acceptGate
	busy atomic.Bool
}

func (c *gatedConn) setBusy(busy bool) {
	if c.busy.CompareAndSwap(!busy, busy) {
		if busy {
			c.g.busy.Add(1)
		} else {
			c.g.release()
		}
	}
}

func (c *gatedConn) Close() error {
	c.setBusy(false)
	return c.Conn.Close()
}

// gatedOf returns the gate's record of a connection net/http serves (plain,
// or TLS over it); nil when it did not come through a gate.
func gatedOf(c net.Conn) *gatedConn {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	gc, _ := c.(*gatedConn)
	return gc
}

// trackBusy is the servers' ConnState: a connection is busy while a request
// is read or answered.
func trackBusy(c net.Conn, st http.ConnState) {
	gc := gatedOf(c)
	if gc == nil {
		return
	}
	switch st {
	case http.StateNew, http.StateActive:
		gc.setBusy(true)
	case http.StateIdle, http.StateHijacked, http.StateClosed:
		gc.setBusy(false)
	}
}

// notBusy takes r's connection out of the gate's count until its next
// request, for answers paced by the client rather than the server's CPU: a
// firmware download at the device's link speed, a held 429 (tarpit.go).
// Counted, a rollout's thousand concurrent downloads would hold the gate
// shut against every push.
func notBusy(r *http.Request) {
	if cs, _ := r.Context().Value(connKey{}).(*connState); cs != nil && cs.gated != nil {
		cs.gated.setBusy(false)
	}
}
