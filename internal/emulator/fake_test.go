package emulator

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/protocol"
)

// fake is a Drover stand-in that checks every request against the
// protocol and counts what it accepted.
type fake struct {
	t      testing.TB
	secret string
	srv    *httptest.Server

	mu        sync.Mutex
	tokens    map[string]string // token → machine ID
	ids       map[string]string // machine ID → device ID
	regCalls  map[string]int    // machine ID → registration requests
	pushCalls map[string]int    // machine ID → push requests
	lastSeq   map[string]uint64
	cfgSeen   map[string]int64 // machine ID → config_version last reported
	remotes   map[string]int   // remote IP → requests
	pushTimes map[string][]time.Time

	accepted, registeredNew, renewed atomic.Int64
	inflight, maxInflight            atomic.Int64

	// Behaviours; nil: answer normally.
	onRegister func(w http.ResponseWriter, machine string, call int) bool // true: answered
	onPush     func(w http.ResponseWriter, machine string, call int) bool
	// seen, when set, sees every registration and authenticated push with
	// its device's machine ID before it is answered.
	seen   func(r *http.Request, machine string, register bool)
	delay  time.Duration
	config int64 // >0: answer pushes with this config version until reported
}

func newFake(t testing.TB, tlsServer bool) *fake { return newFakeTLS(t, tlsServer, nil) }

// newFakeTLS is newFake with the TLS server's configuration (nil: httptest's).
func newFakeTLS(t testing.TB, tlsServer bool, conf *tls.Config) *fake {
	f := &fake{t: t, secret: "s3cret", tokens: map[string]string{}, ids: map[string]string{}, regCalls: map[string]int{},
		pushCalls: map[string]int{}, lastSeq: map[string]uint64{}, cfgSeen: map[string]int64{}, remotes: map[string]int{},
		pushTimes: map[string][]time.Time{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+protocol.PathRegister, f.register)
	mux.HandleFunc("POST "+protocol.PathPush, f.push)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := f.inflight.Add(1)
		defer f.inflight.Add(-1)
		for {
			m := f.maxInflight.Load()
			if n <= m || f.maxInflight.CompareAndSwap(m, n) {
				break
			}
		}
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		f.mu.Lock()
		f.remotes[host]++
		f.mu.Unlock()
		if f.delay > 0 { // a slow server, as the test asked for
			time.Sleep(f.delay)
		}
		mux.ServeHTTP(w, r)
	})
	if tlsServer {
		f.srv = httptest.NewUnstartedServer(h)
		f.srv.EnableHTTP2 = false
		f.srv.TLS = conf
		f.srv.StartTLS()
	} else {
		f.srv = httptest.NewServer(h)
	}
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, status int, code string) {
	writeJSON(w, status, protocol.ErrorBody{Error: protocol.ErrorDetail{Code: code, Message: code}})
}

func (f *fake) register(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req, err := protocol.DecodeRegister(body)
	if err != nil {
		f.t.Errorf("fake: bad registration: %v: %s", err, body)
		fail(w, 400, "invalid")
		return
	}
	if f.seen != nil {
		f.seen(r, req.MachineID, true)
	}
	f.mu.Lock()
	f.regCalls[req.MachineID]++
	call := f.regCalls[req.MachineID]
	f.mu.Unlock()
	if f.onRegister != nil && f.onRegister(w, req.MachineID, call) {
		return
	}
	if req.EnrollmentSecret != f.secret {
		fail(w, 403, "wrong_enrollment_secret")
		return
	}
	f.mu.Lock()
	id, ok := f.ids[req.MachineID]
	if !ok {
		id = strconv.Itoa(len(f.ids) + 1)
		f.ids[req.MachineID] = id
	}
	token := fmt.Sprintf("tok-%s-%d", id, call)
	f.tokens[token] = req.MachineID
	f.mu.Unlock()
	if ok {
		f.renewed.Add(1)
	} else {
		f.registeredNew.Add(1)
	}
	writeJSON(w, 200, protocol.RegisterResponse{DeviceID: id, Token: token, PushInterval: 200, New: !ok})
}

func (f *fake) push(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	f.mu.Lock()
	machine, ok := f.tokens[tok]
	f.mu.Unlock()
	if !ok {
		fail(w, 401, "unauthorized")
		return
	}
	if f.seen != nil {
		f.seen(r, machine, false)
	}
	p, err := protocol.DecodePush(body)
	if err != nil {
		f.t.Errorf("fake: bad push: %v: %s", err, body)
		fail(w, 400, "invalid")
		return
	}
	f.mu.Lock()
	f.pushCalls[machine]++
	call := f.pushCalls[machine]
	f.pushTimes[machine] = append(f.pushTimes[machine], time.Now())
	f.mu.Unlock()
	if f.onPush != nil && f.onPush(w, machine, call) {
		return
	}
	f.mu.Lock()
	if p.Seq <= f.lastSeq[machine] {
		f.t.Errorf("fake: device %s sent seq %d after %d", machine, p.Seq, f.lastSeq[machine])
	}
	f.lastSeq[machine] = p.Seq
	f.cfgSeen[machine] = p.ConfigVersion
	f.mu.Unlock()
	f.accepted.Add(1)
	resp := protocol.PushResponse{PushInterval: 200}
	if f.config > 0 && p.ConfigVersion != f.config {
		resp.Config = &protocol.Config{Version: f.config, Data: json.RawMessage(`{"x":1}`)}
	}
	writeJSON(w, 200, resp)
}

// cfg is a small run against f.
func (f *fake) cfg(mode Mode, devices int) Config {
	c := DefaultConfig()
	c.Target, c.EnrollmentSecret, c.Devices, c.Mode, c.Seed = f.srv.URL, f.secret, devices, mode, "test"
	c.Workers, c.Loops, c.Interval, c.Duration, c.Timeout = 4, 3, time.Second, 0, 5*time.Second
	if strings.HasPrefix(f.srv.URL, "https") {
		c.CACertPEM = f.caPEM()
	}
	return c
}

// run runs cfg and returns the summary and the parsed result stream.
func run(t testing.TB, cfg Config) (*results.Summary, *results.Stream) {
	t.Helper()
	var buf strings.Builder
	sum, err := Run(context.Background(), cfg, &buf)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var st results.Stream
	if err := st.Read(strings.NewReader(buf.String())); err != nil {
		t.Fatalf("result stream: %v", err)
	}
	return sum, &st
}

func hasWarning(s *results.Summary, part string) bool {
	for _, w := range s.Warnings {
		if strings.Contains(w, part) {
			return true
		}
	}
	return false
}
