package emulator

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/testwait"
)

// A rollout to emulated devices: real bytes from the real server at a
// limited rate, half the attempts cut and resumed with Range, every device
// verified by the firmware it reports after its "reboot".
func TestFirmwareRolloutToEmulatedDevices(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) {
		c.PushInterval, c.RolloutInterval = 1, 100*time.Millisecond
	}})
	api := func(method, path string, body []byte, out any) int {
		t.Helper()
		return srv.Admin(t, method, path, body, out)
	}
	const devices, size, rate = 12, 256 << 10, 256 << 10
	cfg := DefaultConfig()
	cfg.Target, cfg.EnrollmentSecret, cfg.CACertPEM, cfg.Seed, cfg.Devices = srv.URL, srv.EnrollmentSecret, srv.CACertPEM, "fw", devices
	cfg.Mode, cfg.Interval, cfg.Duration = ModeFleet, time.Second, 25*time.Second
	cfg.DownloadRate, cfg.DownloadFailRate, cfg.InstallTime = rate, 0.5, 200*time.Millisecond
	type out struct {
		sum *results.Summary
		err error
	}
	done := make(chan out, 1)
	go func() {
		sum, err := Run(context.Background(), cfg, nil)
		done <- out{sum, err}
	}()
	deadline := time.Now().Add(20 * time.Second)
	online := 0
	if !testwait.Until(time.Until(deadline), func() bool {
		var list struct{ Devices []json.RawMessage }
		api("GET", "/api/v1/devices?liveness=online&limit=100", nil, &list)
		online = len(list.Devices)
		return online == devices
	}) {
		t.Fatalf("%d of %d devices online", online, devices)
	}
	img := make([]byte, size)
	rand.Read(img)
	if st := api("POST", "/api/v1/firmware?device_type=router&version=8.0.0", img, nil); st != 201 {
		t.Fatalf("upload: %d", st)
	}
	if st := api("POST", "/api/v1/rollouts", []byte(`{"firmware_id":1,"waves":["4","100%"],"max_downloads":6}`), nil); st != 201 {
		t.Fatalf("rollout: %d", st)
	}
	var ro struct {
		State  string
		Counts map[string]int
	}
	testwait.Until(time.Until(deadline.Add(5*time.Second)), func() bool {
		api("GET", "/api/v1/rollouts/1", nil, &ro)
		return ro.State == "done"
	})
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	if ro.State != "done" || ro.Counts["verified"] != devices {
		var devs struct{ Devices []map[string]any }
		api("GET", "/api/v1/rollouts/1/devices", nil, &devs)
		t.Fatalf("rollout %+v, devices %v", ro, devs.Devices)
	}
	dl := o.sum.Downloads
	if dl == nil || dl.Started != devices || dl.Completed != devices || dl.Installed != devices || dl.Failed != 0 {
		t.Fatalf("downloads %+v", dl)
	}
	if dl.Interrupted == 0 || dl.Resumed < dl.Interrupted || dl.Bytes < devices*size {
		t.Fatalf("with a failure rate of 0.5: %+v", dl)
	}
	if dl.MaxActive > 6 {
		t.Errorf("%d downloads at once, max_downloads 6", dl.MaxActive)
	}
	t.Logf("downloads %+v, p50 %v", *dl, dl.Time.Quantile(0.5))
	// The link speed: a whole file at rate takes size/rate at least.
	if p50 := dl.Time.Quantile(0.5); p50 < time.Duration(size)*time.Second/rate*9/10 {
		t.Errorf("median download time %v at %d B/s of %d bytes", p50, rate, size)
	}
	if got := srv.Metric("drover_firmware_file_requests_total", nil); got < float64(devices+dl.Interrupted) {
		t.Errorf("the server answered %v file requests, want at least %d", got, devices+dl.Interrupted)
	}
}
