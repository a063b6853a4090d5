package server_test

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// Two servers with the same -tls-ticket-keys file (cluster nodes with the
// same certificate) resume each other's TLS sessions; without it they do
// not; SIGHUP (Reload) with a file that lost the old key ends resumption of
// sessions made with it.
func TestTLSTicketKeysShared(t *testing.T) {
	dir := t.TempDir()
	key := func() string {
		b := make([]byte, 32)
		rand.Read(b)
		return base64.StdEncoding.EncodeToString(b)
	}
	keys := filepath.Join(dir, "ticket-keys")
	if err := os.WriteFile(keys, []byte("# first encrypts\n"+key()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	aDir := filepath.Join(dir, "a")
	a := servertest.Start(t, servertest.Options{DataDir: aDir, Configure: func(c *server.Config) { c.TLSTicketKeys = keys }})
	cert, certKey := filepath.Join(aDir, "tls", "cert.pem"), filepath.Join(aDir, "tls", "key.pem")
	node := func(ticketKeys string) *servertest.Server {
		return servertest.Start(t, servertest.Options{Configure: func(c *server.Config) {
			c.TLSCert, c.TLSKey, c.TLSTicketKeys = cert, certKey, ticketKeys
		}})
	}
	b, plain := node(keys), node("")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(a.CACertPEM)
	cfg := &tls.Config{RootCAs: pool, ServerName: "localhost", ClientSessionCache: tls.NewLRUClientSessionCache(4)}
	dial := func(s *servertest.Server) bool {
		t.Helper()
		conn, err := tls.Dial("tcp", strings.TrimPrefix(s.URL, "https://"), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		io.ReadAll(conn) // reads the session ticket too
		return conn.ConnectionState().DidResume
	}
	if dial(a) {
		t.Fatal("first connection resumed")
	}
	if !dial(b) {
		t.Error("a session from node a did not resume on node b (same ticket keys)")
	}
	if dial(plain) {
		t.Error("a session resumed on a server without the shared ticket keys")
	}
	// The last session (full, on plain) is not resumable elsewhere; get
	// one from b, then rotate b's keys without the old one.
	dial(b)
	if !dial(a) {
		t.Fatal("a session from node b did not resume on node a")
	}
	if err := os.WriteFile(keys, []byte(key()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rc := server.DefaultConfig()
	rc.TLSCert, rc.TLSKey, rc.TLSTicketKeys = cert, certKey, keys
	if err := b.Srv.Reload(rc); err != nil {
		t.Fatal(err)
	}
	if dial(b) {
		t.Error("after a reload without the old key, a session made with it resumed")
	}
	os.WriteFile(keys, []byte("not base64\n"), 0o600)
	if err := b.Srv.Reload(rc); err == nil || !strings.Contains(err.Error(), "tls-ticket-keys") {
		t.Errorf("reload with a bad key file: %v", err)
	}
}
