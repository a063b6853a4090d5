package server

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"testing"

	fastjson "github.com/goccy/go-json"

	"github.com/drover/drover/internal/protocol"
)

// A push answer carrying only the interval is written byte for byte as
// the JSON encoder writes it, headers included.
func TestPushAnswerBytes(t *testing.T) {
	for _, iv := range []int{0, 1, 9, 10, 99, 100, 200, 3600, 86400, -1, 1 << 40} {
		var want bytes.Buffer
		if err := fastjson.NewEncoder(&want).Encode(protocol.PushResponse{PushInterval: iv}); err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		writeJSON(w, http.StatusOK, protocol.PushResponse{PushInterval: iv, Commands: []protocol.Command{}})
		if got := w.Body.String(); got != want.String() {
			t.Errorf("interval %d: %q, want %q", iv, got, want.String())
		}
		if ct, cl := w.Header().Get("Content-Type"), w.Header().Get("Content-Length"); ct != "application/json" || cl != strconv.Itoa(want.Len()) {
			t.Errorf("interval %d: headers %q %q", iv, ct, cl)
		}
	}
	// Anything more goes through the encoder.
	w := httptest.NewRecorder()
	writeJSON(w, http.StatusOK, protocol.PushResponse{PushInterval: 5, Config: &protocol.Config{Version: 2, Data: []byte(`{"a":1}`)}})
	if got := w.Body.String(); got != `{"push_interval":5,"config":{"version":2,"data":{"a":1}}}`+"\n" {
		t.Errorf("answer with a configuration: %q", got)
	}
}

// An accepted push on a served connection stays within its allocation
// budget: the body is decoded in one pass into a few blocks (protocol's
// pushdecode.go), the answer goes out without the encoder, the token is
// hashed without a heap copy, the signal is checked without building
// field names.
func TestPushHandlerAllocations(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation count")
	}
	h, req := connPush(t)
	allocs := testing.AllocsPerRun(200, serveOnce(t, h, req, []byte(routerPushBody)))
	const budget = 17
	if allocs > budget && !raceEnabled {
		t.Errorf("%.0f allocations per push, want at most %d", allocs, budget)
	}
}

// TestPushAnswerFieldsKnown: the short path of the push answer
// (plainPushAnswer) knows every field of protocol.PushResponse; a new
// field must be added there, or answers carrying it would lose it.
func TestPushAnswerFieldsKnown(t *testing.T) {
	known := []string{"PushInterval", "Config", "FirmwareUpdate", "Commands", "Connect"}
	rt := reflect.TypeFor[protocol.PushResponse]()
	if rt.NumField() != len(known) {
		t.Fatalf("protocol.PushResponse has %d fields, plainPushAnswer knows %v: add the new ones to it", rt.NumField(), known)
	}
	for i, name := range known {
		if rt.Field(i).Name != name {
			t.Errorf("field %d of protocol.PushResponse is %s, plainPushAnswer knows %s", i, rt.Field(i).Name, name)
		}
	}
}
