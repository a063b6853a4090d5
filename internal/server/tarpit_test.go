package server_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// conn is a client on one keep-alive connection.
type conn struct {
	t     *testing.T
	s     *servertest.Server
	token string
	cl    *http.Client
}

func newConn(t *testing.T, s *servertest.Server, token string) *conn {
	tr := s.HTTPTransport().Clone()
	tr.MaxConnsPerHost = 1
	t.Cleanup(tr.CloseIdleConnections)
	return &conn{t: t, s: s, token: token, cl: &http.Client{Transport: tr}}
}

// push pushes seq and returns the status and whether the server closes the
// connection.
func (c *conn) push(seq int) (int, bool) {
	req, _ := http.NewRequest("POST", c.s.URL+"/api/v1/push", strings.NewReader(fmt.Sprintf(state, seq, 0)))
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.cl.Do(req)
	if err != nil {
		c.t.Error(err)
		return 0, false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 429 && (!strings.Contains(string(body), `"code":"quota_exceeded"`) || resp.Header.Get("Retry-After") == "") {
		c.t.Errorf("429 without its body or Retry-After: %q %v", body, resp.Header)
	}
	return resp.StatusCode, resp.Close
}

// A push over quota on a connection whose last push was refused too is
// held; beyond heldPerDevice held connections of one device the refusal
// closes the connection; other devices are not affected.
func TestOverQuotaPushesAreHeld(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Quotas: true, Configure: func(c *server.Config) { c.QuotaHold = 3 * time.Second }})
	c := &client{t: t, s: s, url: s.URL}
	_, token := c.register("flood")
	_, honest := c.register("honest")
	answers := func(a string) float64 {
		return s.Metric("drover_push_quota_answers_total", map[string]string{"answer": a})
	}

	first := newConn(t, s, token)
	for i := range 6 { // the burst
		if st, _ := first.push(i + 1); st != 200 {
			t.Fatalf("push %d within the burst: %d", i+1, st)
		}
	}
	if st, _ := first.push(7); st != 429 || answers("at_once") != 1 || answers("held") != 0 {
		t.Fatalf("first push over quota: %d, at_once %v held %v", st, answers("at_once"), answers("held"))
	}
	if st, closed := first.push(8); st != 429 || closed || answers("held") != 1 {
		t.Fatalf("second push over quota on the connection: %d closed %v, held %v", st, closed, answers("held"))
	}

	// Six connections, each refused once; then all push again at once:
	// four are held, two closed.
	conns := make([]*conn, 6)
	for i := range conns {
		conns[i] = newConn(t, s, token)
		if st, _ := conns[i].push(100 + i); st != 429 {
			t.Fatalf("connection %d: %d", i, st)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	closed := 0
	for i, cn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, cl := cn.push(200 + i)
			mu.Lock()
			defer mu.Unlock()
			if st != 429 {
				t.Errorf("connection %d: %d", i, st)
			}
			if cl {
				closed++
			}
		}()
	}
	// Meanwhile another device pushes as usual.
	if st, _, out := c.do("POST", "/api/v1/push", honest, fmt.Sprintf(state, 1, 0)); st != 200 {
		t.Errorf("honest device: %d %v", st, out)
	}
	wg.Wait()
	if closed != 2 || answers("closed") != 2 || answers("held") != 5 || answers("at_once") != 7 {
		t.Fatalf("%d connections closed; answers at_once %v, held %v, closed %v", closed, answers("at_once"), answers("held"), answers("closed"))
	}
	// Every refusal is counted as before.
	if v := s.Metric("drover_pushes_total", map[string]string{"outcome": "quota"}); v != 14 {
		t.Errorf("quota pushes counted %v, want 14", v)
	}
}
