package openapiclient_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server/openapiclient"
	"github.com/drover/drover/internal/server/servertest"
)

// The client generated from the OpenAPI document works against a real
// server with typed requests and answers: list the devices, label them,
// change a profile, send a command and read it back. (servertest also
// checks each of these requests and answers against the document.)
func TestGeneratedClientAgainstServer(t *testing.T) {
	ctx := context.Background()
	s := servertest.Start(t, servertest.Options{})
	for i := range 2 {
		body := fmt.Sprintf(`{"machine_id":"gen-%d","device_type":"ICR-3241","firmware":"6.3.5","enrollment_secret":%q}`, i, s.EnrollmentSecret)
		resp, err := s.Client().Post(s.URL+"/api/v1/register", "application/json", strings.NewReader(body))
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("register: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	c, err := openapiclient.NewClientWithResponses(s.URL, openapiclient.WithHTTPClient(s.Client()),
		openapiclient.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+s.AdminToken)
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}

	// List the devices, two to a page, newest first.
	limit, dir := 2, openapiclient.GetDevicesParamsDir("desc")
	devs, err := c.GetDevicesWithResponse(ctx, &openapiclient.GetDevicesParams{Limit: &limit, Dir: &dir})
	if err != nil || devs.JSON200 == nil || devs.JSON200.Devices == nil || len(*devs.JSON200.Devices) != 2 {
		t.Fatalf("devices: %v %s", err, devs.Body)
	}
	first := (*devs.JSON200.Devices)[0]
	if first.MachineId != "gen-1" || first.DeviceType != "ICR-3241" {
		t.Fatalf("newest device %+v", first)
	}

	// Label the devices of one machine ID, then filter by the label.
	q := "gen-0"
	lab, err := c.PostLabelsAssignWithResponse(ctx, openapiclient.LabelAssignBody{Label: "north", Filter: &openapiclient.LabelFilterInput{Q: &q}})
	if err != nil || lab.JSON200 == nil || lab.JSON200.Changed != 1 || lab.JSON200.Label != "north" {
		t.Fatalf("label: %v %d %s", err, lab.StatusCode(), lab.Body)
	}
	north, err := c.GetDevicesWithResponse(ctx, &openapiclient.GetDevicesParams{Label: &[]string{"north"}})
	if err != nil || north.JSON200 == nil || len(*north.JSON200.Devices) != 1 || (*north.JSON200.Devices)[0].MachineId != "gen-0" {
		t.Fatalf("devices labelled north: %v %s", err, north.Body)
	}
	labels, err := c.GetLabelsWithResponse(ctx)
	if err != nil || labels.JSON200 == nil || len(*labels.JSON200.Labels) != 1 || (*labels.JSON200.Labels)[0].Devices != 1 {
		t.Fatalf("labels: %v %s", err, labels.Body)
	}

	// Change the devices' profile.
	interval := 120
	prof, err := c.PutProfilesIdWithResponse(ctx, first.ProfileId, nil, openapiclient.ProfileUpdateInput{PushInterval: &interval})
	if err != nil || prof.JSON200 == nil || prof.JSON200.PushInterval != 120 || prof.JSON200.Id != first.ProfileId {
		t.Fatalf("profile: %v %d %s", err, prof.StatusCode(), prof.Body)
	}
	// A bad one answers 400 with the error body, typed too.
	interval = -1
	bad, err := c.PutProfilesIdWithResponse(ctx, first.ProfileId, nil, openapiclient.ProfileUpdateInput{PushInterval: &interval})
	if err != nil || bad.JSON400 == nil || bad.JSON400.Error.Code == "" {
		t.Fatalf("bad profile: %v %d %s", err, bad.StatusCode(), bad.Body)
	}

	// Send a command to one device and read it back.
	sent, err := c.PostCommandsWithResponse(ctx, openapiclient.CommandBody{Kind: "reboot", DeviceId: &first.Id})
	if err != nil || sent.JSON201 == nil || sent.JSON201.Kind != "reboot" || sent.JSON201.Total != 1 {
		t.Fatalf("command: %v %d %s", err, sent.StatusCode(), sent.Body)
	}
	got, err := c.GetCommandsIdWithResponse(ctx, sent.JSON201.Id)
	if err != nil || got.JSON200 == nil || got.JSON200.Id != sent.JSON201.Id || got.JSON200.Target != sent.JSON201.Target {
		t.Fatalf("command read back: %v %d %s", err, got.StatusCode(), got.Body)
	}
	cmds, err := c.GetCommandsIdDevicesWithResponse(ctx, sent.JSON201.Id, &openapiclient.GetCommandsIdDevicesParams{})
	if err != nil || cmds.JSON200 == nil || len(*cmds.JSON200.Commands) != 1 || (*cmds.JSON200.Commands)[0].DeviceId != first.Id {
		t.Fatalf("command's devices: %v %s", err, cmds.Body)
	}
}
