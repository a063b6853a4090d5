package server

// Device labels in the operator API (docs/alerts.md#labels): list them,
// assign one to the devices of a filter, define a live one
// (docs/groups.md), delete one.

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/drover/drover/internal/fleet"
)

func (a *api) listLabels(r *http.Request) (any, error) {
	return labelList{a.fleet.Labels()}, nil
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
	Where      string   `json:"where"` // the filter language (docs/groups.md)
}

func (a *api) assignLabel(r *http.Request) (any, error) {
	var in labelAssignBody
	if err := decodeStrict(r, "", &in); err != nil {
		return nil, err
	}
	if in.Filter == nil {
		return nil, badField(`filter is required ({} selects every device)`)
	}
	f, err := a.fleet.ParseFilter(in.Filter.values())
	if err != nil {
		return nil, err
	}
	n, err := a.fleet.AssignLabel(r.Context(), in.Label, f, in.Remove)
	switch {
	case errors.Is(err, fleet.ErrLabelName), errors.Is(err, fleet.ErrTooManyIDs):
		return nil, badField("label: " + err.Error())
	case err != nil:
		return nil, ifNotFound(err, "label "+strconv.Quote(in.Label))
	}
	return labelAssigned{in.Label, n, in.Remove}, nil
}

// values is the filter as fleet.ParseFilter reads it.
func (f *labelFilter) values() url.Values {
	v := url.Values{fleet.FilterLabel: f.Labels}
	for k, val := range map[string]string{
		fleet.FilterSyncState: f.SyncState, fleet.FilterLiveness: f.Liveness, fleet.FilterDeviceType: f.DeviceType,
		fleet.FilterFirmware: f.Firmware, fleet.FilterText: f.Q,
	} {
		v.Set(k, val)
	}
	if f.ProfileID != 0 {
		v.Set(fleet.FilterProfileID, strconv.FormatUint(f.ProfileID, 10))
	}
	if f.Where != "" {
		v.Set(fleet.FilterWhere, f.Where)
	}
	return v
}

func (a *api) getLabel(r *http.Request) (any, error) {
	name := r.PathValue("name")
	l, err := a.fleet.Label(name)
	return l, ifNotFound(err, "label "+strconv.Quote(name))
}

// defineLabel makes the label a live one of the devices its filter
// selects, or changes its filter.
func (a *api) defineLabel(r *http.Request) (any, error) {
	var in labelDefineBody
	if err := decodeStrict(r, "", &in); err != nil {
		return nil, err
	}
	name := r.PathValue("name")
	if in.Filter == "" {
		return nil, badField(`filter is required: an expression of the filter language, e.g. "state.extra.site = north"`)
	}
	dry, err := dryRun(r)
	if err != nil {
		return nil, err
	}
	define := a.fleet.DefineLabel
	if dry {
		define = a.fleet.CheckLabelDefinition
	}
	l, err := define(r.Context(), name, in.Filter)
	switch {
	case errors.Is(err, fleet.ErrLabelName), errors.Is(err, fleet.ErrTooManyIDs):
		return nil, badField("label: " + err.Error())
	case err != nil:
		return nil, err
	}
	if dry {
		return unchangedBody{l}, nil
	}
	return l, nil
}

func (a *api) deleteLabel(r *http.Request) (any, error) {
	name := r.PathValue("name")
	if err := a.fleet.DeleteLabel(r.Context(), name); err != nil {
		return nil, ifNotFound(err, "label "+strconv.Quote(name))
	}
	return deleted{name}, nil
}
