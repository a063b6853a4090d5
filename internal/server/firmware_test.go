package server_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// raw does a request with a byte body and returns the whole answer.
func (c *client) raw(method, path, token string, body []byte, hdr map[string]string) (*http.Response, []byte) {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.url+path, bytes.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.s.Client().Transport.RoundTrip(req) // redirects are not followed
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// Upload, download with Range by a device, access rules, a rollout over
// the API to verification, and profile history with rollback.
func TestFirmwareOverHTTP(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.FirmwareMaxSize = 1 << 20 }})
	c := &client{t: t, s: s, url: s.URL}
	devID, token := c.register("m-1")
	c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 1, 0))
	img := bytes.Repeat([]byte("firmware-image-"), 5000) // 75 kB: above the 64 KiB API body limit
	sum := sha256.Sum256(img)
	hexSum := hex.EncodeToString(sum[:])

	// Uploads: metadata is checked before the body, the hash when given,
	// the size always.
	if resp, b := c.raw("POST", "/api/v1/firmware?device_type=ICR-3241&version=7.0.0", "", img, nil); resp.StatusCode != 401 {
		t.Fatalf("upload without token: %d %s", resp.StatusCode, b)
	}
	if resp, b := c.raw("POST", "/api/v1/firmware?device_type=ICR-3241", s.AdminToken, img, nil); resp.StatusCode != 400 || !strings.Contains(string(b), "version") {
		t.Fatalf("upload without version: %d %s", resp.StatusCode, b)
	}
	if resp, b := c.raw("POST", "/api/v1/firmware?device_type=ICR-3241&version=7.0.0&sha256="+strings.Repeat("0", 64), s.AdminToken, img, nil); resp.StatusCode != 400 || !strings.Contains(string(b), "mismatch") {
		t.Fatalf("wrong sha256: %d %s", resp.StatusCode, b)
	}
	if resp, b := c.raw("POST", "/api/v1/firmware?device_type=ICR-3241&version=9", s.AdminToken, make([]byte, 1<<20+1), nil); resp.StatusCode != 413 {
		t.Fatalf("too large: %d %s", resp.StatusCode, b)
	}
	resp, b := c.raw("POST", "/api/v1/firmware?device_type=ICR-3241&version=7.0.0&sha256="+hexSum, s.AdminToken, img, map[string]string{"X-Drover-Operator": "alice"})
	if resp.StatusCode != 201 || !strings.Contains(string(b), hexSum) || !strings.Contains(string(b), `"by":"api:alice"`) {
		t.Fatalf("upload: %d %s", resp.StatusCode, b)
	}
	files, _ := os.ReadDir(filepath.Join(s.Config.DataDir, "firmware"))
	if len(files) != 1 || files[0].Name() != hexSum+".bin" {
		t.Fatalf("firmware dir: %v (temporary files must be gone)", files)
	}
	if resp, _ := c.raw("POST", "/api/v1/firmware?device_type=ICR-3241&version=7.0.0", s.AdminToken, img, nil); resp.StatusCode != 409 {
		t.Fatalf("duplicate version: %d", resp.StatusCode)
	}
	// A reference to a file elsewhere.
	ref := fmt.Sprintf(`{"device_type":"ICR-3241","version":"7.1.0","sha256":%q,"size":%d,"url":"https://cdn.example/fw.bin"}`, hexSum, len(img))
	resp, b = c.raw("POST", "/api/v1/firmware", s.AdminToken, []byte(ref), map[string]string{"Content-Type": "application/json"})
	if resp.StatusCode != 201 || !strings.Contains(string(b), `"url":"https://cdn.example/fw.bin"`) {
		t.Fatalf("reference: %d %s", resp.StatusCode, b)
	}

	// Download: the device token, with Range; others are refused.
	if resp, _ := c.raw("GET", "/api/v1/firmware/1/file", "", nil, nil); resp.StatusCode != 401 {
		t.Fatalf("download without token: %d", resp.StatusCode)
	}
	if resp, _ := c.raw("GET", "/api/v1/firmware/1/file", "1.bogus", nil, nil); resp.StatusCode != 401 {
		t.Fatalf("download with a bad token: %d", resp.StatusCode)
	}
	resp, got := c.raw("GET", "/api/v1/firmware/1/file", token, nil, nil)
	if resp.StatusCode != 200 || !bytes.Equal(got, img) || resp.Header.Get("Accept-Ranges") != "bytes" {
		t.Fatalf("download: %d, %d bytes", resp.StatusCode, len(got))
	}
	resp, got = c.raw("GET", "/api/v1/firmware/1/file", token, nil, map[string]string{"Range": "bytes=70000-", "If-Range": `"` + hexSum + `"`})
	if resp.StatusCode != 206 || !bytes.Equal(got, img[70000:]) {
		t.Fatalf("resume: %d, %d bytes", resp.StatusCode, len(got))
	}
	resp, _ = c.raw("GET", "/api/v1/firmware/2/file", token, nil, nil)
	if resp.StatusCode != 302 || resp.Header.Get("Location") != "https://cdn.example/fw.bin" {
		t.Fatalf("external: %d %v", resp.StatusCode, resp.Header)
	}
	// A device of another type does not see it.
	st, _, out := c.do("POST", "/api/v1/register", "", map[string]string{"machine_id": "other", "device_type": "X", "firmware": "1", "enrollment_secret": s.EnrollmentSecret})
	if resp, _ := c.raw("GET", "/api/v1/firmware/1/file", out["token"].(string), nil, nil); st != 200 || resp.StatusCode != 404 {
		t.Fatalf("other device type: %d", resp.StatusCode)
	}

	// A rollout to the one device.
	if st, _, out := c.do("POST", "/api/v1/rollouts", s.AdminToken, `{"firmware_id":1,"waves":["0"]}`); st != 400 {
		t.Fatalf("bad waves: %d %v", st, out)
	}
	if st, _, out := c.do("POST", "/api/v1/rollouts", s.AdminToken, `{"firmware_id":1,"filter":"label=nobody"}`); st != 409 {
		t.Fatalf("no devices: %d %v", st, out)
	}
	st, _, out = c.do("POST", "/api/v1/rollouts", s.AdminToken, `{"firmware_id":1,"waves":["100%"],"max_downloads":1}`)
	if st != 201 || out["state"] != "running" || out["total"] != 1.0 {
		t.Fatalf("create rollout: %d %v", st, out)
	}
	if err := s.Srv.Fleet().RolloutStep(t.Context()); err != nil {
		t.Fatal(err)
	}
	st, _, out = c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 2, 0))
	offer, _ := out["firmware_update"].(map[string]any)
	if st != 200 || offer["url"] != "/api/v1/firmware/1/file" || offer["sha256"] != hexSum || offer["size"] != float64(len(img)) {
		t.Fatalf("offer: %d %v", st, out)
	}
	rep := `{"seq":3,"config_version":0,"state":{"firmware":"6.3.5"},"firmware_update":{"rollout":1,"state":"downloading","progress":100}}`
	if st, _, out := c.do("POST", "/api/v1/push", token, rep); st != 200 || out["firmware_update"] == nil {
		t.Fatalf("progress push: %d %v", st, out)
	}
	st, _, out = c.do("GET", "/api/v1/rollouts/1/devices?state=downloading", s.AdminToken, nil)
	if ds, _ := out["devices"].([]any); st != 200 || len(ds) != 1 || ds[0].(map[string]any)["progress"] != 100.0 || ds[0].(map[string]any)["device_id"] != devID {
		t.Fatalf("rollout devices: %d %v", st, out)
	}
	if st, _, _ := c.do("GET", "/api/v1/rollouts/1/devices?state=bogus", s.AdminToken, nil); st != 400 {
		t.Fatalf("bad state: %d", st)
	}
	c.do("POST", "/api/v1/push", token, `{"seq":4,"config_version":0,"state":{"firmware":"7.0.0"}}`)
	st, _, out = c.do("GET", "/api/v1/rollouts/1", s.AdminToken, nil)
	if counts, _ := out["counts"].(map[string]any); st != 200 || counts["verified"] != 1.0 {
		t.Fatalf("rollout: %d %v", st, out)
	}
	if st, _, out := c.do("POST", "/api/v1/rollouts/1/resume", s.AdminToken, nil); st != 409 {
		t.Fatalf("resume a running rollout: %d %v", st, out)
	}
	if st, _, out := c.do("POST", "/api/v1/rollouts/1/pause", s.AdminToken, nil); st != 200 || out["state"] != "paused" {
		t.Fatalf("pause: %d %v", st, out)
	}
	if st, _, _ := c.do("DELETE", "/api/v1/firmware/1", s.AdminToken, nil); st != 409 {
		t.Fatalf("delete firmware in use: %d", st)
	}
	if st, _, out := c.do("POST", "/api/v1/rollouts/1/abort", s.AdminToken, nil); st != 200 || out["state"] != "aborted" {
		t.Fatalf("abort: %d %v", st, out)
	}
	if st, _, _ := c.do("DELETE", "/api/v1/firmware/1", s.AdminToken, nil); st != 200 {
		t.Fatalf("delete firmware: %d", st)
	}
	if files, _ := os.ReadDir(filepath.Join(s.Config.DataDir, "firmware")); len(files) != 0 {
		t.Fatalf("file left after delete: %v", files)
	}
	if v := s.Metric("drover_firmware_file_requests_total", nil); v != 2 {
		t.Errorf("file requests counted %v, want 2", v)
	}

	// Profile history: who, diff, rollback.
	c.do("PUT", "/api/v1/profiles/1", s.AdminToken, `{"config":{"apn":"a"}}`)
	req := `{"config":{"apn":"b"}}`
	if resp, b := c.raw("PUT", "/api/v1/profiles/1", s.AdminToken, []byte(req), map[string]string{"X-Drover-Operator": "bob"}); resp.StatusCode != 200 {
		t.Fatalf("update: %d %s", resp.StatusCode, b)
	}
	st, _, out = c.do("GET", "/api/v1/profiles/1/history", s.AdminToken, nil)
	revs, _ := out["revisions"].([]any)
	if st != 200 || len(revs) != 3 || revs[2].(map[string]any)["by"] != "api:bob" || revs[1].(map[string]any)["by"] != "api" {
		t.Fatalf("history: %d %v", st, out)
	}
	st, _, out = c.do("GET", "/api/v1/profiles/1/diff?from=2&to=3", s.AdminToken, nil)
	if ch, _ := out["changes"].([]any); st != 200 || len(ch) != 1 || ch[0].(map[string]any)["path"] != "/apn" {
		t.Fatalf("diff: %d %v", st, out)
	}
	if st, _, _ := c.do("GET", "/api/v1/profiles/1/diff?from=x", s.AdminToken, nil); st != 400 {
		t.Fatalf("bad diff: %d", st)
	}
	st, _, out = c.do("POST", "/api/v1/profiles/1/rollback", s.AdminToken, `{"rev":2}`)
	if cfg, _ := out["config"].(map[string]any); st != 200 || cfg["apn"] != "a" {
		t.Fatalf("rollback: %d %v", st, out)
	}
	if st, _, _ := c.do("POST", "/api/v1/profiles/1/rollback", s.AdminToken, `{"rev":99}`); st != 400 {
		t.Fatalf("rollback to nothing: %d", st)
	}
	if st, _, _ := c.do("GET", "/api/v1/profiles/1/history", token, nil); st != 401 {
		t.Fatalf("history with a device token: %d", st)
	}
}
