package web_test

import (
	"context"
	"encoding/json"
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
