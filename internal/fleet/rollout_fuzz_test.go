package fleet

import (
	"encoding/json"
	"testing"
	"time"
)

// A rollout spec as the API decodes it: Check accepts or refuses it, and
// what it accepts never panics the engine's arithmetic.
func FuzzRolloutSpec(f *testing.F) {
	f.Add([]byte(`{"firmware_id":1,"waves":["1","10%","100%"],"max_failure_pct":10,"max_downloads":50,"stall_timeout":3600}`))
	f.Add([]byte(`{"waves":["0.5%"],"max_downloads":1,"stall_timeout":60,"window":{"start":"22:00","end":"04:00"}}`))
	f.Add([]byte(`{"waves":["1e400%"],"window":{"start":"24:00","end":"-1:00"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		spec := DefaultRolloutSpec()
		if json.Unmarshal(body, &spec) != nil || spec.Check() != nil {
			return
		}
		r := &rollout{Rollout: Rollout{RolloutSpec: spec, Total: 1000}}
		for n := 1; n <= len(spec.Waves)+1; n++ {
			if l := r.waveLimit(n); l < 1 {
				t.Fatalf("wave %d of %v: size %d", n, spec.Waves, l)
			}
		}
		spec.Window.Open(time.Unix(0, 0))
	})
}

// DiffJSON on any two documents: an equal pair has no difference.
func FuzzDiffJSON(f *testing.F) {
	f.Add([]byte(`{"a":{"b":1}}`), []byte(`{"a":{"b":2},"c":[1]}`))
	f.Add([]byte(`null`), []byte(`{"~/":1}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		DiffJSON(a, b)
		if json.Valid(a) {
			if d := DiffJSON(a, a); len(d) != 0 {
				t.Fatalf("%s differs from itself: %+v", a, d)
			}
		}
	})
}
