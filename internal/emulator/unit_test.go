package emulator

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

func TestShards(t *testing.T) {
	for _, bad := range []string{"0/4", "5/4", "1", "a/b", "1/0", ""} {
		if _, err := ParseShard(bad); err == nil {
			t.Errorf("ParseShard(%q) accepted", bad)
		}
	}
	const n = 103
	seen := make([]int, n)
	for k := 1; k <= 3; k++ {
		s, err := ParseShard(strings.Join([]string{string(rune('0' + k)), "3"}, "/"))
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i <= 2; i++ { // each shard split again over 2 processes
			for _, idx := range s.Sub(i, 2).indexes(n) {
				seen[idx]++
			}
		}
	}
	for i, c := range seen {
		if c != 1 {
			t.Fatalf("device %d covered %d times", i, c)
		}
	}
}

func TestIdentity(t *testing.T) {
	a, b := MachineID("s", 1), MachineID("s", 1)
	if a != b || len(a) != 32 {
		t.Fatalf("machine ID not stable: %q %q", a, b)
	}
	ids := map[string]bool{}
	for i := range 10000 {
		ids[MachineID("s", i)] = true
	}
	if len(ids) != 10000 || MachineID("s", 1) == MachineID("t", 1) {
		t.Fatal("machine IDs collide")
	}
	id := newIdentity("s")
	interval := 200 * time.Second
	var sum time.Duration
	for i := range 1000 {
		p := id.phase(i, interval)
		if p < 0 || p >= interval {
			t.Fatalf("phase %v", p)
		}
		sum += p / 1000
	}
	if mean := sum; mean < 80*time.Second || mean > 120*time.Second {
		t.Fatalf("phases are not spread over the interval: mean %v", mean)
	}
}

func TestDefaultTemplateIsValidAndVaries(t *testing.T) {
	tpl, err := ParseTemplate("default", DefaultTemplate)
	if err != nil {
		t.Fatal(err)
	}
	if !tpl.Wrapped {
		t.Fatal("the default template is a state and should be wrapped")
	}
	id := newIdentity("x")
	d := newDevice(id, 42)
	d.deviceID, d.token = "7", "tok"
	rc := renderCtx{firmware: "1.2.3", start: time.Now().Add(-time.Hour)}
	var prev protocol.PushRequest
	for i := range 50 {
		r := d.advance(id)
		body := tpl.Render(nil, d, &rc, time.Now(), &r)
		p, err := protocol.DecodePush(body)
		if err != nil {
			t.Fatalf("push %d refused: %v\n%s", i, err, body)
		}
		if p.Seq != uint64(i+1) || p.State.Interfaces[2].RxBytes == 0 {
			t.Fatalf("seq %d, wwan0 rx %d", p.Seq, p.State.Interfaces[2].RxBytes)
		}
		if i > 0 {
			if p.State.Interfaces[2].RxBytes <= prev.State.Interfaces[2].RxBytes || p.State.Interfaces[0].TxBytes <= prev.State.Interfaces[0].TxBytes {
				t.Fatal("traffic counters do not grow")
			}
			if *p.State.Uptime < *prev.State.Uptime {
				t.Fatal("uptime went back")
			}
		}
		if *p.State.Temperature < 35 || *p.State.Temperature > 85 || *p.State.CPU < 1 || *p.State.CPU > 99 {
			t.Fatalf("cpu %v temperature %v", *p.State.CPU, *p.State.Temperature)
		}
		prev = p
	}
	if prev.State.Extra["imei"] != "356938030000042" || prev.State.Firmware != "1.2.3" || prev.State.Extra["hostname"] != "router-42" {
		t.Fatalf("extra %v firmware %q", prev.State.Extra, prev.State.Firmware)
	}
}

func TestCustomTemplate(t *testing.T) {
	src := `{"seq":{{seq}},"config_version":{{config_version}},"state":{"cpu":{{cpu}},"extra":{"m":"{{machine_id}}","d":"{{device_id}}","t":"{{token}}","i":"{{index}}","s":"{{serial}}","r":"{{rand:5:5}}","f":"{{randf:1.5:1.5}}","u":"{{unix}}","ms":"{{unix_ms}}","time":"{{time}}"}}}`
	tpl, err := ParseTemplate("custom", src)
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Wrapped {
		t.Fatal("a whole push body must not be wrapped")
	}
	d := &device{idx: 3, machineID: "mid", deviceID: "99", token: `a"b\c`, seq: 7, cfgVer: 4}
	now := time.Unix(1700000000, 123e6)
	r := rng{s: 9}
	body := tpl.Render(nil, d, &renderCtx{}, now, &r)
	var got struct {
		Seq           int
		ConfigVersion int `json:"config_version"`
		State         struct {
			Extra map[string]string
		}
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	want := map[string]string{"m": "mid", "d": "99", "t": `a"b\c`, "i": "3", "s": "EMU00000003", "r": "5", "f": "1.5",
		"u": "1700000000", "ms": "1700000000123", "time": "2023-11-14T22:13:20Z"}
	for k, v := range want {
		if got.State.Extra[k] != v {
			t.Errorf("%s = %q, want %q", k, got.State.Extra[k], v)
		}
	}
	if got.Seq != 7 || got.ConfigVersion != 4 {
		t.Fatalf("seq %d config_version %d", got.Seq, got.ConfigVersion)
	}
}

func TestTemplateErrors(t *testing.T) {
	for src, want := range map[string]string{
		`{"cpu":{{nope}}}`:          "unknown placeholder",
		`{"cpu":{{cpu}`:             "unclosed",
		`{"cpu":{{rand:9:1}}}`:      "A ≤ B",
		`{"cpu":{{cpu:1}}}`:         "no argument",
		`{"cpu":200}`:               "would refuse",
		`[1,2]`:                     "not a JSON object",
		`{"cpu":{{rx_bytes:x}}}`:    "interface number",
		`{"state":{"cpu":"text"}}`:  "would refuse",
		`{"temperature":{{seq}}, }`: "not a JSON object",
	} {
		if _, err := ParseTemplate("t", src); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", src, err, want)
		}
	}
}

func TestRenderDoesNotAllocate(t *testing.T) {
	tpl, _ := ParseTemplate("default", DefaultTemplate)
	id := newIdentity("x")
	d := newDevice(id, 1)
	d.deviceID, d.token = "1", "t"
	rc := renderCtx{firmware: "1", start: time.Now()}
	buf := make([]byte, 0, 4096)
	now := time.Now()
	allocs := testing.AllocsPerRun(200, func() {
		r := d.advance(id)
		buf = tpl.Render(buf[:0], d, &rc, now, &r)
	})
	if allocs != 0 {
		t.Fatalf("Render allocates %.1f times per push", allocs)
	}
}

func BenchmarkRenderDefault(b *testing.B) {
	tpl, _ := ParseTemplate("default", DefaultTemplate)
	id := newIdentity("x")
	d := newDevice(id, 1)
	d.deviceID, d.token = "123", "0123456789abcdef0123456789abcdef"
	rc := renderCtx{firmware: "7.4.2", start: time.Now()}
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		r := d.advance(id)
		buf = tpl.Render(buf[:0], d, &rc, time.Now(), &r)
	}
	b.SetBytes(int64(len(buf)))
}

func TestAppendJSONText(t *testing.T) {
	in := "a\"b\\c\nd\x01é"
	out := appendJSONText(nil, in)
	var back string
	if err := json.Unmarshal([]byte(`"`+string(out)+`"`), &back); err != nil || back != in {
		t.Fatalf("%q -> %q -> %q (%v)", in, out, back, err)
	}
}

func TestParseSourceAddrs(t *testing.T) {
	ips, err := ParseSourceAddrs("127.0.0.1-3, 127.0.0.9,127.0.1.1-127.0.1.2")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ip := range ips {
		got = append(got, ip.String())
	}
	if strings.Join(got, " ") != "127.0.0.1 127.0.0.2 127.0.0.3 127.0.0.9 127.0.1.1 127.0.1.2" {
		t.Fatal(got)
	}
	for _, bad := range []string{"x", "127.0.0.5-2", "127.0.0.1-127.0.1.1", "::1-5"} {
		if _, err := ParseSourceAddrs(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// readResp parses raw as one answer.
func readResp(t *testing.T, raw string, used int) (response, error) {
	t.Helper()
	c := &conn{br: bufio.NewReader(strings.NewReader(raw)), used: used}
	var r response
	err := c.readResponse(&r, make([]byte, 0, 16))
	return r, err
}

func TestReadResponse(t *testing.T) {
	r, err := readResp(t, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: x\r\n\r\nhello", 0)
	if err != nil || r.status != 200 || string(r.body) != "hello" || r.close || r.retryAfter != -1 {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = readResp(t, "HTTP/1.1 503 Service Unavailable\r\nretry-after: 7\r\nConnection: close\r\ncontent-length: 0\r\n\r\n", 0)
	if err != nil || r.status != 503 || r.retryAfter != 7*time.Second || !r.close {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = readResp(t, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: v\r\n\r\n", 0)
	if err != nil || r.status != 200 || string(r.body) != "abcde" {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = readResp(t, "HTTP/1.0 200 OK\r\n\r\nuntil eof", 0)
	if err != nil || string(r.body) != "until eof" || !r.close {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := readResp(t, "", 1); !errors.Is(err, errStale) {
		t.Fatalf("EOF on a reused connection: %v", err)
	}
	if _, err := readResp(t, "", 0); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("EOF on a new connection: %v", err)
	}
	for _, bad := range []string{"SSH-2.0\r\n", "HTTP/1.1 2x0 OK\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "HTTP/1.1 200 OK\r\nnocolon\r\n\r\n"} {
		if _, err := readResp(t, bad, 0); !errors.Is(err, errProtocol) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := readResp(t, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", 0); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short body: %v", err)
	}
}

func TestRetryAfterDate(t *testing.T) {
	if d := parseRetryAfter(time.Now().Add(3 * time.Second).UTC().Format(time.RFC1123)); d < time.Second || d > 3*time.Second {
		t.Fatalf("date: %v", d)
	}
	if parseRetryAfter("soon") != -1 {
		t.Fatal("garbage accepted")
	}
}

func TestClassify(t *testing.T) {
	cases := map[string]error{
		DropTimeout:  os.ErrDeadlineExceeded,
		DropRefused:  &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)},
		DropReset:    syscall.ECONNRESET,
		DropNoPort:   syscall.EADDRNOTAVAIL,
		DropFDLimit:  syscall.EMFILE,
		DropEOF:      io.ErrUnexpectedEOF,
		DropProtocol: errProtocol,
		DropTLS:      &tlsError{errors.New("x509: bad")},
		DropOther:    errors.New("?"),
	}
	for want, err := range cases {
		if got := classify(err); got != want {
			t.Errorf("%v: %s, want %s", err, got, want)
		}
	}
}

func TestRetryWait(t *testing.T) {
	e := &engine{cfg: Config{MaxRetryWait: 10 * time.Second}}
	j := rng{s: 1}
	for attempt := 1; attempt <= 6; attempt++ {
		w, ok := e.retryWait(2*time.Second, attempt, &j)
		base := max(time.Second<<(attempt-1), 2*time.Second)
		if !ok || w < min(base, 10*time.Second) || w > 10*time.Second || w > base*3/2 {
			t.Fatalf("attempt %d: %v", attempt, w)
		}
	}
	if _, ok := e.retryWait(11*time.Second, 1, &j); ok {
		t.Fatal("a Retry-After beyond --max-retry-wait must end the operation")
	}
}
