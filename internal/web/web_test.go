package web_test

import (
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/sessions"
	"github.com/drover/drover/internal/web"
	"golang.org/x/crypto/bcrypt"
)

const token = "admin-token-for-tests"

type site struct {
	t      *testing.T
	srv    *httptest.Server
	c      *http.Client
	fleet  *fleet.Service
	eng    *alert.Engine
	ready  atomic.Pointer[error]
	acc    *access.Service
	audit  []audited // Options.Audit's records
	tokens []string
	opts   web.Options
}

func newSite(t *testing.T, devices int) *site {
	t.Helper()
	ctx := context.Background()
	fl, err := fleet.New(ctx, fleet.Stores{}, nil, fleet.Options{EnrollmentSecret: "s", DefaultPushInterval: 60})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := alert.New(ctx, alert.Options{Fleet: fl})
	if err != nil {
		t.Fatal(err)
	}
	s := &site{t: t, fleet: fl, eng: eng, acc: access.New(access.Options{AdminToken: token, BcryptCost: bcrypt.MinCost})}
	s.opts = web.Options{Fleet: fl, Alerts: eng, AdminToken: token, Access: s.acc, Audit: s.recordAudit, Ready: func() error {
		if e := s.ready.Load(); e != nil {
			return *e
		}
		return nil
	}, Sessions: sessions.NewMem()}
	h, err := web.New(s.opts)
	if err != nil {
		t.Fatal(err)
	}
	s.srv = httptest.NewServer(h)
	t.Cleanup(s.srv.Close)
	jar, _ := cookiejar.New(nil)
	s.c = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for i := range devices {
		typ := "ICR-3241"
		if i%3 == 0 {
			typ = "ICR-4461"
		}
		r, err := fl.Register(ctx, protocol.RegisterRequest{MachineID: fmt.Sprintf("m-%04d", i), DeviceType: typ, Firmware: "6.3.5",
			Serial: fmt.Sprintf("SN%04d", i), EnrollmentSecret: "s"})
		if err != nil {
			t.Fatal(err)
		}
		s.tokens = append(s.tokens, r.Token)
		if i%2 == 0 {
			s.push(i, 0, fmt.Sprintf(`{"uptime":%d,"cpu":%d,"temperature":45,"interfaces":[{"name":"wwan0","rx_bytes":1000,"tx_bytes":500}],"signal":{"rssi":-70}}`, 100+i, i%100))
		}
	}
	return s
}

func (s *site) push(i int, applied int64, state string) {
	s.t.Helper()
	req, err := protocol.DecodePush([]byte(fmt.Sprintf(`{"seq":1,"config_version":%d,"state":%s}`, applied, state)))
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.fleet.Push(context.Background(), s.tokens[i], req); err != nil {
		s.t.Fatal(err)
	}
}

func (s *site) get(path string) (int, http.Header, string) {
	s.t.Helper()
	resp, err := s.c.Get(s.srv.URL + path)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func (s *site) post(path string, form url.Values, hdr map[string]string) (int, http.Header, string) {
	s.t.Helper()
	req, _ := http.NewRequest("POST", s.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := s.c.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t *testing.T, body string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF field in:\n%s", body)
	}
	return m[1]
}

// login logs in and returns the session's CSRF token.
func (s *site) login() string {
	s.t.Helper()
	_, _, body := s.get("/ui/login")
	st, hdr, _ := s.post("/ui/login", url.Values{"csrf": {csrfOf(s.t, body)}, "username": {"admin"}, "password": {token}, "next": {"/ui/devices"}}, nil)
	if st != http.StatusSeeOther || hdr.Get("Location") != "/ui/devices" {
		s.t.Fatalf("login: %d %v", st, hdr)
	}
	_, _, body = s.get("/ui/")
	return csrfOf(s.t, body)
}

func TestLoginSessionAndHeaders(t *testing.T) {
	s := newSite(t, 3)
	st, hdr, _ := s.get("/ui/devices?q=x")
	if st != http.StatusSeeOther || hdr.Get("Location") != "/ui/login?next=%2Fui%2Fdevices%3Fq%3Dx" {
		t.Fatalf("anonymous: %d %v", st, hdr.Get("Location"))
	}
	st, hdr, body := s.get("/ui/login")
	if st != 200 {
		t.Fatalf("login page %d", st)
	}
	for k, want := range map[string]string{
		"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "Cache-Control": "no-store",
	} {
		if hdr.Get(k) != want {
			t.Errorf("%s: %q", k, hdr.Get(k))
		}
	}
	if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") ||
		!strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("CSP %q", csp)
	}
	if strings.Contains(body, "<script>") || strings.Contains(body, "style=") || strings.Contains(body, "http://") && !strings.Contains(body, "xmlns") {
		t.Errorf("login page has inline script, inline style or an external URL")
	}
	csrf := csrfOf(t, body)

	// Wrong CSRF, then wrong token, then cross-origin.
	if st, _, _ := s.post("/ui/login", url.Values{"csrf": {"forged"}, "password": {token}}, nil); st != http.StatusForbidden {
		t.Fatalf("forged login CSRF: %d", st)
	}
	_, _, body = s.get("/ui/login")
	csrf = csrfOf(t, body)
	if st, _, b := s.post("/ui/login", url.Values{"csrf": {csrf}, "password": {"nope"}}, nil); st != http.StatusUnauthorized || !strings.Contains(b, "Wrong user name or password") {
		t.Fatalf("wrong token: %d", st)
	}
	if st, _, _ := s.post("/ui/login", url.Values{"csrf": {csrf}, "password": {token}}, map[string]string{"Origin": "https://evil.example"}); st != http.StatusForbidden {
		t.Fatalf("cross-origin login: %d", st)
	}
	csrf = s.login()
	u, _ := url.Parse(s.srv.URL + "/ui/")
	var sess *http.Cookie
	for _, c := range s.c.Jar.Cookies(u) {
		if c.Name == "drover_session" {
			sess = c
		}
	}
	if sess == nil {
		t.Fatal("no session cookie")
	}
	// The jar hides attributes: check them on a fresh login's answer.
	req, _ := http.NewRequest("GET", s.srv.URL+"/ui/login", nil)
	resp, _ := http.DefaultClient.Do(req)
	lb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	form := url.Values{"csrf": {csrfOf(t, string(lb))}, "password": {token}}
	req, _ = http.NewRequest("POST", s.srv.URL+"/ui/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, c := range resp.Cookies() {
		req.AddCookie(c)
	}
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var setCookie string
	for _, v := range resp.Header.Values("Set-Cookie") {
		if strings.HasPrefix(v, "drover_session=") {
			setCookie = v
		}
	}
	if !strings.Contains(setCookie, "HttpOnly") || !strings.Contains(setCookie, "SameSite=Strict") || !strings.Contains(setCookie, "Path=/ui/") {
		t.Fatalf("session cookie %q", setCookie)
	}

	// POSTs need the session's CSRF token.
	if st, _, _ := s.post("/ui/labels", url.Values{"name": {"x"}}, nil); st != http.StatusForbidden {
		t.Fatalf("POST without CSRF: %d", st)
	}
	if st, _, _ := s.post("/ui/labels", url.Values{"name": {"x"}, "csrf": {csrf}}, map[string]string{"Sec-Fetch-Site": "cross-site"}); st != http.StatusForbidden {
		t.Fatalf("cross-site POST: %d", st)
	}
	if st, _, _ := s.post("/ui/labels", url.Values{"name": {"x"}, "csrf": {csrf}}, nil); st != http.StatusSeeOther {
		t.Fatalf("POST with CSRF: %d", st)
	}
	if st, _, _ := s.post("/ui/logout", url.Values{"csrf": {csrf}}, nil); st != http.StatusSeeOther {
		t.Fatalf("logout: %d", st)
	}
	if st, _, _ := s.get("/ui/"); st != http.StatusSeeOther {
		t.Fatalf("after logout: %d", st)
	}
	if st, _, _ := s.get("/ui/status.json"); st != http.StatusUnauthorized {
		t.Fatalf("status.json after logout: %d", st)
	}
}

func TestLoginThrottle(t *testing.T) {
	s := newSite(t, 0)
	for i := range 6 {
		_, _, body := s.get("/ui/login")
		st, _, _ := s.post("/ui/login", url.Values{"csrf": {csrfOf(t, body)}, "password": {"guess"}}, nil)
		want := http.StatusUnauthorized
		if i == 5 {
			want = http.StatusTooManyRequests
		}
		if st != want {
			t.Fatalf("attempt %d: %d, want %d", i+1, st, want)
		}
	}
	_, _, body := s.get("/ui/login")
	if st, _, _ := s.post("/ui/login", url.Values{"csrf": {csrfOf(t, body)}, "password": {token}}, nil); st != http.StatusTooManyRequests {
		t.Fatalf("right token while blocked: %d", st)
	}
}

func TestPages(t *testing.T) {
	s := newSite(t, 60)
	csrf := s.login()
	ctx := context.Background()

	// Overview: yellow (30 devices never pushed are not a problem; no
	// alerts yet) ... with an alert it turns yellow, with a store failure red.
	_, _, body := s.get("/ui/")
	if !strings.Contains(body, `class="status green"`) || !strings.Contains(body, "30 registered and not pushed yet") {
		t.Fatalf("overview not green:\n%s", body)
	}
	if _, err := s.eng.CreateRule(ctx, alert.Rule{Name: "hot", Kind: alert.TemperatureAbove, Threshold: 80}); err != nil {
		t.Fatal(err)
	}
	s.push(2, 0, `{"temperature":91}`)
	_, _, body = s.get("/ui/")
	if !strings.Contains(body, `class="status yellow"`) || !strings.Contains(body, "1 alert raised") || !strings.Contains(body, "temperature 91.0 °C above 80 °C") {
		t.Fatalf("overview with an alert:\n%s", body)
	}
	bad := errors.New("store failing: disk full")
	s.ready.Store(&bad)
	_, _, body = s.get("/ui/")
	if !strings.Contains(body, `class="status red"`) || !strings.Contains(body, "Service problem: store failing: disk full") {
		t.Fatalf("overview with a failing store:\n%s", body)
	}
	s.ready.Store(nil)

	// Devices: filter, sort, page.
	_, _, body = s.get("/ui/devices?device_type=ICR-4461&liveness=online&limit=25")
	if !strings.Contains(body, "<strong>10</strong> matching devices") || strings.Count(body, `<tr><td><a href="/ui/devices/`) != 10 {
		t.Fatalf("filtered devices:\n%s", body)
	}
	_, _, body = s.get("/ui/devices?q=m-0042")
	if !strings.Contains(body, "<strong>1</strong> matching devices") || !strings.Contains(body, ">m-0042<") {
		t.Fatalf("text filter:\n%s", body)
	}
	_, _, body = s.get("/ui/devices?sort=machine_id&dir=desc&limit=25")
	first := regexp.MustCompile(`class="mono">(m-\d+)<`).FindAllStringSubmatch(body, -1)
	if len(first) != 25 || first[0][1] != "m-0059" || first[24][1] != "m-0035" {
		t.Fatalf("sorted page: %v", first)
	}
	next := regexp.MustCompile(`href="([^"]+)" id="next"`).FindStringSubmatch(body)
	if next == nil {
		t.Fatal("no next page link")
	}
	_, _, body = s.get(strings.ReplaceAll(next[1], "&amp;", "&"))
	if m := regexp.MustCompile(`class="mono">(m-\d+)<`).FindStringSubmatch(body); m == nil || m[1] != "m-0034" {
		t.Fatalf("second page starts with %v", m)
	}
	if st, _, body := s.get("/ui/devices?sync_state=bogus"); st != 200 || !strings.Contains(body, "unknown sync state") {
		t.Fatalf("bad filter: %d", st)
	}

	// Label the filtered devices, then filter by the label.
	st, hdr, _ := s.post("/ui/devices/label", url.Values{"csrf": {csrf}, "device_type": {"ICR-4461"}, "label_name": {"north"}, "action": {"add"}}, nil)
	if st != http.StatusSeeOther || hdr.Get("Location") != "/ui/devices?device_type=ICR-4461" {
		t.Fatalf("label: %d %v", st, hdr)
	}
	_, _, body = s.get("/ui/devices?label=north")
	if !strings.Contains(body, "Label &#34;north&#34; added to 20 devices.") || !strings.Contains(body, "<strong>20</strong> matching") {
		t.Fatalf("labelled devices:\n%s", body)
	}
	_, _, body = s.get("/ui/labels")
	if !strings.Contains(body, ">north</a></td><td class=\"num\">20<") {
		t.Fatalf("labels page:\n%s", body)
	}

	// Device page with charts and alert history.
	_, _, body = s.get("/ui/devices/3")
	for _, want := range []string{"Device 3", "m-0002", `<svg class="chart"`, "Temperature (°C)", "Traffic", "Signal", "hot", "temperature 91.0 °C", "synchronized"} {
		if !strings.Contains(body, want) {
			t.Fatalf("device page lacks %q:\n%s", want, body)
		}
	}
	if st, _, _ := s.get("/ui/devices/999"); st != http.StatusNotFound {
		t.Fatalf("missing device: %d", st)
	}

	// Profiles: invalid JSON is refused, valid JSON raises the version.
	_, _, body = s.get("/ui/profiles")
	pid := regexp.MustCompile(`href="/ui/profiles/(\d+)">ICR-3241<`).FindStringSubmatch(body)
	if pid == nil {
		t.Fatalf("profiles:\n%s", body)
	}
	st, _, body = s.post("/ui/profiles/"+pid[1], url.Values{"csrf": {csrf}, "config": {`{"apn": `}, "push_interval": {"60"}}, nil)
	if st != http.StatusBadRequest || !strings.Contains(body, "not valid JSON") || !strings.Contains(body, `{&#34;apn&#34;: </textarea>`) {
		t.Fatalf("invalid JSON: %d\n%s", st, body)
	}
	if st, _, body := s.post("/ui/profiles/"+pid[1], url.Values{"csrf": {csrf}, "config": {`["x"]`}, "push_interval": {"60"}}, nil); st != 400 || !strings.Contains(body, "must be a JSON object") {
		t.Fatalf("array config: %d", st)
	}
	// The fleet's rules, with the fleet's messages (the API shows the same).
	big := `{"a":"` + strings.Repeat("x", fleet.MaxConfigBytes) + `"}`
	_, bigErr := fleet.NormalizeConfig([]byte(big))
	for _, tc := range []struct {
		config, interval string
		want             error
	}{
		{big, "60", bigErr},
		{`{"apn": "x"}`, "0", fleet.CheckPushInterval(0)},
		{`{"apn": "x"}`, "604801", fleet.CheckPushInterval(604801)},
	} {
		st, _, body := s.post("/ui/profiles/"+pid[1], url.Values{"csrf": {csrf}, "config": {tc.config}, "push_interval": {tc.interval}}, nil)
		if tc.want == nil || st != 400 || !strings.Contains(body, html.EscapeString(tc.want.Error())) {
			t.Fatalf("config %.20q, interval %s: %d, want 400 with %v", tc.config, tc.interval, st, tc.want)
		}
	}
	st, _, _ = s.post("/ui/profiles/"+pid[1], url.Values{"csrf": {csrf}, "config": {`{"apn": "iot.example"}`}, "push_interval": {"120"}}, nil)
	if st != http.StatusSeeOther {
		t.Fatalf("save profile: %d", st)
	}
	_, _, body = s.get("/ui/profiles/" + pid[1])
	if !strings.Contains(body, `<strong id="version">1</strong>`) || !strings.Contains(body, "Sync pending until they report it applied") ||
		!strings.Contains(body, "Devices sync pending") {
		t.Fatalf("saved profile:\n%s", body)
	}

	// Rules: a bad rule is refused with the reason; a good one is listed.
	st, _, body = s.post("/ui/alerts/rules", url.Values{"csrf": {csrf}, "name": {"cpu"}, "kind": {"cpu_above"}, "threshold": {"150"}}, nil)
	if st != http.StatusBadRequest || !strings.Contains(body, "threshold of cpu_above must be 0..100") {
		t.Fatalf("bad rule: %d\n%s", st, body)
	}
	st, _, _ = s.post("/ui/alerts/rules", url.Values{"csrf": {csrf}, "name": {"cpu"}, "kind": {"cpu_above"}, "threshold": {"90"}, "pushes": {"3"},
		"label": {"north"}, "severity": {"critical"}, "webhook": {"http://127.0.0.1:1/hook"}}, nil)
	if st != http.StatusSeeOther {
		t.Fatalf("rule: %d", st)
	}
	_, _, body = s.get("/ui/alerts/rules")
	if !strings.Contains(body, "CPU &gt; 90 % for 3 pushes") || !strings.Contains(body, "label north") {
		t.Fatalf("rules:\n%s", body)
	}
	for _, p := range []string{"/ui/alerts", "/ui/alerts/rules/new", "/ui/alerts/rules/1", "/ui/alerts/deliveries", "/ui/settings", "/ui/status.json",
		"/ui/static/app.css", "/ui/static/app.js", "/ui/static/favicon.svg"} {
		if st, _, body := s.get(p); st != 200 || len(body) < 100 {
			t.Fatalf("%s: %d %q", p, st, body)
		}
	}
	st, _, body = s.post("/ui/settings", url.Values{"csrf": {csrf}, "addr": {"mail.example:25"}, "from": {"not an address"}}, nil)
	if st != http.StatusBadRequest || !strings.Contains(body, "from:") {
		t.Fatalf("bad SMTP settings: %d", st)
	}
}

// A restart (a new Handler on the same session store) keeps operators
// logged in; the store holds the session ID's hash, not the ID.
func TestSessionsSurviveRestart(t *testing.T) {
	s := newSite(t, 1)
	csrf := s.login()
	if st, _, _ := s.get("/ui/devices"); st != http.StatusOK {
		t.Fatalf("devices after login: %d", st)
	}
	h, err := web.New(s.opts)
	if err != nil {
		t.Fatal(err)
	}
	s.srv.Config.Handler = h
	if st, hdr, _ := s.get("/ui/devices"); st != http.StatusOK {
		t.Fatalf("devices after a restart: %d %v", st, hdr)
	}
	u, _ := url.Parse(s.srv.URL + "/ui/")
	var id string
	for _, c := range s.c.Jar.Cookies(u) {
		if c.Name == "drover_session" {
			id = c.Value
		}
	}
	ctx := context.Background()
	if _, err := s.opts.Sessions.LoadSession(ctx, sessions.Hash(id)); err != nil {
		t.Fatalf("session by hash: %v", err)
	}
	if _, err := s.opts.Sessions.LoadSession(ctx, []byte(id)); !errors.Is(err, sessions.ErrNotFound) {
		t.Fatalf("session by its plain ID: %v; want not found", err)
	}
	// Logging out on the restarted handler ends it for good.
	if st, _, _ := s.post("/ui/logout", url.Values{"csrf": {csrf}}, nil); st != http.StatusSeeOther {
		t.Fatalf("logout: %d", st)
	}
	h, _ = web.New(s.opts)
	s.srv.Config.Handler = h
	if st, _, _ := s.get("/ui/devices"); st != http.StatusSeeOther {
		t.Fatalf("devices after logout and a restart: %d", st)
	}
}

// A dashboard session logged in with the admin token ends when the token
// is replaced (a rotated --admin-token-file and SIGHUP), and a login with
// the new token works; user sessions are not concerned.
func TestAdminTokenReplacedEndsItsSessions(t *testing.T) {
	s := newSite(t, 1)
	s.login()
	if st, _, _ := s.get("/ui/devices"); st != http.StatusOK {
		t.Fatalf("devices after login: %d", st)
	}
	s.acc.SetAdminToken(token + "-rotated")
	if st, _, _ := s.get("/ui/devices"); st == http.StatusOK {
		t.Fatalf("devices with a session of the replaced admin token: %d, want it ended", st)
	}
	_, _, body := s.get("/ui/login")
	st, hdr, _ := s.post("/ui/login", url.Values{"csrf": {csrfOf(t, body)}, "username": {"admin"}, "password": {token + "-rotated"}, "next": {"/ui/devices"}}, nil)
	if st != http.StatusSeeOther || hdr.Get("Location") != "/ui/devices" {
		t.Fatalf("login with the new admin token: %d %v", st, hdr)
	}
	if st, _, _ := s.get("/ui/devices"); st != http.StatusOK {
		t.Fatalf("devices after a login with the new admin token: %d", st)
	}
}
