package server_test

import (
	"sort"
	"strings"
	"testing"
)

// Every ID in every JSON answer of the API's GET routes is a decimal
// string ("id", "…_id", "…_ids"), whichever route gives it: one ID form
// for clients (openapi.json's description says so).
func TestAPIIDsAreStrings(t *testing.T) {
	var bad []string
	ids := 0
	for path, out := range everyGETAnswer(t) {
		walkJSON(path, "", out, func(where, key string, v any) {
			if key != "id" && !strings.HasSuffix(key, "_id") && !strings.HasSuffix(key, "_ids") {
				return
			}
			switch v.(type) {
			case float64:
				bad = append(bad, where)
			case string:
				ids++
			}
		})
	}
	sort.Strings(bad)
	for _, k := range bad {
		t.Errorf("%s is a number, want a decimal string", k)
	}
	t.Logf("%d string IDs checked", ids)
	if ids < 5 {
		t.Fatalf("only %d IDs seen in the answers", ids)
	}
}
