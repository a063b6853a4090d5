package server_test

import (
	"encoding/csv"
	"fmt"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

// The devices list and a device's history as CSV, asked with ?format=csv
// or Accept: text/csv: one header row, one row per device (every page of
// the fleet, in the order asked) or sample.
func TestCSVExport(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	const n = 1203 // more than one page of the export (1,000)
	var id1, tok1 string
	for i := range n {
		id, tok := c.register(fmt.Sprintf("m-%04d", i))
		if i == 0 {
			id1, tok1 = id, tok
		}
	}
	for seq := 1; seq <= 3; seq++ {
		if st, _, out := c.do("POST", "/api/v1/push", tok1, fmt.Sprintf(state, seq, 0)); st != 200 {
			t.Fatalf("push: %d %v", st, out)
		}
	}
	read := func(path string, hdr map[string]string) [][]string {
		t.Helper()
		resp, body := c.raw("GET", path, s.AdminToken, nil, hdr)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/csv") {
			t.Fatalf("GET %s: %d %s %.200s", path, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		rows, err := csv.NewReader(strings.NewReader(string(body))).ReadAll()
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return rows
	}
	rows := read("/api/v1/devices?format=csv", nil)
	if len(rows) != n+1 || rows[0][0] != "id" || rows[0][1] != "machine_id" || rows[1][0] != id1 || rows[1][1] != "m-0000" {
		t.Fatalf("devices CSV: %d rows, first %v %v", len(rows), rows[0], rows[1])
	}
	rows = read("/api/v1/devices?sort=machine_id&dir=desc", map[string]string{"Accept": "text/csv"})
	if len(rows) != n+1 || rows[1][1] != fmt.Sprintf("m-%04d", n-1) || rows[n][1] != "m-0000" {
		t.Fatalf("devices CSV by machine ID, descending: %d rows, %v … %v", len(rows), rows[1], rows[len(rows)-1])
	}
	rows = read("/api/v1/devices?format=csv&q=m-000", nil) // a filter applies
	if len(rows) != 11 {
		t.Fatalf("filtered devices CSV: %d rows, want 11", len(rows))
	}
	rows = read("/api/v1/devices/"+id1+"/history?format=csv", nil)
	if len(rows) != 4 || rows[0][0] != "at" || rows[1][1] != "1" || rows[3][1] != "3" || rows[1][2] != "100" || rows[1][8] != "41.5" {
		t.Fatalf("history CSV: %v", rows)
	}
	// JSON stays the default, and the same query sorts it.
	if st, _, out := c.do("GET", "/api/v1/devices?sort=machine_id&dir=desc&limit=2", s.AdminToken, nil); st != 200 ||
		out["devices"].([]any)[0].(map[string]any)["machine_id"] != fmt.Sprintf("m-%04d", n-1) {
		t.Fatalf("sorted JSON: %d %v", st, out)
	}
	for _, bad := range []string{"/api/v1/devices?format=xml", "/api/v1/devices?format=csv&limit=5", "/api/v1/devices?sort=colour", "/api/v1/devices?dir=up", "/api/v1/devices?format=csv&cursor=zzz"} {
		if st, _, out := c.do("GET", bad, s.AdminToken, nil); st != 400 {
			t.Errorf("GET %s: %d %v, want 400", bad, st, out)
		}
	}
}
