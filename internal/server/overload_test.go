package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

func TestOverloadAnswers503WithRetryAfter(t *testing.T) {
	f, err := fleet.New(context.Background(), fleet.Stores{}, nil, fleet.Options{EnrollmentSecret: "s"})
	if err != nil {
		t.Fatal(err)
	}
	a := &api{fleet: f, m: newMetrics(), log: discardLogger(), slots: make(chan struct{}, 1),
		ready: func() error { return nil }}
	a.slots <- struct{}{} // the only slot is busy
	h := a.routes()
	for _, path := range []string{"/api/v1/push", "/api/v1/register"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`)))
		if rec.Code != 503 || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), `"code":"overloaded"`) {
			t.Fatalf("%s: %d %q %s", path, rec.Code, rec.Header().Get("Retry-After"), rec.Body)
		}
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// failingStore accepts nothing.
type failingStore struct{}

func (failingStore) Load(context.Context, fleet.LoadOptions, func(fleet.DeviceRecord) error) (fleet.LoadResult, error) {
	return fleet.LoadResult{}, nil
}
func (failingStore) Commit(context.Context, *fleet.Batch) error { return errors.New("disk full") }
func (failingStore) History(context.Context, uint64, fleet.HistoryQuery) ([]fleet.Sample, error) {
	return nil, errors.New("disk full")
}
func (failingStore) PruneHistory(context.Context, time.Time, int) (int64, error) { return 0, nil }
func (failingStore) Close() error                                                { return nil }

// A store that cannot commit gets 503 with Retry-After, never 200, and
// readiness says why.
func TestStoreFailureAnswers503(t *testing.T) {
	s := &Server{log: discardLogger()}
	s.m = newMetrics()
	wt := fleet.NewWriteThrough(failingStore{}, 0, func(n int, d time.Duration, err error) {
		s.m.observeCommit(n, d, err)
		if err != nil {
			msg := err.Error()
			s.storeErr.Store(&msg)
		}
	})
	defer wt.Close(context.Background())
	f, err := fleet.New(context.Background(), fleet.Stores{Devices: failingStore{}}, wt, fleet.Options{EnrollmentSecret: "s"})
	if err != nil {
		t.Fatal(err)
	}
	s.fleet = f
	a := &api{fleet: f, m: s.m, log: discardLogger(), slots: make(chan struct{}, 8), ready: s.ready}
	h := a.routes()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/api/v1/register",
		strings.NewReader(`{"machine_id":"m","device_type":"t","firmware":"f","enrollment_secret":"s"}`)))
	if rec.Code != 503 || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), `"code":"unavailable"`) {
		t.Fatalf("register with failing store: %d %q %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "disk full") {
		t.Fatalf("readyz: %d %s", rec.Code, rec.Body)
	}
}

// The dashboard's overload note counts the device requests refused for
// overload, from the API's own counter.
func TestOverloadWatchCountsRefusals(t *testing.T) {
	f, err := fleet.New(context.Background(), fleet.Stores{}, nil, fleet.Options{EnrollmentSecret: "s"})
	if err != nil {
		t.Fatal(err)
	}
	a := &api{fleet: f, m: newMetrics(), log: discardLogger(), slots: make(chan struct{}, 1), ready: func() error { return nil }}
	ov := &overloadWatch{refused: a.refused.Load}
	if r := ov.reason(); r != "" {
		t.Fatalf("before any refusal: %q", r)
	}
	h := a.routes()
	a.slots <- struct{}{}
	for _, path := range []string{"/api/v1/push", "/api/v1/register", "/api/v1/push"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`)))
	}
	if r := ov.reason(); !strings.HasPrefix(r, "3 device requests refused with 503") {
		t.Fatalf("after 3 refusals: %q", r)
	}
}

// 503s spread their Retry-After over [n, 2n] (docs/protocol.md), so that
// clients refused together do not come back together.
func TestOverloadRetryAfterIsSpread(t *testing.T) {
	f, err := fleet.New(context.Background(), fleet.Stores{}, nil, fleet.Options{EnrollmentSecret: "s"})
	if err != nil {
		t.Fatal(err)
	}
	a := &api{fleet: f, m: newMetrics(), log: discardLogger(), slots: make(chan struct{}, 1),
		ready: func() error { return nil }}
	a.slots <- struct{}{}
	h := a.routes()
	seen := map[string]int{}
	for range 200 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/api/v1/push", strings.NewReader(`{}`)))
		if rec.Code != 503 {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		seen[rec.Header().Get("Retry-After")]++
	}
	for v, n := range seen {
		if v != "2" && v != "3" && v != "4" {
			t.Fatalf("Retry-After %q (%d times), want 2..4", v, n)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("Retry-After values %v: not spread over 2..4", seen)
	}
	for _, e := range []*apiError{errCancelled, answerError(errors.New("disk full")), rateLimited(10 * time.Second)} {
		lo, hi := e.retryAfter, 0
		for range 200 {
			v := e.retryAfterSeconds()
			if v < e.retryAfter || v > 2*e.retryAfter {
				t.Fatalf("%s: Retry-After %d outside %d..%d", e.code, v, e.retryAfter, 2*e.retryAfter)
			}
			lo, hi = min(lo, v), max(hi, v)
		}
		if lo == hi {
			t.Fatalf("%s: Retry-After always %d", e.code, lo)
		}
	}
	if q := quotaError(&fleet.QuotaError{RetryAfter: 1500 * time.Millisecond}); q.retryAfterSeconds() != 2 {
		t.Fatalf("quota Retry-After %d, want exactly 2 (not spread)", q.retryAfterSeconds())
	}
}
