package web_test

import (
	"context"
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/drover/drover/internal/fleet"
)

// A configuration rollout shows on the firmware page's list and on its
// own page, with its label and revisions.
func TestPagesConfigRollout(t *testing.T) {
	s := newSite(t, 2)
	ctx := context.Background()
	if _, err := s.fleet.AssignLabel(ctx, "g", fleet.Filter{}, false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.fleet.PutConfigLayer(ctx, fleet.LayerLabel, "g", fleet.LayerUpdate{Values: json.RawMessage(`{"x":1}`)}); err != nil {
		t.Fatal(err)
	}
	spec := fleet.DefaultRolloutSpec()
	spec.Config = &fleet.ConfigChange{Label: "g", Values: json.RawMessage(`{"x":2}`)}
	if _, err := s.fleet.CreateConfigRollout(ctx, spec, "otto"); err != nil {
		t.Fatal(err)
	}
	s.login()
	if st, _, body := s.get("/ui/firmware"); st != 200 || !strings.Contains(body, "label g values") {
		t.Fatalf("firmware page: %d\n%s", st, body)
	}
	if st, _, body := s.get("/ui/rollouts/1"); st != 200 || !strings.Contains(body, "label g values, revision 1 → 2") {
		t.Fatalf("rollout page: %d\n%s", st, body)
	}
}

// The labels page's form stages a label's new values as a rollout,
// checked as the API checks it: refused input starts nothing; a policy's
// plan is taken, a policy with a plan field refused; a label already
// staged is refused; the rollout started is audited.
func TestLabelsPageConfigRollout(t *testing.T) {
	s := newSite(t, 4)
	ctx := context.Background()
	if _, err := s.fleet.AssignLabel(ctx, "g", fleet.Filter{}, false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.fleet.PutConfigLayer(ctx, fleet.LayerLabel, "g", fleet.LayerUpdate{Values: json.RawMessage(`{"x":1}`)}); err != nil {
		t.Fatal(err)
	}
	slow := fleet.DefaultRolloutPolicy("slow")
	slow.Waves = []string{"1", "50%"}
	if _, _, err := s.fleet.SetRolloutPolicy(ctx, slow, "t", false); err != nil {
		t.Fatal(err)
	}
	csrf := s.login()
	if st, _, body := s.get("/ui/labels"); st != 200 || !strings.Contains(body, `id="configrolloutform"`) || !strings.Contains(body, `<option value="slow">`) {
		t.Fatalf("labels page: %d\n%s", st, body)
	}
	form := func(kv ...string) url.Values {
		v := url.Values{"csrf": {csrf}, "label": {"g"}}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	for _, tc := range []struct {
		form url.Values
		want string
	}{
		{form(), "values is required"},
		{form("values", `[1]`), "config.values"},
		{form("values", `{"x":2}`, "waves", "0"), "wave"},
		{form("values", `{"x":2}`, "policy", "slow", "waves", "1"), "not both"},
		{form("values", `{"x":2}`, "policy", "nothing"), "no rollout policy"},
		{form("values", `{"x":2}`, "label", "nobody"), "Not done"},
		{form("values", `{"x":2}`, "filter", "q=nobody"), "Not done"},
	} {
		if st, _, body := s.post("/ui/labels/rollout", tc.form, nil); st != 400 || !strings.Contains(body, tc.want) {
			t.Errorf("%v: %d, want 400 with %q\n%s", tc.form, st, tc.want, body)
		}
	}
	if ro := s.fleet.Rollouts(); len(ro) != 0 {
		t.Fatalf("refused forms started %v", ro)
	}
	st, hdr, _ := s.post("/ui/labels/rollout", form("values", `{"x": 2}`, "policy", "slow"), nil)
	if st != 303 || hdr.Get("Location") != "/ui/rollouts/1" {
		t.Fatalf("start: %d %v", st, hdr)
	}
	ro, ok := s.fleet.RolloutByID(1)
	if !ok || ro.Config == nil || ro.Config.Label != "g" || string(ro.Config.Values) != `{"x":2}` || strings.Join(ro.Waves, ",") != "1,50%" || ro.Total != 2 || ro.By != "dashboard" {
		t.Fatalf("rollout: %+v", ro)
	}
	if st, _, body := s.post("/ui/labels/rollout", form("values", `{"x":3}`, "waves", "100%"), nil); st != 400 || !strings.Contains(body, "stages the values of label g") {
		t.Fatalf("a staged label again: %d\n%s", st, body)
	}
	var rows []string
	for _, a := range s.audit {
		rows = append(rows, a.action+" "+a.create)
	}
	if !slices.Contains(rows, "POST /ui/labels/rollout /api/v1/rollouts/1") {
		t.Fatalf("audit: %q", rows)
	}
}
