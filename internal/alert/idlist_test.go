package alert_test

import (
	"encoding/json"
	"testing"

	"github.com/drover/drover/internal/alert"
)

func TestDeliveryEventIDsAreStrings(t *testing.T) {
	b, err := json.Marshal(alert.Delivery{ID: 4, EventIDs: alert.IDList{1, 22}})
	var v struct {
		ID       string   `json:"id"`
		EventIDs []string `json:"event_ids"`
	}
	if err != nil || json.Unmarshal(b, &v) != nil || v.ID != "4" || len(v.EventIDs) != 2 || v.EventIDs[1] != "22" {
		t.Fatalf("%s %v", b, err)
	}
}
