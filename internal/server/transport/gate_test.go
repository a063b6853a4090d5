package transport

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/drover/drover/internal/testwait"
)

// With the busy connections at the limit, a new connection is not accepted
// (it waits in the kernel's queue) until one of them is answered; idle
// kept-alive connections do not count.
func TestAcceptGateHoldsNewConnectionsWhileBusy(t *testing.T) {
	held := prometheus.NewCounter(prometheus.CounterOpts{Name: "held"})
	g := NewGate(2, held, prometheus.NewCounter(prometheus.CounterOpts{Name: "held_s"}))
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var entered atomic.Int32
	srv := &http.Server{ConnState: TrackBusy, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			entered.Add(1)
			<-release
		}
		io.WriteString(w, "ok")
	})}
	go srv.Serve(g.Listener(raw))
	defer srv.Close()
	url := "http://" + raw.Addr().String()
	oneShot := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
	get := func(c *http.Client, path string) <-chan error {
		done := make(chan error, 1)
		go func() {
			resp, err := c.Get(url + path)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			done <- err
		}()
		return done
	}

	// Kept-alive connections answered and idle are not busy.
	keep := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for range 2 {
		if err := <-get(keep, "/quick"); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 10*time.Second, "idle connections no longer counted busy", func() bool { return g.busy.Load() == 0 })

	b1, b2 := get(oneShot, "/block"), get(oneShot, "/block")
	testwait.For(t, 10*time.Second, "the blocking requests in the handler", func() bool { return entered.Load() == 2 })
	third := get(oneShot, "/quick")
	select {
	case err := <-third:
		t.Fatalf("a third connection was served while 2 of 2 were busy (err %v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	close(release)
	for i, ch := range []<-chan error{b1, b2, third} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("request %d not answered after the busy ones finished", i)
		}
	}
	var m dto.Metric
	if err := held.Write(&m); err != nil || m.GetCounter().GetValue() < 1 {
		t.Fatal("the wait was not counted")
	}
	testwait.For(t, 10*time.Second, "the busy count back to 0 (not leaked)", func() bool { return g.busy.Load() == 0 })
}

// A request marked NotBusy (a download, a held 429) leaves the gate's count.
func TestNotBusyLeavesTheGate(t *testing.T) {
	g := NewGate(1, prometheus.NewCounter(prometheus.CounterOpts{Name: "h"}), prometheus.NewCounter(prometheus.CounterOpts{Name: "hs"}))
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	gc := &GatedConn{Conn: c1, g: g}
	gc.SetBusy(true)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r = r.WithContext(WithConn(r.Context(), gc))
	NotBusy(r)
	if n := g.busy.Load(); n != 0 {
		t.Fatalf("busy %d after NotBusy, want 0", n)
	}
	NotBusy(r) // twice: still counted once
	TrackBusy(gc, http.StateActive)
	if n := g.busy.Load(); n != 1 {
		t.Fatalf("busy %d after the next request, want 1", n)
	}
}
