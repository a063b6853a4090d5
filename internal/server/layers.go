package server

// Configuration layers in the operator API (docs/configuration.md): a
// device's own values, a label's (group) values and a device type's JSON
// Schema, each with its history, diff and rollback, and a device's
// effective configuration with each member's source.

import (
	"net/http"
	"strconv"

	"github.com/drover/drover/internal/fleet"
)

// layerAt reads which layer a route names: the device {id}, the label
// {name} or the device type {type}.
type layerAt struct {
	kind  fleet.LayerKind
	param string
	what  string // for not-found answers
}

var (
	deviceLayer = layerAt{fleet.LayerDevice, "id", "device"}
	labelLayer  = layerAt{fleet.LayerLabel, "name", "label"}
	schemaLayer = layerAt{fleet.LayerSchema, "type", "device type"}
)

func (l layerAt) name(r *http.Request) (string, error) {
	v := r.PathValue(l.param)
	if l.kind == fleet.LayerDevice {
		id, err := pathID(r)
		if err != nil {
			return "", err
		}
		v = strconv.FormatUint(id, 10)
	}
	return v, nil
}

func (l layerAt) notFound(name string, err error) error {
	return ifNotFound(err, l.what+" "+name)
}

func (a *api) listLayers(r *http.Request) (any, error) {
	return layerList{a.fleet.ConfigLayers()}, nil
}

func (a *api) getLayer(l layerAt) apiFunc {
	return func(r *http.Request) (any, error) {
		name, err := l.name(r)
		if err != nil {
			return nil, err
		}
		c, err := a.fleet.ConfigLayer(l.kind, name)
		if err != nil {
			// An unknown device or label, or one without values.
			return nil, l.notFound(name+" values", err)
		}
		return c, nil
	}
}

func (a *api) putLayer(l layerAt) apiFunc {
	return func(r *http.Request) (any, error) {
		name, err := l.name(r)
		if err != nil {
			return nil, err
		}
		var u fleet.LayerUpdate
		if err := decodeStrict(r, string(l.kind)+" values: ", &u); err != nil {
			return nil, err
		}
		if u.Values == nil {
			return nil, badField("values must be a JSON object")
		}
		if u.By, err = changedBy(r); err != nil {
			return nil, err
		}
		if u.DryRun, err = dryRun(r); err != nil {
			return nil, err
		}
		c, changed, err := a.fleet.PutConfigLayer(r.Context(), l.kind, name, u)
		if err != nil {
			return nil, l.notFound(name, err)
		}
		if !changed || u.DryRun {
			return unchangedBody{c}, nil
		}
		return c, nil
	}
}

func (a *api) deleteLayer(l layerAt) apiFunc {
	return func(r *http.Request) (any, error) {
		name, err := l.name(r)
		if err != nil {
			return nil, err
		}
		by, err := changedBy(r)
		if err != nil {
			return nil, err
		}
		if err := a.fleet.DeleteConfigLayer(r.Context(), l.kind, name, by); err != nil {
			return nil, l.notFound(name, err)
		}
		return layerDeleted{Deleted: name, Kind: l.kind}, nil
	}
}

func (a *api) layerHistory(l layerAt) apiFunc {
	return func(r *http.Request) (any, error) {
		name, err := l.name(r)
		if err != nil {
			return nil, err
		}
		h, err := a.fleet.LayerHistory(r.Context(), l.kind, name)
		if err != nil {
			return nil, l.notFound(name, err)
		}
		return layerRevisions{Revisions: h}, nil
	}
}

func (a *api) layerDiff(l layerAt) apiFunc {
	return func(r *http.Request) (any, error) {
		name, err := l.name(r)
		if err != nil {
			return nil, err
		}
		q := r.URL.Query()
		from, err1 := strconv.Atoi(q.Get("from"))
		to, err2 := strconv.Atoi(q.Get("to"))
		if err1 != nil || err2 != nil {
			return nil, badField("from and to must be revision numbers")
		}
		d, err := a.fleet.LayerDiff(r.Context(), l.kind, name, from, to)
		if err != nil {
			return nil, l.notFound(name, err)
		}
		return profileDiff{From: from, To: to, Changes: d}, nil
	}
}

func (a *api) rollbackLayer(l layerAt) apiFunc {
	return func(r *http.Request) (any, error) {
		name, err := l.name(r)
		if err != nil {
			return nil, err
		}
		by, err := changedBy(r)
		if err != nil {
			return nil, err
		}
		var body rollbackBody
		if err := decodeStrict(r, "rollback: ", &body); err != nil {
			return nil, err
		}
		c, err := a.fleet.RollbackLayer(r.Context(), l.kind, name, body.Rev, by)
		if err != nil {
			return nil, l.notFound(name, err)
		}
		return c, nil
	}
}

func (a *api) effectiveConfig(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	e, err := a.fleet.EffectiveConfig(id)
	if err != nil {
		return nil, ifNotFound(err, "device "+strconv.FormatUint(id, 10))
	}
	return e, nil
}
