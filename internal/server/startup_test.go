package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/testwait"
)

// heldStore's Load expects 10 devices, streams 4 and waits for release.
type heldStore struct {
	failingStore
	release chan struct{}
}

func (s heldStore) Load(ctx context.Context, opts fleet.LoadOptions, each func(fleet.DeviceRecord) error) (fleet.LoadResult, error) {
	opts.Expect(10)
	for id := uint64(1); id <= 4; id++ {
		if err := each(fleet.DeviceRecord{ID: id, MachineID: "m-" + string(rune('0'+id)), DeviceType: "t", Firmware: "f",
			TokenHash: make([]byte, 32), RegisteredAt: time.Unix(1, 0)}); err != nil {
			return fleet.LoadResult{}, err
		}
	}
	<-s.release
	return fleet.LoadResult{MaxDeviceID: 4}, nil
}

// While the fleet loads, /readyz says how many devices of how many are
// loaded, and the metrics say it too.
func TestReadyzTellsLoadProgress(t *testing.T) {
	s := &Server{log: discardLogger(), m: newMetrics()}
	s.start.since = time.Now()
	s.start.setPhase(phaseLoading)
	s.m.reg.MustRegister(startupCollector{&s.start})
	st := heldStore{release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := fleet.New(context.Background(), fleet.Stores{Devices: st}, nil,
			fleet.Options{EnrollmentSecret: "s", Progress: &s.start.loading})
		done <- err
	}()
	readyz := func() string {
		rec := httptest.NewRecorder()
		s.startingUp(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		if rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz while loading: %d %s", rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	testwait.For(t, 10*time.Second, "the progress in /readyz", func() bool {
		return strings.Contains(readyz(), `"reason":"loading the fleet: 4 of 10 devices (started `)
	})
	rec := httptest.NewRecorder()
	s.m.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{"drover_startup_devices_loaded 4\n", "drover_startup_devices_expected 10\n", "drover_startup_seconds 0\n"} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("metrics while loading lack %q", want)
		}
	}
	close(st.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s.routesInPlace()
	rec = httptest.NewRecorder()
	s.m.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if strings.Contains(rec.Body.String(), "drover_startup_seconds 0\n") || !strings.Contains(rec.Body.String(), "drover_startup_seconds ") {
		t.Errorf("drover_startup_seconds not set once ready")
	}
}
