package servertest

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// checkTransport checks every request the server accepted and every answer
// it gave against the OpenAPI document the server serves: a request body
// answered 2xx against the operation's request body schema, a JSON answer
// against the schema of its status, an error answer against the error
// body's, and its status against those the operation lists. A mismatch
// fails the test that started the server.
type checkTransport struct {
	base  http.RoundTripper
	t     testing.TB
	hosts []string // the server's API addresses: others are not checked

	mu     sync.Mutex
	closed bool // the test ended: report nothing more
	doc    *openAPIDoc
	err    error // loading the document failed
}

func (c *checkTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !slices.Contains(c.hosts, req.URL.Host) {
		return c.base.RoundTrip(req)
	}
	var reqBody []byte
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		reqBody = peekRequest(req)
	}
	resp, err := c.base.RoundTrip(req)
	if err != nil || resp.StatusCode == http.StatusSwitchingProtocols || req.URL.Path == "/api/v1/openapi.json" {
		return resp, err
	}
	doc, derr := c.document(req)
	if derr != nil {
		c.errorf("openapi check: %v", derr)
		return resp, err
	}
	var respBody []byte
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if ct == "application/json" && req.Method != http.MethodHead && resp.ContentLength >= 0 && resp.ContentLength <= 8<<20 {
		respBody, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(respBody))
		if err != nil {
			return resp, err
		}
	}
	for _, problem := range doc.check(req, reqBody, resp.StatusCode, ct, respBody) {
		c.errorf("openapi check: %s %s: %s", req.Method, req.URL.RequestURI(), problem)
	}
	return resp, nil
}

func (c *checkTransport) errorf(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.t.Errorf(format, args...)
	}
}

func (c *checkTransport) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}

// peekRequest is a copy of req's body, leaving it to be sent; nil for a
// stream of unknown or large size.
func peekRequest(req *http.Request) []byte {
	if req.Body == nil || req.Body == http.NoBody {
		return nil
	}
	if req.GetBody != nil {
		if rc, err := req.GetBody(); err == nil {
			defer rc.Close()
			b, _ := io.ReadAll(io.LimitReader(rc, 1<<20))
			return b
		}
		return nil
	}
	if req.ContentLength <= 0 || req.ContentLength > 1<<20 {
		return nil
	}
	b, err := io.ReadAll(req.Body)
	req.Body.Close()
	req.Body = io.NopCloser(bytes.NewReader(b))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	if err != nil {
		return nil
	}
	return b
}

// document is the server's OpenAPI document, fetched once.
func (c *checkTransport) document(req *http.Request) (*openAPIDoc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.doc != nil || c.err != nil {
		return c.doc, c.err
	}
	get, _ := http.NewRequestWithContext(req.Context(), "GET", req.URL.Scheme+"://"+req.URL.Host+"/api/v1/openapi.json", nil)
	resp, err := c.base.RoundTrip(get)
	if err != nil {
		return nil, err // not kept: the next request tries again
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("GET /api/v1/openapi.json: %d", resp.StatusCode)
	}
	if err == nil {
		c.doc, err = loadOpenAPI(raw)
	}
	c.err = err
	return c.doc, err
}

// CheckOpenAPI lists what the OpenAPI document doc does not allow in a
// request (reqBody: its body) answered with status, a body of content type
// ct (respBody: nil when not JSON).
func CheckOpenAPI(doc []byte, req *http.Request, reqBody []byte, status int, ct string, respBody []byte) ([]string, error) {
	d, err := loadOpenAPI(doc)
	if err != nil {
		return nil, err
	}
	return d.check(req, reqBody, status, ct, respBody), nil
}

// openAPIDoc is a document with its schemas compiled as they are needed.
type openAPIDoc struct {
	ops []docOp

	mu       sync.Mutex
	compiler *jsonschema.Compiler
	schemas  map[string]*jsonschema.Schema
	valid    map[[32]byte]bool // schema and body found valid: tests send and get the same ones often
}

// docOp is one operation of the document.
type docOp struct {
	method, path string
	re           *regexp.Regexp
	params       int // path parameters: the fewer, the more specific
	op           map[string]any
}

var (
	docsMu sync.Mutex
	docs   = map[[32]byte]*openAPIDoc{} // by the document's SHA-256: tests share them
)

const docURL = "https://drover.invalid/openapi.json"

func loadOpenAPI(raw []byte) (*openAPIDoc, error) {
	sum := sha256.Sum256(raw)
	docsMu.Lock()
	defer docsMu.Unlock()
	if d := docs[sum]; d != nil {
		return d, nil
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	root, _ := v.(map[string]any)
	paths, _ := root["paths"].(map[string]any)
	if len(paths) == 0 {
		return nil, fmt.Errorf("the document has no paths")
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(docURL, v); err != nil {
		return nil, err
	}
	d := &openAPIDoc{compiler: c, schemas: map[string]*jsonschema.Schema{}, valid: map[[32]byte]bool{}}
	param := regexp.MustCompile(`\\\{[^}]+\\\}`)
	for p, item := range paths {
		for m, op := range item.(map[string]any) {
			quoted := regexp.QuoteMeta(p)
			d.ops = append(d.ops, docOp{strings.ToUpper(m), p, regexp.MustCompile("^" + param.ReplaceAllString(quoted, "[^/]+") + "$"),
				len(param.FindAllString(quoted, -1)), op.(map[string]any)})
		}
	}
	slices.SortFunc(d.ops, func(a, b docOp) int { return a.params - b.params })
	docs[sum] = d
	return d, nil
}

// find is the operation a request is routed to, as http.ServeMux routes
// it: the most specific path.
func (d *openAPIDoc) find(method, path string) *docOp {
	if method == http.MethodHead {
		method = http.MethodGet
	}
	for i := range d.ops {
		if d.ops[i].method == method && d.ops[i].re.MatchString(path) {
			return &d.ops[i]
		}
	}
	return nil
}

var pointerEscape = strings.NewReplacer("~", "~0", "/", "~1")

// schema compiles the schema at a JSON pointer of the document.
func (d *openAPIDoc) schema(ptr ...string) (*jsonschema.Schema, error) {
	for i, p := range ptr {
		ptr[i] = pointerEscape.Replace(p)
	}
	loc := docURL + "#/" + strings.Join(ptr, "/")
	d.mu.Lock()
	defer d.mu.Unlock()
	if s, ok := d.schemas[loc]; ok {
		return s, nil
	}
	s, err := d.compiler.Compile(loc)
	if err != nil {
		return nil, err
	}
	d.schemas[loc] = s
	return s, nil
}

// check lists what, in one request and its answer, the document does not
// allow.
func (d *openAPIDoc) check(req *http.Request, reqBody []byte, status int, ct string, respBody []byte) []string {
	var problems []string
	validate := func(what string, body []byte, ptr ...string) {
		h := sha256.New()
		h.Write([]byte(strings.Join(ptr, "\x00") + "\x00"))
		h.Write(body)
		var key [32]byte
		h.Sum(key[:0])
		d.mu.Lock()
		seen := d.valid[key]
		d.mu.Unlock()
		if seen {
			return
		}
		s, err := d.schema(ptr...)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: schema %s: %v", what, strings.Join(ptr, "/"), err))
			return
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s is not JSON: %v: %.200s", what, err, body))
			return
		}
		if err := s.Validate(v); err != nil {
			problems = append(problems, fmt.Sprintf("%s does not match the document: %v\n%.500s", what, err, body))
			return
		}
		d.mu.Lock()
		if len(d.valid) > 100000 {
			clear(d.valid)
		}
		d.valid[key] = true
		d.mu.Unlock()
	}
	op := d.find(req.Method, req.URL.Path)
	if op == nil {
		if respBody != nil && status >= 400 {
			validate("the error answer", respBody, "components", "schemas", "Error")
		}
		return problems
	}
	responses, _ := op.op["responses"].(map[string]any)
	code := strconv.Itoa(status)
	if _, listed := responses[code]; !listed && status < 500 {
		problems = append(problems, fmt.Sprintf("answered %d, which %s %s does not list", status, op.method, op.path))
	}
	if status >= 200 && status < 300 && len(bytes.TrimSpace(reqBody)) > 0 {
		rct, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type"))
		body, _ := op.op["requestBody"].(map[string]any)
		content, _ := body["content"].(map[string]any)
		_, json := content["application/json"]
		if _, file := content["application/octet-stream"]; file && rct == "" {
			rct = "application/octet-stream" // as the handler reads it
		}
		switch {
		case rct != "" && rct != "application/json":
			if _, ok := content[rct]; !ok {
				problems = append(problems, fmt.Sprintf("the request body is %s, which the document does not list", rct))
			}
		case json:
			validate("the request body", reqBody, "paths", op.path, strings.ToLower(op.method), "requestBody", "content", "application/json", "schema")
		case body == nil && rct == "application/json":
			problems = append(problems, "a JSON request body was accepted, but the operation documents none")
		}
	}
	if respBody == nil {
		return problems
	}
	r, _ := responses[code].(map[string]any)
	content, _ := r["content"].(map[string]any)
	if _, ok := content[ct]; status >= 400 && !ok {
		validate("the error answer", respBody, "components", "schemas", "Error")
		return problems
	}
	if _, ok := content[ct]; !ok && r != nil {
		problems = append(problems, fmt.Sprintf("answered %s with %d, which the document does not list", ct, status))
		return problems
	}
	if r != nil {
		validate("the answer", respBody, "paths", op.path, strings.ToLower(op.method), "responses", code, "content", ct, "schema")
	}
	return problems
}

// CloseIdleConnections closes the base transport's, for http.Client.
func (c *checkTransport) CloseIdleConnections() {
	if ci, ok := c.base.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}
