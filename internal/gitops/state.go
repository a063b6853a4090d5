package gitops

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"sort"
)

// API is the operator API as this package uses it: one request, its body
// (when not nil) sent as JSON, the answer's body returned; an answer
// other than 2xx is an error with an HTTPStatus method.
type API interface {
	Do(ctx context.Context, method, path string, query url.Values, body any) ([]byte, error)
}

// statusOf is the HTTP status of an API error, 0 for another error.
func statusOf(err error) int {
	var s interface{ HTTPStatus() int }
	if errors.As(err, &s) {
		return s.HTTPStatus()
	}
	return 0
}

// state is the server's side: every object as a description would
// write it, and the IDs the API names some of them by.
type state struct {
	objs       map[string]*Object // by kind and key
	profileIDs map[string]string  // profile key → ID
	ruleIDs    map[string]string  // rule name → ID
	labels     map[string]bool    // every label, manual ones too
	users      bool               // users were read
}

func stateKey(kind, key string) string { return kind + "\x00" + key }

func (s *state) add(o *Object) { s.objs[stateKey(o.Kind, o.Key())] = o }

// sorted is every object in apply order.
func (s *state) sorted() []*Object {
	out := make([]*Object, 0, len(s.objs))
	for _, o := range s.objs {
		out = append(out, o)
	}
	sortObjects(out)
	return out
}

func sortObjects(objs []*Object) {
	sort.SliceStable(objs, func(i, j int) bool {
		a, b := objs[i], objs[j]
		if a.Kind != b.Kind {
			return kindOrder(a.Kind) < kindOrder(b.Kind)
		}
		ka, kb := a.Key(), b.Key()
		if a.Kind == KindDeviceLayer && len(ka) != len(kb) {
			return len(ka) < len(kb) // device IDs in number order
		}
		return ka < kb
	})
}

// getJSON reads a GET answer into v.
func getJSON(ctx context.Context, api API, path string, v any) error {
	b, err := api.Do(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return err
	}
	return decodeJSON(b, v)
}

func decodeJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("the server's answer: %w", err)
	}
	return nil
}

// fetch reads the server's state. withUsers reads the users too (admin
// only); optionalUsers skips them when the token may not.
func fetch(ctx context.Context, api API, withUsers, optionalUsers bool) (*state, error) {
	s := &state{objs: map[string]*Object{}, profileIDs: map[string]string{}, ruleIDs: map[string]string{}, labels: map[string]bool{}}
	var policy map[string]any
	if err := getJSON(ctx, api, "/api/v1/profiles/policy", &policy); err != nil {
		return nil, err
	}
	s.add(project(KindProfilePolicy, policy, nil))

	var profiles struct{ Profiles []map[string]any }
	if err := getJSON(ctx, api, "/api/v1/profiles", &profiles); err != nil {
		return nil, err
	}
	for _, p := range profiles.Profiles {
		o := project(KindProfile, p, nil)
		s.add(o)
		s.profileIDs[o.Key()] = fmt.Sprint(p["id"])
	}

	var labels struct{ Labels []map[string]any }
	if err := getJSON(ctx, api, "/api/v1/labels", &labels); err != nil {
		return nil, err
	}
	for _, l := range labels.Labels {
		s.labels[fmt.Sprint(l["name"])] = true
		if f, _ := l["filter"].(string); f != "" {
			s.add(project(KindLabel, l, nil))
		}
	}

	var layers struct{ Layers []map[string]any }
	if err := getJSON(ctx, api, "/api/v1/config/layers", &layers); err != nil {
		return nil, err
	}
	for _, l := range layers.Layers {
		if o := projectLayer(l); o != nil {
			s.add(o)
		}
	}

	var rps struct{ Policies []map[string]any }
	if err := getJSON(ctx, api, "/api/v1/rollout-policies", &rps); err != nil {
		return nil, err
	}
	for _, p := range rps.Policies {
		s.add(project(KindRolloutPolicy, p, nil))
	}

	var rules struct{ Rules []map[string]any }
	if err := getJSON(ctx, api, "/api/v1/alerts/rules", &rules); err != nil {
		return nil, err
	}
	for _, r := range rules.Rules {
		o := project(KindAlertRule, r, nil)
		s.add(o)
		s.ruleIDs[o.Key()] = fmt.Sprint(r["id"])
	}

	if withUsers {
		var users struct{ Users []map[string]any }
		err := getJSON(ctx, api, "/api/v1/users", &users)
		switch st := statusOf(err); {
		case err == nil:
			s.users = true
			for _, u := range users.Users {
				s.add(project(KindUser, u, nil))
			}
		case optionalUsers && (st == http.StatusForbidden || st == http.StatusUnauthorized):
		default:
			return nil, err
		}
	}
	return s, nil
}

// projectLayer is a configuration layer as its kind of document.
func projectLayer(l map[string]any) *Object {
	switch l["kind"] {
	case "device":
		return project(KindDeviceLayer, l, map[string]string{"device": "name"})
	case "label":
		return project(KindLabelLayer, l, map[string]string{"label": "name"})
	case "schema":
		return project(KindSchema, l, map[string]string{"device_type": "name", "schema": "values"})
	}
	return nil
}

// project is an API object (JSON decoded with UseNumber) as a document
// of kind: its fields, each read from the member of its name (or the
// one from names), absent members and nulls left out.
func project(kind string, m map[string]any, from map[string]string) *Object {
	o := &Object{Kind: kind, Fields: map[string]any{}, Lines: map[string]int{}}
	for _, f := range kindFields[kind] {
		src := f.apiName()
		if n, ok := from[f.name]; ok {
			src = n
		}
		v, ok := m[src]
		if !ok || v == nil {
			continue
		}
		if f.typ == tString {
			v = fmt.Sprint(v) // IDs are strings or numbers
		}
		o.Fields[f.name] = canon(v)
	}
	return o
}

// canon makes a decoded JSON value comparable: json.Number becomes an
// int64 when whole, a float64 otherwise.
func canon(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x)
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = canon(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = canon(e)
		}
		return out
	}
	return v
}

// sameFields tells whether two objects' fields are the same JSON.
func sameFields(a, b *Object) bool {
	ja, err1 := json.Marshal(canon(a.Fields))
	jb, err2 := json.Marshal(canon(b.Fields))
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}
