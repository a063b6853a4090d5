package alert_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
)

// A quota rule raises for a device refused with 429 and clears once the
// device has hit no quota for the rule's seconds.
func TestQuotaRule(t *testing.T) {
	ctx := context.Background()
	clk := &clock{t: time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)}
	fl, err := fleet.New(ctx, fleet.Stores{}, nil, fleet.Options{EnrollmentSecret: "s", DefaultPushInterval: 60, Now: clk.now,
		Quotas: fleet.QuotaOptions{PushRate: 1, PushBurst: 1}})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := alert.New(ctx, alert.Options{Fleet: fl, Store: alert.NewMemStore(), Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, clk: clk, fleet: fl, eng: eng, tokens: map[string]string{}, ids: map[string]uint64{}, seq: map[string]uint64{}}
	e.register("a", "ICR")
	e.register("b", "ICR")
	e.rule(alert.Rule{Name: "abuse", Kind: alert.Quota, Seconds: 600})
	e.push("a", 0, `{"uptime":1}`)
	e.push("b", 0, `{"uptime":1}`)
	if _, err := fl.Push(ctx, e.tokens["a"], protocol.PushRequest{Seq: 9}); !errors.Is(err, fleet.ErrQuota) {
		t.Fatalf("second push within the interval: %v", err)
	}
	e.eng.Check(clk.now())
	e.wantActive("abuse/a")
	clk.add(5 * time.Minute)
	e.eng.Check(clk.now())
	e.wantActive("abuse/a")
	clk.add(6 * time.Minute)
	e.eng.Check(clk.now())
	e.wantActive()
	r := e.rule(alert.Rule{Name: "q2", Kind: alert.Quota})
	if r.Seconds != 900 || r.Summary() != "hit a quota within 15m0s" {
		t.Fatalf("defaults: %+v %q", r, r.Summary())
	}
}
