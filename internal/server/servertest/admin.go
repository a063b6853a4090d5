package servertest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
)

// Admin calls the operator API with the admin token and body (nil: none);
// out, when set, gets the JSON answer. It returns the status.
func (s *Server) Admin(t testing.TB, method, path string, body []byte, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, s.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.AdminToken)
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil {
		json.Unmarshal(raw, out)
	}
	return resp.StatusCode
}
