package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// The dashboard's where box filters on reported fields, and the labels
// page makes live labels that follow pushes.
func TestPagesWhereAndLiveLabels(t *testing.T) {
	s := newSite(t, 4)
	csrf := s.login()
	s.push(0, 0, `{"temperature":70,"extra":{"site":"north"}}`)
	s.push(1, 0, `{"temperature":40,"extra":{"site":"north"}}`)
	s.push(2, 0, `{"temperature":90,"extra":{"site":"south"}}`)

	_, _, body := s.get("/ui/devices?" + url.Values{"where": {"state.extra.site = north and state.temperature > 50"}}.Encode())
	if !strings.Contains(body, "<strong>1</strong> matching devices") || !strings.Contains(body, `id="where"`) {
		t.Fatalf("where filter:\n%s", body)
	}
	if _, _, body := s.get("/ui/devices?where=state.temperature+%3E"); !strings.Contains(body, "a value must follow") {
		t.Fatalf("bad where:\n%s", body)
	}

	st, hdr, _ := s.post("/ui/labels", url.Values{"csrf": {csrf}, "name": {"hot"}, "filter": {"state.temperature >= 70"}}, nil)
	if st != http.StatusSeeOther || hdr.Get("Location") != "/ui/labels" {
		t.Fatalf("live label: %d %v", st, hdr)
	}
	_, _, body = s.get("/ui/labels")
	if !strings.Contains(body, `Live label &#34;hot&#34;: 2 devices match state.temperature &gt;= 70.`) ||
		!strings.Contains(body, ">hot</a></td><td class=\"num\">2</td><td><code>state.temperature &gt;= 70</code>") {
		t.Fatalf("labels page:\n%s", body)
	}
	s.push(1, 0, `{"temperature":75}`)
	_, _, body = s.get("/ui/devices?label=hot")
	if !strings.Contains(body, "<strong>3</strong> matching devices") {
		t.Fatalf("live label after a push:\n%s", body)
	}
	// A bad filter, and a manual assignment to a live label, are refused
	// with a message.
	s.post("/ui/labels", url.Values{"csrf": {csrf}, "name": {"x"}, "filter": {"state.t >"}}, nil)
	if _, _, body = s.get("/ui/labels"); !strings.Contains(body, "Live label not saved: where: a value must follow") {
		t.Fatalf("bad live label:\n%s", body)
	}
	s.post("/ui/devices/label", url.Values{"csrf": {csrf}, "label_name": {"hot"}, "action": {"add"}}, nil)
	if _, _, body = s.get("/ui/devices"); !strings.Contains(body, "Nothing labelled: label conflict") {
		t.Fatalf("manual assignment of a live label:\n%s", body)
	}
}
