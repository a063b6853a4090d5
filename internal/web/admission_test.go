package web_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
)

func TestAdmissionButtonsAndFilter(t *testing.T) {
	s := newSite(t, 4)
	csrf := s.login()
	ctx := context.Background()
	// Someone claims m-0001 with the enrollment secret alone.
	if r, err := s.fleet.RegisterWith(ctx, protocol.RegisterRequest{MachineID: "m-0001", DeviceType: "ICR-3241", Firmware: "6.3.5",
		EnrollmentSecret: "s"}, fleet.Proof{Source: "203.0.113.7:999"}); err != nil || !r.Pending {
		t.Fatalf("claim: %+v %v", r, err)
	}
	_, _, body := s.get("/ui/devices/2")
	for _, want := range []string{`id="enrollrequest"`, "203.0.113.7:999", `id="action-approve"`, `id="action-reject"`, `id="action-block"`, `id="action-delete"`} {
		if !strings.Contains(body, want) {
			t.Fatalf("device page lacks %s:\n%s", want, body)
		}
	}
	_, _, body = s.get("/ui/devices?admission=reenroll")
	if !strings.Contains(body, "<strong>1</strong> matching devices") || !strings.Contains(body, ">m-0001<") {
		t.Fatalf("reenroll filter:\n%s", body)
	}
	_, _, body = s.get("/ui/devices?admission=bogus")
	if !strings.Contains(body, `unknown admission &#34;bogus&#34;`) {
		t.Fatalf("bad admission filter:\n%s", body)
	}
	// Without the CSRF token nothing happens.
	if st, _, _ := s.post("/ui/devices/2/admission", url.Values{"action": {"block"}}, nil); st == http.StatusSeeOther {
		t.Fatal("admission action without CSRF token accepted")
	}
	st, hdr, _ := s.post("/ui/devices/2/admission", url.Values{"csrf": {csrf}, "action": {"block"}}, map[string]string{"Origin": s.srv.URL})
	if st != http.StatusSeeOther || hdr.Get("Location") != "/ui/devices/2" {
		t.Fatalf("block: %d %v", st, hdr)
	}
	if d, _ := s.fleet.Device(ctx, 2); d.Admission != "blocked" || d.EnrollRequest != nil {
		t.Fatalf("after block: %+v", d)
	}
	req, _ := protocol.DecodePush([]byte(`{"seq":2,"config_version":0,"state":{}}`))
	if _, err := s.fleet.Push(ctx, s.tokens[1], req); !errors.Is(err, fleet.ErrBlocked) {
		t.Fatalf("push of a blocked device: %v", err)
	}
	_, _, body = s.get("/ui/devices?admission=blocked")
	if !strings.Contains(body, "<strong>1</strong> matching devices") {
		t.Fatalf("blocked filter:\n%s", body)
	}
	st, hdr, _ = s.post("/ui/devices/2/admission", url.Values{"csrf": {csrf}, "action": {"delete"}}, map[string]string{"Origin": s.srv.URL})
	if st != http.StatusSeeOther || hdr.Get("Location") != "/ui/devices" {
		t.Fatalf("delete: %d %v", st, hdr)
	}
	if _, err := s.fleet.Device(ctx, 2); !errors.Is(err, fleet.ErrNotFound) {
		t.Fatalf("deleted device: %v", err)
	}
	if st, _, _ := s.post("/ui/devices/2/admission", url.Values{"csrf": {csrf}, "action": {"block"}}, map[string]string{"Origin": s.srv.URL}); st != http.StatusNotFound {
		t.Fatalf("action on a deleted device: %d", st)
	}
}
