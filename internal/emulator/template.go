package emulator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// DefaultTemplate is a cellular router's state: uptime, CPU and temperature
// that wander, traffic counters that grow, a LAN, an unused and a cellular
// interface, radio signal and SIM identifiers.
const DefaultTemplate = `{"uptime":{{uptime}},"cpu":{{cpu}},"load1":{{load1}},` +
	`"mem_total":268435456,"mem_used":{{mem_used}},"disk_total":134217728,"disk_used":{{rand:41000000:42000000}},` +
	`"temperature":{{temperature}},"firmware":"{{firmware}}","interfaces":[` +
	`{"name":"eth0","rx_bytes":{{rx_bytes:1}},"tx_bytes":{{tx_bytes:1}},"rx_packets":{{rx_packets:1}},"tx_packets":{{tx_packets:1}}},` +
	`{"name":"eth1","rx_bytes":0,"tx_bytes":0,"rx_packets":0,"tx_packets":0},` +
	`{"name":"wwan0","rx_bytes":{{rx_bytes}},"tx_bytes":{{tx_bytes}},"rx_packets":{{rx_packets}},"tx_packets":{{tx_packets}}}],` +
	`"signal":{"rssi":{{rand:-85:-55}},"rsrp":{{rand:-115:-80}},"rsrq":{{rand:-15:-5}},"sinr":{{randf:0:25}},"operator":"{{operator}}","technology":"LTE"},` +
	`"extra":{"iccid":"{{iccid}}","imei":"{{imei}}","apn":"internet","hostname":"router-{{index}}"}}`

// Placeholders a template may use, with what they insert.
var placeholders = map[string]string{
	"machine_id":     "the device's machine ID (string content)",
	"device_id":      "the device ID the server assigned (string content)",
	"token":          "the device's token (string content)",
	"index":          "the device's index in the fleet",
	"serial":         "the device's serial number (string content)",
	"imei":           "a 15-digit IMEI derived from the index (string content)",
	"iccid":          "a 19-digit ICCID derived from the index (string content)",
	"operator":       "a mobile operator name chosen by index (string content)",
	"firmware":       "the firmware version (--firmware; string content)",
	"seq":            "the push sequence number",
	"config_version": "the configuration version last received",
	"unix":           "the send time, unix seconds",
	"unix_ms":        "the send time, unix milliseconds",
	"time":           "the send time, RFC 3339 (string content)",
	"uptime":         "seconds since the emulated boot",
	"cpu":            "CPU percent, a random walk in 1..99",
	"load1":          "load average, follows cpu",
	"mem_used":       "used memory bytes, follows cpu",
	"temperature":    "degrees Celsius, a random walk in 35..85",
	"rx_bytes":       "received bytes, grows each push; rx_bytes:K scales it for interface K",
	"tx_bytes":       "sent bytes, grows each push; tx_bytes:K likewise",
	"rx_packets":     "received packets, grows with rx_bytes; rx_packets:K likewise",
	"tx_packets":     "sent packets, grows with tx_bytes; tx_packets:K likewise",
	"rand":           "rand:A:B, a uniform integer in A..B each push",
	"randf":          "randf:A:B, a uniform number in A..B with one decimal each push",
}

type fieldKind uint8

const (
	fLiteral fieldKind = iota
	fMachineID
	fDeviceID
	fToken
	fIndex
	fSerial
	fIMEI
	fICCID
	fOperator
	fFirmware
	fSeq
	fConfigVersion
	fUnix
	fUnixMs
	fTime
	fUptime
	fCPU
	fLoad1
	fMemUsed
	fTemperature
	fRxBytes
	fTxBytes
	fRxPackets
	fTxPackets
	fRand
	fRandF
)

var kinds = map[string]fieldKind{
	"machine_id": fMachineID, "device_id": fDeviceID, "token": fToken, "index": fIndex, "serial": fSerial,
	"imei": fIMEI, "iccid": fICCID, "operator": fOperator, "firmware": fFirmware, "seq": fSeq,
	"config_version": fConfigVersion, "unix": fUnix, "unix_ms": fUnixMs, "time": fTime, "uptime": fUptime,
	"cpu": fCPU, "load1": fLoad1, "mem_used": fMemUsed, "temperature": fTemperature,
	"rx_bytes": fRxBytes, "tx_bytes": fTxBytes, "rx_packets": fRxPackets, "tx_packets": fTxPackets,
	"rand": fRand, "randf": fRandF,
}

var operators = []string{"Vodafone CZ", "T-Mobile CZ", "O2 CZ", "Telekom DE", "Orange FR"}

type segment struct {
	kind fieldKind
	lit  []byte
	a, b int64 // rand range (randf: tenths), or interface scale for counters
}

// Template renders push bodies. It is parsed once into literal segments and
// fields; rendering appends to a caller's buffer without allocating.
type Template struct {
	segs    []segment
	Name    string // "default" or the file name
	Wrapped bool   // the template is a state object, wrapped into a push body
	Source  string
}

// ParseTemplate parses a template: JSON with {{placeholder}} fields. A
// template with a top-level "state" key is a whole push body; any other
// object is the state and is wrapped as {"seq":…,"config_version":…,"state":…}.
func ParseTemplate(name, src string) (*Template, error) {
	segs, err := parseSegments(src)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", name, err)
	}
	t := &Template{segs: segs, Name: name, Source: src}
	// Decide on wrapping from a sample rendering.
	sample := t.sample()
	var top map[string]json.RawMessage
	if err := json.Unmarshal(sample, &top); err != nil {
		return nil, fmt.Errorf("template %s: not a JSON object once rendered: %v\n%s", name, err, sample)
	}
	if _, ok := top["state"]; !ok {
		t.Wrapped = true
		var w []segment
		w = append(w, segment{kind: fLiteral, lit: []byte(`{"seq":`)}, segment{kind: fSeq},
			segment{kind: fLiteral, lit: []byte(`,"config_version":`)}, segment{kind: fConfigVersion},
			segment{kind: fLiteral, lit: []byte(`,"state":`)})
		w = append(w, segs...)
		w = append(w, segment{kind: fLiteral, lit: []byte(`}`)})
		t.segs = mergeLiterals(w)
	}
	if _, err := protocol.DecodePush(t.sample()); err != nil {
		return nil, fmt.Errorf("template %s: the server would refuse it: %v\n%s", name, err, t.sample())
	}
	return t, nil
}

func (t *Template) sample() []byte {
	d := &device{idx: 7, machineID: "0123456789abcdef0123456789abcdef", deviceID: "42", token: "sample-token", seq: 1,
		cpu: 12.5, temp: 45, rx: 123456, tx: 65432, bootUptime: 3600}
	rc := renderCtx{firmware: "1.0.0", start: time.Unix(1700000000, 0)}
	r := rng{s: 1}
	return t.Render(nil, d, &rc, time.Unix(1700000100, 0), &r)
}

func parseSegments(src string) ([]segment, error) {
	var segs []segment
	rest := src
	for {
		i := strings.Index(rest, "{{")
		if i < 0 {
			segs = append(segs, segment{kind: fLiteral, lit: []byte(rest)})
			break
		}
		segs = append(segs, segment{kind: fLiteral, lit: []byte(rest[:i])})
		rest = rest[i+2:]
		j := strings.Index(rest, "}}")
		if j < 0 {
			return nil, fmt.Errorf("unclosed {{ near %q", clip(rest))
		}
		seg, err := parseField(strings.TrimSpace(rest[:j]))
		if err != nil {
			return nil, err
		}
		segs = append(segs, seg)
		rest = rest[j+2:]
	}
	return mergeLiterals(segs), nil
}

func clip(s string) string {
	if len(s) > 30 {
		return s[:30] + "…"
	}
	return s
}

func parseField(f string) (segment, error) {
	parts := strings.Split(f, ":")
	k, ok := kinds[parts[0]]
	if !ok {
		return segment{}, fmt.Errorf("unknown placeholder {{%s}} (known: %s)", f, strings.Join(SortedPlaceholders(), ", "))
	}
	seg := segment{kind: k}
	switch k {
	case fRand, fRandF:
		if len(parts) != 3 {
			return seg, fmt.Errorf("{{%s}}: want %s:A:B", f, parts[0])
		}
		a, err1 := strconv.ParseFloat(parts[1], 64)
		b, err2 := strconv.ParseFloat(parts[2], 64)
		if err1 != nil || err2 != nil || a > b {
			return seg, fmt.Errorf("{{%s}}: want numbers A ≤ B", f)
		}
		if k == fRandF {
			seg.a, seg.b = int64(a*10), int64(b*10)
		} else {
			seg.a, seg.b = int64(a), int64(b)
		}
	case fRxBytes, fTxBytes, fRxPackets, fTxPackets:
		seg.a = 0
		if len(parts) == 2 {
			n, err := strconv.Atoi(parts[1])
			if err != nil || n < 0 || n > 63 {
				return seg, fmt.Errorf("{{%s}}: interface number must be 0..63", f)
			}
			seg.a = int64(n)
		} else if len(parts) > 2 {
			return seg, fmt.Errorf("{{%s}}: too many arguments", f)
		}
	default:
		if len(parts) != 1 {
			return seg, fmt.Errorf("{{%s}} takes no argument", parts[0])
		}
	}
	return seg, nil
}

// SortedPlaceholders lists the placeholder names.
func SortedPlaceholders() []string {
	out := make([]string, 0, len(placeholders))
	for k := range placeholders {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// PlaceholderHelp describes every placeholder, one per line.
func PlaceholderHelp() string {
	var b strings.Builder
	for _, k := range SortedPlaceholders() {
		fmt.Fprintf(&b, "  {{%s}}\t%s\n", k, placeholders[k])
	}
	return b.String()
}

func mergeLiterals(in []segment) []segment {
	var out []segment
	for _, s := range in {
		if s.kind == fLiteral {
			if len(s.lit) == 0 {
				continue
			}
			if n := len(out); n > 0 && out[n-1].kind == fLiteral {
				out[n-1].lit = append(bytes.Clone(out[n-1].lit), s.lit...)
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

// renderCtx holds what is shared by all devices of a run.
type renderCtx struct {
	firmware string
	start    time.Time
	// cached RFC 3339 text of the current second
	timeCache atomic.Pointer[cachedTime]
}

type cachedTime struct {
	sec  int64
	text []byte
}

// scale gives interface K's counters their own pace (K=0: the counter).
func scale(v uint64, k int64) uint64 {
	if k == 0 {
		return v
	}
	return v / uint64(k+1) * 3 / 4
}

// Render appends the body for device d at time now to dst.
func (t *Template) Render(dst []byte, d *device, rc *renderCtx, now time.Time, r *rng) []byte {
	for i := range t.segs {
		s := &t.segs[i]
		switch s.kind {
		case fLiteral:
			dst = append(dst, s.lit...)
		case fMachineID:
			dst = appendJSONText(dst, d.machineID)
		case fDeviceID:
			dst = appendJSONText(dst, d.deviceID)
		case fToken:
			dst = appendJSONText(dst, d.token)
		case fIndex:
			dst = strconv.AppendInt(dst, int64(d.idx), 10)
		case fSerial:
			dst = appendSerial(dst, d.idx)
		case fIMEI:
			dst = append(dst, "35693803"...)
			dst = appendPadded(dst, uint64(d.idx)%10_000_000, 7)
		case fICCID:
			dst = append(dst, "89420310"...)
			dst = appendPadded(dst, uint64(d.idx)%100_000_000_000, 11)
		case fOperator:
			dst = append(dst, operators[d.idx%len(operators)]...)
		case fFirmware:
			if d.firmware != "" {
				dst = appendJSONText(dst, d.firmware)
			} else {
				dst = appendJSONText(dst, rc.firmware)
			}
		case fSeq:
			dst = strconv.AppendUint(dst, d.seq, 10)
		case fConfigVersion:
			dst = strconv.AppendInt(dst, d.cfgVer, 10)
		case fUnix:
			dst = strconv.AppendInt(dst, now.Unix(), 10)
		case fUnixMs:
			dst = strconv.AppendInt(dst, now.UnixMilli(), 10)
		case fTime:
			dst = append(dst, rc.rfc3339(now)...)
		case fUptime:
			up := int64(d.bootUptime) + int64(now.Sub(rc.start)/time.Second)
			dst = strconv.AppendInt(dst, max(up, 0), 10)
		case fCPU:
			dst = appendTenths(dst, int64(d.cpu*10+0.5))
		case fLoad1:
			dst = appendHundredths(dst, int64(d.cpu*2.2+0.5)) // ~2.2 at 100 %
		case fMemUsed:
			dst = strconv.AppendInt(dst, 80<<20+int64(d.cpu)*(1<<20), 10)
		case fTemperature:
			dst = appendTenths(dst, int64(d.temp*10+0.5))
		case fRxBytes:
			dst = strconv.AppendUint(dst, scale(d.rx, s.a), 10)
		case fTxBytes:
			dst = strconv.AppendUint(dst, scale(d.tx, s.a), 10)
		case fRxPackets:
			dst = strconv.AppendUint(dst, scale(d.rx, s.a)/700, 10)
		case fTxPackets:
			dst = strconv.AppendUint(dst, scale(d.tx, s.a)/400, 10)
		case fRand:
			dst = strconv.AppendInt(dst, s.a+r.intn(s.b-s.a+1), 10)
		case fRandF:
			dst = appendTenths(dst, s.a+r.intn(s.b-s.a+1))
		}
	}
	return dst
}

func (rc *renderCtx) rfc3339(now time.Time) []byte {
	sec := now.Unix()
	if c := rc.timeCache.Load(); c != nil && c.sec == sec {
		return c.text
	}
	c := &cachedTime{sec: sec, text: now.UTC().AppendFormat(nil, time.RFC3339)}
	rc.timeCache.Store(c)
	return c.text
}

// appendTenths appends v/10 with one decimal.
func appendTenths(dst []byte, v int64) []byte {
	if v < 0 {
		dst = append(dst, '-')
		v = -v
	}
	dst = strconv.AppendInt(dst, v/10, 10)
	return append(dst, '.', byte('0'+v%10))
}

// appendHundredths appends v/100 with two decimals.
func appendHundredths(dst []byte, v int64) []byte {
	if v < 0 {
		dst = append(dst, '-')
		v = -v
	}
	dst = strconv.AppendInt(dst, v/100, 10)
	return append(dst, '.', byte('0'+v/10%10), byte('0'+v%10))
}

func appendPadded(dst []byte, v uint64, width int) []byte {
	var buf [20]byte
	i := len(buf)
	for ; width > 0 || v > 0; width-- {
		i--
		buf[i] = byte('0' + v%10)
		v /= 10
	}
	return append(dst, buf[i:]...)
}

func appendSerial(dst []byte, idx int) []byte {
	dst = append(dst, "EMU"...)
	return appendPadded(dst, uint64(idx), 8)
}

func serial(idx int) string { return string(appendSerial(nil, idx)) }

// appendJSONText appends s escaped for the inside of a JSON string.
func appendJSONText(dst []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', "0123456789abcdef"[c>>4], "0123456789abcdef"[c&15])
		}
		start = i + 1
	}
	return append(dst, s[start:]...)
}
