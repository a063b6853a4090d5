package server

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/server/transport"
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

func benchAPI(b testing.TB) (*api, http.Handler) {
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
	serve := serveOnce(b, h, req, raw)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		serve()
	}
}

// serveOnce returns a function that serves req with raw as its body,
// wanting 200, allocating nothing of its own.
func serveOnce(tb testing.TB, h http.Handler, req *http.Request, raw []byte) func() {
	w := &discardWriter{h: http.Header{}}
	rd := &body{}
	return func() {
		rd.Reset(raw)
		req.Body, req.ContentLength = rd, int64(len(raw))
		clear(w.h)
		h.ServeHTTP(w, req)
		if w.code != 200 {
			tb.Fatal(w.code)
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

// routerPushBody is the push scripts/wrk/push.lua sends: a router's state
// of about 750 bytes.
const routerPushBody = `{"seq":2,"config_version":0,"state":{"uptime":1,"cpu":12.5,"load1":0.31,"mem_total":268435456,"mem_used":98304000,"disk_total":134217728,"disk_used":41943040,"temperature":47.5,"firmware":"6.3.5","interfaces":[{"name":"eth0","rx_bytes":1234567,"tx_bytes":7654321,"rx_packets":9876,"tx_packets":8765},{"name":"eth1","rx_bytes":0,"tx_bytes":0},{"name":"wwan0","rx_bytes":987654321,"tx_bytes":123456789,"rx_packets":765432,"tx_packets":654321}],"signal":{"rssi":-67,"rsrp":-95,"rsrq":-10,"sinr":12.4,"operator":"Vodafone CZ","technology":"LTE"},"extra":{"iccid":"8942031019123456789","imei":"356938035643809","apn":"internet"}}}`

// BenchmarkPushHandlerConn is a push as a served connection has it: the
// request's context carries the connection's state (transport.WithConn), the
// body is a router's state.
func BenchmarkPushHandlerConn(b *testing.B) {
	h, req := connPush(b)
	run(b, h, req, []byte(routerPushBody))
}

// connPush is the push handler and a push request of a registered device
// whose context carries a connection's state, as a served connection's does.
func connPush(tb testing.TB) (http.Handler, *http.Request) {
	a, h := benchAPI(tb)
	resp, err := a.fleet.Register(context.Background(), protocol.RegisterRequest{MachineID: "m", DeviceType: "t", Firmware: "f", EnrollmentSecret: "s"})
	if err != nil {
		tb.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, protocol.PathPush, nil)
	req = req.WithContext(transport.WithConn(req.Context(), nil))
	req.Header.Set("Authorization", "Bearer "+resp.Token)
	return h, req
}
