package generate_test

import (
	"bytes"
	"flag"
	"io"
	"os"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/oapi-codegen/oapi-codegen/v2/pkg/codegen"

	"github.com/drover/drover/internal/server/servertest"
)

var update = flag.Bool("update", false, "rewrite client.gen.go from the server's OpenAPI document")

const clientFile = "../client.gen.go"

// generate makes the client from the document a real server serves.
func generate(t *testing.T) []byte {
	t.Helper()
	s := servertest.Start(t, servertest.Options{})
	resp, err := s.Client().Get(s.URL + "/api/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	doc, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("openapi.json: %d %v", resp.StatusCode, err)
	}
	spec, err := openapi3.NewLoader().LoadFromData(doc)
	if err != nil {
		t.Fatalf("loading the document: %v", err)
	}
	code, err := codegen.Generate(spec, codegen.Configuration{
		PackageName: "openapiclient",
		Generate:    codegen.GenerateOptions{Client: true, Models: true},
	})
	if err != nil {
		t.Fatalf("generating the client: %v", err)
	}
	return []byte(code)
}

// The committed client is the one the server's document generates: a
// route added or changed without regenerating it fails here.
func TestGeneratedClientUpToDate(t *testing.T) {
	code := generate(t)
	if *update {
		if err := os.WriteFile(clientFile, code, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	old, err := os.ReadFile(clientFile)
	if err != nil || !bytes.Equal(old, code) {
		t.Fatalf("client.gen.go is not what the server's OpenAPI document generates: run go generate ./internal/server/openapiclient")
	}
}
