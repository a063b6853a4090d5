package server

import (
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/drover/drover/internal/fleet"
)

// openAPI describes the routes table as an OpenAPI 3.1 document, served at
// GET /api/v1/openapi.json: every route with a method (not the dashboard),
// its summary, path and query parameters, request body, answers and
// error answers, and who may call it. Built from the table, so that it
// cannot list a route the server lacks or miss one it has;
// TestOpenAPIMatchesHandlers checks it against the real handlers, and
// every request and answer of the tests that use servertest is checked
// against it (servertest.OpenAPIChecker). The bodies' schemas are made
// from the Go types the handlers decode and return (route.in, route.out;
// openapi_schema.go).
func openAPI(table []route) map[string]any {
	g := newSchemaGen()
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
		item[strings.ToLower(rt.method)] = g.operation(rt)
	}
	schemas := g.components
	schemas["Error"] = map[string]any{
		"type":     "object",
		"required": []string{"error"},
		"properties": map[string]any{"error": map[string]any{
			"type":       "object",
			"required":   []string{"code", "message"},
			"properties": map[string]any{"code": map[string]any{"type": "string"}, "message": map[string]any{"type": "string"}},
		}},
	}
	return map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{
			"title":       "Drover API",
			"version":     "v1",
			"description": "Device protocol (docs/protocol.md) and operator API (docs/operations.md). IDs are decimal strings, times RFC 3339 in UTC. A query parameter not listed for an operation answers 400 unknown_parameter; a request body with a field not listed answers 400.",
		},
		"paths": paths,
		"components": map[string]any{
			"securitySchemes": map[string]any{
				"bearer": map[string]any{"type": "http", "scheme": "bearer", "description": "the admin token, a user's API token (drv_…) or, on device endpoints, the device token"},
			},
			"schemas": schemas,
		},
	}
}

var pathParam = regexp.MustCompile(`\{([a-z_]+)\}`)

var needNames = map[need]string{public: "public", viewer: "viewer", operator: "operator", admin: "admin", metricsReader: "metrics", remoteAccess: "operator"}

// Kinds of route.out besides a Go value written as JSON with 200.
type (
	// answers are the success answers by status.
	answers map[int]any
	// oneOf: the answer is one of these.
	oneOf []any
	// rawAnswer is an answer that is not JSON: a WebSocket (101, no
	// content type), a file, the metrics.
	rawAnswer struct {
		status      int
		contentType string
	}
)

// e lists route.errs.
func e(statuses ...int) []int { return statuses }

func (g *schemaGen) operation(rt route) map[string]any {
	op := map[string]any{
		"operationId":   operationID(rt),
		"summary":       rt.summary,
		"responses":     g.responses(rt),
		"x-drover-role": needNames[rt.need],
	}
	var params []any
	for _, m := range pathParam.FindAllStringSubmatch(rt.path, -1) {
		params = append(params, map[string]any{"name": m[1], "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
	}
	for _, name := range rt.query {
		p := map[string]any{"name": name, "in": "query", "required": false, "schema": querySchema(rt, name)}
		if name == fleet.FilterLabel {
			p["schema"] = map[string]any{"type": "array", "items": map[string]any{"type": "string"}}
			p["explode"] = true
		}
		params = append(params, p)
	}
	if params != nil {
		op["parameters"] = params
	}
	if _, raw := rt.in.(rawUpload); raw {
		op["requestBody"] = map[string]any{"required": true, "content": map[string]any{
			"application/octet-stream": map[string]any{"schema": map[string]any{"type": "string", "format": "binary"}}}}
	} else if rt.in != nil {
		if _, none := rt.in.(noBody); !none {
			content := map[string]any{"application/json": map[string]any{"schema": g.request(rt.in)}}
			if rt.stream { // the file itself, its metadata in the query
				content["application/octet-stream"] = map[string]any{"schema": map[string]any{"type": "string", "format": "binary"}}
			}
			op["requestBody"] = map[string]any{"required": !rt.stream, "content": content}
		}
	}
	if rt.need != public {
		op["security"] = []any{map[string]any{"bearer": []string{}}}
	}
	return op
}

func (g *schemaGen) responses(rt route) map[string]any {
	out := map[string]any{}
	ok := func(status int, v any) {
		desc := http.StatusText(status)
		switch x := v.(type) {
		case rawAnswer:
			r := map[string]any{"description": desc}
			if x.contentType != "" {
				r["content"] = map[string]any{x.contentType: map[string]any{"schema": map[string]any{"type": "string"}}}
			}
			out[strconv.Itoa(x.status)] = r
			return
		case createdBody:
			status, v = http.StatusCreated, x.v
			desc = http.StatusText(status)
		}
		var s map[string]any
		if alts, ok := v.(oneOf); ok {
			var branches []any
			for _, a := range alts {
				branches = append(branches, g.answer(a))
			}
			s = map[string]any{"oneOf": branches}
		} else {
			s = g.answer(v)
		}
		content := map[string]any{"application/json": map[string]any{"schema": s}}
		if slices.Contains(rt.query, "format") {
			content["text/csv"] = map[string]any{"schema": map[string]any{"type": "string"}}
		}
		out[strconv.Itoa(status)] = map[string]any{"description": desc, "content": content}
	}
	if as, several := rt.out.(answers); several {
		for status, v := range as {
			ok(status, v)
		}
	} else if rt.out != nil {
		ok(http.StatusOK, rt.out)
	}
	errBody := map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/Error"}}}
	for _, st := range errorStatuses(rt) {
		if _, set := out[strconv.Itoa(st)]; !set {
			out[strconv.Itoa(st)] = map[string]any{"description": errorMeaning[st], "content": errBody}
		}
	}
	out["default"] = map[string]any{"description": "error", "content": errBody}
	return out
}

// errorMeaning describes the error answers.
var errorMeaning = map[int]string{
	400: "Bad request: an invalid field or query parameter, an unknown query parameter or body field, malformed JSON",
	401: "No credential, or a wrong, expired or revoked one",
	403: "The credential's role may not do this, or the device is refused",
	404: "No such object",
	409: "Conflicts with the object's state",
	413: "The request body is too large",
	429: "Too many requests: retry after the Retry-After header's seconds",
	502: "The device could not reach the destination, or its tunnel link failed",
	504: "The device did not answer in time",
	503: "Unavailable for now (the store, or no request slot free): retry after the Retry-After header's seconds",
}

// errorStatuses are the error answers of a route: 400 (an unknown query
// parameter) and 413 (a body over the limit) for every route; 401 and
// 403 for a route that needs a credential; 404 for a route with a path
// parameter; 503 (the store unavailable) for an apiFunc; and route.errs.
func errorStatuses(rt route) []int {
	st := []int{http.StatusBadRequest, http.StatusRequestEntityTooLarge}
	if rt.need != public {
		st = append(st, http.StatusUnauthorized, http.StatusForbidden)
	}
	if strings.Contains(rt.path, "{") {
		st = append(st, http.StatusNotFound)
	}
	if rt.fn != nil {
		st = append(st, http.StatusServiceUnavailable)
	}
	st = append(st, rt.errs...)
	slices.Sort(st)
	return slices.Compact(st)
}

// querySchema is the schema of a query parameter: its type and, where the
// values are few, their list.
func querySchema(rt route, name string) map[string]any {
	str := map[string]any{"type": "string"}
	enum := func(vals ...string) map[string]any { return map[string]any{"type": "string", "enum": vals} }
	integer := map[string]any{"type": "integer", "minimum": 0}
	id := map[string]any{"type": "string", "pattern": "^[0-9]+$"}
	timeParam := map[string]any{"type": "string", "format": "date-time"}
	if v := fleet.ParamValues(name); v != nil && strings.HasPrefix(rt.path, "/api/v1/devices") {
		return enum(v...)
	}
	switch name {
	case "limit":
		return integer
	case "format":
		return enum("json", "csv")
	case "dir":
		return enum("asc", "desc")
	case fleet.FilterProfileID, "device_id", "rule_id":
		return id
	case "since", "until":
		return timeParam
	case "from", "to":
		if strings.HasSuffix(rt.path, "/diff") {
			return map[string]any{"type": "integer", "description": "a revision number"}
		}
		if strings.HasSuffix(rt.path, "/tunnel") {
			return str
		}
		return timeParam
	case "state":
		switch {
		case strings.HasPrefix(rt.path, "/api/v1/rollouts"):
			return enum(fleet.RolloutDeviceStates...)
		case strings.HasPrefix(rt.path, "/api/v1/alerts"):
			return enum("active", "all")
		default:
			return enum(fleet.ParamValues("command_state")...)
		}
	}
	return str
}

// operationID is method and path in one word: GET /api/v1/devices/{id} is
// get_devices_id.
func operationID(rt route) string {
	p := strings.TrimPrefix(rt.path, "/api/v1/")
	p = strings.NewReplacer("{", "", "}", "", "/", "_", ".", "_", "-", "_").Replace(strings.Trim(p, "/"))
	return strings.ToLower(rt.method) + "_" + p
}

func (a *api) openAPIDoc(*http.Request) (any, error) { return a.openapi, nil }
