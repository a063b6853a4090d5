package gitops

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
)

// Actions of a plan's changes.
const (
	Create    = "create"
	Update    = "change"
	Unchanged = "unchanged"
	Delete    = "delete" // --prune: on the server, not described
)

// Change is what applying one object does.
type Change struct {
	Object *Object
	Action string
	// Before is the server's object (nil when created), After what it
	// becomes as the server would store it (nil when deleted).
	Before, After *Object
	// The request that makes the change.
	method, path string
	body         any
}

// Plan is every object of a description compared with the server.
type Plan struct{ Changes []Change }

// Counts are how many objects the plan creates, changes, deletes and
// leaves.
func (p *Plan) Counts() (created, changed, deleted, unchanged int) {
	for _, c := range p.Changes {
		switch c.Action {
		case Create:
			created++
		case Update:
			changed++
		case Delete:
			deleted++
		default:
			unchanged++
		}
	}
	return
}

// prunable are the kinds --prune deletes, with the path of an object's
// deletion. Profiles belong to their devices' firmware, and the profile
// policy is always there: neither is deleted.
var prunable = map[string]func(st *state, key string) string{
	KindSchema:        func(_ *state, k string) string { return "/api/v1/device-types/" + url.PathEscape(k) + "/schema" },
	KindLabel:         func(_ *state, k string) string { return "/api/v1/labels/" + url.PathEscape(k) },
	KindLabelLayer:    func(_ *state, k string) string { return "/api/v1/labels/" + url.PathEscape(k) + "/config" },
	KindDeviceLayer:   func(_ *state, k string) string { return "/api/v1/devices/" + url.PathEscape(k) + "/config" },
	KindRolloutPolicy: func(_ *state, k string) string { return "/api/v1/rollout-policies/" + url.PathEscape(k) },
	KindAlertRule:     func(st *state, k string) string { return "/api/v1/alerts/rules/" + url.PathEscape(st.ruleIDs[k]) },
	KindUser:          func(_ *state, k string) string { return "/api/v1/users/" + url.PathEscape(k) },
}

// prune is the deletions of the server's objects of the kinds objs
// describe that objs do not name, last kind first (a label's values
// before the label). The caller's own user is never deleted.
func prune(ctx context.Context, api API, st *state, objs []*Object) ([]Change, error) {
	described, named := map[string]bool{}, map[string]bool{}
	for _, o := range objs {
		described[o.Kind] = true
		named[stateKey(o.Kind, o.Key())] = true
	}
	me := ""
	if described[KindUser] {
		var who struct{ Name string }
		if err := getJSON(ctx, api, "/api/v1/whoami", &who); err != nil {
			return nil, err
		}
		me = who.Name
	}
	var out []Change
	server := st.sorted()
	for i := len(server) - 1; i >= 0; i-- {
		o := server[i]
		path, ok := prunable[o.Kind]
		if !ok || !described[o.Kind] || named[stateKey(o.Kind, o.Key())] || (o.Kind == KindUser && o.Key() == me) {
			continue
		}
		o.Pos = Pos{File: "server"}
		out = append(out, Change{Object: o, Action: Delete, Before: o, method: http.MethodDelete, path: path(st, o.Key())})
	}
	return out, nil
}

// Options are how a description is planned.
type Options struct {
	// Prune deletes the server's objects of the kinds the description
	// has that it does not name (never profiles or the profile policy).
	Prune bool
}

// Prepare compares objs with the server's state: each object is checked
// by the server (its ?dry_run=1), which answers the object as it would
// store it, so that values written differently but meaning the same
// (defaults, a filter's spacing) are no change. Every problem is
// reported, each at its file and line (an *InvalidError); the server is
// not changed.
func Prepare(ctx context.Context, api API, objs []*Object, opt Options) (*Plan, error) {
	if p := duplicates(objs); len(p) > 0 {
		return nil, &InvalidError{p}
	}
	withUsers := false
	for _, o := range objs {
		withUsers = withUsers || o.Kind == KindUser
	}
	st, err := fetch(ctx, api, withUsers, false)
	if err != nil {
		return nil, err
	}
	sorted := append([]*Object(nil), objs...)
	sortObjects(sorted)
	newLabels := map[string]bool{}
	for _, o := range sorted {
		if o.Kind == KindLabel && !st.labels[o.Key()] {
			newLabels[o.Key()] = true
		}
	}
	plan := &Plan{}
	var problems []Problem
	for _, o := range sorted {
		c, problem, err := prepare(ctx, api, st, o, newLabels)
		if err != nil {
			return nil, err
		}
		if problem != nil {
			problems = append(problems, *problem)
			continue
		}
		plan.Changes = append(plan.Changes, c)
	}
	if len(problems) > 0 {
		sort.SliceStable(problems, func(i, j int) bool {
			a, b := problems[i].Pos, problems[j].Pos
			return a.File < b.File || (a.File == b.File && a.Line < b.Line)
		})
		return nil, &InvalidError{problems}
	}
	if opt.Prune {
		dels, err := prune(ctx, api, st, objs)
		if err != nil {
			return nil, err
		}
		plan.Changes = append(plan.Changes, dels...)
	}
	return plan, nil
}

// prepare is one object's change, or the problem the server found in it.
func prepare(ctx context.Context, api API, st *state, o *Object, newLabels map[string]bool) (Change, *Problem, error) {
	c := Change{Object: o, Before: st.objs[stateKey(o.Kind, o.Key())]}
	key := o.Key()
	f := o.Fields
	body := map[string]any{}
	pick := func(names ...string) {
		for _, n := range names {
			if v, ok := f[n]; ok {
				body[n] = v
			}
		}
	}
	// local: the server cannot check the object yet (it names a label
	// this plan makes); what it answers is checked when it is applied.
	local := false
	switch o.Kind {
	case KindProfilePolicy:
		c.method, c.path = http.MethodPut, "/api/v1/profiles/policy"
		pick("mode", "carry", "create_limit", "create_window")
	case KindSchema:
		c.method, c.path = http.MethodPut, "/api/v1/device-types/"+url.PathEscape(key)+"/schema"
		body["values"] = f["schema"]
	case KindProfile:
		id, ok := st.profileIDs[key]
		if !ok {
			return c, &Problem{o.Pos, fmt.Sprintf("no profile of device type %q and firmware %q on the server: profiles are made when devices of a firmware register (or when it is approved), and apply changes them", f["device_type"], f["firmware"])}, nil
		}
		c.method, c.path = http.MethodPatch, "/api/v1/profiles/"+url.PathEscape(id)
		pick("config", "push_interval")
	case KindLabel:
		c.method, c.path = http.MethodPut, "/api/v1/labels/"+url.PathEscape(key)
		pick("filter")
	case KindLabelLayer:
		c.method, c.path = http.MethodPut, "/api/v1/labels/"+url.PathEscape(key)+"/config"
		pick("values", "priority")
		local = newLabels[key]
	case KindDeviceLayer:
		c.method, c.path = http.MethodPut, "/api/v1/devices/"+url.PathEscape(key)+"/config"
		pick("values")
	case KindRolloutPolicy:
		c.method, c.path = http.MethodPut, "/api/v1/rollout-policies/"+url.PathEscape(key)
		pick("waves", "max_failure_pct", "max_downloads", "window", "stall_timeout")
	case KindAlertRule:
		c.method, c.path = http.MethodPost, "/api/v1/alerts/rules"
		if id, ok := st.ruleIDs[key]; ok {
			c.method, c.path = http.MethodPut, c.path+"/"+url.PathEscape(id)
		}
		for _, fd := range kindFields[o.Kind] {
			if v, ok := f[fd.name]; ok {
				body[fd.apiName()] = v
			}
		}
	case KindUser:
		if c.Before != nil {
			c.method, c.path = http.MethodPatch, "/api/v1/users/"+url.PathEscape(key)
			pick("role")
		} else {
			c.method, c.path = http.MethodPost, "/api/v1/users"
			pick("name", "role")
		}
	}
	c.body = body
	var after *Object
	if local {
		after = &Object{Kind: o.Kind, Fields: canon(o.Fields).(map[string]any)}
		if _, ok := after.Fields["priority"]; !ok {
			after.Fields["priority"] = int64(0)
		}
	} else {
		b, err := api.Do(ctx, c.method, c.path, url.Values{"dry_run": {"1"}}, body)
		if err != nil {
			if st := statusOf(err); st >= 400 && st < 500 && st != http.StatusUnauthorized && st != http.StatusForbidden {
				return c, &Problem{problemAt(o, err.Error()), o.Name() + ": " + err.Error()}, nil
			}
			return c, nil, fmt.Errorf("%s (%s): %w", o.Name(), o.Pos, err)
		}
		var m map[string]any
		if err := decodeJSON(b, &m); err != nil {
			return c, nil, err
		}
		if o.Kind == KindSchema || o.Kind == KindLabelLayer || o.Kind == KindDeviceLayer {
			after = projectLayer(m)
		} else {
			after = project(o.Kind, m, nil)
		}
		if after == nil {
			return c, nil, fmt.Errorf("%s: the server answered a layer of another kind", o.Name())
		}
	}
	c.After = after
	switch {
	case c.Before == nil:
		c.Action = Create
	case sameFields(c.Before, after):
		c.Action = Unchanged
	default:
		c.Action = Update
	}
	return c, nil, nil
}

// messageNames are names the server's messages give fields by.
var messageNames = map[string]string{"where": "filter", "kind": "condition"}

var words = regexp.MustCompile(`[a-z_]+`)

// problemAt is the line of the field the server's message names first
// (by its name or the API's), or the document's.
func problemAt(o *Object, msg string) Pos {
	best, at := "", len(msg)+1
	for _, w := range words.FindAllStringIndex(msg, -1) {
		name := msg[w[0]:w[1]]
		if n, ok := messageNames[name]; ok {
			name = n
		}
		if _, ok := o.Lines[name]; ok && w[0] < at {
			best, at = name, w[0]
		}
	}
	if best == "" {
		return o.Pos
	}
	return o.at(best)
}

// Apply makes the plan's changes, in order. It stops at the first the
// server refuses (the ones before it stay made), which it reports with
// the object's file and line. progress, when not nil, gets a line per
// change.
func (p *Plan) Apply(ctx context.Context, api API, progress io.Writer) error {
	for _, c := range p.Changes {
		if c.Action == Unchanged {
			continue
		}
		if _, err := api.Do(ctx, c.method, c.path, nil, c.body); err != nil {
			return fmt.Errorf("%s: %s: %w", c.Object.Pos, c.Object.Name(), err)
		}
		if progress != nil {
			verb := map[string]string{Create: "created", Update: "changed", Delete: "deleted"}[c.Action]
			fmt.Fprintf(progress, "%s %s\n", c.Object.Name(), verb)
		}
	}
	return nil
}

// diff is the change as a unified diff of the object's document.
func (c Change) diff() string {
	before, from := "", "/dev/null"
	if c.Before != nil {
		before = string(Encode([]*Object{c.Before}))
		from = "server: " + c.Object.Name()
	}
	after, to := "", c.Object.Pos.String()
	if c.After != nil {
		after = string(Encode([]*Object{c.After}))
	} else {
		to = "/dev/null"
	}
	return unifiedDiff(from, to, before, after)
}

// Write writes the plan for people: each created or changed object as a
// unified diff of its document, then the counts.
func (p *Plan) Write(w io.Writer) error {
	var b strings.Builder
	for _, c := range p.Changes {
		if c.Action == Unchanged {
			continue
		}
		fmt.Fprintf(&b, "%s %s (%s)\n", map[string]string{Create: "+", Update: "~", Delete: "-"}[c.Action], c.Object.Name(), c.Object.Pos)
		b.WriteString(c.diff())
		b.WriteString("\n")
	}
	created, changed, deleted, unchanged := p.Counts()
	if deleted > 0 {
		fmt.Fprintf(&b, "%d to create, %d to change, %d to delete, %d unchanged\n", created, changed, deleted, unchanged)
	} else {
		fmt.Fprintf(&b, "%d to create, %d to change, %d unchanged\n", created, changed, unchanged)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
