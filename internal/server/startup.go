package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/server/transport"
	"github.com/drover/drover/internal/store"
)

// startup is what the device listeners answer before the fleet is
// loaded: the server listens from its first second, so that devices get a
// 503 with a spread Retry-After instead of a refused connection, and
// /readyz says why the server is not ready.
type startup struct {
	routes    atomic.Pointer[http.Handler] // set once the fleet is loaded
	phase     atomic.Pointer[string]       // what the server is doing, for /readyz
	since     time.Time
	errc      chan error              // a device server that failed
	inherited map[string]net.Listener // systemd socket activation or a handover
	raw       map[string]net.Listener // the device sockets by name, under TLS and gate
	mu        sync.Mutex
	fresh     map[net.Conn]struct{} // accepted, no request read yet
	freshGone chan struct{}         // closed when fresh empties, while stopping
	// handedOver: started by a handover, this process waits for the
	// store's instance lock that the old one releases once drained.
	handedOver bool
	// loading is how far the fleet's load got, for /readyz and metrics.
	loading fleet.LoadProgress
	ready   atomic.Int64 // nanoseconds from since to the routes in place; 0: not yet
	// gcPercent is the GOGC to restore after the load, if gcRaised.
	gcPercent int
	gcRaised  bool
}

// connState is the device servers' ConnState hook: the accept gate's
// count, and the connections that have not sent their first request.
func (st *startup) connState(c net.Conn, state http.ConnState) {
	transport.TrackBusy(c, state)
	st.mu.Lock()
	defer st.mu.Unlock()
	if state == http.StateNew {
		if st.fresh == nil {
			st.fresh = map[net.Conn]struct{}{}
		}
		st.fresh[c] = struct{}{}
		return
	}
	delete(st.fresh, c)
	if len(st.fresh) == 0 && st.freshGone != nil {
		close(st.freshGone)
		st.freshGone = nil
	}
}

// stopAccepting closes the device listeners and waits, at most wait, for
// the connections accepted so far to send their first request: net/http's
// Shutdown closes a connection whose request it reads after Shutdown
// began, without an answer, and a device that just connected counts such
// a push lost. Shutdown then answers those requests.
func (s *Server) stopAccepting(wait time.Duration) {
	for _, ln := range s.deviceListeners() {
		ln.Close()
	}
	s.start.mu.Lock()
	if len(s.start.fresh) == 0 {
		s.start.mu.Unlock()
		return
	}
	gone := make(chan struct{})
	s.start.freshGone = gone
	s.start.mu.Unlock()
	select {
	case <-gone:
	case <-time.After(wait):
	}
}

// startupRetryAfter bounds the Retry-After of an answer before the fleet
// is loaded, in seconds: drawn at random in between, so that a fleet
// refused together does not come back together.
const startupRetryMin, startupRetryMax = 1, 5

func (st *startup) setPhase(p string) { st.phase.Store(&p) }

// phaseLoading is the phase while the fleet loads: /readyz adds how many
// devices are loaded.
const phaseLoading = "loading the fleet"

func (st *startup) reason() string {
	p := "starting"
	if v := st.phase.Load(); v != nil {
		p = *v
	}
	if p == phaseLoading {
		switch n, of := st.loading.Devices(); {
		case of > 0:
			p += fmt.Sprintf(": %d of %d devices", n, of)
		case n > 0:
			p += fmt.Sprintf(": %d devices", n)
		}
	}
	return fmt.Sprintf("%s (started %s ago)", p, time.Since(st.since).Round(100*time.Millisecond))
}

// routesInPlace ends the start-up answers: from now on the routes answer.
func (s *Server) routesInPlace() {
	s.start.routes.Store(&s.handler)
	s.start.ready.Store(int64(time.Since(s.start.since)))
}

// startupCollector exports the start's progress: the devices loaded, of
// how many, and how long the start took.
type startupCollector struct{ st *startup }

var (
	startupLoadedDesc = prometheus.NewDesc("drover_startup_devices_loaded",
		"Devices the fleet's load at start has read so far (all of them once the server is ready).", nil, nil)
	startupExpectedDesc = prometheus.NewDesc("drover_startup_devices_expected",
		"Devices the fleet's load at start expects at most: the highest device ID in the store (0: not known yet).", nil, nil)
	startupSecondsDesc = prometheus.NewDesc("drover_startup_seconds",
		"Time from the start of the process to the routes answering, the fleet loaded (0: still starting).", nil, nil)
)

func (c startupCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- startupLoadedDesc
	ch <- startupExpectedDesc
	ch <- startupSecondsDesc
}

func (c startupCollector) Collect(ch chan<- prometheus.Metric) {
	n, of := c.st.loading.Devices()
	ch <- prometheus.MustNewConstMetric(startupLoadedDesc, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(startupExpectedDesc, prometheus.GaugeValue, float64(of))
	ch <- prometheus.MustNewConstMetric(startupSecondsDesc, prometheus.GaugeValue, time.Duration(c.st.ready.Load()).Seconds())
}

// front is the device servers' handler: the routes once they are in
// place, before that the start-up answers.
func (s *Server) front() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := s.start.routes.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		s.startingUp(w, r)
	})
}

// startingUp answers a request before the fleet is loaded: /healthz says
// the process is alive, /readyz why it is not ready, everything else gets
// a 503 with the JSON error body and a Retry-After of 1 to 5 s.
func (s *Server) startingUp(w http.ResponseWriter, r *http.Request) {
	if s.cfg.NodeName != "" {
		w.Header().Set("X-Drover-Node", s.cfg.NodeName)
	}
	switch r.URL.Path {
	case "/healthz":
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		return
	case "/readyz":
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": s.start.reason()})
		return
	}
	io.Copy(io.Discard, io.LimitReader(r.Body, 64<<10)) // lets the connection be reused
	w.Header().Set("Retry-After", strconv.Itoa(startupRetryMin+rand.IntN(startupRetryMax-startupRetryMin+1)))
	writeJSON(w, http.StatusServiceUnavailable, protocol.ErrorBody{Error: protocol.ErrorDetail{
		Code: "unavailable", Message: "the server is starting: " + s.start.reason() + "; retry later"}})
}

// deviceListener is the listener of a device address: the inherited
// socket of that name when there is one, else a new one.
func (s *Server) deviceListener(name, addr string) (net.Listener, error) {
	if s.start.inherited == nil {
		s.start.since = time.Now()
		inh, err := transport.Inherited()
		if err != nil {
			return nil, err
		}
		s.start.inherited = inh
	}
	if s.start.raw == nil {
		s.start.raw = map[string]net.Listener{}
	}
	if ln := s.start.inherited[name]; ln != nil {
		delete(s.start.inherited, name)
		s.log.Info("listening on an inherited socket", "proto", name, "addr", ln.Addr().String())
		s.start.raw[name] = ln
		return ln, nil
	}
	ln, err := listenDevices(addr)
	if err == nil {
		s.start.raw[name] = ln
	}
	return ln, err
}

// deviceListeners are the device listeners, HTTPS first, in the order of
// s.servers.
func (s *Server) deviceListeners() []net.Listener {
	var lns []net.Listener
	if s.httpsLn != nil {
		lns = append(lns, s.httpsLn)
	}
	if s.httpLn != nil {
		lns = append(lns, s.httpLn)
	}
	return lns
}

// answerEarly starts the device servers before the store is opened and
// the fleet loaded, and tells a process handing over to this one that it
// may stop accepting.
func (s *Server) answerEarly(context.Context) error {
	if s.start.since.IsZero() {
		s.start.since = time.Now()
	}
	for name, ln := range s.start.inherited {
		s.log.Info("inherited socket not configured; closed", "name", name, "addr", ln.Addr().String())
		ln.Close()
	}
	s.start.inherited = nil
	s.start.setPhase("opening the store")
	s.m.reg.MustRegister(startupCollector{&s.start})
	if s.metricsSrv != nil {
		// The start's progress can be scraped while the fleet loads.
		s.log.Info("metrics listener", "addr", s.metricsLn.Addr().String())
		go s.metricsSrv.Serve(s.metricsLn)
	}
	s.start.errc = make(chan error, 2)
	for i, ln := range s.deviceListeners() {
		go func(srv *http.Server, ln net.Listener) {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.start.errc <- err
			}
		}(s.servers[i], ln)
	}
	if f := transport.HandoverReady(); f != nil {
		s.start.handedOver = true
		f.Write([]byte{1})
		f.Close()
		s.log.Info("handover: answering on the inherited sockets; the old process drains")
	}
	return nil
}

// openStoreWaiting opens the store. A process started by a handover waits
// for the old one to release the instance lock (it drains first, within
// its --shutdown-timeout).
func (s *Server) openStoreWaiting(ctx context.Context) (store.Store, error) {
	deadline := time.Now().Add(s.cfg.ShutdownTimeout + 30*time.Second)
	for {
		st, err := openStore(ctx, s.cfg.dbDSN())
		var held *store.HeldError
		if err == nil || !s.start.handedOver || !errors.As(err, &held) || time.Now().After(deadline) {
			if err == nil {
				s.start.setPhase(phaseLoading)
				testLoadGate()
			}
			return st, err
		}
		s.start.setPhase("waiting for the store: " + held.Error())
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// testLoadGateEnv names a FIFO that the fleet load waits to read, so that
// tests of the real binary can hold a start in its loading phase without
// a large store. Not for production use.
const testLoadGateEnv = "DROVER_TEST_LOAD_GATE"

func testLoadGate() {
	if p := os.Getenv(testLoadGateEnv); p != "" {
		os.ReadFile(p) // a FIFO: returns once a writer opened and closed it
	}
}

// Handover starts exe with args (normally this binary, new or the same,
// with this process's arguments) on this server's device sockets, and
// returns nil once it answers on them: then the caller ends Serve, which
// stops accepting, drains in-flight requests and pending writes and
// releases the store, which the new process waits for before loading the
// fleet. Connections meanwhile wait in the kernel's queue or get the new
// process's 503 with Retry-After: none is refused. On an error this
// server keeps serving.
func (s *Server) Handover(ctx context.Context, exe string, args []string, stdout, stderr *os.File) error {
	var names []string
	var lns []net.Listener
	for _, name := range []string{"https", "http"} {
		if ln := s.start.raw[name]; ln != nil {
			names, lns = append(names, name), append(lns, ln)
		}
	}
	if len(lns) == 0 {
		return errors.New("handover: no device listener")
	}
	proc, r, err := transport.StartHandover(exe, args, os.Environ(), stdout, stderr, names, lns)
	if err != nil {
		return fmt.Errorf("handover: %w", err)
	}
	defer r.Close()
	go proc.Wait() // reaped if it ends before this process
	s.log.Info("handover: new process started", "pid", proc.Pid, "exe", exe)
	got := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := io.ReadFull(r, b[:])
		got <- err
	}()
	select {
	case err = <-got:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(time.Minute):
		err = errors.New("no answer within 1m")
	}
	if err != nil {
		proc.Kill()
		return fmt.Errorf("handover: the new process (pid %d) did not take the sockets: %w", proc.Pid, err)
	}
	s.log.Info("handover: the new process answers; draining", "pid", proc.Pid)
	return nil
}

// loadGCPercent is the GOGC while the fleet loads, unless it is higher
// already or off. The load's garbage (each row read, the store's buffers)
// comes in a burst; at the server's GOGC the heap, growing from nothing to
// the fleet, was collected a dozen times over: about a tenth of a large
// fleet's start. The collection after the load gives the memory back.
const loadGCPercent = 400

// gcForLoad raises GOGC for the load.
func (s *Server) gcForLoad(context.Context) error {
	if prev := debug.SetGCPercent(loadGCPercent); prev < 0 || prev >= loadGCPercent {
		debug.SetGCPercent(prev)
	} else {
		s.start.gcPercent, s.start.gcRaised = prev, true
	}
	return nil
}

// gcAfterLoad restores GOGC, collects the load's garbage and returns the
// freed memory to the system.
func (s *Server) gcAfterLoad(context.Context) error {
	if s.start.gcRaised {
		debug.SetGCPercent(s.start.gcPercent)
		s.start.gcRaised = false
		debug.FreeOSMemory()
	}
	return nil
}
