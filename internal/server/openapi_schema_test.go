package server_test

import (
	"encoding/json"
	"maps"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

// Every GET answer matches the schema openapi.json declares for it (the
// JSON Schema of its Go type): every property of the right type, the
// required ones present, no undeclared one.
func TestOpenAPIAnswersMatchSchemas(t *testing.T) {
	answers := everyGETAnswer(t)
	doc, _ := json.Marshal(answers["GET /api/v1/openapi.json"])
	var parsed openAPIOps
	if err := json.Unmarshal(doc, &parsed); err != nil || len(parsed.Paths) == 0 {
		t.Fatalf("openapi.json: %v", err)
	}
	check := func(path string, out any) []string {
		body, _ := json.Marshal(out)
		req := httptest.NewRequest("GET", strings.NewReplacer("{id}", "1", "{name}", "x", "{machine_id}", "m").Replace(path), nil)
		problems, err := servertest.CheckOpenAPI(doc, req, nil, 200, "application/json", body)
		if err != nil {
			t.Fatal(err)
		}
		return problems
	}
	checked := 0
	for path, ops := range parsed.Paths {
		for m, op := range ops {
			if m != "get" || op.Responses["200"].Content["application/json"].Schema == nil {
				continue
			}
			out, ok := answers["GET "+path]
			if !ok {
				continue // files, the device connection, the cluster
			}
			for _, e := range check(path, out) {
				t.Errorf("GET %s: %s", path, e)
			}
			checked++
		}
	}
	if checked < 30 {
		t.Fatalf("only %d operations have an answer schema checked", checked)
	}
	// The validator finds what it should.
	good := answers["GET /api/v1/devices/{id}"].(map[string]any)
	if p := check("/api/v1/devices/{id}", good); len(p) > 0 {
		t.Fatalf("a real answer refused: %v", p)
	}
	for _, change := range []func(map[string]any){
		func(d map[string]any) { d["id"] = 1.0 },        // an ID as a number
		func(d map[string]any) { d["id"] = "a" },        // not a decimal string
		func(d map[string]any) { delete(d, "id") },      // required
		func(d map[string]any) { d["zz_extra"] = true }, // undeclared
	} {
		bad := maps.Clone(good)
		change(bad)
		if len(check("/api/v1/devices/{id}", bad)) == 0 {
			t.Errorf("%v passed", bad)
		}
	}
	// A request body accepted against its schema, and the statuses listed.
	post := func(body string, status int) []string {
		req := httptest.NewRequest("POST", "/api/v1/labels/assign", strings.NewReader(body))
		problems, err := servertest.CheckOpenAPI(doc, req, []byte(body), status, "application/json", []byte(`{"label":"a","changed":0,"removed":false}`))
		if err != nil {
			t.Fatal(err)
		}
		return problems
	}
	if p := post(`{"label":"a","filter":{}}`, 200); len(p) > 0 {
		t.Errorf("a right request refused: %v", p)
	}
	for _, body := range []string{`{"label":5,"filter":{}}`, `{"filter":{}}`, `{"label":"a","filter":{},"zz":1}`, `{"label":"a","filter":{"liveness":3}}`} {
		if len(post(body, 200)) == 0 {
			t.Errorf("request %s passed", body)
		}
	}
	if p := post(`{"label":"a","filter":{}}`, 418); !strings.Contains(strings.Join(p, " "), "does not list") {
		t.Errorf("an answer with a status not listed passed")
	}
}
