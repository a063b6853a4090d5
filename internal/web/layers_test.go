package web_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/drover/drover/internal/fleet"
)

// The device page shows the effective configuration, each member with its
// source: the profile, a label, the device.
func TestDevicePageEffectiveConfig(t *testing.T) {
	s := newSite(t, 3)
	s.login()
	ctx := context.Background()
	d, _ := s.fleet.Device(ctx, 2)
	if _, err := s.fleet.UpdateProfile(ctx, d.ProfileID, fleet.ProfileUpdate{Config: json.RawMessage(`{"ntp":"pool","apn":"iot"}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.fleet.AssignLabel(ctx, "site=north", fleet.Filter{Text: "m-0001"}, false); err != nil {
		t.Fatal(err)
	}
	put := func(kind fleet.LayerKind, name, v string) {
		if _, _, err := s.fleet.PutConfigLayer(ctx, kind, name, fleet.LayerUpdate{Values: json.RawMessage(v)}); err != nil {
			t.Fatal(err)
		}
	}
	put(fleet.LayerLabel, "site=north", `{"apn":"${label.site}.iot"}`)
	put(fleet.LayerDevice, "2", `{"host":"${device.serial}","x":"${label.rack}"}`)
	_, _, body := s.get("/ui/devices/2")
	for _, want := range []string{`id="effectiveconfig"`, `<td class="mono">/apn</td><td class="mono">&#34;north.iot&#34;</td><td>label site=north</td>`,
		`<td class="mono">/ntp</td><td class="mono">&#34;pool&#34;</td><td>profile</td>`,
		`<td class="mono">/host</td><td class="mono">&#34;SN0001&#34;</td><td>device</td>`, "label.rack", "device 2 rev 1"} {
		if !strings.Contains(body, want) {
			t.Errorf("device page lacks %s", want)
		}
	}
	if t.Failed() {
		i := strings.Index(body, `id="effectiveconfig"`)
		t.Logf("page: %s", body[max(i, 0):min(len(body), max(i, 0)+2000)])
	}
}
