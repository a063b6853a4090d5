package server

// Rollout policies in the operator API (docs/firmware.md#rollout-policies):
// named rollout plans that a rollout may name instead of giving its plan.

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/drover/drover/internal/fleet"
)

// inlinePlan names the first plan field (fleet.PlanFields) the JSON
// object data gives ("": none).
func inlinePlan(data []byte) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return ""
	}
	for _, f := range fleet.PlanFields {
		for k := range m {
			if strings.EqualFold(k, f) {
				return f
			}
		}
	}
	return ""
}

// strictUnmarshal decodes data into v refusing unknown fields, as
// decodeStrict does.
func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func (a *api) listRolloutPolicies(*http.Request) (any, error) {
	return rolloutPolicyList{a.fleet.RolloutPolicies()}, nil
}

func (a *api) getRolloutPolicy(r *http.Request) (any, error) {
	name := r.PathValue("name")
	p, ok := a.fleet.RolloutPolicy(name)
	if !ok {
		return nil, notFound("rollout policy " + strconv.Quote(name))
	}
	return p, nil
}

// putRolloutPolicy creates (201) or replaces the policy of the path's name.
func (a *api) putRolloutPolicy(r *http.Request) (any, error) {
	by, err := changedBy(r)
	if err != nil {
		return nil, err
	}
	name := r.PathValue("name")
	in := rolloutPolicyBody{RolloutPlan: fleet.DefaultRolloutSpec().RolloutPlan}
	if err := decodeStrict(r, "rollout policy: ", &in); err != nil {
		return nil, err
	}
	if in.Name != "" && in.Name != name {
		return nil, badField("rollout policy: name " + strconv.Quote(in.Name) + " differs from the path's " + strconv.Quote(name))
	}
	dry, err := dryRun(r)
	if err != nil {
		return nil, err
	}
	p := fleet.RolloutPolicy{Name: name, RolloutPlan: in.RolloutPlan}
	out, isNew, err := a.fleet.SetRolloutPolicy(r.Context(), p, by, dry)
	switch {
	case err != nil:
		return nil, err
	case dry:
		return unchangedBody{out}, nil
	case isNew:
		return created(out), nil
	}
	return out, nil
}

func (a *api) deleteRolloutPolicy(r *http.Request) (any, error) {
	by, err := changedBy(r)
	if err != nil {
		return nil, err
	}
	name := r.PathValue("name")
	dry, err := dryRun(r)
	if err != nil {
		return nil, err
	}
	if err := a.fleet.DeleteRolloutPolicy(r.Context(), name, by, dry); err != nil {
		return nil, ifNotFound(err, "rollout policy "+strconv.Quote(name))
	}
	if dry {
		return unchangedBody{deleted{name}}, nil
	}
	return deleted{name}, nil
}
