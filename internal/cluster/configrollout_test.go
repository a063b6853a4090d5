package cluster_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/dbtest"
)

// TestSeamClusterConfigRollouts: a label's new values staged as a
// rollout on A hold on B: B refuses other changes of the label's values,
// a push on B gives the new values to the canary only, the canary's
// apply taken by B ends the wave that A drives, and the other device
// then gets them on B; abort on B gives both the previous values.
func TestSeamClusterConfigRollouts(t *testing.T) {
	dsn := dbtest.Need(t, dbtest.Postgres, pg).NewDB(t)
	nats := startNATS(t)
	a := startNode(t, "a", dsn, nats.url(), "--rollout-interval", "200ms")
	b := startNode(t, "b", dsn, nats.url(), "--rollout-interval", "200ms")
	devs := []registration{registerAs(t, a, "m-seam-cr-1", "SEAM-CR", "1.0"), registerAs(t, a, "m-seam-cr-2", "SEAM-CR", "1.0")}
	applied := []int64{0, 0}
	// x pushes device i on n with what it applied, applies the answer's
	// configuration and returns its x ("" when the answer has none).
	x := func(n *node, i int) string {
		t.Helper()
		st, ans := pushAt(t, n, devs[i].Token, applied[i])
		if st != 200 {
			t.Fatalf("push of %s on %s: %d", devs[i].DeviceID, n.name, st)
		}
		if ans.Config == nil {
			return ""
		}
		applied[i] = ans.Config.Version
		var v struct{ X json.Number }
		json.Unmarshal(ans.Config.Data, &v)
		return v.X.String()
	}
	for i := range devs {
		within(t, converge, "b knows the device", func() bool { st, _ := pushAt(t, b, devs[i].Token, 0); return st == 200 })
	}
	for _, rq := range []struct{ method, path, body string }{
		{"POST", "/api/v1/labels/assign", `{"label":"cr","filter":{"q":"m-seam-cr-"}}`},
		{"PUT", "/api/v1/labels/cr/config", `{"values":{"x":1}}`},
	} {
		if st, body := a.do(rq.method, rq.path, adminToken, rq.body); st != 200 {
			t.Fatalf("%s %s on a: %d %s", rq.method, rq.path, st, body)
		}
	}
	for i := range devs {
		within(t, 5*time.Second, "b sends the label's values", func() bool { return x(b, i) == "1" })
		x(b, i) // reports it applied
	}
	for i := range devs {
		if got := x(a, i); got != "" { // seen on a too, in sync
			t.Fatalf("a sent %s x=%s", devs[i].DeviceID, got)
		}
	}
	st, body := a.do("POST", "/api/v1/labels/cr/config/rollout", adminToken, `{"values":{"x":2},"waves":["1","100%"]}`)
	var ro rolloutView
	if st != 201 || json.Unmarshal(body, &ro) != nil || ro.Kind != fleet.RolloutConfig || ro.Total != 2 {
		t.Fatalf("configuration rollout on a: %d %s", st, body)
	}
	within(t, converge, "b refuses other changes of the staged values", func() bool {
		st, _ := b.do("PUT", "/api/v1/labels/cr/config", adminToken, `{"values":{"x":9}}`)
		return st == 409
	})
	var canary int
	within(t, 10*time.Second, "b knows wave 1", func() bool {
		st, body := b.do("GET", fmt.Sprintf("/api/v1/rollouts/%d/devices", ro.ID), adminToken, "")
		var page struct{ Devices []fleet.RolloutDevice }
		if st != 200 || json.Unmarshal(body, &page) != nil || len(page.Devices) != 1 {
			return false
		}
		canary = map[bool]int{true: 0, false: 1}[fmt.Sprint(page.Devices[0].DeviceID) == devs[0].DeviceID]
		return true
	})
	other := 1 - canary
	if got := x(b, other); got != "" {
		t.Fatalf("wave 1: the other device got x=%s on b", got)
	}
	if got := x(b, canary); got != "2" {
		t.Fatalf("wave 1: the canary got x=%q on b", got)
	}
	x(b, canary) // applied, on b
	within(t, 10*time.Second, "wave 2 after the canary's apply on b", func() bool { return x(b, other) == "2" })
	x(b, other)
	within(t, 10*time.Second, "done on a", func() bool {
		v := getRollout(t, a, ro.ID)
		return v.State == fleet.RolloutDone && v.Counts[fleet.DeviceVerified] == 2
	})

	// Abort on b: both devices get the previous values.
	st, body = a.do("POST", "/api/v1/labels/cr/config/rollout", adminToken, `{"values":{"x":3},"waves":["1","100%"]}`)
	if st != 201 || json.Unmarshal(body, &ro) != nil {
		t.Fatalf("second rollout on a: %d %s", st, body)
	}
	within(t, 10*time.Second, "b knows the second rollout", func() bool { return getRollout(t, b, ro.ID).Wave == 1 })
	if st, body := b.do("POST", fmt.Sprintf("/api/v1/rollouts/%d/abort", ro.ID), adminToken, ""); st != 200 || !strings.Contains(string(body), `"aborted"`) {
		t.Fatalf("abort on b: %d %s", st, body)
	}
	within(t, converge, "a knows the abort", func() bool { return getRollout(t, a, ro.ID).State == fleet.RolloutAborted })
	for i := range devs {
		within(t, converge, "a sends the previous values", func() bool { return x(a, i) == "2" })
		st, body := a.do("GET", "/api/v1/devices/"+devs[i].DeviceID+"/config/effective", adminToken, "")
		if st != 200 || !strings.Contains(string(body), `"config":{"x":2}`) {
			t.Fatalf("effective configuration of %s on a after abort: %d %s", devs[i].DeviceID, st, body)
		}
		x(a, i) // applied
	}

	// The profile's configuration staged on a: b refuses other changes of
	// it and sends it to the canary only.
	prof := deviceProfile(t, a, devs[0].DeviceID)
	st, body = a.do("POST", "/api/v1/profiles/"+prof+"/rollout", adminToken, `{"config":{"p":1},"waves":["1","100%"]}`)
	if st != 201 || json.Unmarshal(body, &ro) != nil {
		t.Fatalf("profile rollout on a: %d %s", st, body)
	}
	within(t, converge, "b refuses other changes of the staged profile", func() bool {
		st, _ := b.do("PATCH", "/api/v1/profiles/"+prof, adminToken, `{"config":{"p":9}}`)
		return st == 409
	})
	within(t, 10*time.Second, "b knows wave 1 of the profile rollout", func() bool { return getRollout(t, b, ro.ID).Wave == 1 })
	st, body = b.do("GET", fmt.Sprintf("/api/v1/rollouts/%d/devices", ro.ID), adminToken, "")
	var page struct{ Devices []fleet.RolloutDevice }
	if st != 200 || json.Unmarshal(body, &page) != nil || len(page.Devices) != 1 {
		t.Fatalf("wave 1 of the profile rollout on b: %d %s", st, body)
	}
	canary = map[bool]int{true: 0, false: 1}[fmt.Sprint(page.Devices[0].DeviceID) == devs[0].DeviceID]
	if _, ans := pushAt(t, b, devs[1-canary].Token, applied[1-canary]); ans.Config != nil {
		t.Fatalf("the device not released got %s on b", ans.Config.Data)
	}
	within(t, converge, "b sends the canary the profile's new configuration", func() bool {
		_, ans := pushAt(t, b, devs[canary].Token, applied[canary])
		return ans.Config != nil && strings.Contains(string(ans.Config.Data), `"p":1`)
	})
}
