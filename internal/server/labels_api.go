package server

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/drover/drover/internal/fleet"
)

func (a *api) listLabels(r *http.Request) (any, error) {
	return map[string]any{"labels": a.fleet.Labels()}, nil
}

// labelFilter is the JSON form of the devices filter.
type labelFilter struct {
	SyncState  string   `json:"sync_state"`
	Liveness   string   `json:"liveness"`
	DeviceType string   `json:"device_type"`
	Firmware   string   `json:"firmware"`
	ProfileID  uint64   `json:"profile_id,string"`
	Q          string   `json:"q"`
	Labels     []string `json:"labels"`
}

func (a *api) assignLabel(r *http.Request) (any, error) {
	var in struct {
		Label  string       `json:"label"`
		Remove bool         `json:"remove"`
		Filter *labelFilter `json:"filter"`
	}
	if err := decodeStrict(r, "", &in); err != nil {
		return nil, err
	}
	if in.Filter == nil {
		return nil, badField(`filter is required ({} selects every device)`)
	}
	f, msg := in.Filter.fleetFilter(a.fleet)
	if msg != "" {
		return nil, badField(msg)
	}
	n, err := a.fleet.AssignLabel(r.Context(), in.Label, f, in.Remove)
	switch {
	case errors.Is(err, fleet.ErrLabelName), errors.Is(err, fleet.ErrTooManyIDs):
		return nil, badField("label: " + err.Error())
	case err != nil:
		return nil, ifNotFound(err, "label "+strconv.Quote(in.Label))
	}
	return map[string]any{"label": in.Label, "changed": n, "removed": in.Remove}, nil
}

func (f *labelFilter) fleetFilter(fl *fleet.Service) (fleet.Filter, string) {
	var out fleet.Filter
	if f.SyncState != "" {
		v, ok := fleet.ParseSyncState(f.SyncState)
		if !ok {
			return out, "sync_state must be arriving, synchronized, sync_pending or sync_error"
		}
		out.SyncState = &v
	}
	if f.Liveness != "" {
		v, ok := fleet.ParseLiveness(f.Liveness)
		if !ok {
			return out, "liveness must be online, late, offline or unknown"
		}
		out.Liveness = &v
	}
	out.DeviceType, out.Firmware, out.ProfileID, out.Text = f.DeviceType, f.Firmware, f.ProfileID, f.Q
	if len(f.Labels) > 0 {
		out.Labels = fl.LabelIDs(f.Labels)
	}
	return out, ""
}

func (a *api) deleteLabel(r *http.Request) (any, error) {
	name := r.PathValue("name")
	if err := a.fleet.DeleteLabel(r.Context(), name); err != nil {
		return nil, ifNotFound(err, "label "+strconv.Quote(name))
	}
	return map[string]any{"deleted": name}, nil
}
