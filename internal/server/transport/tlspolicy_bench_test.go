//go:build linux

package transport

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// BenchmarkTLSHandshake measures the CPU per TLS handshake for each key
// exchange a client may choose, full and resumed (TLS 1.3 tickets; Go resumes
// with a fresh key exchange, psk_dhe_ke), in-process over loopback: x25519
// and p256 (the client offers that group only) against the default server
// setting (classic), hybrid (Go's default groups, X25519MLKEM768 and X25519
// key shares) against a hybrid server. Server and client each run on their
// own locked OS thread, whose CPU time is read around each handshake:
// server-µs/op and client-µs/op are each side's own cost; ns/op is the wall
// time of one whole handshake, both sides on the same machine. With
// -tags purego, crypto runs without assembly, as on a MIPS or 32-bit ARM
// router.
//
//	go test -run '^$' -bench TLSHandshake -benchtime 1000x -count 5 ./internal/server/transport/
func BenchmarkTLSHandshake(b *testing.B) {
	certPEM, keyPEM, err := SelfSigned()
	if err != nil {
		b.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		b.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	for _, c := range []struct {
		name, client, server string
		want                 tls.CurveID
		maxVersion           uint16
	}{
		{"x25519", protocol.KeyExchangeX25519, protocol.KeyExchangeClassic, tls.X25519, tls.VersionTLS13},
		{"p256", protocol.KeyExchangeP256, protocol.KeyExchangeClassic, tls.CurveP256, tls.VersionTLS13},
		{"hybrid", protocol.KeyExchangeHybrid, protocol.KeyExchangeHybrid, tls.X25519MLKEM768, tls.VersionTLS13},
		// For comparison: TLS 1.2 resumes from a ticket without a key
		// exchange (and so without forward secrecy for the resumed session).
		{"x25519-tls1.2", protocol.KeyExchangeX25519, protocol.KeyExchangeClassic, tls.X25519, tls.VersionTLS12},
	} {
		for _, resumed := range []bool{false, true} {
			name := c.name + "/full"
			if resumed {
				name = c.name + "/resumed"
			}
			b.Run(name, func(b *testing.B) {
				benchHandshake(b, cert, pool, c.client, c.server, c.want, c.maxVersion, resumed)
			})
		}
	}
}

func benchHandshake(b *testing.B, cert tls.Certificate, pool *x509.CertPool, clientKX, serverKX string, want tls.CurveID, maxVersion uint16, resumed bool) {
	srvCfg := &tls.Config{Certificates: []tls.Certificate{cert}}
	if err := (Policy{KeyExchange: serverKX, MaxVersion: "1.3"}).Apply(srvCfg); err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		cpu time.Duration
		err error
	}
	results := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // this thread runs only the server side
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			before := threadCPU()
			tc := tls.Server(c, srvCfg)
			err = tc.Handshake()
			cpu := threadCPU() - before
			if err == nil {
				_, err = tc.Write([]byte{1}) // the client reads its ticket with this
			}
			tc.Close()
			results <- result{cpu, err}
		}
	}()
	groups, err := protocol.KeyExchangeGroups(clientKX)
	if err != nil {
		b.Fatal(err)
	}
	cliCfg := &tls.Config{RootCAs: pool, ServerName: "localhost", CurvePreferences: groups, MaxVersion: maxVersion}
	if resumed {
		cliCfg.ClientSessionCache = tls.NewLRUClientSessionCache(1)
	}
	runtime.LockOSThread() // and this one only the client side
	defer runtime.UnlockOSThread()
	handshake := func() (st tls.ConnectionState, server, client time.Duration) {
		before := threadCPU()
		c, err := tls.Dial("tcp", ln.Addr().String(), cliCfg)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			b.Fatal(err)
		}
		client = threadCPU() - before
		st = c.ConnectionState()
		c.Close()
		r := <-results
		if r.err != nil {
			b.Fatal(r.err)
		}
		return st, r.cpu, client
	}
	if resumed {
		handshake() // the first handshake is full; it brings the ticket
	}
	var serverCPU, clientCPU time.Duration
	for b.Loop() {
		st, server, client := handshake()
		if st.DidResume != resumed || st.CurveID != want {
			b.Fatalf("resumed %v, key exchange %v; want %v, %v", st.DidResume, st.CurveID, resumed, want)
		}
		serverCPU += server
		clientCPU += client
	}
	b.ReportMetric(float64(serverCPU.Nanoseconds())/1e3/float64(b.N), "server-µs/op")
	b.ReportMetric(float64(clientCPU.Nanoseconds())/1e3/float64(b.N), "client-µs/op")
}

// threadCPU is the calling OS thread's CPU time (user + system).
func threadCPU() time.Duration {
	const rusageThread = 1 // RUSAGE_THREAD, Linux
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
