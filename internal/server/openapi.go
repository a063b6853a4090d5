package server

import (
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
)

// openAPI describes the routes table as an OpenAPI 3.1 document, served at
// GET /api/v1/openapi.json: every route with a method (not the dashboard),
// its path and query parameters, who may call it and its error body.
// Built from the table, so that it cannot list a route the server lacks or
// miss one it has; TestOpenAPIMatchesHandlers checks it against the real
// handlers. The answer bodies of the main operations (answers,
// openapi_schema.go) have schemas made from their Go types; the others are
// described in docs/operations.md and docs/protocol.md.
func openAPI(table []route) map[string]any {
	paths := map[string]any{}
	for _, rt := range table {
		if rt.method == "" || rt.path == "/{$}" || (rt.fn == nil && rt.h == nil) {
			continue
		}
		item, _ := paths[rt.path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[rt.path] = item
		}
		item[strings.ToLower(rt.method)] = operation(rt)
	}
	return map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{
			"title":       "Drover API",
			"version":     "v1",
			"description": "Device protocol (docs/protocol.md) and operator API (docs/operations.md). IDs are decimal strings, times RFC 3339 in UTC. A query parameter not listed for an operation answers 400 unknown_parameter.",
		},
		"paths": paths,
		"components": map[string]any{
			"securitySchemes": map[string]any{
				"bearer": map[string]any{"type": "http", "scheme": "bearer", "description": "the admin token, a user's API token (drv_…) or, on device endpoints, the device token"},
			},
			"schemas": map[string]any{
				"Error": map[string]any{
					"type":     "object",
					"required": []string{"error"},
					"properties": map[string]any{"error": map[string]any{
						"type":       "object",
						"required":   []string{"code", "message"},
						"properties": map[string]any{"code": map[string]any{"type": "string"}, "message": map[string]any{"type": "string"}},
					}},
				},
			},
		},
	}
}

var pathParam = regexp.MustCompile(`\{([a-z_]+)\}`)

var needNames = map[need]string{public: "public", viewer: "viewer", operator: "operator", admin: "admin", metricsReader: "metrics", remoteAccess: "operator"}

func operation(rt route) map[string]any {
	var params []any
	for _, m := range pathParam.FindAllStringSubmatch(rt.path, -1) {
		params = append(params, map[string]any{"name": m[1], "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
	}
	for _, name := range rt.query {
		params = append(params, map[string]any{"name": name, "in": "query", "required": false, "schema": map[string]any{"type": "string"}})
	}
	body := map[string]any{}
	if v, ok := answers[rt.method+" "+rt.path]; ok {
		body["schema"] = schemaOf(reflect.TypeOf(v))
	}
	ok := map[string]any{"description": "success", "content": map[string]any{"application/json": body}}
	if slices.Contains(rt.query, "format") {
		ok["content"].(map[string]any)["text/csv"] = map[string]any{}
	}
	op := map[string]any{
		"operationId": operationID(rt),
		"responses": map[string]any{
			"2XX":     ok, // 200, 201 for a creation, 202 for a registration waiting for approval
			"default": map[string]any{"description": "error", "content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/Error"}}}},
		},
		"x-drover-role": needNames[rt.need],
	}
	if params != nil {
		op["parameters"] = params
	}
	if rt.need != public {
		op["security"] = []any{map[string]any{"bearer": []string{}}}
	}
	return op
}

// operationID is method and path in one word: GET /api/v1/devices/{id} is
// get_devices_id.
func operationID(rt route) string {
	p := strings.TrimPrefix(rt.path, "/api/v1/")
	p = strings.NewReplacer("{", "", "}", "", "/", "_", ".", "_", "-", "_").Replace(strings.Trim(p, "/"))
	return strings.ToLower(rt.method) + "_" + p
}

func (a *api) openAPIDoc(*http.Request) (any, error) { return a.openapi, nil }
