package server

// Rollouts in the operator API (docs/firmware.md): start one — a
// firmware's, or a label's new configuration values (docs/configuration.md,
// staged changes) — follow it device by device, pause, resume or abort
// it. The firmware files are in firmware.go.

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/drover/drover/internal/fleet"
)

func (a *api) listRollouts(*http.Request) (any, error) {
	return rolloutList{a.fleet.Rollouts()}, nil
}

func (a *api) createRollout(r *http.Request) (any, error) {
	by, err := changedBy(r)
	if err != nil {
		return nil, err
	}
	spec := fleet.DefaultRolloutSpec()
	in := rolloutBody{RolloutSpec: &spec}
	if err := decodeStrict(r, "rollout: ", &in); err != nil {
		return nil, err
	}
	if in.FirmwareID != "" {
		if spec.FirmwareID, err = strconv.ParseUint(string(in.FirmwareID), 10, 64); err != nil {
			return nil, badField("rollout: firmware_id must be a firmware ID")
		}
	}
	if err := a.fleet.UseRolloutPolicy(&spec, in.inline); err != nil {
		return nil, err
	}
	ro, err := a.fleet.CreateRollout(r.Context(), spec, by)
	if err != nil {
		return nil, err
	}
	return created(ro), nil
}

// createConfigRollout stages new values of the label's layer as a
// configuration rollout.
func (a *api) createConfigRollout(r *http.Request) (any, error) {
	in := configRolloutBody{stagedWaves: defaultWaves()}
	if err := decodeStrict(r, "configuration rollout: ", &in); err != nil {
		return nil, err
	}
	if in.Values == nil {
		return nil, badField("configuration rollout: values is required")
	}
	name := r.PathValue("name")
	return a.createStaged(r, in.stagedWaves, in.inline, fleet.ConfigChange{Label: name, Values: in.Values}, "label "+name)
}

// createProfileRollout stages a profile's new configuration as a
// configuration rollout.
func (a *api) createProfileRollout(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	in := profileRolloutBody{stagedWaves: defaultWaves()}
	if err := decodeStrict(r, "profile rollout: ", &in); err != nil {
		return nil, err
	}
	if in.Config == nil {
		return nil, badField("profile rollout: config is required")
	}
	return a.createStaged(r, in.stagedWaves, in.inline, fleet.ConfigChange{ProfileID: id, Values: in.Config}, "profile "+strconv.FormatUint(id, 10))
}

// defaultWaves are the rollouts' defaults for what a body leaves out.
func defaultWaves() stagedWaves {
	def := fleet.DefaultRolloutSpec()
	return stagedWaves{Waves: def.Waves, MaxFailurePct: def.MaxFailurePct, StallTimeout: def.StallTimeout}
}

// createStaged starts the configuration rollout of c (?dry_run: answers
// the rollout it would start, 200); inline names a plan field the body
// gave; what names its target for a not-found answer.
func (a *api) createStaged(r *http.Request, w stagedWaves, inline string, c fleet.ConfigChange, what string) (any, error) {
	by, err := changedBy(r)
	if err != nil {
		return nil, err
	}
	spec := fleet.DefaultRolloutSpec()
	spec.Filter, spec.Waves, spec.MaxFailurePct, spec.Window, spec.StallTimeout = w.Filter, w.Waves, w.MaxFailurePct, w.Window, w.StallTimeout
	spec.Config, spec.Policy = &c, w.Policy
	if err := a.fleet.UseRolloutPolicy(&spec, inline); err != nil {
		return nil, err
	}
	dry, err := dryRun(r)
	if err != nil {
		return nil, err
	}
	if dry {
		ro, err := a.fleet.CheckConfigRollout(r.Context(), spec, by)
		if err != nil {
			return nil, ifNotFound(err, what)
		}
		return unchangedBody{ro}, nil
	}
	ro, err := a.fleet.CreateConfigRollout(r.Context(), spec, by)
	if err != nil {
		return nil, ifNotFound(err, what)
	}
	return created(ro), nil
}

func (a *api) getRollout(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	ro, ok := a.fleet.RolloutByID(id)
	if !ok {
		return nil, notFound("rollout " + strconv.FormatUint(id, 10))
	}
	return ro, nil
}

// rolloutDevices pages a rollout's devices: ?state=&after=<device id>&limit=.
func (a *api) rolloutDevices(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	c, err := cursor(r, "after")
	if err != nil {
		return nil, err
	}
	after, err := optUint(c)
	if err != nil {
		return nil, badField("cursor must be a next_cursor value")
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 1000 {
			return nil, badField("limit must be 1..1000")
		}
	}
	st := q.Get("state")
	if st != "" && !strings.Contains(" "+strings.Join(fleet.RolloutDeviceStates, " ")+" ", " "+st+" ") {
		return nil, badField("state must be one of " + strings.Join(fleet.RolloutDeviceStates, ", "))
	}
	ds, err := a.fleet.RolloutDevices(r.Context(), id, st, after, limit)
	if err != nil {
		return nil, err
	}
	out := rolloutDevicePage{Devices: ds}
	if len(ds) == limit {
		out.NextCursor = strconv.FormatUint(ds[len(ds)-1].DeviceID, 10)
	}
	return out, nil
}

func (a *api) controlRollout(action string) apiFunc {
	return func(r *http.Request) (any, error) {
		id, err := pathID(r)
		if err != nil {
			return nil, err
		}
		by, err := changedBy(r)
		if err != nil {
			return nil, err
		}
		return a.fleet.ControlRollout(r.Context(), id, action, by)
	}
}
