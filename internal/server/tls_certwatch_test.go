package server_test

import (
	"bytes"
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/testwait"
)

// -tls-cert files replaced on disk (a renewal) are served without SIGHUP
// once -tls-cert-check notices; a half-replaced pair that does not load
// keeps the old certificate.
func TestCertificateFilesReloadWhenChanged(t *testing.T) {
	dir := t.TempDir()
	a := servertest.Start(t, servertest.Options{DataDir: filepath.Join(dir, "a")})
	b := servertest.Start(t, servertest.Options{DataDir: filepath.Join(dir, "b")})
	read := func(s *servertest.Server, name string) []byte {
		data, err := os.ReadFile(filepath.Join(s.Config.DataDir, "tls", name))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(cert, read(a, "cert.pem"), 0o600)
	os.WriteFile(key, read(a, "key.pem"), 0o600)
	var log testwait.Buffer
	s := servertest.Start(t, servertest.Options{Logger: slog.New(slog.NewTextHandler(&log, nil)), Configure: func(c *server.Config) {
		c.TLSCert, c.TLSKey, c.TLSCertCheck = cert, key, 20*time.Millisecond
	}})
	served := func() []byte { return servedOf(t, s) }
	first := served()
	if !bytes.Equal(first, servedOf(t, a)) {
		t.Fatal("the server does not serve the first pair")
	}
	// Half replaced: b's certificate with a's key does not load.
	os.WriteFile(cert, read(b, "cert.pem"), 0o600)
	testwait.For(t, 10*time.Second, "the half-replaced pair tried", func() bool {
		return strings.Contains(log.String(), "changed certificate files do not load")
	})
	if !bytes.Equal(served(), first) {
		t.Fatal("a certificate that does not match its key was served")
	}
	os.WriteFile(key, read(b, "key.pem"), 0o600)
	testwait.For(t, 10*time.Second, "the renewed certificate served", func() bool { return bytes.Equal(served(), servedOf(t, b)) })
}

func servedOf(t *testing.T, s *servertest.Server) []byte {
	t.Helper()
	conn, err := tls.Dial("tcp", strings.TrimPrefix(s.URL, "https://"), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Raw
}
