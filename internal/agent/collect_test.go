package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// copyTree copies testdata/root so that a test can change files.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if info.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func testSystem(root string) *system {
	return &system{root: root, diskPath: "/", log: slog.New(slog.DiscardHandler)}
}

func TestIdentityFromOpenWrt(t *testing.T) {
	got := testSystem("testdata/root").identity()
	want := Identity{DeviceType: "openwrt", Model: "GL.iNet GL-MT300N-V2", Serial: "SN-0042", Firmware: "OpenWrt 23.05.3 r23809-234f1a2efa"}
	if got != want {
		t.Fatalf("identity = %+v, want %+v", got, want)
	}
}

func TestIdentityFromOSRelease(t *testing.T) {
	root := copyTree(t, "testdata/root")
	os.Remove(filepath.Join(root, "etc/openwrt_release"))
	os.WriteFile(filepath.Join(root, "etc/os-release"), []byte("ID=debian\nVERSION_ID=\"12\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"), 0o644)
	got := testSystem(root).identity()
	if got.DeviceType != "debian" || got.Firmware != "Debian GNU/Linux 12 (bookworm)" {
		t.Fatalf("identity = %+v", got)
	}
	os.Remove(filepath.Join(root, "etc/os-release"))
	if got := testSystem(root).identity(); got.DeviceType != "linux" || got.Firmware != "5.15.150" {
		t.Fatalf("without release files: %+v", got)
	}
}

func TestCollectFromFakeProc(t *testing.T) {
	s := testSystem("testdata/root")
	st := s.collect(context.Background())
	if err := st.Validate(); err != nil {
		t.Fatalf("collected state fails the server's validation: %v", err)
	}
	check := func(name string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("uptime", *st.Uptime, int64(12345))
	check("load1", *st.Load1, 0.42)
	check("mem_total", *st.MemTotal, int64(256000*1024))
	check("mem_used", *st.MemUsed, int64((256000-100000)*1024))
	check("temperature", *st.Temperature, 52.3) // hottest zone; the -274 °C one is ignored
	check("cpu", st.CPU, (*float64)(nil))       // /proc/stat did not move
	check("interfaces", st.Interfaces, []protocol.Interface{
		{Name: "eth0", RxBytes: 123456789, RxPackets: 1000, TxBytes: 987654321, TxPackets: 2000},
		{Name: "wwan0", RxBytes: 5000000, RxPackets: 400, TxBytes: 600000, TxPackets: 300},
		{Name: "br-lan", RxBytes: 42, RxPackets: 1, TxBytes: 84, TxPackets: 2},
	})
	check("kernel", st.Extra["kernel"], "5.15.150")
	check("hostname", st.Extra["hostname"], "router-1")
	check("zone 0", st.Extra["temp.thermal_zone0.cpu-thermal"], "47.5")
	if _, ok := st.Extra["temp.thermal_zone2.disconnected"]; ok {
		t.Error("a disconnected sensor is reported")
	}
	if st.DiskTotal == nil || *st.DiskTotal <= 0 || *st.DiskUsed < 0 || *st.DiskUsed > *st.DiskTotal {
		t.Errorf("disk = %v/%v", st.DiskUsed, st.DiskTotal)
	}
}

func TestCPUPercentBetweenSamples(t *testing.T) {
	root := copyTree(t, "testdata/root")
	s := testSystem(root)
	if c := s.cpu(context.Background()); c != nil {
		t.Fatalf("cpu without movement = %v", *c)
	}
	// 1000 more jiffies, 250 of them idle or iowait: 75 % busy.
	os.WriteFile(filepath.Join(root, "proc/stat"), []byte("cpu  1600 0 650 8200 550 0 0 0 0 0\n"), 0o644)
	c := s.cpu(context.Background())
	if c == nil || *c != 75 {
		t.Fatalf("cpu = %v, want 75", c)
	}
	// A counter going backwards (reboot of a container, wrap) yields nothing
	// rather than nonsense.
	os.WriteFile(filepath.Join(root, "proc/stat"), []byte("cpu  10 0 10 10 0 0 0 0 0 0\n"), 0o644)
	if c := s.cpu(context.Background()); c != nil {
		t.Fatalf("cpu after counters went back = %v", *c)
	}
}

func TestCPUFirstSampleWaitsWindow(t *testing.T) {
	s := testSystem("testdata/root")
	s.cpuWindow = 50 * time.Millisecond
	start := time.Now()
	s.cpu(context.Background())
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Fatalf("first CPU sample took %v, want the 50ms window", took)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s2 := testSystem("testdata/root")
	s2.cpuWindow = time.Hour
	if c := s2.cpu(ctx); c != nil {
		t.Fatal("cancelled sample returned a value")
	}
}

func TestMemoryWithoutMemAvailable(t *testing.T) {
	root := copyTree(t, "testdata/root")
	os.WriteFile(filepath.Join(root, "proc/meminfo"), []byte("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 50 kB\nCached: 250 kB\n"), 0o644)
	var st protocol.State
	testSystem(root).memory(&st)
	if *st.MemTotal != 1000*1024 || *st.MemUsed != 600*1024 {
		t.Fatalf("mem = %d/%d", *st.MemUsed, *st.MemTotal)
	}
}

func TestInterfacePatternsAndLimits(t *testing.T) {
	root := copyTree(t, "testdata/root")
	s := testSystem(root)
	s.interfaces = []string{"wwan*", "lo"}
	var names []string
	for _, i := range s.netdev() {
		names = append(names, i.Name)
	}
	if strings.Join(names, ",") != "lo,wwan0" {
		t.Fatalf("interfaces = %v", names)
	}
	var b strings.Builder
	b.WriteString("h1\nh2\n")
	for i := 0; i < 100; i++ {
		b.WriteString("  veth" + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + "0: 1 2 0 0 0 0 0 0 3 4 0 0 0 0 0 0\n")
	}
	b.WriteString(" " + strings.Repeat("n", 70) + ": 1 2 0 0 0 0 0 0 3 4 0 0 0 0 0 0\n")
	os.WriteFile(filepath.Join(root, "proc/net/dev"), []byte(b.String()), 0o644)
	s.interfaces = nil
	got := s.netdev()
	if len(got) != protocol.MaxInterfaces {
		t.Fatalf("%d interfaces, want the limit %d", len(got), protocol.MaxInterfaces)
	}
	st := protocol.State{Interfaces: got}
	if err := st.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestCleanKeepsProtocolLimits(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain", "plain"},
		{"a\x00b\nc", "a b c"},
		{"\xff\xfeok", "?ok"},
		{"x\u0085y\u009f\x7fz", "x y  z"},                  // C1 controls and DEL, refused by the server
		{strings.Repeat("é", 40), strings.Repeat("é", 32)}, // 2 bytes each, cut at 64 bytes
	} {
		if got := clean(c.in, 64); got != c.want {
			t.Errorf("clean(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestParseCollector(t *testing.T) {
	out := "# modem\nrssi=-71\nrsrp = -101.5\nrsrq=-11\nsinr=500\noperator=\"Telekom.de\"\ntechnology=LTE\nband=B20\ncell_id=0x1A2B\nnot a pair\nrssi_raw=x\n"
	c, problems := parseCollector([]byte(out))
	if c.Signal == nil || *c.Signal.RSSI != -71 || *c.Signal.RSRP != -101.5 || *c.Signal.RSRQ != -11 || c.Signal.SINR != nil {
		t.Fatalf("signal = %+v", c.Signal)
	}
	if c.Signal.Operator != "Telekom.de" || c.Signal.Technology != "LTE" {
		t.Fatalf("operator/technology = %q/%q", c.Signal.Operator, c.Signal.Technology)
	}
	if !reflect.DeepEqual(c.Extra, map[string]string{"band": "B20", "cell_id": "0x1A2B", "rssi_raw": "x"}) {
		t.Fatalf("extra = %v", c.Extra)
	}
	if len(problems) != 2 || !strings.Contains(problems[0], "not a pair") || !strings.Contains(problems[1], "sinr=500") {
		t.Fatalf("problems = %q", problems)
	}

	c, problems = parseCollector([]byte(`{"signal":{"rssi":-60,"technology":"5G"},"extra":{"apn":"internet"}}`))
	if len(problems) != 0 || *c.Signal.RSSI != -60 || c.Signal.Technology != "5G" || c.Extra["apn"] != "internet" {
		t.Fatalf("JSON: %+v %v %q", c.Signal, c.Extra, problems)
	}
	if _, problems = parseCollector([]byte(`{"signal":`)); len(problems) != 1 {
		t.Fatalf("broken JSON: problems = %q", problems)
	}
}

func TestCollectorMergeRespectsLimits(t *testing.T) {
	st := protocol.State{Extra: map[string]string{"hostname": "mine"}}
	c := collected{Extra: map[string]string{"hostname": "theirs"}}
	for i := 0; i < 100; i++ {
		c.Extra[strings.Repeat("k", 1+i%60)+string(rune('a'+i%26))] = "v"
	}
	c.merge(&st)
	if st.Extra["hostname"] != "mine" {
		t.Fatal("collector replaced an agent key")
	}
	if len(st.Extra) > protocol.MaxExtraKeys {
		t.Fatalf("%d extra keys", len(st.Extra))
	}
	if err := st.Validate(); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(st)
	if len(b) > protocol.MaxBodyBytes {
		t.Fatalf("state of %d bytes", len(b))
	}
}
