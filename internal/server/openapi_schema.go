package server

import (
	"encoding"
	"encoding/json"
	"reflect"
	"strings"
	"time"
	"unicode"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
)

var (
	timeType      = reflect.TypeFor[time.Time]()
	rawType       = reflect.TypeFor[json.RawMessage]()
	numberType    = reflect.TypeFor[json.Number]()
	marshalerType = reflect.TypeFor[json.Marshaler]()
	textType      = reflect.TypeFor[encoding.TextMarshaler]()
)

// idString is the schema of an ID: a decimal string.
func idString() map[string]any { return map[string]any{"type": "string", "pattern": "^[0-9]+$"} }

// ownJSON is the schema of a type whose JSON is its own (MarshalJSON,
// MarshalText).
func (g *schemaGen) ownJSON(t reflect.Type, request bool) (map[string]any, bool) {
	switch t {
	case reflect.TypeFor[fleet.Rollout]():
		return g.ref(t, request, func() map[string]any {
			s := g.structSchema(t, request)
			props := s["properties"].(map[string]any)
			props["id"], props["firmware_id"] = idString(), idString()
			return s
		}), true
	case reflect.TypeFor[alert.IDList]():
		return map[string]any{"type": "array", "items": idString()}, true
	case reflect.TypeFor[access.Role]():
		return map[string]any{"type": "string", "enum": []string{"viewer", "operator", "admin"}}, true
	case reflect.TypeFor[fleet.CommandState]():
		return map[string]any{"type": "string", "enum": fleet.ParamValues("command_state")}, true
	}
	return nil, false
}

// schemaGen makes the JSON Schemas of Go types: a named struct type is
// described once, in components (answers under its name, request bodies
// under its name and "Input" when the name does not say so), and referred
// to.
type schemaGen struct {
	components map[string]any
	names      map[string]reflect.Type // component name → the type, to keep names unique
	done       map[reflect.Type]map[bool]string
}

func newSchemaGen() *schemaGen {
	return &schemaGen{components: map[string]any{}, names: map[string]reflect.Type{}, done: map[reflect.Type]map[bool]string{}}
}

// answer is the schema of the JSON encoding/json writes for v's type:
// objects list their properties (required unless omitempty or a pointer)
// and allow no others; ",string" integers and times are strings; nil
// slices, maps and pointers are null.
func (g *schemaGen) answer(v any) map[string]any { return g.schemaOf(reflect.TypeOf(v), false) }

// request is the schema of a request body decoded into v's type: the
// same, except that a field is required only when tagged
// openapi:"required" (the handler checks the rest).
func (g *schemaGen) request(v any) map[string]any { return g.schemaOf(reflect.TypeOf(v), true) }

func (g *schemaGen) schemaOf(t reflect.Type, request bool) map[string]any {
	if s, ok := g.ownJSON(t, request); ok {
		return s
	}
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t == rawType:
		return map[string]any{} // any JSON
	case t == numberType:
		return map[string]any{"anyOf": []any{idString(), map[string]any{"type": "integer", "minimum": 0}}}
	case t.Kind() != reflect.Pointer && t.Implements(marshalerType):
		return map[string]any{} // its own JSON, not described
	case t.Kind() != reflect.Pointer && t.Implements(textType):
		return map[string]any{"type": "string"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		s := g.schemaOf(t.Elem(), request)
		if typ, ok := s["type"].(string); ok {
			s["type"] = []string{typ, "null"}
		} else if _, ok := s["$ref"]; ok {
			s = map[string]any{"anyOf": []any{s, map[string]any{"type": "null"}}}
		}
		return s
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return map[string]any{"type": "integer"}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer", "minimum": 0}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Slice, reflect.Array:
		return map[string]any{"type": []string{"array", "null"}, "items": g.schemaOf(t.Elem(), request)}
	case reflect.Map:
		return map[string]any{"type": []string{"object", "null"}, "additionalProperties": g.schemaOf(t.Elem(), request)}
	case reflect.Interface:
		return map[string]any{}
	case reflect.Struct:
		if t.Name() == "" {
			return g.structSchema(t, request)
		}
		return g.ref(t, request, func() map[string]any { return g.structSchema(t, request) })
	}
	return map[string]any{}
}

// ref puts a named type's schema in components, once, and refers to it.
func (g *schemaGen) ref(t reflect.Type, request bool, make func() map[string]any) map[string]any {
	if name, ok := g.done[t][request]; ok {
		return map[string]any{"$ref": "#/components/schemas/" + name}
	}
	name := exported(t.Name())
	if request && !strings.HasSuffix(name, "Body") && !strings.HasSuffix(name, "Request") {
		name += "Input"
	}
	if other, taken := g.names[name]; taken && other != t {
		pkg := t.PkgPath()
		name = exported(pkg[strings.LastIndex(pkg, "/")+1:]) + name
	}
	g.names[name] = t
	if g.done[t] == nil {
		g.done[t] = map[bool]string{}
	}
	g.done[t][request] = name
	g.components[name] = map[string]any{} // a type that contains itself refers to it
	g.components[name] = make()
	return map[string]any{"$ref": "#/components/schemas/" + name}
}

func exported(name string) string {
	r := []rune(name)
	r[0] = unicode.ToUpper(r[0])
	return string(r)
}

func (g *schemaGen) structSchema(t reflect.Type, request bool) map[string]any {
	props, required := map[string]any{}, []string{}
	g.addFields(t, props, &required, request, map[string]int{}, 0)
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

// addFields adds t's fields at the depth of embedding given: as
// encoding/json, a shallower field wins over a deeper one of the same name.
func (g *schemaGen) addFields(t reflect.Type, props map[string]any, required *[]string, request bool, depth map[string]int, d int) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				g.addFields(ft, props, required, request, depth, d+1)
				continue
			}
		}
		if name == "" {
			name = f.Name
		}
		if old, seen := depth[name]; seen && old <= d {
			continue
		}
		depth[name] = d
		s := g.schemaOf(f.Type, request)
		if strings.Contains(","+opts+",", ",string,") {
			s = idString()
		}
		props[name] = s
		var req bool
		if request {
			req = f.Tag.Get("openapi") == "required"
		} else {
			req = !strings.Contains(","+opts+",", ",omitempty,") && !strings.Contains(","+opts+",", ",omitzero,") && f.Type.Kind() != reflect.Pointer
		}
		if i := indexOf(*required, name); i >= 0 {
			*required = append((*required)[:i], (*required)[i+1:]...)
		}
		if req {
			*required = append(*required, name)
		}
	}
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}
