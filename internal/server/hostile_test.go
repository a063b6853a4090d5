package server_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// uiPaths are the dashboard's pages (internal/web), behind web.Prefix.
var uiPaths = []string{
	"/ui/login", "/ui/logout", "/ui/status.json", "/ui/devices", "/ui/devices/1", "/ui/devices/label",
	"/ui/profiles", "/ui/profiles/1", "/ui/labels", "/ui/labels/delete", "/ui/alerts", "/ui/alerts/rules",
	"/ui/alerts/rules/new", "/ui/alerts/rules/1", "/ui/alerts/rules/1/delete", "/ui/alerts/deliveries",
	"/ui/settings", "/ui/static/", "/ui/static/app.css",
}

// hostileSuffixes are appended to every prefix, as raw request-target bytes.
var hostileSuffixes = []string{
	"", "/", "//", "///x", "/.", "/..", "/../..", "/%2e", "/%2e%2e", "/%2E%2E/%2e%2e/etc/passwd",
	"/%c0%ae%c0%ae/%c0%ae%c0%ae/etc/passwd", "/%c0%af", "/%e0%80%ae%e0%80%ae/", "/%c1%9c", "/..%2f..%2fetc%2fpasswd",
	"/..%5c..%5cwindows", "\\..\\..\\etc\\passwd", "/%5c", "/%00", "/a%00b", "/%ff%fe", "/\xff\xfe", "/\xc0\xae\xc0\xae/",
	"/%ed%a0%80", "/%f4%90%80%80", "/%25", "/%", "/%zz", "/%u002e", "/?", "/?%ff=%00&a=%c0%ae", "/;jsessionid=x",
	"/" + strings.Repeat("a", 6000), "/" + strings.Repeat("b", 20000), // the second beyond the header limit: 431 "/" + strings.Repeat("%2e%2e/", 800), "/" + strings.Repeat("x/", 2000),
	"/-1", "/0", "/18446744073709551616", "/1e9", "/0x10", "/%20", "/+", "/\t", "/app.css/", "/./app.css",
	"/static", "/%2fetc%2fpasswd", "//etc/passwd", "/favicon.svg%00.png", "/..;/", "/%3f", "/%23", "#frag",
}

// Every hostile path on every route, by every method, authenticated or not,
// gets an answer below 500 and never a directory listing.
func TestHostilePaths(t *testing.T) {
	s := servertest.Start(t, servertest.Options{HTTP: true})
	addr := strings.TrimPrefix(s.HTTPURL, "http://")
	session := dashboardSession(t, s)
	auths := []struct{ name, header string }{
		{"anonymous", ""},
		{"admin token", "Authorization: Bearer " + s.AdminToken + "\r\n"},
		{"dashboard session", "Cookie: " + session + "\r\n"},
	}
	listing := regexp.MustCompile(`(?i)<pre>\s*<a href=|index of /`)
	var conn net.Conn
	var rd *bufio.Reader
	requests := 0
	for _, prefix := range append(server.RoutePaths(), uiPaths...) {
		for _, suffix := range hostileSuffixes {
			target := prefix + suffix
			if strings.HasSuffix(prefix, "/") && strings.HasPrefix(suffix, "/") {
				target = prefix + suffix[1:] // and with the doubled slash below
			}
			targets := []string{target}
			if target != prefix+suffix {
				targets = append(targets, prefix+suffix)
			}
			for _, target := range targets {
				for _, method := range []string{"GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"} {
					for i, a := range auths {
						if i > 0 && method != "GET" && method != "POST" && (i != 1 || method == "HEAD" || method == "OPTIONS") {
							continue // every method anonymous; GET and POST also logged in; PUT, DELETE, PATCH with the admin token
						}
						if conn == nil {
							var err error
							if conn, err = net.DialTimeout("tcp", addr, 5*time.Second); err != nil {
								t.Fatal(err)
							}
							rd = bufio.NewReader(conn)
						}
						body := `{"seq":1,"state":{}}`
						req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
							method, target, addr, a.header, len(body), body)
						conn.SetDeadline(time.Now().Add(30 * time.Second))
						if _, err := io.WriteString(conn, req); err != nil {
							t.Fatalf("%s %q: %v", method, target, err)
						}
						resp, err := http.ReadResponse(rd, &http.Request{Method: method})
						if err != nil {
							t.Fatalf("%s %q (%s): no answer: %v", method, target, a.name, err)
						}
						out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
						resp.Body.Close()
						requests++
						if resp.StatusCode >= 500 {
							t.Errorf("%s %q (%s): %d %s", method, target, a.name, resp.StatusCode, out)
						}
						if strings.HasPrefix(prefix, "/ui/static/") && listing.Match(out) {
							t.Errorf("%s %q (%s): directory listing: %s", method, target, a.name, out)
						}
						if resp.Close {
							conn.Close()
							conn = nil
						}
					}
				}
			}
		}
	}
	if conn != nil {
		conn.Close()
	}
	t.Logf("%d requests", requests)
	// The two findings, exactly.
	for target, want := range map[string]int{
		"/ui/static/%c0%ae%c0%ae/%c0%ae%c0%ae/etc/passwd": 404,
		"/ui/static/":        404,
		"/ui/static/app.css": 200,
	} {
		resp, err := http.Get(s.HTTPURL + target)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || want == 404 && strings.Contains(string(b), "app.") {
			t.Errorf("GET %s: %d %q, want %d", target, resp.StatusCode, b, want)
		}
	}
}

// dashboardSession logs in to the dashboard and returns the Cookie header value.
func dashboardSession(t *testing.T, s *servertest.Server) string {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(s.HTTPURL + "/ui/login")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("login form without csrf: %s", b)
	}
	resp, err = c.PostForm(s.HTTPURL+"/ui/login", url.Values{"csrf": {string(m[1])}, "username": {"admin"}, "password": {s.AdminToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	u, _ := url.Parse(s.HTTPURL + "/ui/")
	var parts []string
	for _, ck := range jar.Cookies(u) {
		parts = append(parts, ck.Name+"="+ck.Value)
	}
	if resp.StatusCode != http.StatusSeeOther || len(parts) == 0 {
		t.Fatalf("login: %d, cookies %v", resp.StatusCode, parts)
	}
	return strings.Join(parts, "; ")
}
