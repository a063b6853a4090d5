package server

import (
	"encoding/json"
	"reflect"
	"strings"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// answers are the answer bodies of the main operations, as the Go values
// their handlers return; openAPI describes each as a JSON Schema made from
// the type (schemaOf), so that the description follows the code.
// TestOpenAPIAnswersMatchSchemas checks real answers against them.
var answers = map[string]any{
	"GET /api/v1/devices":      devicePage{},
	"GET /api/v1/devices/{id}": fleet.Device{},
	"GET /api/v1/profiles": struct {
		Profiles []fleet.Profile `json:"profiles"`
	}{},
	"GET /api/v1/profiles/{id}": fleet.Profile{},
	"GET /api/v1/labels": struct {
		Labels []fleet.Label `json:"labels"`
	}{},
	"GET /api/v1/server":                        serverInfo{},
	"GET /api/v1/devices/{id}/config/effective": fleet.EffectiveConfig{},
	"GET /api/v1/devices/{id}/config":           fleet.ConfigLayer{},
	"GET /api/v1/labels/{name}/config":          fleet.ConfigLayer{},
	"GET /api/v1/profiles/policy":               fleet.ProfilePolicy{},
}

var (
	timeType = reflect.TypeFor[time.Time]()
	rawType  = reflect.TypeFor[json.RawMessage]()
)

// schemaOf is the JSON Schema of the JSON encoding/json writes for t:
// objects list their properties (required unless omitempty or a pointer)
// and allow no others; ",string" integers and times are strings.
func schemaOf(t reflect.Type) map[string]any {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t == rawType:
		return map[string]any{} // any JSON
	}
	switch t.Kind() {
	case reflect.Pointer:
		s := schemaOf(t.Elem())
		if typ, ok := s["type"].(string); ok {
			s["type"] = []string{typ, "null"}
		}
		return s
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Slice, reflect.Array:
		return map[string]any{"type": []string{"array", "null"}, "items": schemaOf(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": []string{"object", "null"}, "additionalProperties": schemaOf(t.Elem())}
	case reflect.Struct:
		props, required := map[string]any{}, []string{}
		addFields(t, props, &required)
		return map[string]any{"type": "object", "properties": props, "required": required, "additionalProperties": false}
	}
	return map[string]any{}
}

func addFields(t reflect.Type, props map[string]any, required *[]string) {
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
				addFields(ft, props, required)
				continue
			}
		}
		if name == "" {
			name = f.Name
		}
		s := schemaOf(f.Type)
		if strings.Contains(","+opts+",", ",string,") {
			s = map[string]any{"type": "string", "pattern": "^-?[0-9]+$"}
		}
		props[name] = s
		if !strings.Contains(","+opts+",", ",omitempty,") && !strings.Contains(","+opts+",", ",omitzero,") && f.Type.Kind() != reflect.Pointer {
			*required = append(*required, name)
		}
	}
}
