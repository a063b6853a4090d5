package emulator

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"sync"
	"testing"
	"time"
)

// sessionWatch is a TLS server configuration that keeps its sessions
// itself (the ticket is a number), so that it knows, for every
// connection, which session it issued and which one it resumed.
type sessionWatch struct {
	mu      sync.Mutex
	state   map[uint64][]byte // session number → its state
	issued  map[string]uint64 // remote address → the session issued on it
	resumed map[string]uint64 // remote address → the session it resumed
	owner   map[uint64]string // session number → machine ID of its connection
	refuse  bool              // refuse every ticket: each handshake is a full one
	errs    []string

	full, resumedN, regResumed, foreign int
}

func newSessionWatch() *sessionWatch {
	return &sessionWatch{state: map[uint64][]byte{}, issued: map[string]uint64{}, resumed: map[string]uint64{}, owner: map[uint64]string{}}
}

// config is the server's TLS configuration; the certificate is httptest's.
func (w *sessionWatch) config(srv func() *tls.Config) *tls.Config {
	return &tls.Config{GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		addr := hello.Conn.RemoteAddr().String()
		base := srv()
		return &tls.Config{
			Certificates: base.Certificates, NextProtos: base.NextProtos, MinVersion: tls.VersionTLS12,
			WrapSession: func(_ tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
				b, err := ss.Bytes()
				if err != nil {
					return nil, err
				}
				w.mu.Lock()
				defer w.mu.Unlock()
				n := uint64(len(w.state) + 1)
				w.state[n], w.issued[addr] = b, n
				return binary.BigEndian.AppendUint64(nil, n), nil
			},
			UnwrapSession: func(identity []byte, _ tls.ConnectionState) (*tls.SessionState, error) {
				if len(identity) != 8 {
					return nil, nil // TLS 1.2's empty ticket: asks for one
				}
				n := binary.BigEndian.Uint64(identity)
				w.mu.Lock()
				defer w.mu.Unlock()
				b, ok := w.state[n]
				if !ok || w.refuse {
					return nil, nil // not resumed: a full handshake
				}
				w.resumed[addr] = n
				return tls.ParseSessionState(b)
			},
		}, nil
	}}
}

// seen checks one request: a device's first connection (its registration)
// is a full handshake; a resumed one resumes a session issued to the same
// device.
func (w *sessionWatch) seen(r *http.Request, machine string, register bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.TLS.DidResume {
		w.resumedN++
		n := w.resumed[r.RemoteAddr]
		if register {
			w.regResumed++
		}
		if o := w.owner[n]; o != machine {
			w.foreign++
			w.errs = append(w.errs[:min(len(w.errs), 4)], fmt.Sprintf("device %s resumed session %d of device %q", machine, n, o))
		}
	} else {
		w.full++
	}
	if n, ok := w.issued[r.RemoteAddr]; ok {
		w.owner[n] = machine
	}
}

func newSessionFake(t *testing.T) (*fake, *sessionWatch) {
	w := newSessionWatch()
	var f *fake
	f = newFakeTLS(t, true, w.config(func() *tls.Config { return f.srv.TLS }))
	f.seen = w.seen
	return f, w
}

// With --conn resume each device keeps its own TLS session, as an agent
// does: its first connection is a full handshake, each later one resumes
// the session the server gave that device, never another device's.
func TestResumeSessionPerDevice(t *testing.T) {
	for _, version := range []string{"1.3", "1.2"} {
		t.Run("TLS "+version, func(t *testing.T) {
			f, w := newSessionFake(t)
			cfg := f.cfg(ModeBenchmark, 10)
			cfg.Loops, cfg.Conn, cfg.TLSMaxVersion = 3, ConnResume, version
			sum, _ := run(t, cfg)
			if c := sum.Conns; c.Dials != 40 || c.TLSFull != 10 || c.TLSResumed != 30 || c.TLSResumeFailed != 0 || c.TLSErrors != 0 {
				t.Errorf("emulator counted %+v, want 10 full handshakes (one per device) and 30 resumed", c)
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.full != 10 || w.resumedN != 30 || w.regResumed != 0 || w.foreign != 0 {
				t.Errorf("server saw %d full, %d resumed handshakes, %d registrations resumed, %d sessions of another device: %q",
					w.full, w.resumedN, w.regResumed, w.foreign, w.errs)
			}
			if f.accepted.Load() != 30 {
				t.Errorf("server accepted %d pushes", f.accepted.Load())
			}
		})
	}
}

// A device whose session the server refuses (a restart, another node's
// keys) does a full handshake; the report counts it apart.
func TestResumeRefusedIsCounted(t *testing.T) {
	f, w := newSessionFake(t)
	w.refuse = true
	cfg := f.cfg(ModeBenchmark, 10)
	cfg.Loops, cfg.Conn = 2, ConnResume
	sum, _ := run(t, cfg)
	if c := sum.Conns; c.TLSFull != 30 || c.TLSResumed != 0 || c.TLSResumeFailed != 20 {
		t.Errorf("emulator counted %+v, want 30 full handshakes, 20 of them after a refused session", c)
	}
}

// New connections without resumption offer no session at all.
func TestConnNewOffersNoSession(t *testing.T) {
	f, w := newSessionFake(t)
	cfg := f.cfg(ModeBenchmark, 5)
	cfg.Loops, cfg.Conn = 2, ConnNew
	sum, _ := run(t, cfg)
	if c := sum.Conns; c.TLSFull != 15 || c.TLSResumed != 0 || c.TLSResumeFailed != 0 {
		t.Errorf("emulator counted %+v", c)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.resumedN != 0 {
		t.Errorf("server resumed %d sessions", w.resumedN)
	}
}

// sessionBytes is the heap that n devices' TLS sessions hold, per device,
// after one connection each to a Go TLS server at version (its own ticket
// keys, as Drover's).
func sessionBytes(t testing.TB, version string, n int) float64 {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "2")
		w.Write([]byte("{}"))
	}))
	srv.EnableHTTP2 = false
	srv.StartTLS()
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	conf := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS13}
	if version == "1.2" {
		conf.MaxVersion = tls.VersionTLS12
	}
	tr, err := newTransport(u, conf, ConnResume, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.shutdown(true)
	req := []byte("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	var resp response
	get := func(s *sessionSlot) {
		if _, err := tr.do(context.Background(), s, req, make([]byte, 0, 64), &resp); err != nil || resp.status != 200 {
			t.Fatalf("request: %v, status %d", err, resp.status)
		}
	}
	get(&sessionSlot{}) // the first: pools, certificate cache
	slots := make([]sessionSlot, n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range slots {
		get(&slots[i])
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	for i := range slots {
		if slots[i].s == nil {
			t.Fatalf("device %d kept no session", i)
		}
	}
	runtime.KeepAlive(slots)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

// A device's session stays small: the parsed server certificate is shared
// (crypto/tls's certificate cache), the rest is the ticket and the secret.
// docs/emulator.md gives the figures.
func TestSessionBytesPerDevice(t *testing.T) {
	for _, version := range []string{"1.3", "1.2"} {
		b := sessionBytes(t, version, 200)
		t.Logf("TLS %s: %.0f bytes of heap per device's session", version, b)
		if b > 2048 {
			t.Errorf("TLS %s: %.0f bytes per device's session, want at most 2 KiB", version, b)
		}
	}
}
