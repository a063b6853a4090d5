package cluster_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
)

// TestClusterLiveLabels: a live label defined on one node is every node's
// (the change log), and a device pushing to one node joins and leaves it
// on the others too (push summaries carry the state while filters read
// reported fields).
func TestClusterLiveLabels(t *testing.T) {
	t.Parallel()
	_, _, nodes := startCluster(t, "a", "b")
	a, b := nodes[0], nodes[1]
	dev := a.mustRegister("live-1")
	seqs := 0
	pushSite := func(n *node, site string) {
		t.Helper()
		seqs++
		if st, body := n.do("POST", "/api/v1/push", dev.Token, fmt.Sprintf(`{"seq":%d,"state":{"extra":{"site":%q}}}`, seqs, site)); st != 200 {
			t.Fatalf("push: %d %s", st, body)
		}
	}
	members := func(n *node) int {
		t.Helper()
		st, body := n.do("GET", "/api/v1/devices?label=north", adminToken, "")
		var page struct {
			Devices []json.RawMessage `json:"devices"`
		}
		if st != 200 || json.Unmarshal(body, &page) != nil {
			t.Fatalf("devices on %s: %d %s", n.name, st, body)
		}
		return len(page.Devices)
	}
	pushSite(a, "south")
	if st, body := a.do("PUT", "/api/v1/labels/north", adminToken, `{"filter":"state.extra.site = north"}`); st != 200 {
		t.Fatalf("define on a: %d %s", st, body)
	}
	within(t, 5*converge, "b knows the live label", func() bool {
		st, _ := b.do("GET", "/api/v1/labels/north", adminToken, "")
		return st == 200
	})
	pushSite(b, "north") // to b: a hears it
	within(t, 5*converge, "the device in north on a and b", func() bool { return members(a) == 1 && members(b) == 1 })
	pushSite(a, "south") // to a: b hears it
	within(t, 5*converge, "the device out of north on a and b", func() bool { return members(a) == 0 && members(b) == 0 })
	where := "/api/v1/devices?" + url.Values{"where": {"state.extra.site = south"}}.Encode()
	if st, body := b.do("GET", where, adminToken, ""); st != 200 || !json.Valid(body) || members(b) != 0 {
		t.Fatalf("where on b: %d %s", st, body)
	}
}
