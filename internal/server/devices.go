package server

// The devices: list (JSON pages or CSV, csvexport.go), one device, its
// history, the fleet's stats. Their admission is in admission.go, their
// commands in commands.go, their quotas in quotas.go.

import (
	"net/http"
	"strconv"
	"time"

	"github.com/drover/drover/internal/fleet"
)

func (a *api) listDevices(r *http.Request) (any, error) {
	q := r.URL.Query()
	f, err := a.fleet.ParseFilter(q)
	if err != nil {
		return nil, err
	}
	fq := fleet.Query{Filter: f, After: q.Get("cursor"), Limit: 100, NoTotal: true, Desc: q.Get("dir") == "desc"}
	if v := q.Get("sort"); v != "" {
		var ok bool
		if fq.Sort, ok = fleet.ParseSortBy(v); !ok {
			return nil, badField("sort must be id, machine_id, device_type, firmware, last_seen or sync_state")
		}
	}
	if v := q.Get("dir"); v != "" && v != "asc" && v != "desc" {
		return nil, badField("dir must be asc or desc")
	}
	asCSV, err := wantCSV(r)
	if err != nil {
		return nil, err
	}
	if v := q.Get("limit"); v != "" {
		if asCSV {
			return nil, badField("the CSV export streams every matching device: no limit")
		}
		if fq.Limit, err = strconv.Atoi(v); err != nil || fq.Limit < 1 || fq.Limit > 1000 {
			return nil, badField("limit must be 1..1000")
		}
	}
	if asCSV {
		fq.Limit = 1000
		if _, err := a.fleet.Query(fleet.Query{Filter: f, After: fq.After, Sort: fq.Sort, Desc: fq.Desc, Limit: 1, NoTotal: true}); err != nil {
			return nil, err // a bad cursor, before the 200
		}
		return a.devicesCSV(fq), nil
	}
	res, err := a.fleet.Query(fq)
	if err != nil {
		return nil, err
	}
	return devicePage{res.Devices, res.Next}, nil
}

// devicePage is a page of the devices list, in the order asked (ID by default).
type devicePage struct {
	Devices []fleet.Device `json:"devices"`
	Next    string         `json:"next_cursor,omitempty"`
}

func (a *api) getDevice(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	d, err := a.fleet.Device(r.Context(), id)
	return d, ifNotFound(err, "device "+strconv.FormatUint(id, 10))
}

func (a *api) getHistory(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	var hq fleet.HistoryQuery
	q := r.URL.Query()
	for _, p := range []struct {
		name string
		t    *time.Time
	}{{"from", &hq.From}, {"to", &hq.To}} {
		if v := q.Get(p.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return nil, badField(p.name + " must be an RFC 3339 time")
			}
			*p.t = t
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			return nil, badField("limit must be 1..10000")
		}
		hq.Limit = n
	}
	asCSV, err := wantCSV(r)
	if err != nil {
		return nil, err
	}
	samples, err := a.fleet.History(r.Context(), id, hq)
	if err != nil {
		return nil, ifNotFound(err, "device "+strconv.FormatUint(id, 10))
	}
	if asCSV {
		return historyCSV(samples), nil
	}
	return historyPage{strconv.FormatUint(id, 10), samples}, nil
}

func (a *api) stats(r *http.Request) (any, error) {
	return a.fleet.Stats(), nil
}

// admitDevice is POST /api/v1/devices/{id}/{approve,reject,block,decommission}
// and DELETE /api/v1/devices/{id}.
func (a *api) admitDevice(action fleet.Action) apiFunc {
	return func(r *http.Request) (any, error) {
		id, err := pathID(r)
		if err != nil {
			return nil, err
		}
		d, err := a.fleet.Admit(r.Context(), id, action, actor(r))
		if err != nil {
			return nil, ifNotFound(err, "device "+r.PathValue("id"))
		}
		if action == fleet.Delete || (action == fleet.Reject && d.ID == 0) {
			return deviceDeleted{true, strconv.FormatUint(id, 10)}, nil
		}
		return d, nil
	}
}
