package server_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// On the defaults, a device pushing in a loop gets 429 with Retry-After,
// is counted and listed, and an operator can lift and restore its quota.
// Its refusals are not held (tarpit_test.go tests holding).
func TestPushQuotaOverHTTP(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Quotas: true, Configure: func(c *server.Config) { c.QuotaHold = 0 }})
	c := &client{t: t, s: s, url: s.URL}
	id, token := c.register("m-1")
	_, otherToken := c.register("m-2")
	accepted, refused := 0, 0
	var retryAfter string
	for i := range 20 {
		st, h, out := c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, i+1, 0))
		switch st {
		case 200:
			accepted++
		case 429:
			refused++
			e := out["error"].(map[string]any)
			if e["code"] != "quota_exceeded" {
				t.Fatalf("429 body %v", out)
			}
			retryAfter = h.Get("Retry-After")
		default:
			t.Fatalf("push %d: %d %v", i+1, st, out)
		}
	}
	// Default burst 6: the interval (200 s) is far away for the rest.
	if accepted != 6 || refused != 14 {
		t.Fatalf("%d accepted, %d refused", accepted, refused)
	}
	if n, err := strconv.Atoi(retryAfter); err != nil || n < 95 || n > 100 {
		t.Fatalf("Retry-After %q, want about 100 s (half the 200 s interval)", retryAfter)
	}
	if v := s.Metric("drover_pushes_total", map[string]string{"outcome": "quota"}); v != 14 {
		t.Errorf("quota pushes counted %v", v)
	}
	if v := s.Metric("drover_quota_hits_total", map[string]string{"reason": "push_rate"}); v != 14 {
		t.Errorf("push_rate hits %v", v)
	}
	if v := s.Metric("drover_request_errors_total", map[string]string{"endpoint": "push", "status": "429", "code": "quota_exceeded"}); v != 14 {
		t.Errorf("429 counted %v", v)
	}
	// Another device is not affected.
	if st, _, out := c.do("POST", "/api/v1/push", otherToken, fmt.Sprintf(state, 1, 0)); st != 200 {
		t.Fatalf("other device: %d %v", st, out)
	}
	// The device's stored seq is the last accepted one.
	if st, _, out := c.do("GET", "/api/v1/devices/"+id, s.AdminToken, nil); st != 200 || out["seq"] != 6.0 {
		t.Fatalf("device after refusals: %d %v", st, out)
	}
	st, _, out := c.do("GET", "/api/v1/quotas", s.AdminToken, nil)
	devs, _ := out["devices"].([]any)
	if st != 200 || len(devs) != 1 || devs[0].(map[string]any)["device_id"] != id {
		t.Fatalf("quotas: %d %v", st, out)
	}
	st, _, out = c.do("GET", "/api/v1/devices?quota=push_rate", s.AdminToken, nil)
	if list, _ := out["devices"].([]any); st != 200 || len(list) != 1 {
		t.Fatalf("devices?quota=push_rate: %d %v", st, out)
	}
	if st, _, _ := c.do("GET", "/api/v1/devices?quota=bogus", s.AdminToken, nil); st != 400 {
		t.Fatalf("quota=bogus: %d", st)
	}

	// Lift: pushes go through; bad input is refused.
	if st, _, _ := c.do("PUT", "/api/v1/devices/"+id+"/quota", s.AdminToken, `{"until":"2001-01-01T00:00:00Z"}`); st != 400 {
		t.Fatalf("lift into the past: %d", st)
	}
	if st, _, _ := c.do("PUT", "/api/v1/devices/999/quota", s.AdminToken, `{}`); st != 404 {
		t.Fatalf("lift of unknown device: %d", st)
	}
	if st, _, _ := c.do("PUT", "/api/v1/devices/"+id+"/quota", "", `{}`); st != 401 {
		t.Fatalf("lift without admin token: %d", st)
	}
	until := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if st, _, out := c.do("PUT", "/api/v1/devices/"+id+"/quota", s.AdminToken, `{"until":"`+until+`","note":"lab unit"}`); st != 200 {
		t.Fatalf("lift: %d %v", st, out)
	}
	for i := range 10 {
		if st, _, out := c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 100+i, 0)); st != 200 {
			t.Fatalf("lifted push %d: %d %v", i, st, out)
		}
	}
	if st, _, out := c.do("GET", "/api/v1/devices/"+id+"/quota", s.AdminToken, nil); st != 200 || out["lifted"] != true || out["lifted_until"] == nil {
		t.Fatalf("device quota: %d %v", st, out)
	}
	if st, _, out := c.do("DELETE", "/api/v1/devices/"+id+"/quota", s.AdminToken, nil); st != 200 {
		t.Fatalf("restore: %d %v", st, out)
	}
	if st, _, _ := c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 200, 0)); st != 429 {
		t.Fatalf("after restore: %d", st)
	}
}
