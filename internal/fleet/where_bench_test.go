package fleet

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// benchState is a realistic pushed state of device i: the agent's
// measurements, two interfaces, the modem, and extras (site one of 50).
func benchState(i int) []byte {
	return fmt.Appendf(nil, `{"seq":1,"config_version":0,"state":{"uptime":%d,"cpu":%.1f,"load1":%.2f,"mem_total":268435456,"mem_used":%d,`+
		`"disk_total":1073741824,"disk_used":%d,"temperature":%.1f,"firmware":"7.4.2",`+
		`"interfaces":[{"name":"eth0","rx_bytes":%d,"tx_bytes":%d},{"name":"wwan0","rx_bytes":%d,"tx_bytes":%d}],`+
		`"signal":{"rssi":%d,"rsrp":%d,"rsrq":%d,"sinr":%d,"operator":"Operator %d","technology":"LTE"},`+
		`"extra":{"site":"site-%d","rack":"r%d","owner":"team-%d"}}}`,
		1000+i%86400, float64(i%1000)/10, float64(i%400)/100, 100_000_000+i%100_000_000, 200_000_000+i%500_000_000,
		20+float64(i%700)/10, i*1000, i*300, i*50, i*20, -50-i%60, -80-i%40, -5-i%15, i%30, i%7, i%50, i%40, i%9)
}

// BenchmarkWhereQuery registers DROVER_WHERE_DEVICES devices (default
// 1,000,000; memory mode), each pushing one realistic state, then filters
// them on reported fields: site (one device in 50) and temperature (one in
// 7), a device in 350. It reports the first query, which indexes the two
// fields (index-ms), the heap the index and a live label of the same
// filter add per device, and per query: a dashboard page with its total
// (every device visited; ns/op) and an API page (the first 100 matches in
// ID order, no total; api-page-ms), and the CPU time of both (cpu-ms/op:
// on a loaded machine the wall time includes waiting for a core).
func BenchmarkWhereQuery(b *testing.B) {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("DROVER_WHERE_DEVICES")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	s, err := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame"})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for i := range n {
		r, err := s.Register(ctx, emulatorLikeRegistration(i))
		if err != nil {
			b.Fatal(err)
		}
		p, err := protocol.DecodePush(benchState(i))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Push(ctx, r.Token, p); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("%d devices registered and pushed in %v", n, time.Since(start).Round(time.Millisecond))
	const expr = `state.extra.site = site-7 and state.temperature > 80`
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	start = time.Now()
	f, err := s.ParseFilter(url.Values{FilterWhere: {expr}})
	if err != nil {
		b.Fatal(err)
	}
	indexMS := float64(time.Since(start).Microseconds()) / 1000
	indexed := heap()
	l, err := s.DefineLabel(ctx, "hot-site-7", expr)
	if err != nil {
		b.Fatal(err)
	}
	labelled := heap()
	want := 0
	for i := range n {
		if i%50 == 7 && 20+float64(i%700)/10 > 80 {
			want++
		}
	}
	if l.Devices != want {
		b.Fatalf("live label: %d devices, want %d", l.Devices, want)
	}
	var api time.Duration
	queries := 0
	cpu0 := cpuTime()
	for b.Loop() {
		queries++
		res, err := s.Query(Query{Filter: f, Limit: 50})
		if err != nil || res.Total != want {
			b.Fatalf("query: %d matching, want %d (%v)", res.Total, want, err)
		}
		t0 := time.Now()
		page, err := s.Query(Query{Filter: f, Limit: 100, NoTotal: true})
		api += time.Since(t0)
		if err != nil || len(page.Devices) != min(100, want) {
			b.Fatalf("API page: %d devices (%v)", len(page.Devices), err)
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/1e6/float64(queries), "cpu-ms/op")
	b.ReportMetric(float64(api.Microseconds())/1000/float64(queries), "api-page-ms")
	b.ReportMetric(indexMS, "index-ms")
	b.ReportMetric(float64(int64(indexed)-int64(before))/float64(n), "index-B/device")
	b.ReportMetric(float64(int64(labelled)-int64(indexed))/float64(n), "label-B/device")
	runtime.KeepAlive(s)
}

// BenchmarkNoteReported is the push's hook with two indexed fields and
// three live labels: what a push pays for live groups.
func BenchmarkNoteReported(b *testing.B) {
	ctx := context.Background()
	s, err := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame"})
	if err != nil {
		b.Fatal(err)
	}
	r, err := s.Register(ctx, emulatorLikeRegistration(1))
	if err != nil {
		b.Fatal(err)
	}
	p, err := protocol.DecodePush(benchState(7))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Push(ctx, r.Token, p); err != nil {
		b.Fatal(err)
	}
	for i, e := range []string{`state.extra.site = site-7`, `state.temperature > 80 and firmware prefix 7.`, `state.extra.site = site-7 and state.temperature > 20`} {
		if _, err := s.DefineLabel(ctx, fmt.Sprint("l", i), e); err != nil {
			b.Fatal(err)
		}
	}
	d := s.get(1)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		d.mu.Lock()
		s.noteReported(d, p.RawState)
		d.mu.Unlock()
	}
}
