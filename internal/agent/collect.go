package agent

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/drover/drover/internal/protocol"
)

// Identity is what the agent registers with.
type Identity struct {
	DeviceType string
	Model      string
	Serial     string
	Firmware   string
}

// system reads a device's state from /proc, /sys and /etc under root, so
// tests can point it at a fake tree.
type system struct {
	root       string
	diskPath   string   // file system whose usage is reported
	interfaces []string // glob patterns of interfaces to report; empty: all but lo
	cpuWindow  time.Duration
	log        *slog.Logger

	prevCPU cpuTimes
}

type cpuTimes struct{ total, idle uint64 }

func (s *system) path(p string) string { return filepath.Join(s.root, filepath.FromSlash(p)) }

func (s *system) read(p string) (string, error) {
	b, err := os.ReadFile(s.path(p))
	return string(b), err
}

// readLine returns a file's first line without NULs and surrounding space
// (device-tree strings end in NUL).
func (s *system) readLine(p string) string {
	b, err := os.ReadFile(s.path(p))
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(strings.ReplaceAll(line, "\x00", ""))
}

// identity works out device type, model, serial and firmware; the caller
// overrides any of them with flags.
func (s *system) identity() Identity {
	var id Identity
	owrt := parseShellVars(s.readOr("etc/openwrt_release"))
	osr := parseShellVars(s.readOr("etc/os-release"))
	switch {
	case owrt["DISTRIB_ID"] != "" || owrt["DISTRIB_RELEASE"] != "":
		id.DeviceType = "openwrt"
		id.Firmware = firstNonEmpty(owrt["DISTRIB_DESCRIPTION"], strings.TrimSpace(owrt["DISTRIB_ID"]+" "+owrt["DISTRIB_RELEASE"]))
	case osr["ID"] != "":
		id.DeviceType = osr["ID"]
		id.Firmware = firstNonEmpty(osr["PRETTY_NAME"], strings.TrimSpace(osr["ID"]+" "+osr["VERSION_ID"]))
	default:
		id.DeviceType = "linux"
	}
	if id.Firmware == "" {
		id.Firmware = firstNonEmpty(s.readLine("proc/sys/kernel/osrelease"), "unknown")
	}
	id.Model = firstNonEmpty(s.readLine("tmp/sysinfo/model"), s.readLine("proc/device-tree/model"), s.readLine("sys/class/dmi/id/product_name"))
	id.Serial = firstNonEmpty(s.readLine("proc/device-tree/serial-number"), s.readLine("sys/class/dmi/id/product_serial"))
	id.DeviceType = clean(id.DeviceType, protocol.MaxNameLen)
	id.Model = clean(id.Model, protocol.MaxNameLen)
	id.Serial = clean(id.Serial, protocol.MaxIDLen)
	id.Firmware = clean(id.Firmware, protocol.MaxNameLen)
	return id
}

func (s *system) readOr(p string) string {
	v, _ := s.read(p)
	return v
}

// collect reads the current state. Values that cannot be read are left out;
// the first call waits cpuWindow to measure CPU use.
func (s *system) collect(ctx context.Context) protocol.State {
	var st protocol.State
	if v, err := s.read("proc/uptime"); err == nil {
		if f, ok := firstFloat(v); ok && f >= 0 {
			st.Uptime = ptr(int64(f))
		}
	}
	if v, err := s.read("proc/loadavg"); err == nil {
		if f, ok := firstFloat(v); ok && f >= 0 && f <= 1e6 {
			st.Load1 = ptr(f)
		}
	}
	st.CPU = s.cpu(ctx)
	s.memory(&st)
	s.disk(&st)
	temps := s.temperatures()
	if len(temps) > 0 {
		hottest := math.Inf(-1)
		for _, t := range temps {
			hottest = math.Max(hottest, t.celsius)
		}
		st.Temperature = ptr(hottest)
	}
	st.Interfaces = s.netdev()
	st.Extra = map[string]string{"arch": runtime.GOARCH, "agent": "drover-agent " + Version()}
	if v := s.readLine("proc/sys/kernel/osrelease"); v != "" {
		st.Extra["kernel"] = clean(v, protocol.MaxExtraValueLen)
	}
	if v := s.readLine("proc/sys/kernel/hostname"); v != "" {
		st.Extra["hostname"] = clean(v, protocol.MaxExtraValueLen)
	}
	for _, t := range temps {
		if len(st.Extra) >= protocol.MaxExtraKeys/2 {
			break
		}
		st.Extra[clean("temp."+t.name, protocol.MaxExtraKeyLen)] = strconv.FormatFloat(t.celsius, 'f', 1, 64)
	}
	return st
}

func (s *system) readCPU() (cpuTimes, bool) {
	v, err := s.read("proc/stat")
	if err != nil {
		return cpuTimes{}, false
	}
	line, _, _ := strings.Cut(v, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return cpuTimes{}, false
	}
	var t cpuTimes
	// user nice system idle iowait irq softirq steal; guest time is
	// already counted in user.
	for i := 1; i < len(f) && i <= 8; i++ {
		n, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return cpuTimes{}, false
		}
		t.total += n
		if i == 4 || i == 5 {
			t.idle += n
		}
	}
	return t, true
}

// cpu is the busy percentage since the previous call.
func (s *system) cpu(ctx context.Context) *float64 {
	cur, ok := s.readCPU()
	if !ok {
		return nil
	}
	if s.prevCPU.total == 0 || cur.total < s.prevCPU.total {
		s.prevCPU = cur
		t := time.NewTimer(s.cpuWindow)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		if cur, ok = s.readCPU(); !ok {
			return nil
		}
	}
	prev := s.prevCPU
	s.prevCPU = cur
	dt := cur.total - prev.total
	if dt == 0 || cur.idle < prev.idle {
		return nil
	}
	busy := float64(dt-min(cur.idle-prev.idle, dt)) / float64(dt) * 100
	return ptr(math.Round(busy*10) / 10)
}

func (s *system) memory(st *protocol.State) {
	v, err := s.read("proc/meminfo")
	if err != nil {
		return
	}
	kb := map[string]int64{}
	for _, line := range strings.Split(v, "\n") {
		k, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		if n, err := strconv.ParseInt(f[0], 10, 64); err == nil && n >= 0 {
			kb[k] = n
		}
	}
	total, ok := kb["MemTotal"]
	if !ok {
		return
	}
	avail, ok := kb["MemAvailable"]
	if !ok { // kernels before 3.14
		avail = kb["MemFree"] + kb["Buffers"] + kb["Cached"]
	}
	st.MemTotal = ptr(total * 1024)
	st.MemUsed = ptr(max(total-avail, 0) * 1024)
}

func (s *system) disk(st *protocol.State) {
	total, free, err := statfs(s.path(s.diskPath))
	if err != nil {
		s.log.Debug("disk usage unavailable", "path", s.diskPath, "err", err)
		return
	}
	st.DiskTotal = ptr(int64(total))
	st.DiskUsed = ptr(int64(total - min(free, total)))
}

type temperature struct {
	name    string
	celsius float64
}

// temperatures reads the thermal zones, or hwmon sensors when there are none.
func (s *system) temperatures() []temperature {
	var out []temperature
	zones, _ := filepath.Glob(s.path("sys/class/thermal/thermal_zone*"))
	for _, z := range zones {
		if c, ok := s.milliCelsius(filepath.Join(z, "temp")); ok {
			name := firstNonEmpty(readTrim(filepath.Join(z, "type")), filepath.Base(z))
			out = append(out, temperature{name: filepath.Base(z) + "." + name, celsius: c})
		}
	}
	if len(out) == 0 {
		inputs, _ := filepath.Glob(s.path("sys/class/hwmon/hwmon*/temp*_input"))
		for _, in := range inputs {
			if c, ok := s.milliCelsius(in); ok {
				dir := filepath.Dir(in)
				name := firstNonEmpty(readTrim(filepath.Join(dir, "name")), filepath.Base(dir))
				sensor := strings.TrimSuffix(filepath.Base(in), "_input")
				out = append(out, temperature{name: name + "." + sensor, celsius: c})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func (s *system) milliCelsius(file string) (float64, bool) {
	n, err := strconv.ParseInt(readTrim(file), 10, 64)
	if err != nil {
		return 0, false
	}
	c := float64(n)
	if n > 1000 || n < -1000 { // millidegrees; a few drivers report degrees
		c /= 1000
	}
	if c < -60 || c > 250 { // sensor not connected or bogus
		return 0, false
	}
	return math.Round(c*10) / 10, true
}

func readTrim(file string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// netdev reads per-interface counters from /proc/net/dev.
func (s *system) netdev() []protocol.Interface {
	v, err := s.read("proc/net/dev")
	if err != nil {
		return nil
	}
	var out []protocol.Interface
	sc := bufio.NewScanner(strings.NewReader(v))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue // header lines
		}
		name = strings.TrimSpace(name)
		if name == "" || clean(name, protocol.MaxNameLen) != name || !s.wanted(name) {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 10 {
			continue
		}
		var n [4]uint64
		ok = true
		for i, col := range []int{0, 1, 8, 9} { // rx bytes, rx packets, tx bytes, tx packets
			var perr error
			n[i], perr = strconv.ParseUint(f[col], 10, 64)
			ok = ok && perr == nil
		}
		if !ok {
			continue
		}
		out = append(out, protocol.Interface{Name: name, RxBytes: n[0], RxPackets: n[1], TxBytes: n[2], TxPackets: n[3]})
		if len(out) == protocol.MaxInterfaces {
			break
		}
	}
	return out
}

func (s *system) wanted(name string) bool {
	if len(s.interfaces) == 0 {
		return name != "lo"
	}
	for _, p := range s.interfaces {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// parseShellVars reads KEY=value and KEY='value' lines as in os-release.
func parseShellVars(v string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(v, "\n") {
		k, val, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok || k == "" || strings.HasPrefix(k, "#") {
			continue
		}
		val = strings.TrimSpace(val)
		if len(val) >= 2 && (val[0] == '"' || val[0] == '\'') && val[len(val)-1] == val[0] {
			val = val[1 : len(val)-1]
		}
		out[k] = val
	}
	return out
}

func firstFloat(v string) (float64, bool) {
	f := strings.Fields(v)
	if len(f) == 0 {
		return 0, false
	}
	x, err := strconv.ParseFloat(f[0], 64)
	return x, err == nil && !math.IsNaN(x) && !math.IsInf(x, 0)
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// clean makes v a valid protocol string: valid UTF-8, no control
// characters, at most max bytes, cut at a rune boundary.
func clean(v string, max int) string {
	if v == "" {
		return ""
	}
	var b bytes.Buffer
	for _, r := range strings.ToValidUTF8(v, "?") {
		if protocol.IsControl(r) {
			r = ' '
		}
		if b.Len()+utf8.RuneLen(r) > max {
			break
		}
		b.WriteRune(r)
	}
	return strings.TrimSpace(b.String())
}

func ptr[T any](v T) *T { return &v }

// describe is a one-line summary of a state for logs.
func describe(st *protocol.State) string {
	var parts []string
	if st.CPU != nil {
		parts = append(parts, fmt.Sprintf("cpu=%.1f%%", *st.CPU))
	}
	if st.MemUsed != nil && st.MemTotal != nil && *st.MemTotal > 0 {
		parts = append(parts, fmt.Sprintf("mem=%.0f%%", float64(*st.MemUsed)/float64(*st.MemTotal)*100))
	}
	if st.Temperature != nil {
		parts = append(parts, fmt.Sprintf("temp=%.1fC", *st.Temperature))
	}
	parts = append(parts, fmt.Sprintf("interfaces=%d", len(st.Interfaces)))
	return strings.Join(parts, " ")
}
