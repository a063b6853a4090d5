package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// LoadKeyPair parses the leaf; WatchFiles calls reload on a change and
// again at each check while reload fails, then not until the next change.
func TestLoadKeyPairAndWatchFiles(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	certPEM, keyPEM, err := SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	// write replaces a file at once, as certificate tools do.
	write := func(p string, b []byte) {
		if err := os.WriteFile(p+".new", b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p+".new", p); err != nil {
			t.Fatal(err)
		}
	}
	write(certPath, certPEM)
	write(keyPath, keyPEM)
	cert, err := LoadKeyPair(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Leaf == nil || cert.Leaf.Subject.Organization[0] != "Drover self-signed" {
		t.Fatalf("leaf %+v", cert.Leaf)
	}
	if _, err := LoadKeyPair(certPath, filepath.Join(dir, "none.pem")); err == nil {
		t.Fatal("a missing key loaded")
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := make(chan int) // each reload waits until the test has seen it
	failing := 2            // the first two reloads fail: the pair is half replaced
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		WatchFiles(ctx, time.Millisecond, []string{certPath, keyPath}, func() error {
			n++
			select {
			case calls <- n:
			case <-ctx.Done():
			}
			if n <= failing {
				return errors.New("half replaced")
			}
			return nil
		})
	}()
	// Change the key file until the watcher sees it (its first look may
	// come after a first change).
	poke := time.NewTicker(20 * time.Millisecond)
	defer poke.Stop()
	grown := keyPEM
	first := 0
	for first == 0 {
		grown = append(grown, '\n')
		write(keyPath, grown)
		select {
		case first = <-calls:
		case <-poke.C:
		}
	}
	if first != 1 {
		t.Fatalf("first reload %d", first)
	}
	for want := 2; want <= failing+1; want++ {
		select {
		case got := <-calls:
			if got != want {
				t.Fatalf("reload %d, want %d", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("reload %d not called", want)
		}
	}
	// Reloaded: nothing more until the files change again.
	select {
	case got := <-calls:
		t.Fatalf("reload %d without a change", got)
	case <-time.After(50 * time.Millisecond):
	}
	write(certPath, append(certPEM, '\n'))
	select {
	case <-calls:
	case <-time.After(10 * time.Second):
		t.Fatal("second change not seen")
	}
	cancel()
	<-done
}

// Policy.Apply: TLS 1.2 at least, AEAD suites only unless legacy CBC is
// allowed, the cap and the groups as set; bad settings refused.
func TestPolicyApply(t *testing.T) {
	var c tls.Config
	if err := (Policy{KeyExchange: "x25519", MaxVersion: "1.2"}).Apply(&c); err != nil {
		t.Fatal(err)
	}
	if c.MinVersion != tls.VersionTLS12 || c.MaxVersion != tls.VersionTLS12 || len(c.CipherSuites) != len(tls12AEADSuites) {
		t.Fatalf("versions %x..%x, %d suites", c.MinVersion, c.MaxVersion, len(c.CipherSuites))
	}
	if len(c.CurvePreferences) != 1 || c.CurvePreferences[0] != tls.X25519 {
		t.Fatalf("groups %v", c.CurvePreferences)
	}
	if err := (Policy{AllowLegacyCBC: true, KeyExchange: "classic"}).Apply(&c); err != nil {
		t.Fatal(err)
	}
	if len(c.CipherSuites) != len(tls12AEADSuites)+len(tls12LegacyCBCSuites) {
		t.Fatalf("%d suites with legacy CBC", len(c.CipherSuites))
	}
	for _, p := range []Policy{{KeyExchange: "quantum"}, {MaxVersion: "1.1"}} {
		if err := p.Apply(&c); err == nil {
			t.Errorf("%+v accepted", p)
		}
	}
}

// ForACME: the handshakes naming an ACME domain, in any case and with a
// trailing dot; not those without a name or with another.
func TestForACME(t *testing.T) {
	domains := ParseDomains(" Fleet.Example.com, ,b.example ")
	if len(domains) != 2 || domains[0] != "fleet.example.com" || domains[1] != "b.example" {
		t.Fatalf("domains %q", domains)
	}
	for name, want := range map[string]bool{"fleet.example.com": true, "FLEET.example.com.": true, "b.example": true, "": false, "192.0.2.1": false, "c.example": false} {
		if got := ForACME(domains, &tls.ClientHelloInfo{ServerName: name}); got != want {
			t.Errorf("%q: %v, want %v", name, got, want)
		}
	}
}
