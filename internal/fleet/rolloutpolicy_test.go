package fleet

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// Rollout policies: checked as an inline plan is, stored, read back after
// a restart; a rollout started by one copies its plan, which a later
// change or the deletion of the policy leaves alone.
func TestRolloutPolicies(t *testing.T) {
	ctx := context.Background()
	st := newPolStore()
	s := newQuotaService(t, st, QuotaOptions{}, newClock())
	r, err := s.Register(ctx, reg("a"))
	if err != nil {
		t.Fatal(err)
	}
	s.Push(ctx, r.Token, pushFW(1, 0, "6.3.5"))
	fw := addTestFirmware(t, s, "7.0.0")

	bad := func(mod func(p *RolloutPolicy), field string) {
		t.Helper()
		p := DefaultRolloutPolicy("p")
		mod(&p)
		var fe *FieldError
		if _, _, err := s.SetRolloutPolicy(ctx, p, "op", false); !errors.As(err, &fe) || fe.Field != field {
			t.Fatalf("%+v: %v, want a field error on %s", p, err, field)
		}
	}
	bad(func(p *RolloutPolicy) { p.Name = "" }, "name")
	bad(func(p *RolloutPolicy) { p.Name = "Upper" }, "name")
	bad(func(p *RolloutPolicy) { p.Name = "-x" }, "name")
	bad(func(p *RolloutPolicy) { p.Waves = nil }, "waves")
	bad(func(p *RolloutPolicy) { p.Waves = []string{"101%"} }, "waves")
	bad(func(p *RolloutPolicy) { p.MaxFailurePct = 101 }, "max_failure_pct")
	bad(func(p *RolloutPolicy) { p.MaxDownloads = 0 }, "max_downloads")
	bad(func(p *RolloutPolicy) { p.StallTimeout = 59 }, "stall_timeout")
	bad(func(p *RolloutPolicy) { p.Window = &Window{Start: "01:00", End: "01:00"} }, "window")
	if _, _, err := s.SetRolloutPolicy(ctx, DefaultRolloutPolicy("dry"), "op", true); err != nil {
		t.Fatal(err)
	}
	if len(s.RolloutPolicies()) != 0 || len(st.rps) != 0 {
		t.Fatalf("refused or dry-run policies kept: %+v", s.RolloutPolicies())
	}

	p := DefaultRolloutPolicy("canary-first")
	p.Waves, p.MaxFailurePct, p.Window = []string{"1", "25%"}, 3, &Window{Start: "22:00", End: "04:00"}
	got, isNew, err := s.SetRolloutPolicy(ctx, p, "op", false)
	if err != nil || !isNew || got.By != "op" || got.UpdatedAt.IsZero() {
		t.Fatalf("create: %+v %v %v", got, isNew, err)
	}
	if _, isNew, err := s.SetRolloutPolicy(ctx, p, "op", false); err != nil || isNew {
		t.Fatalf("replace: %v %v", isNew, err)
	}

	spec := DefaultRolloutSpec()
	spec.FirmwareID, spec.Policy = fw.ID, "canary-first"
	if err := s.UseRolloutPolicy(&spec, "waves"); err == nil {
		t.Fatal("a policy with an inline plan was taken")
	}
	none := spec
	none.Policy = "none"
	if err := s.UseRolloutPolicy(&none, ""); err == nil {
		t.Fatal("an unknown policy was taken")
	}
	if err := s.UseRolloutPolicy(&spec, ""); err != nil {
		t.Fatal(err)
	}
	ro, err := s.CreateRollout(ctx, spec, "op")
	if err != nil || ro.Policy != "canary-first" || !slices.Equal(ro.Waves, p.Waves) || ro.MaxFailurePct != 3 || *ro.Window != *p.Window {
		t.Fatalf("rollout by policy: %+v %v", ro, err)
	}

	p.Waves, p.Window = []string{"100%"}, nil
	if _, _, err := s.SetRolloutPolicy(ctx, p, "op", false); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteRolloutPolicy(ctx, "canary-first", "op", false); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteRolloutPolicy(ctx, "canary-first", "op", false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	ro, _ = s.RolloutByID(ro.ID)
	if !slices.Equal(ro.Waves, []string{"1", "25%"}) || ro.MaxFailurePct != 3 || ro.Window == nil {
		t.Fatalf("rollout after the policy changed and went: %+v", ro)
	}

	// Stored: a new service over the same store has them.
	keep := DefaultRolloutPolicy("kept")
	if _, _, err := s.SetRolloutPolicy(ctx, keep, "op", false); err != nil {
		t.Fatal(err)
	}
	s2 := newQuotaService(t, st, QuotaOptions{}, newClock())
	if ps := s2.RolloutPolicies(); len(ps) != 1 || ps[0].Name != "kept" {
		t.Fatalf("after a restart: %+v", ps)
	}
}
