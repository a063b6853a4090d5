// Package gitops is configuration as code for `drover ctl apply` and
// `drover ctl export` (docs/ctl.md, "Configuration as code"): a fleet's
// configuration — the profile policy, device types' schemas, profiles,
// live labels, label and device layers, rollout policies, alert rules and
// users — written as YAML documents, one object each, read with the line
// of every field, compared with the server's state and applied through
// the operator API.
// The server checks every object (its ?dry_run=1) before anything is
// written, so the rules live once, in the server; this package checks
// only the form of the documents. It knows no flags.
package gitops

import (
	"fmt"
	"strings"
)

// APIVersion is the apiVersion of every document.
const APIVersion = "drover/v1"

// The kinds, in the order they are applied: what an object names exists
// before it (a label before its layer, a schema before the profiles it
// checks).
const (
	KindProfilePolicy = "ProfilePolicy"
	KindSchema        = "DeviceTypeSchema"
	KindProfile       = "Profile"
	KindLabel         = "Label"
	KindLabelLayer    = "LabelLayer"
	KindDeviceLayer   = "DeviceLayer"
	KindRolloutPolicy = "RolloutPolicy"
	KindAlertRule     = "AlertRule"
	KindUser          = "User"
)

// Kinds lists the kinds in apply order.
var Kinds = []string{KindProfilePolicy, KindSchema, KindProfile, KindLabel, KindLabelLayer, KindDeviceLayer, KindRolloutPolicy, KindAlertRule, KindUser}

// ftype is what a field holds.
type ftype int

const (
	tString  ftype = iota
	tInt           // a whole number
	tNumber        // any number
	tBool          //
	tStrings       // a list of strings
	tObject        // a mapping of any JSON values
)

// apiName is the API's name of f.
func (f field) apiName() string {
	if f.api != "" {
		return f.api
	}
	return f.name
}

func (t ftype) String() string {
	return [...]string{"a string", "a whole number", "a number", "true or false", "a list of strings", "a mapping"}[t]
}

// field is one field of a kind.
type field struct {
	name     string
	typ      ftype
	required bool
	key      bool   // part of the object's identity
	api      string // the API's name of it, when another
}

// kindFields are each kind's fields, in the order export writes them.
var kindFields = map[string][]field{
	KindProfilePolicy: {{name: "mode", typ: tString}, {name: "carry", typ: tString}, {name: "create_limit", typ: tInt}, {name: "create_window", typ: tInt}},
	KindSchema:        {{name: "device_type", typ: tString, required: true, key: true}, {name: "schema", typ: tObject, required: true}},
	KindProfile: {{name: "device_type", typ: tString, required: true, key: true}, {name: "firmware", typ: tString, required: true, key: true},
		{name: "push_interval", typ: tInt}, {name: "config", typ: tObject}},
	KindLabel:       {{name: "name", typ: tString, required: true, key: true}, {name: "filter", typ: tString, required: true}},
	KindLabelLayer:  {{name: "label", typ: tString, required: true, key: true}, {name: "priority", typ: tInt}, {name: "values", typ: tObject, required: true}},
	KindDeviceLayer: {{name: "device", typ: tString, required: true, key: true}, {name: "values", typ: tObject, required: true}},
	KindRolloutPolicy: {{name: "name", typ: tString, required: true, key: true}, {name: "waves", typ: tStrings},
		{name: "max_failure_pct", typ: tNumber}, {name: "max_downloads", typ: tInt}, {name: "window", typ: tObject}, {name: "stall_timeout", typ: tInt}},
	KindAlertRule: {{name: "name", typ: tString, required: true, key: true}, {name: "condition", api: "kind", typ: tString, required: true},
		{name: "threshold", typ: tNumber}, {name: "pushes", typ: tInt}, {name: "seconds", typ: tInt},
		{name: "label", typ: tString}, {name: "device_type", typ: tString}, {name: "severity", typ: tString},
		{name: "disabled", typ: tBool}, {name: "webhook", typ: tString}, {name: "email", typ: tStrings}},
	KindUser: {{name: "name", typ: tString, required: true, key: true}, {name: "role", typ: tString, required: true}},
}

// secretFields are refused in every document: secrets are never part of
// the description (passwords and tokens are set with drover ctl users
// and tokens).
var secretFields = map[string]string{"password": "passwords", "password_hash": "passwords", "token": "tokens", "tokens": "tokens", "secret": "secrets"}

// Pos is where a document or a field is.
type Pos struct {
	File string
	Line int
}

func (p Pos) String() string {
	if p.Line == 0 {
		return p.File
	}
	if p.File == "" {
		return fmt.Sprintf("line %d", p.Line)
	}
	return fmt.Sprintf("%s:%d", p.File, p.Line)
}

// Object is one document: a kind and its fields as JSON values (strings,
// float64 or int64 numbers, bools, []any, map[string]any).
type Object struct {
	Kind   string
	Fields map[string]any
	Pos    Pos            // the document's kind line
	Lines  map[string]int // each field's line
}

// Key is the object's identity within its kind: "" for the profile
// policy, DEVICE_TYPE/FIRMWARE for a profile, the name otherwise.
func (o *Object) Key() string {
	var parts []string
	for _, f := range kindFields[o.Kind] {
		if f.key {
			s, _ := o.Fields[f.name].(string)
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "/")
}

// Name is the object as people read it: "Profile sensor/1.4.0".
func (o *Object) Name() string {
	if k := o.Key(); k != "" {
		return o.Kind + " " + k
	}
	return o.Kind
}

// at is where field name is, or the document when it is not in it.
func (o *Object) at(name string) Pos {
	if l, ok := o.Lines[name]; ok {
		return Pos{o.Pos.File, l}
	}
	return o.Pos
}

// kindOrder is a kind's place in Kinds.
func kindOrder(k string) int {
	for i, n := range Kinds {
		if n == k {
			return i
		}
	}
	return len(Kinds)
}
