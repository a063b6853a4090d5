package server

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/drover/drover/internal/fleet"
)

func TestOverloadAnswers503WithRetryAfter(t *testing.T) {
	f, err := fleet.New(context.Background(), nil, nil, fleet.Options{EnrollmentSecret: "s"})
	if err != nil {
		t.Fatal(err)
	}
	a := &api{fleet: f, m: newMetrics(func() *fleet.Service { return f }), log: discardLogger(), slots: make(chan struct{}, 1),
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
