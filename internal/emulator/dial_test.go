package emulator

import (
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/drover/drover/internal/emulator/results"
)

// A connect the server refuses is a "refused" drop, over HTTP and HTTPS
// (the lean dialer learns it from the first write), from source addresses
// or not.
func TestRefusedConnectsAreClassified(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, target := range []string{"http://" + addr, "https://" + addr} {
		for _, src := range [][]net.IP{nil, {net.ParseIP("127.0.0.2")}} {
			cfg := DefaultConfig()
			cfg.Target, cfg.EnrollmentSecret, cfg.Devices, cfg.Mode, cfg.Loops, cfg.Insecure = target, "s", 5, ModeBenchmark, 0, true
			cfg.SourceAddrs = src
			sum, _ := run(t, cfg)
			reg := sum.Op(results.OpRegister)
			if reg.Dropped[DropRefused] != 5 || sum.Conns.DialErrors != 5 {
				t.Fatalf("%s from %v: %+v, conns %+v", target, src, reg.Counts, sum.Conns)
			}
		}
	}
}

// The emulated devices offer the agent's key exchanges: no post-quantum
// key share with "classic", X25519MLKEM768 with "hybrid".
func TestKeyExchangeOffered(t *testing.T) {
	var hybridOffers, hellos atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"device_id":"d","token":"t"}`))
	}))
	srv.EnableHTTP2 = false
	srv.TLS = &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		hellos.Add(1)
		if slices.Contains(h.SupportedCurves, tls.X25519MLKEM768) {
			hybridOffers.Add(1)
		}
		return nil, nil
	}}
	srv.StartTLS()
	defer srv.Close()
	for _, kx := range []string{"classic", "hybrid"} {
		hybridOffers.Store(0)
		hellos.Store(0)
		cfg := DefaultConfig()
		cfg.Target, cfg.EnrollmentSecret, cfg.Devices, cfg.Mode, cfg.Loops, cfg.Insecure = srv.URL, "s", 3, ModeBenchmark, 0, true
		cfg.Conn, cfg.TLSKeyExchange = ConnNew, kx
		run(t, cfg)
		want := int64(0)
		if kx == "hybrid" {
			want = 3
		}
		if hellos.Load() != 3 || hybridOffers.Load() != want {
			t.Fatalf("%s: %d hellos, %d offered X25519MLKEM768", kx, hellos.Load(), hybridOffers.Load())
		}
	}
}

// --tls-max-version 1.2 makes the devices speak TLS 1.2; a version the
// emulator does not know is refused before anything is sent.
func TestTLSMaxVersion(t *testing.T) {
	var tls12 atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS.Version == tls.VersionTLS12 {
			tls12.Add(1)
		}
		w.Write([]byte(`{"device_id":"d","token":"t"}`))
	}))
	srv.EnableHTTP2 = false
	srv.StartTLS()
	defer srv.Close()
	for _, v := range []string{"1.2", "1.3"} {
		tls12.Store(0)
		cfg := DefaultConfig()
		cfg.Target, cfg.EnrollmentSecret, cfg.Devices, cfg.Mode, cfg.Loops, cfg.Insecure = srv.URL, "s", 3, ModeBenchmark, 0, true
		cfg.Conn, cfg.TLSMaxVersion = ConnNew, v
		run(t, cfg)
		if want := map[string]int64{"1.2": 3, "1.3": 0}[v]; tls12.Load() != want {
			t.Fatalf("max %s: %d requests over TLS 1.2, want %d", v, tls12.Load(), want)
		}
	}
	cfg := DefaultConfig()
	cfg.Target, cfg.EnrollmentSecret, cfg.TLSMaxVersion = srv.URL, "s", "1.1"
	if err := cfg.Validate(); err == nil {
		t.Fatal("TLS 1.1 accepted")
	}
}
