package server_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"testing"
)

// The answers of the main operations match the schemas openapi.json
// declares for them: every property of the right type, the required ones
// present, no undeclared one.
func TestOpenAPIAnswersMatchSchemas(t *testing.T) {
	answers := everyGETAnswer(t)
	body, _ := json.Marshal(answers["GET /api/v1/openapi.json"])
	var doc struct {
		Paths map[string]map[string]struct {
			Responses map[string]struct {
				Content map[string]struct {
					Schema map[string]any `json:"schema"`
				} `json:"content"`
			} `json:"responses"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || len(doc.Paths) == 0 {
		t.Fatalf("openapi.json: %v", err)
	}
	checked := 0
	for path, ops := range doc.Paths {
		for m, op := range ops {
			schema := op.Responses["2XX"].Content["application/json"].Schema
			if schema == nil {
				continue
			}
			out, ok := answers["GET "+path]
			if m != "get" || !ok {
				t.Errorf("%s %s: a schema, but no GET answer to check it with", m, path)
				continue
			}
			for _, e := range validate("GET "+path, schema, out) {
				t.Error(e)
			}
			checked++
		}
	}
	if checked < 6 {
		t.Fatalf("only %d operations have an answer schema", checked)
	}
	// The validator finds what it should.
	sch := map[string]any{"type": "object", "additionalProperties": false, "required": []any{"id"},
		"properties": map[string]any{"id": map[string]any{"type": "string", "pattern": "^-?[0-9]+$"}}}
	for _, v := range []any{map[string]any{"id": 1.0}, map[string]any{}, map[string]any{"id": "1", "x": true}, map[string]any{"id": "a"}} {
		if len(validate("v", sch, v)) == 0 {
			t.Errorf("%v passed %v", v, sch)
		}
	}
}

// validate checks v against the JSON Schema subset schemaOf writes.
func validate(where string, schema map[string]any, v any) []string {
	var errs []string
	types := []string{}
	switch ty := schema["type"].(type) {
	case string:
		types = append(types, ty)
	case []any:
		for _, x := range ty {
			types = append(types, x.(string))
		}
	}
	kind := "null"
	switch x := v.(type) {
	case bool:
		kind = "boolean"
	case float64:
		kind = "number"
		if x == float64(int64(x)) {
			kind = "integer"
		}
	case string:
		kind = "string"
	case []any:
		kind = "array"
	case map[string]any:
		kind = "object"
	}
	if len(types) > 0 && !slices.Contains(types, kind) && !(kind == "integer" && slices.Contains(types, "number")) {
		return []string{fmt.Sprintf("%s: %s, declared %v", where, kind, types)}
	}
	switch x := v.(type) {
	case string:
		if p, ok := schema["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(x) {
			errs = append(errs, fmt.Sprintf("%s: %q does not match %s", where, x, p))
		}
	case []any:
		if items, ok := schema["items"].(map[string]any); ok {
			for i, e := range x {
				errs = append(errs, validate(fmt.Sprintf("%s[%d]", where, i), items, e)...)
			}
		}
	case map[string]any:
		props, _ := schema["properties"].(map[string]any)
		req, _ := schema["required"].([]any)
		for _, r := range req {
			if _, ok := x[r.(string)]; !ok && props != nil {
				errs = append(errs, fmt.Sprintf("%s.%s: required, missing", where, r))
			}
		}
		for k, e := range x {
			if ps, ok := props[k].(map[string]any); ok {
				errs = append(errs, validate(where+"."+k, ps, e)...)
			} else if ap, ok := schema["additionalProperties"].(map[string]any); ok {
				errs = append(errs, validate(where+"."+k, ap, e)...)
			} else if schema["additionalProperties"] == false {
				errs = append(errs, fmt.Sprintf("%s.%s: not declared", where, k))
			}
		}
	}
	return errs
}
