package fleet

import (
	"encoding/json"
	"strings"
	"testing"
)

// A rollout's IDs are written as strings and read as strings or numbers
// (rollouts stored before IDs became strings).
func TestRolloutJSONIDs(t *testing.T) {
	b, err := json.Marshal(Rollout{ID: 3, RolloutSpec: RolloutSpec{FirmwareID: 5, RolloutPlan: RolloutPlan{MaxDownloads: 7}}, State: RolloutRunning})
	if err != nil || !strings.Contains(string(b), `"id":"3"`) || !strings.Contains(string(b), `"firmware_id":"5"`) ||
		strings.Count(string(b), `"id"`) != 1 || !strings.Contains(string(b), `"max_downloads":7`) {
		t.Fatalf("%s %v", b, err)
	}
	for _, in := range []string{string(b), `{"id":3,"firmware_id":5,"max_downloads":7,"state":"running"}`} {
		var r Rollout
		if err := json.Unmarshal([]byte(in), &r); err != nil || r.ID != 3 || r.FirmwareID != 5 || r.MaxDownloads != 7 || r.State != RolloutRunning {
			t.Errorf("%s: %+v %v", in, r, err)
		}
	}
	var r Rollout
	if err := json.Unmarshal([]byte(`{"id":"x"}`), &r); err == nil {
		t.Error(`id "x" accepted`)
	}
}
