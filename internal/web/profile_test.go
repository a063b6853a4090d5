package web_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// Saving a profile with its configuration written differently (members
// reordered, other whitespace) and its interval changes nothing: no new
// version; the fleet decides, as it does for the API.
func TestProfileSaveUnchangedKeepsVersion(t *testing.T) {
	s := newSite(t, 3)
	csrf := s.login()
	p := s.fleet.Profiles()[0]
	path := "/ui/profiles/" + strconv.FormatUint(p.ID, 10)
	save := func(config string) string {
		t.Helper()
		st, _, _ := s.post(path, url.Values{"csrf": {csrf}, "config": {config}, "push_interval": {"60"}}, nil)
		if st != http.StatusSeeOther {
			t.Fatalf("save %s: %d", config, st)
		}
		_, _, body := s.get(path)
		return body
	}
	save(`{"apn": "iot.example", "mtu": 1400}`)
	first, _ := s.fleet.Profile(p.ID)
	body := save("{\n  \"mtu\": 1400,\n  \"apn\": \"iot.example\"\n}")
	if !strings.Contains(body, "No changes to save.") {
		t.Errorf("the same configuration reordered was saved:\n%s", body)
	}
	if now, _ := s.fleet.Profile(p.ID); now.Version != first.Version || !now.UpdatedAt.Equal(first.UpdatedAt) {
		t.Fatalf("the same configuration reordered: version %d -> %d", first.Version, now.Version)
	}
}
