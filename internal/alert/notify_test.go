package alert_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/testwait"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, 10*time.Second, what, cond)
}

func run(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.eng.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func TestWebhookRetriesWithBackoff(t *testing.T) {
	var calls atomic.Int32
	var mu sync.Mutex
	var got []alert.WebhookBody
	var times []time.Time
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		times = append(times, time.Now())
		if calls.Add(1) <= 2 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		var b alert.WebhookBody
		if r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&b) != nil {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		got = append(got, b)
	}))
	defer hook.Close()
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such hook", http.StatusNotFound)
	}))
	defer refuse.Close()

	e := newEnv(t, nil, alert.Options{Retry: alert.Retry{First: 50 * time.Millisecond, Max: time.Second, Attempts: 5}})
	run(t, e)
	e.register("a", "ICR")
	e.rule(alert.Rule{Name: "hot", Kind: alert.TemperatureAbove, Threshold: 80, Webhook: hook.URL + "/alerts"})
	e.rule(alert.Rule{Name: "warm", Kind: alert.TemperatureAbove, Threshold: 60, Webhook: refuse.URL})
	e.push("a", 0, `{"temperature":90}`)

	waitFor(t, "webhook delivery", func() bool {
		for _, d := range e.eng.Deliveries() {
			if d.Target == hook.URL+"/alerts" && d.State == alert.Delivered {
				return true
			}
		}
		return false
	})
	mu.Lock()
	if len(got) != 1 || len(got[0].Events) != 1 || got[0].Events[0].Rule != "hot" || got[0].Events[0].State != alert.Raised || got[0].Source != "drover" {
		t.Fatalf("webhook got %+v", got)
	}
	if gap := times[2].Sub(times[1]); gap < 90*time.Millisecond { // second wait doubles to 100 ms
		t.Fatalf("no backoff between retries: %v", gap)
	}
	mu.Unlock()
	var hot, warm alert.Delivery
	waitFor(t, "refused delivery", func() bool {
		for _, d := range e.eng.Deliveries() {
			switch d.Target {
			case hook.URL + "/alerts":
				hot = d
			case refuse.URL:
				warm = d
			}
		}
		return warm.State == alert.Failed
	})
	if hot.Attempts != 3 || hot.LastError != "" {
		t.Fatalf("delivered after %d attempts, error %q", hot.Attempts, hot.LastError)
	}
	if warm.Attempts != 1 || !strings.Contains(warm.LastError, "404") {
		t.Fatalf("a 404 is not retried: %+v", warm)
	}
	counts := e.eng.NotificationCounts()
	if counts[[2]string{"webhook", "delivered"}] != 1 || counts[[2]string{"webhook", "retried"}] != 2 || counts[[2]string{"webhook", "failed"}] != 1 {
		t.Fatalf("counts %v", counts)
	}

	// The clear is notified too.
	e.push("a", 0, `{"temperature":20}`)
	waitFor(t, "clear notification", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 2
	})
	mu.Lock()
	if ev := got[1].Events[0]; ev.State != alert.Cleared || ev.ClearedAt == nil {
		t.Fatalf("clear notification %+v", ev)
	}
	mu.Unlock()
}

// smtpServer is a minimal SMTP server that records one message per
// session. It offers STARTTLS (a certificate for 127.0.0.1 that roots
// trust) unless made with newPlainSMTPServer.
type smtpServer struct {
	ln    net.Listener
	mu    sync.Mutex
	msgs  []smtpMsg
	tls   *tls.Config
	roots *x509.CertPool
	tlsUp int // sessions that switched to TLS
}

type smtpMsg struct {
	from string
	to   []string
	data string
}

func newSMTPServer(t *testing.T) *smtpServer {
	s := newPlainSMTPServer(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "smtp test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	s.roots = x509.NewCertPool()
	s.roots.AddCert(cert)
	s.tls = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	return s
}

func newPlainSMTPServer(t *testing.T) *smtpServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &smtpServer{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return s
}

func (s *smtpServer) serve(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	say := func(line string) { io.WriteString(c, line+"\r\n") }
	say("220 test ESMTP")
	var m smtpMsg
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		cmd := strings.ToUpper(strings.TrimSpace(line))
		switch {
		case strings.HasPrefix(cmd, "EHLO"), strings.HasPrefix(cmd, "HELO"):
			say("250-test")
			if _, secure := c.(*tls.Conn); s.tls != nil && !secure {
				say("250-STARTTLS")
			}
			say("250 8BITMIME")
		case cmd == "STARTTLS" && s.tls != nil:
			say("220 go ahead")
			tc := tls.Server(c, s.tls)
			if err := tc.Handshake(); err != nil {
				return
			}
			c, r = tc, bufio.NewReader(tc)
			s.mu.Lock()
			s.tlsUp++
			s.mu.Unlock()
		case cmd == "NOOP", cmd == "RSET":
			say("250 ok")
		case strings.HasPrefix(cmd, "MAIL FROM:"):
			from, _, _ := strings.Cut(strings.TrimSpace(line)[10:], " ")
			m.from = strings.Trim(from, "<>")
			say("250 ok")
		case strings.HasPrefix(cmd, "RCPT TO:"):
			m.to = append(m.to, strings.Trim(strings.TrimSpace(line)[8:], "<>"))
			say("250 ok")
		case cmd == "DATA":
			say("354 go on")
			var b strings.Builder
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if l == ".\r\n" {
					break
				}
				b.WriteString(l)
			}
			m.data = b.String()
			s.mu.Lock()
			s.msgs = append(s.msgs, m)
			s.mu.Unlock()
			say("250 queued")
		case cmd == "QUIT":
			say("221 bye")
			return
		default:
			say("502 not implemented")
		}
	}
}

func TestEmailOverSMTP(t *testing.T) {
	srv := newSMTPServer(t)
	e := newEnv(t, nil, alert.Options{Retry: alert.Retry{First: 20 * time.Millisecond, Attempts: 3}, SMTPRootCAs: srv.roots})
	run(t, e)
	e.register("a", "ICR")
	e.rule(alert.Rule{Name: "hot", Kind: alert.TemperatureAbove, Threshold: 80, Email: []string{"Ops <ops@example.com>", "noc@example.com"}})

	// Without SMTP settings the delivery fails visibly.
	e.push("a", 0, `{"temperature":90}`)
	waitFor(t, "failed e-mail", func() bool {
		d := e.eng.Deliveries()
		return len(d) == 1 && d[0].State == alert.Failed && strings.Contains(d[0].LastError, "SMTP is not configured")
	})
	if _, err := e.eng.SetSMTP(e.ctx, alert.SMTPSettings{Addr: "nohost", From: "x"}); err == nil {
		t.Fatal("bad SMTP settings accepted")
	}
	if _, err := e.eng.SetSMTP(e.ctx, alert.SMTPSettings{Addr: srv.ln.Addr().String(), From: "Drover <drover@example.com>"}); err != nil {
		t.Fatal(err)
	}
	e.push("a", 0, `{"temperature":20}`)
	waitFor(t, "e-mail", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.msgs) == 1
	})
	m := srv.msgs[0]
	if srv.tlsUp != 1 {
		t.Errorf("%d session(s) switched to TLS, want 1 (STARTTLS)", srv.tlsUp)
	}
	if m.from != "drover@example.com" || strings.Join(m.to, ",") != "ops@example.com,noc@example.com" {
		t.Fatalf("envelope %q -> %q", m.from, m.to)
	}
	if !strings.Contains(m.data, "Subject: [Drover] cleared: hot on device 1") || !strings.Contains(m.data, "condition no longer holds") {
		t.Fatalf("message:\n%s", m.data)
	}
	waitFor(t, "delivered status", func() bool { return e.eng.Deliveries()[0].State == alert.Delivered })
	if v, _ := e.store.Setting(e.ctx, "smtp"); !strings.Contains(v, srv.ln.Addr().String()) {
		t.Fatalf("SMTP settings not stored: %q", v)
	}
}

// STARTTLS is required: a relay that does not offer it (or whose offer a
// man in the middle stripped) gets no message in plain text, and the
// delivery fails visibly; tls "none", given explicitly, sends plain text.
func TestEmailRequiresSTARTTLS(t *testing.T) {
	srv := newPlainSMTPServer(t)
	e := newEnv(t, nil, alert.Options{Retry: alert.Retry{First: 20 * time.Millisecond, Attempts: 2}})
	run(t, e)
	e.register("a", "ICR")
	e.rule(alert.Rule{Name: "hot", Kind: alert.TemperatureAbove, Threshold: 80, Email: []string{"ops@example.com"}})
	if _, err := e.eng.SetSMTP(e.ctx, alert.SMTPSettings{Addr: srv.ln.Addr().String(), From: "drover@example.com"}); err != nil {
		t.Fatal(err)
	}
	e.push("a", 0, `{"temperature":90}`)
	waitFor(t, "failed e-mail", func() bool {
		d := e.eng.Deliveries()
		return len(d) == 1 && d[0].State == alert.Failed && strings.Contains(strings.ToLower(d[0].LastError), "starttls")
	})
	srv.mu.Lock()
	if len(srv.msgs) != 0 {
		t.Fatalf("a message went out without STARTTLS: %+v", srv.msgs)
	}
	srv.mu.Unlock()
	if _, err := e.eng.SetSMTP(e.ctx, alert.SMTPSettings{Addr: srv.ln.Addr().String(), From: "drover@example.com", TLS: "none"}); err != nil {
		t.Fatal(err)
	}
	e.push("a", 0, `{"temperature":20}`)
	waitFor(t, "plain e-mail with tls none", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.msgs) == 1 && strings.Contains(srv.msgs[0].data, "cleared: hot on device 1")
	})
}

// A webhook URL's path and query (where chat services put their secret)
// never reach the log, not even in the error of a failed delivery.
func TestWebhookSecretNotLogged(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	base := dead.URL
	dead.Close() // connections refused: net/http's error names the URL
	var logged strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logged.Write(p)
	}), nil))
	e := newEnv(t, nil, alert.Options{Logger: log, Retry: alert.Retry{First: 10 * time.Millisecond, Max: 10 * time.Millisecond, Attempts: 2}})
	run(t, e)
	e.register("a", "ICR")
	e.rule(alert.Rule{Name: "hot", Kind: alert.TemperatureAbove, Threshold: 80, Webhook: base + "/services/T0/B0/s3cret-path?token=s3cret-query"})
	e.push("a", 0, `{"temperature":90}`)
	waitFor(t, "the failed delivery logged", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logged.String(), "alert notification failed")
	})
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logged.String(), "s3cret") || !strings.Contains(logged.String(), base+"/…") {
		t.Errorf("log:\n%s", logged.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
