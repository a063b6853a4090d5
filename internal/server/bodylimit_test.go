package server_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// declaredBody sends a request head declaring length body bytes, then only
// body, over a raw connection to base (http:// or https://), and reads the
// answer with a deadline of a few seconds: a server that waits for the
// rest of the body fails it. It returns the answer and its body, and what
// the next read on the connection gave (io.EOF: closed cleanly).
func declaredBody(t *testing.T, s *servertest.Server, base, method, path, token string, length int64, body string) (*http.Response, []byte, error) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	var conn net.Conn
	if u.Scheme == "https" {
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(s.CACertPEM)
		// HTTP/1.1 on purpose: no ALPN, as curl --http1.1 and the agents.
		conn, err = tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", u.Host, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	} else {
		conn, err = net.DialTimeout("tcp", u.Host, 3*time.Second)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	conn.SetDeadline(start.Add(5 * time.Second))
	head := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", method, path, u.Host, length)
	if token != "" {
		head += "Authorization: Bearer " + token + "\r\n"
	}
	if _, err := io.WriteString(conn, head+"\r\n"+body); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s %s declaring %d bytes, sending %d: no answer after %s: %v", method, path, length, len(body), time.Since(start).Round(time.Millisecond), err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	_, next := br.ReadByte()
	return resp, b, next
}

// A request declaring a body over a route's limit is answered 413 with the
// JSON error body at once, before the body is read, and the connection is
// then closed cleanly: over HTTP and HTTPS, on every route that takes a
// body (each route of the API, the device routes, firmware uploads with
// their own limit), whatever the declared length.
func TestDeclaredOversizeBodyAnswered413AtOnce(t *testing.T) {
	const fwMax, fileMax = 4 << 20, 2 << 20
	s := servertest.Start(t, servertest.Options{HTTP: true, Configure: func(c *server.Config) {
		c.FirmwareMaxSize, c.RemoteFileMaxSize = fwMax, fileMax
	}})
	c := &client{t: t, s: s, url: s.URL}
	_, token := c.register("m-1")

	// Every route of the operator and device API that takes a method with
	// a body, from the API's own description.
	_, _, doc := c.do("GET", "/api/v1/openapi.json", "", nil)
	paths, _ := doc["paths"].(map[string]any)
	type req struct{ method, path string }
	var reqs []req
	fill := strings.NewReplacer("{id}", "1", "{name}", "x", "{machine_id}", "x")
	for p, ops := range paths {
		for m := range ops.(map[string]any) {
			if m := strings.ToUpper(m); slices.Contains([]string{"POST", "PUT", "PATCH", "DELETE"}, m) {
				reqs = append(reqs, req{m, fill.Replace(p)})
			}
		}
	}
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].path+reqs[i].method < reqs[j].path+reqs[j].method })
	var checkOne func(t *testing.T, base, method, path, token string, length int64, limit string)
	if len(reqs) < 40 || !slices.Contains(reqs, req{"POST", "/api/v1/register"}) || !slices.Contains(reqs, req{"POST", "/api/v1/push"}) {
		t.Fatalf("routes with a body from openapi.json: %v", reqs)
	}

	// Each check in a parallel subtest: a closing connection lingers
	// (reads what the client still sends) for up to a quarter second.
	check := func(t *testing.T, base, method, path, token string, length int64, limit string) {
		t.Run(fmt.Sprintf("%s %s %d", method, path, length), func(t *testing.T) {
			t.Parallel()
			checkOne(t, base, method, path, token, length, limit)
		})
	}
	checkOne = func(t *testing.T, base, method, path, token string, length int64, limit string) {
		t.Helper()
		start := time.Now()
		resp, body, next := declaredBody(t, s, base, method, path, token, length, "{}")
		took := time.Since(start)
		var e struct {
			Error struct{ Code, Message string }
		}
		dashboard := strings.HasPrefix(path, "/ui/") // text answers
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), limit) ||
			!dashboard && (json.Unmarshal(body, &e) != nil || e.Error.Code != "body_too_large") {
			t.Fatalf("%s %s declaring %d bytes: %d %s, want 413 body_too_large naming %s", method, path, length, resp.StatusCode, body, limit)
		}
		if !resp.Close || !errors.Is(next, io.EOF) {
			t.Fatalf("%s %s declaring %d bytes: Connection: close %v, next read %v; want closed cleanly", method, path, length, resp.Close, next)
		}
		if took > 3*time.Second {
			t.Fatalf("%s %s declaring %d bytes: answered after %s", method, path, length, took)
		}
	}
	for _, base := range []string{s.HTTPURL, s.URL} {
		scheme := base[:strings.Index(base, ":")]
		t.Run(scheme, func(t *testing.T) {
			for _, n := range []int64{65537, 1000000, 99999999999} {
				check(t, base, "POST", "/api/v1/register", "", n, "65536 bytes")
				check(t, base, "POST", "/api/v1/push", token, n, "65536 bytes")
			}
			for _, r := range reqs {
				if r.path == "/api/v1/firmware" && r.method == "POST" || r.path == "/api/v1/devices/1/files" && r.method == "PUT" {
					continue
				}
				check(t, base, r.method, r.path, s.AdminToken, 65537, "65536 bytes")
			}
			// A firmware upload has its own limit (--firmware-max-size).
			check(t, base, "POST", "/api/v1/firmware?device_type=ICR&version=1", s.AdminToken, fwMax+1, fmt.Sprintf("%d bytes", fwMax))
			check(t, base, "POST", "/api/v1/firmware?device_type=ICR&version=1", s.AdminToken, 99999999999, fmt.Sprintf("%d bytes", fwMax))
			// A file upload to a device has its own limit too
			// (--remote-file-max-size).
			check(t, base, "PUT", "/api/v1/devices/1/files?path=/tmp/x", s.AdminToken, fileMax+1, fmt.Sprintf("%d bytes", fileMax))
			check(t, base, "PUT", "/api/v1/devices/1/files?path=/tmp/x", s.AdminToken, 99999999999, fmt.Sprintf("%d bytes", fileMax))
			// The dashboard's forms: the login form 64 KiB, the others 1 MiB.
			check(t, base, "POST", "/ui/login", "", 65537, "65536 bytes")
			check(t, base, "POST", "/ui/profiles/1", "", 1<<20+1, "1048576 bytes")
			// Routes without a body take none larger than the API's.
			check(t, base, "GET", "/api/v1/devices", s.AdminToken, 99999999999, "65536 bytes")
			check(t, base, "GET", "/healthz", "", 99999999999, "65536 bytes")
			// No route: 404 (nothing to limit), at once, then closed.
			resp, _, next := declaredBody(t, s, base, "POST", "/api/v1/nothing", "", 65537, "{}")
			if resp.StatusCode != http.StatusNotFound || !resp.Close || !errors.Is(next, io.EOF) {
				t.Fatalf("no route: %d, Connection: close %v, next read %v", resp.StatusCode, resp.Close, next)
			}
		})
	}
}
