package server

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
)

// discardWriter is a ResponseWriter that keeps nothing, so that the
// benchmarks measure the handlers, not the recorder.
type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(code int)        { w.code = code }

// body is a request body that can be read again.
type body struct{ bytes.Reader }

func (*body) Close() error { return nil }

func benchAPI(b *testing.B) (*api, http.Handler) {
	f, err := fleet.New(context.Background(), fleet.Stores{}, nil, fleet.Options{EnrollmentSecret: "s"})
	if err != nil {
		b.Fatal(err)
	}
	a := &api{fleet: f, m: newMetrics(), log: discardLogger(), slots: make(chan struct{}, 64),
		ready: func() error { return nil }}
	return a, a.routes()
}

// run serves req with raw as its body b.N times, wanting 200.
func run(b *testing.B, h http.Handler, req *http.Request, raw []byte) {
	w := &discardWriter{h: http.Header{}}
	rd := &body{}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rd.Reset(raw)
		req.Body, req.ContentLength = rd, int64(len(raw))
		clear(w.h)
		h.ServeHTTP(w, req)
		if w.code != 200 {
			b.Fatal(w.code)
		}
	}
}

// The device endpoints are the hot path: one request per device every few
// minutes, a million devices.
func BenchmarkPushHandler(b *testing.B) {
	a, h := benchAPI(b)
	resp, err := a.fleet.Register(context.Background(), protocol.RegisterRequest{MachineID: "m", DeviceType: "t", Firmware: "f", EnrollmentSecret: "s"})
	if err != nil {
		b.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, protocol.PathPush, nil)
	req.Header.Set("Authorization", "Bearer "+resp.Token)
	run(b, h, req, []byte(`{"seq":1,"config_version":0,"state":{"uptime":100,"cpu":5,"temperature":41.5,"signal":{"rssi":-70,"technology":"LTE"}}}`))
}

func BenchmarkRegisterHandler(b *testing.B) {
	_, h := benchAPI(b)
	req := httptest.NewRequest(http.MethodPost, protocol.PathRegister, nil)
	run(b, h, req, []byte(`{"machine_id":"m-1","device_type":"t","firmware":"f","enrollment_secret":"s"}`))
}
