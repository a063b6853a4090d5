package storetest

// Conformance of the rollout policies (fleet.PolicyStore): at the store
// level and through fleet.Service across a restart.

import (
	"reflect"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

func init() {
	storeTests = append(storeTests, storeTest{"RolloutPolicyRoundTrip", testRolloutPolicyRoundTrip})
	serviceTests = append(serviceTests, serviceTest{"RolloutPolicyRestart", svcRolloutPolicyRestart})
}

func testRolloutPolicyRoundTrip(t *testing.T, h *handle) {
	ctx := testCtx(t)
	ps := policyStore(t, h.store)
	if d := loadPolicy(t, h.store); len(d.RolloutPolicies) != 0 {
		t.Fatalf("empty store: %+v", d.RolloutPolicies)
	}
	at := time.UnixMilli(1_700_000_000_123).UTC()
	slow := fleet.RolloutPolicy{Name: "slow", RolloutPlan: fleet.RolloutPlan{Waves: []string{"1", "5%", "100%"}, MaxFailurePct: 2.5, MaxDownloads: 10,
		Window: &fleet.Window{Start: "22:00", End: "04:00"}, StallTimeout: 600}, UpdatedAt: at, By: "alice"}
	fast := fleet.RolloutPolicy{Name: "fast", RolloutPlan: fleet.RolloutPlan{Waves: []string{"100%"}, MaxFailurePct: 50, MaxDownloads: 500, StallTimeout: 60}, UpdatedAt: at}
	for _, p := range []fleet.RolloutPolicy{slow, fast} {
		if err := ps.SaveRolloutPolicy(ctx, p); err != nil {
			t.Fatalf("save %s: %v", p.Name, err)
		}
	}
	// An upsert replaces the policy of the same name.
	slow.MaxFailurePct, slow.Window = 5, nil
	if err := ps.SaveRolloutPolicy(ctx, slow); err != nil {
		t.Fatalf("replace: %v", err)
	}
	s := h.reopen()
	if d := loadPolicy(t, s); !reflect.DeepEqual(d.RolloutPolicies, []fleet.RolloutPolicy{fast, slow}) {
		t.Fatalf("rollout policies %+v, want %+v", d.RolloutPolicies, []fleet.RolloutPolicy{fast, slow})
	}
	if err := policyStore(t, s).DeleteRolloutPolicy(ctx, "fast"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if err := policyStore(t, s).DeleteRolloutPolicy(ctx, "missing"); err != nil {
		t.Fatalf("delete missing: %v", err)
	}
	if d := loadPolicy(t, h.reopen()); !reflect.DeepEqual(d.RolloutPolicies, []fleet.RolloutPolicy{slow}) {
		t.Fatalf("after delete: %+v", d.RolloutPolicies)
	}
}

// A rollout policy set through the Service is there after a restart; a
// deleted one is gone.
func svcRolloutPolicyRestart(t *testing.T, e *env) {
	p := fleet.DefaultRolloutPolicy("canary")
	p.Waves = []string{"2", "50%"}
	set, _, err := e.svc.SetRolloutPolicy(e.ctx, p, "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.svc.SetRolloutPolicy(e.ctx, fleet.DefaultRolloutPolicy("gone"), "alice", false); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.DeleteRolloutPolicy(e.ctx, "gone", "alice", false); err != nil {
		t.Fatal(err)
	}
	e.restart()
	if got := e.svc.RolloutPolicies(); !reflect.DeepEqual(got, []fleet.RolloutPolicy{set}) {
		t.Fatalf("after restart: %+v, want %+v", got, []fleet.RolloutPolicy{set})
	}
}
