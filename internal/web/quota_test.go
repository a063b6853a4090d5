package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// The quota filter lists lifted devices; the device page lifts and
// restores quotas (with the CSRF token).
func TestQuotaFilterLiftAndRestore(t *testing.T) {
	s := newSite(t, 4)
	csrf := s.login()
	_, _, body := s.get("/ui/devices/2")
	if !strings.Contains(body, `id="quota-lift"`) || !strings.Contains(body, "never hit a quota") {
		t.Fatalf("device page lacks the quota card:\n%s", body)
	}
	if st, _, _ := s.post("/ui/devices/2/quota", url.Values{"action": {"lift"}, "hours": {"1"}}, nil); st == http.StatusSeeOther {
		t.Fatal("quota lift without CSRF token accepted")
	}
	st, _, _ := s.post("/ui/devices/2/quota", url.Values{"csrf": {csrf}, "action": {"lift"}, "hours": {"24"}}, map[string]string{"Origin": s.srv.URL})
	if st != http.StatusSeeOther {
		t.Fatalf("lift: %d", st)
	}
	_, _, body = s.get("/ui/devices/2")
	if !strings.Contains(body, "Quotas lifted") || !strings.Contains(body, `id="quota-restore"`) {
		t.Fatalf("lifted device page:\n%s", body)
	}
	_, _, body = s.get("/ui/devices?quota=lifted")
	if !strings.Contains(body, `<strong>1</strong> matching devices`) {
		t.Fatalf("quota=lifted filter:\n%s", body)
	}
	_, _, body = s.get("/ui/devices?quota=bogus")
	if !strings.Contains(body, `unknown quota filter &#34;bogus&#34;`) {
		t.Fatalf("bad quota filter:\n%s", body)
	}
	st, _, _ = s.post("/ui/devices/2/quota", url.Values{"csrf": {csrf}, "action": {"restore"}}, map[string]string{"Origin": s.srv.URL})
	if st != http.StatusSeeOther {
		t.Fatalf("restore: %d", st)
	}
	_, _, body = s.get("/ui/devices?quota=lifted")
	if !strings.Contains(body, `<strong>0</strong> matching devices`) {
		t.Fatalf("after restore:\n%s", body)
	}
}

// The profiles page sets the new-firmware policy and approves firmware.
func TestProfilesPagePolicyAndApproval(t *testing.T) {
	s := newSite(t, 2)
	csrf := s.login()
	origin := map[string]string{"Origin": s.srv.URL}
	_, _, body := s.get("/ui/profiles")
	for _, want := range []string{`id="policy"`, `id="pending"`, `id="cleanup"`} {
		if !strings.Contains(body, want) {
			t.Fatalf("profiles page lacks %s:\n%s", want, body)
		}
	}
	st, _, _ := s.post("/ui/profiles/policy", url.Values{"csrf": {csrf}, "mode": {"sometimes"}, "carry": {"inherit"}, "create_limit": {"3"}, "create_window": {"3600"}}, origin)
	if st != http.StatusSeeOther || s.fleet.ProfilePolicy().Mode != "create" {
		t.Fatalf("bad mode saved: %d %+v", st, s.fleet.ProfilePolicy())
	}
	s.post("/ui/profiles/policy", url.Values{"csrf": {csrf}, "mode": {"join"}, "carry": {"empty"}, "create_limit": {"3"}, "create_window": {"3600"}}, origin)
	if p := s.fleet.ProfilePolicy(); p.Mode != "join" || p.Carry != "empty" || p.CreateLimit != 3 {
		t.Fatalf("policy %+v", p)
	}
	if st, _, _ := s.post("/ui/profiles/approve", url.Values{"csrf": {csrf}, "device_type": {"x"}, "firmware": {"y"}}, origin); st != http.StatusSeeOther {
		t.Fatalf("approve unknown: %d", st)
	}
}
