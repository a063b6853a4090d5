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
	// At once: b reads the rollouts back before it takes a change of a
	// label's values, so none slips in before the change log reaches it.
	if st, body := b.do("PUT", "/api/v1/labels/cr/config", adminToken, `{"values":{"x":9}}`); st != 409 {
		t.Fatalf("b took a change of the staged values: %d %s", st, body)
	}
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
	for _, path := range []string{"/api/v1/profiles/" + prof + "/rollout?dry_run=1", "/api/v1/profiles/" + prof + "/rollout"} {
		if st, body := b.do("POST", path, adminToken, `{"config":{"p":3},"waves":["100%"]}`); st != 409 {
			t.Fatalf("b took a second rollout of the staged profile (%s): %d %s", path, st, body)
		}
	}
	if st, body := b.do("PATCH", "/api/v1/profiles/"+prof, adminToken, `{"config":{"p":9}}`); st != 409 {
		t.Fatalf("b took a change of the staged profile: %d %s", st, body)
	}
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

// TestClusterStagedRefusedBeforeReadBack: b refuses a change of what a
// rollout started on a stages, a label's values or a profile's
// configuration, even before the change log reaches b (NATS down: no
// nudge, b reads the log every 250 ms): b reads the rollouts back first.
func TestClusterStagedRefusedBeforeReadBack(t *testing.T) {
	t.Parallel()
	dsn := dbtest.Need(t, dbtest.Postgres, pg).NewDB(t)
	nats := startNATS(t)
	a := startNode(t, "a", dsn, nats.url())
	b := startNode(t, "b", dsn, nats.url())
	d1 := registerAs(t, a, "m-staged-rb-1", "SEAM-SRB", "1.0")
	d2 := registerAs(t, a, "m-staged-rb-2", "SEAM-SRB2", "1.0")
	for _, rq := range []struct{ method, path, body string }{
		{"POST", "/api/v1/labels/assign", `{"label":"srb","filter":{"q":"m-staged-rb-1"}}`},
		{"PUT", "/api/v1/labels/srb/config", `{"values":{"x":1}}`},
	} {
		if st, body := a.do(rq.method, rq.path, adminToken, rq.body); st != 200 {
			t.Fatalf("%s %s on a: %d %s", rq.method, rq.path, st, body)
		}
	}
	// Each device pushes and applies what it is sent: a rollout takes
	// the devices that have pushed.
	for _, d := range []registration{d1, d2} {
		if st, ans := pushAt(t, a, d.Token, 0); st != 200 {
			t.Fatalf("push of %s: %d", d.DeviceID, st)
		} else if ans.Config != nil {
			pushAt(t, a, d.Token, ans.Config.Version)
		}
	}
	prof := deviceProfile(t, a, d2.DeviceID)
	within(t, converge, "b knows the label's values, the devices and the profile", func() bool {
		st, _ := b.do("GET", "/api/v1/labels/srb/config", adminToken, "")
		return st == 200 && deviceProfile(t, b, d1.DeviceID) != "" && deviceProfile(t, b, d2.DeviceID) == prof
	})
	nats.stop()

	if st, body := a.do("POST", "/api/v1/labels/srb/config/rollout", adminToken, `{"values":{"x":2},"waves":["1","100%"]}`); st != 201 {
		t.Fatalf("configuration rollout on a: %d %s", st, body)
	}
	// Each first call on b after a's rollout is the one that must read it
	// back: a second rollout of the label, then a change of its values.
	if st, body := b.do("POST", "/api/v1/labels/srb/config/rollout", adminToken, `{"values":{"x":3},"waves":["100%"]}`); st != 409 {
		t.Fatalf("b started a second rollout of the staged values: %d %s", st, body)
	}
	if st, body := b.do("PUT", "/api/v1/labels/srb/config", adminToken, `{"values":{"x":9}}`); st != 409 {
		t.Fatalf("b took a change of the staged values: %d %s", st, body)
	}
	if st, body := a.do("POST", "/api/v1/profiles/"+prof+"/rollout", adminToken, `{"config":{"p":1},"waves":["1","100%"]}`); st != 201 {
		t.Fatalf("profile rollout on a: %d %s", st, body)
	}
	if st, body := b.do("PATCH", "/api/v1/profiles/"+prof, adminToken, `{"config":{"p":9}}`); st != 409 {
		t.Fatalf("b took a change of the staged profile: %d %s", st, body)
	}
}
