package server_test

import (
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// The OpenAPI document served at /api/v1/openapi.json holds every route of
// the table with its method, and nothing else; each documented operation
// is answered by a real handler (not 404 or 405), takes each documented
// query parameter and refuses an undocumented one with 400
// unknown_parameter.
func TestOpenAPIMatchesHandlers(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	c.register("m-1")
	resp, body := c.raw("GET", "/api/v1/openapi.json", "", nil, nil) // public
	var doc struct {
		OpenAPI string `json:"openapi"`
		Paths   map[string]map[string]struct {
			Parameters []struct{ Name, In string } `json:"parameters"`
			Security   []any                       `json:"security"`
			Role       string                      `json:"x-drover-role"`
		} `json:"paths"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &doc) != nil || doc.OpenAPI != "3.1.0" {
		t.Fatalf("openapi.json: %d %.300s", resp.StatusCode, body)
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for m := range ops {
			documented[strings.ToUpper(m)+" "+path] = true
		}
	}
	// Every route of the table is documented, with its role.
	inTable := map[string]bool{}
	for _, rt := range server.RouteNeeds() {
		if rt.Method == "" || rt.Path == "/{$}" {
			continue // the dashboard and its redirect
		}
		key := rt.Method + " " + rt.Path
		inTable[key] = true
		op, ok := doc.Paths[rt.Path][strings.ToLower(rt.Method)]
		if !ok {
			t.Errorf("%s is a route but not in openapi.json", key)
			continue
		}
		if op.Role != rt.Need || (rt.Need != "public") != (len(op.Security) > 0) {
			t.Errorf("%s: documented role %q security %v, the table says %q", key, op.Role, op.Security, rt.Need)
		}
	}
	for key := range documented {
		if !inTable[key] {
			t.Errorf("%s is documented but not in the table", key)
		}
	}
	if len(documented) < 80 {
		t.Fatalf("only %d operations documented", len(documented))
	}
	// Against the real handlers: the route exists, its documented query
	// parameters are known to it, an undocumented one is refused.
	fill := strings.NewReplacer("{id}", "1", "{name}", "x", "{machine_id}", "m")
	call := func(method, path string) (int, map[string]any) {
		resp, body := c.raw(method, path, s.AdminToken, []byte("{}"), nil)
		var out map[string]any
		json.Unmarshal(body, &out) // not JSON for /metrics: out stays nil
		return resp.StatusCode, out
	}
	errCode := func(out map[string]any) (code, msg string) {
		e, _ := out["error"].(map[string]any)
		code, _ = e["code"].(string)
		msg, _ = e["message"].(string)
		return code, msg
	}
	for path, ops := range doc.Paths {
		for m, op := range ops {
			method := strings.ToUpper(m)
			p := fill.Replace(path)
			st, out := call(method, p)
			if code, msg := errCode(out); st == 405 || (code == "not_found" && strings.HasPrefix(msg, "no such endpoint")) {
				t.Errorf("%s %s: documented but answered %d %v", method, path, st, out)
			}
			q := url.Values{}
			for _, prm := range op.Parameters {
				if prm.In == "query" {
					q.Set(prm.Name, "1")
				}
			}
			if len(q) > 0 {
				if _, out := call(method, p+"?"+q.Encode()); out != nil {
					if code, _ := errCode(out); code == "unknown_parameter" {
						t.Errorf("%s %s?%s: a documented parameter was refused: %v", method, path, q.Encode(), out)
					}
				}
			}
			st, out = call(method, p+"?zz_undocumented=1")
			if code, msg := errCode(out); st != 400 || code != "unknown_parameter" || !strings.Contains(msg, "zz_undocumented") {
				t.Errorf("%s %s?zz_undocumented=1: %d %v, want 400 unknown_parameter", method, path, st, out)
			}
		}
	}
	// The devices list documents its filter, order, paging and format.
	var names []string
	for _, prm := range doc.Paths["/api/v1/devices"]["get"].Parameters {
		names = append(names, prm.Name)
	}
	for _, want := range []string{"liveness", "label", "sort", "dir", "limit", "cursor", "format"} {
		if !slices.Contains(names, want) {
			t.Errorf("GET /api/v1/devices documents %v, missing %s", names, want)
		}
	}
	if resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("Content-Type %q", resp.Header.Get("Content-Type"))
	}
}

// Every route of the table has what the OpenAPI document needs: a summary,
// its answer's type and, for a POST, PUT or PATCH, its request body's
// type (noBody{} when it reads none; a handler that decodes a body its
// route does not declare answers 500). In the document: the summary, the
// request body schema, a success answer and the error answers with the
// error body.
func TestOpenAPIComplete(t *testing.T) {
	for _, rt := range server.RouteDocs() {
		if rt.Method == "" || rt.Path == "/{$}" {
			continue
		}
		key := rt.Method + " " + rt.Path
		if rt.Summary == "" {
			t.Errorf("%s: no summary in the routes table (route.summary, routes.go)", key)
		}
		if !rt.Out {
			t.Errorf("%s: no answer type in the routes table (route.out, routes.go)", key)
		}
		switch rt.Method {
		case "POST", "PUT", "PATCH":
			if !rt.In {
				t.Errorf("%s: no request body type in the routes table (route.in, routes.go; noBody{} if it reads none)", key)
			}
		default:
			if rt.In && !rt.NoBody {
				t.Errorf("%s: a request body on a %s", key, rt.Method)
			}
		}
	}
	s := servertest.Start(t, servertest.Options{})
	var doc openAPIOps
	if st := s.Admin(t, "GET", "/api/v1/openapi.json", nil, &doc); st != 200 {
		t.Fatalf("openapi.json: %d", st)
	}
	bodies := 0
	for path, ops := range doc.Paths {
		for m, op := range ops {
			key := strings.ToUpper(m) + " " + path
			if op.Summary == "" {
				t.Errorf("%s: no summary", key)
			}
			if op.RequestBody != nil {
				_, file := op.RequestBody.Content["application/octet-stream"]
				if op.RequestBody.Content["application/json"].Schema == nil && !(file && len(op.RequestBody.Content) == 1) {
					t.Errorf("%s: a request body without a JSON schema (nor a file's bytes alone)", key)
				}
				bodies++
			}
			success := false
			for code, r := range op.Responses {
				if code >= "200" && code < "300" || code == "101" {
					success = true
				}
				if code >= "400" && code < "600" && key+" "+code != "GET /readyz 503" && r.Content["application/json"].Schema["$ref"] != "#/components/schemas/Error" {
					t.Errorf("%s: error answer %s without the error body", key, code)
				}
			}
			if !success {
				t.Errorf("%s: no success answer", key)
			}
			for _, code := range []string{"400", "default"} {
				if _, ok := op.Responses[code]; !ok {
					t.Errorf("%s: no %s answer", key, code)
				}
			}
		}
	}
	if bodies < 20 {
		t.Errorf("only %d operations take a request body", bodies)
	}
}

// openAPIOps is the part of the OpenAPI document the tests read.
type openAPIOps struct {
	Paths map[string]map[string]struct {
		Summary     string `json:"summary"`
		RequestBody *struct {
			Content map[string]struct {
				Schema map[string]any `json:"schema"`
			} `json:"content"`
		} `json:"requestBody"`
		Responses map[string]struct {
			Content map[string]struct {
				Schema map[string]any `json:"schema"`
			} `json:"content"`
		} `json:"responses"`
	} `json:"paths"`
}
