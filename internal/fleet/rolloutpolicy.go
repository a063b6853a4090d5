package fleet

// Rollout policies (docs/firmware.md#rollout-policies): named, stored
// plans — waves, failure threshold, download limit, window, stall timeout
// — that a rollout may name instead of giving its plan inline. The
// rollout copies the plan when it starts: a later change of the policy
// does not change it. They live in the policy room (policy.go), are
// stored through the PolicyStore and travel to other nodes as policy
// changes.

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// RolloutPolicy is a named rollout plan.
type RolloutPolicy struct {
	Name string `json:"name"`
	RolloutPlan
	UpdatedAt time.Time `json:"updated_at"`
	By        string    `json:"by,omitempty"`
}

// PlanFields are the JSON fields of a rollout's plan, which a policy
// gives instead.
var PlanFields = []string{"waves", "max_failure_pct", "max_downloads", "window", "stall_timeout"}

// DefaultRolloutPolicy is a policy named name with the rollouts' defaults.
func DefaultRolloutPolicy(name string) RolloutPolicy {
	return RolloutPolicy{Name: name, RolloutPlan: DefaultRolloutSpec().RolloutPlan}
}

// ValidRolloutPolicyName checks a policy's name: 1..64 of a-z, 0-9, '.',
// '_' and '-', starting with a letter or digit.
func ValidRolloutPolicyName(name string) error {
	ok := name != "" && len(name) <= 64 && !strings.ContainsAny(name[:1], "._-")
	for _, r := range name {
		ok = ok && (r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
	}
	if !ok {
		return &FieldError{Field: "name", Message: "a rollout policy name is 1..64 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit"}
	}
	return nil
}

// Check checks p's name and, as a rollout's own plan is checked
// (RolloutSpec.Check), its plan.
func (p RolloutPolicy) Check() error {
	if err := ValidRolloutPolicyName(p.Name); err != nil {
		return err
	}
	return p.RolloutPlan.check()
}

// rolloutPolicies reads the policies in force (nil: none).
func (pol *policy) rolloutPolicies() map[string]RolloutPolicy {
	if m := pol.rollouts.Load(); m != nil {
		return *m
	}
	return nil
}

// replaceRolloutPolicies makes ps the policies in force (pol.mu held, or
// while loading); stored ones that fail the check are left out.
func (pol *policy) replaceRolloutPolicies(ps []RolloutPolicy) {
	m := make(map[string]RolloutPolicy, len(ps))
	for _, p := range ps {
		if p.Check() == nil {
			m[p.Name] = p
		}
	}
	pol.rollouts.Store(&m)
}

// RolloutPolicies lists the rollout policies by name.
func (pol *policy) RolloutPolicies() []RolloutPolicy {
	m := pol.rolloutPolicies()
	out := make([]RolloutPolicy, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k])
	}
	return out
}

// RolloutPolicy returns the rollout policy called name.
func (pol *policy) RolloutPolicy(name string) (RolloutPolicy, bool) {
	p, ok := pol.rolloutPolicies()[name]
	return p, ok
}

// SetRolloutPolicy checks p and stores it, creating or replacing the
// policy of its name; dry: only checks it. It says whether the policy
// was new.
func (pol *policy) SetRolloutPolicy(ctx context.Context, p RolloutPolicy, by string, dry bool) (RolloutPolicy, bool, error) {
	p.RolloutPlan = p.RolloutPlan.clone()
	if err := p.Check(); err != nil {
		return RolloutPolicy{}, false, err
	}
	pol.mu.Lock()
	defer pol.mu.Unlock()
	_, exists := pol.rolloutPolicies()[p.Name]
	p.UpdatedAt, p.By = time.Now().UTC().Truncate(time.Millisecond), by
	if dry {
		return p, !exists, nil
	}
	if st := pol.store; st != nil {
		if err := st.SaveRolloutPolicy(ctx, p); err != nil {
			return RolloutPolicy{}, false, err
		}
		pol.note(ctx, ChangePolicy, 0)
	}
	m := maps.Clone(pol.rolloutPolicies())
	if m == nil {
		m = map[string]RolloutPolicy{}
	}
	m[p.Name] = p
	pol.rollouts.Store(&m)
	pol.log.Info("rollout policy set", "policy", p.Name, "by", by)
	return p, !exists, nil
}

// DeleteRolloutPolicy deletes the rollout policy called name (ErrNotFound:
// there is none); dry: only checks that it exists. Rollouts started with
// it keep their plan.
func (pol *policy) DeleteRolloutPolicy(ctx context.Context, name, by string, dry bool) error {
	pol.mu.Lock()
	defer pol.mu.Unlock()
	if _, ok := pol.rolloutPolicies()[name]; !ok {
		return ErrNotFound
	}
	if dry {
		return nil
	}
	if st := pol.store; st != nil {
		if err := st.DeleteRolloutPolicy(ctx, name); err != nil {
			return err
		}
		pol.note(ctx, ChangePolicy, 0)
	}
	m := maps.Clone(pol.rolloutPolicies())
	delete(m, name)
	pol.rollouts.Store(&m)
	pol.log.Info("rollout policy deleted", "policy", name, "by", by)
	return nil
}

// UseRolloutPolicy fills spec's plan from the policy spec.Policy names
// (none: spec is left as it is). inline names a plan field the request
// gave too ("": none): a policy and an inline plan are refused together.
func (pol *policy) UseRolloutPolicy(spec *RolloutSpec, inline string) error {
	if spec.Policy == "" {
		return nil
	}
	if inline != "" {
		return &FieldError{Field: "policy", Message: "give a policy or an inline plan (" + strings.Join(PlanFields, ", ") + "), not both: " + inline + " given with policy " + spec.Policy}
	}
	p, ok := pol.RolloutPolicy(spec.Policy)
	if !ok {
		return &FieldError{Field: "policy", Message: "no rollout policy " + strconv.Quote(spec.Policy)}
	}
	spec.RolloutPlan = p.RolloutPlan.clone()
	return nil
}
