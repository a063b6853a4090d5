package gitops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// fakeAPI answers the state's GETs from gets and each change with what
// answer makes of it (nil: its body as is); it records the changes made.
type fakeAPI struct {
	gets   map[string]string
	answer func(method, path string, dry bool, body map[string]any) (any, error)
	made   []string
}

type statusErr int

func (s statusErr) Error() string   { return fmt.Sprintf("HTTP %d", int(s)) }
func (s statusErr) HTTPStatus() int { return int(s) }

func (f *fakeAPI) Do(_ context.Context, method, path string, q url.Values, body any) ([]byte, error) {
	if method == "GET" {
		if b, ok := f.gets[path]; ok {
			return []byte(b), nil
		}
		return nil, statusErr(404)
	}
	dry := q.Get("dry_run") == "1"
	b, _ := json.Marshal(body)
	var m map[string]any
	json.Unmarshal(b, &m)
	var out any = m
	if f.answer != nil {
		v, err := f.answer(method, path, dry, m)
		if err != nil {
			return nil, err
		}
		if v != nil {
			out = v
		}
	}
	if !dry {
		f.made = append(f.made, method+" "+path)
	}
	return json.Marshal(out)
}

func newFake() *fakeAPI {
	return &fakeAPI{gets: map[string]string{
		"/api/v1/profiles/policy":  `{"mode":"create","carry":"inherit","create_limit":10,"create_window":86400}`,
		"/api/v1/profiles":         `{"profiles":[{"id":"3","device_type":"router","firmware":"1.0","version":4,"config":{"a":1},"push_interval":60}]}`,
		"/api/v1/labels":           `{"labels":[{"id":"1","name":"north","devices":2,"filter":"site = \"north\""},{"id":"2","name":"manual","devices":1}]}`,
		"/api/v1/config/layers":    `{"layers":[{"kind":"label","name":"north","rev":2,"priority":1,"values":{"x":1}}]}`,
		"/api/v1/rollout-policies": `{"policies":[]}`,
		"/api/v1/alerts/rules":     `{"rules":[{"id":"7","name":"hot","kind":"cpu_above","threshold":90,"pushes":1,"severity":"warning","active":0}]}`,
		"/api/v1/users":            `{"users":[{"name":"alice","role":"operator"}]}`,
		"/api/v1/whoami":           `{"name":"admin","role":"admin"}`,
	}}
}

func parseAll(t *testing.T, text string) []*Object {
	t.Helper()
	objs, err := Parse("d.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func TestPlanActions(t *testing.T) {
	f := newFake()
	f.answer = func(method, path string, dry bool, body map[string]any) (any, error) {
		switch {
		case path == "/api/v1/labels/north": // the server writes filters its way
			return map[string]any{"name": "north", "filter": `site = "north"`}, nil
		case path == "/api/v1/profiles/3":
			return map[string]any{"device_type": "router", "firmware": "1.0", "config": body["config"], "push_interval": 60}, nil
		case strings.HasPrefix(path, "/api/v1/alerts/rules"):
			body["pushes"], body["severity"] = 1, "warning" // defaults
		case path == "/api/v1/users":
			return map[string]any{"name": body["name"], "role": body["role"]}, nil
		}
		return nil, nil
	}
	objs := parseAll(t, `apiVersion: drover/v1
kind: Label
name: north
filter: site=north
---
apiVersion: drover/v1
kind: Profile
device_type: router
firmware: "1.0"
config: {a: 2}
---
apiVersion: drover/v1
kind: AlertRule
name: hot
condition: cpu_above
threshold: 90
---
apiVersion: drover/v1
kind: User
name: bob
role: viewer
`)
	plan, err := Prepare(context.Background(), f, objs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range plan.Changes {
		got = append(got, c.Object.Name()+" "+c.Action)
	}
	want := []string{"Profile router/1.0 change", "Label north unchanged", "AlertRule hot unchanged", "User bob create"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("plan %q, want %q", got, want)
	}
	var out strings.Builder
	plan.Write(&out)
	for _, w := range []string{"~ Profile router/1.0 (d.yaml:7)", "-  a: 1\n+  a: 2\n", "+ User bob (d.yaml:19)", "1 to create, 1 to change, 2 unchanged\n"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("plan lacks %q:\n%s", w, out.String())
		}
	}
	if len(f.made) != 0 {
		t.Fatalf("planning made %v", f.made)
	}
	if err := plan.Apply(context.Background(), f, nil); err != nil {
		t.Fatal(err)
	}
	if want := []string{"PATCH /api/v1/profiles/3", "POST /api/v1/users"}; !reflect.DeepEqual(f.made, want) {
		t.Fatalf("applied %v, want %v", f.made, want)
	}
}

// The server's refusals are problems at the field they name; none of the
// objects is applied. A forbidden one ends the plan with that error.
func TestPlanServerProblems(t *testing.T) {
	f := newFake()
	f.answer = func(method, path string, dry bool, body map[string]any) (any, error) {
		switch path {
		case "/api/v1/labels/south":
			return nil, errors.New("not an API error")
		case "/api/v1/alerts/rules/7":
			return nil, &apiErr{400, "invalid rule: threshold of cpu_above must be 0..100"}
		case "/api/v1/labels/east":
			return nil, &apiErr{400, "where: a value must follow site ="}
		case "/api/v1/users/alice":
			return nil, &apiErr{403, "forbidden"}
		}
		return nil, nil
	}
	objs := parseAll(t, "apiVersion: drover/v1\nkind: AlertRule\nname: hot\ncondition: cpu_above\nthreshold: 900\n---\napiVersion: drover/v1\nkind: Label\nname: east\nfilter: site =\n---\napiVersion: drover/v1\nkind: Profile\ndevice_type: router\nfirmware: \"9.9\"\n")
	_, err := Prepare(context.Background(), f, objs, Options{})
	var inv *InvalidError
	if !errors.As(err, &inv) {
		t.Fatalf("err %v", err)
	}
	var got []string
	for _, p := range inv.Problems {
		got = append(got, p.String())
	}
	want := []string{
		"d.yaml:5: AlertRule hot: invalid rule: threshold of cpu_above must be 0..100",
		"d.yaml:10: Label east: where: a value must follow site =",
		`d.yaml:13: no profile of device type "router" and firmware "9.9" on the server: profiles are made when devices of a firmware register (or when it is approved), and apply changes them`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("problems:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	_, err = Prepare(context.Background(), f, parseAll(t, "apiVersion: drover/v1\nkind: User\nname: alice\nrole: admin\n"), Options{})
	if statusOf(err) != 403 {
		t.Fatalf("forbidden: %v", err)
	}
	// A failure that is not the server's answer is no problem of the
	// description: it ends the plan as it is.
	_, err = Prepare(context.Background(), f, parseAll(t, "apiVersion: drover/v1\nkind: Label\nname: south\nfilter: a = b\n"), Options{})
	if err == nil || errors.As(err, &inv) || !strings.Contains(err.Error(), "not an API error") {
		t.Fatalf("transport failure: %v", err)
	}
	if len(f.made) != 0 {
		t.Fatalf("made %v", f.made)
	}
}

type apiErr struct {
	status int
	msg    string
}

func (e *apiErr) Error() string   { return e.msg }
func (e *apiErr) HTTPStatus() int { return e.status }

// --prune deletes the described kinds' other objects, label values
// before labels, never the caller or a manual label.
func TestPlanPrune(t *testing.T) {
	f := newFake()
	f.gets["/api/v1/users"] = `{"users":[{"name":"alice","role":"operator"},{"name":"admin","role":"admin"}]}`
	f.answer = func(method, path string, dry bool, body map[string]any) (any, error) {
		if path == "/api/v1/labels/other/config" {
			return map[string]any{"kind": "label", "name": "other", "priority": 0, "values": body["values"]}, nil
		}
		return nil, nil
	}
	objs := parseAll(t, "apiVersion: drover/v1\nkind: User\nname: carol\nrole: viewer\n---\napiVersion: drover/v1\nkind: LabelLayer\nlabel: other\nvalues: {}\n---\napiVersion: drover/v1\nkind: Label\nname: west\nfilter: a = b\n")
	plan, err := Prepare(context.Background(), f, objs, Options{Prune: true})
	if err != nil {
		t.Fatal(err)
	}
	var dels []string
	for _, c := range plan.Changes {
		if c.Action == Delete {
			dels = append(dels, c.method+" "+c.path)
		}
	}
	want := []string{"DELETE /api/v1/users/alice", "DELETE /api/v1/labels/north/config", "DELETE /api/v1/labels/north"}
	if !reflect.DeepEqual(dels, want) {
		t.Fatalf("deletions %v, want %v", dels, want)
	}
	var out strings.Builder
	plan.Write(&out)
	if !strings.Contains(out.String(), "- User alice (server)\n--- server: User alice\n+++ /dev/null\n") || !strings.Contains(out.String(), "3 to delete") {
		t.Fatalf("plan:\n%s", out.String())
	}
}
