package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/server/servertest"
)

// --wipe: half the devices lose their agent state mid-run and register
// again with their machine ID only. The server holds each as a
// re-enrollment request; approved with the admin token, every one comes
// back under its old device ID, and the server holds no duplicate.
// Without the token they wait for an operator.
func TestWipeReenrollsSameDevices(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{})
	run := func(seed, adminToken string) (wiped, requested, approved, same, moved int) {
		t.Helper()
		var mu sync.Mutex
		var logs []string
		cfg := DefaultConfig()
		cfg.Target, cfg.EnrollmentSecret, cfg.CACertPEM, cfg.Seed, cfg.Devices = srv.URL, srv.EnrollmentSecret, srv.CACertPEM, seed, 20
		cfg.Interval, cfg.Duration, cfg.Wipe, cfg.WipeAt, cfg.AdminToken = 400*time.Millisecond, 4*time.Second, 0.5, time.Second, adminToken
		cfg.Logf = func(f string, a ...any) {
			mu.Lock()
			logs = append(logs, fmt.Sprintf(f, a...))
			mu.Unlock()
		}
		var warnings []string
		cfg.Warn = func(w string) { warnings = append(warnings, w) }
		if _, err := Run(context.Background(), cfg, nil); err != nil {
			t.Fatal(err)
		}
		for _, l := range logs {
			if strings.HasPrefix(l, "wipe:") {
				if _, err := fmt.Sscanf(l, "wipe: %d devices' agent state wiped; %d re-enrollment requests, %d approved; %d back as the same device, %d as a new one",
					&wiped, &requested, &approved, &same, &moved); err != nil {
					t.Fatalf("%q: %v", l, err)
				}
				return
			}
		}
		t.Fatalf("no wipe report in %q (warnings %q)", logs, warnings)
		return
	}
	wiped, requested, approved, same, moved := run("wipe", srv.AdminToken)
	if wiped < 3 || wiped > 17 || requested != wiped || approved != wiped || same != wiped || moved != 0 {
		t.Fatalf("wiped %d, requests %d, approved %d, same %d, new %d", wiped, requested, approved, same, moved)
	}
	var l struct {
		Devices []struct {
			ID string `json:"id"`
		} `json:"devices"`
	}
	resp, err := srv.Client().Do(adminGet(t, srv, "/api/v1/devices?limit=1000"))
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&l)
	resp.Body.Close()
	if len(l.Devices) != 20 {
		t.Fatalf("the server holds %d devices for a fleet of 20", len(l.Devices))
	}
	if n := srv.Metric("drover_registrations_total", map[string]string{"outcome": "new"}); n != 20 {
		t.Fatalf("%v new registrations for a fleet of 20", n)
	}

	wiped, requested, approved, same, moved = run("wipe-wait", "")
	if wiped < 3 || requested != wiped || approved != 0 || same != 0 || moved != 0 {
		t.Fatalf("without a token: wiped %d, requests %d, approved %d, same %d, new %d", wiped, requested, approved, same, moved)
	}
	if n := srv.Metric("drover_enrollment_requests", nil); int(n) != wiped {
		t.Fatalf("%v re-enrollment requests wait, %d devices were wiped", n, wiped)
	}
}
