package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// FuzzDeviceSequence feeds sequences of registrations and pushes, valid and
// hostile, through one running server (real HTTP on loopback, SQLite
// write-through) and checks after every request:
//   - no 5xx, every refusal is a 4xx with the JSON error body;
//   - text is accepted exactly when it is valid UTF-8 without surrogates or
//     control characters (an oracle independent of internal/protocol);
//   - distinct machine IDs never share a device ID, and one machine ID
//     keeps its device ID;
//   - a refused request stores nothing (no device, no profile, the device's
//     state, seq and config error unchanged); an accepted one stores exactly
//     what was sent;
//   - the server's accepted-push and new-device counters match the 200s.
//
// Run it with: go test -run '^$' -fuzz FuzzDeviceSequence -fuzztime 60s -fuzzminimizetime 5s ./internal/server/
// (the target is stateful and slow: Go's default of a minute minimising each
// new input leaves little time to fuzz).
//
// A script is a list of ops, each [kind][length][length bytes of argument].
func FuzzDeviceSequence(f *testing.F) {
	s := servertest.Start(f, servertest.Options{HTTP: true, Configure: func(c *server.Config) {
		c.EnrollmentSecret = fuzzSecret
	}})
	h := &seqHarness{s: s, byMachine: map[string]string{}, byID: map[string]string{}, keys: map[string]string{}}
	for _, seed := range [][]op{
		{{opRegRaw, "m-1"}, {opPushExtra, "\x00ok"}, {opPushConfigError, "modem refused the APN"}},
		{{opRegRaw, "u\xff"}, {opRegRaw, "u\xfe"}, {opRegUTF16, "\x00u\xff\xfd"}, {opRegRaw, "u\uFFFD"}, {opPushExtra, "\x00\xc0\xae"}},
		{{opRegUTF16, "\x00a\xd8\x00"}, {opRegUTF16, "\xd8\x3d\xde\x00"}, {opRegUTF16, "\xdc\x00"}, {opPushExtra, "\x00a\u0085"}},
		{{opRegRaw, "a"}, {opRegRaw, "a"}, {opPushConfigError, "x\x7f"}, {opPushExtra, "\x00\xed\xa0\x80"}, {opPushExtra, "\x00fine"}},
		{{opRegBody, `{"machine_id":"raw-1","device_type":"t","firmware":"f","enrollment_secret":"` + fuzzSecret + `"}`},
			{opPushBody, `{"seq":1,"state":{"extra":{"k":"\uD800"}}}`}, {opPushBody, `{"seq":2,"state":{"cpu":5}}`}},
		{{opRegBody, `{"machine_id":"raw-` + "\xc2\x85" + `","device_type":"t","firmware":"f","enrollment_secret":"` + fuzzSecret + `"}`}},
	} {
		f.Add(encodeOps(seed))
	}
	f.Fuzz(func(t *testing.T, script []byte) {
		h.t = t
		h.iter++
		h.devs = h.devs[:0]
		for _, o := range decodeOps(script) {
			h.step(o)
		}
		h.checkCounters()
		t.Logf("so far: %d devices, %d accepted pushes", len(h.byID), h.accepted)
	})
}

const fuzzSecret = "fuzz-secret"

const (
	opRegRaw          = iota // register machine ID = nonce + arg bytes, as raw JSON string content
	opRegUTF16               // register machine ID = nonce + arg as big-endian UTF-16 \u escapes
	opPushExtra              // push state.extra.k = arg[1:] raw, by device arg[0]
	opPushConfigError        // push config_error = arg raw, by the last device
	opRegBody                // arg is the whole registration body
	opPushBody               // arg is the whole push body, by the last device
	numOps
)

type op struct {
	kind byte
	arg  string
}

func encodeOps(ops []op) []byte {
	var b []byte
	for _, o := range ops {
		b = append(b, o.kind, byte(len(o.arg)))
		b = append(b, o.arg...)
	}
	return b
}

func decodeOps(b []byte) []op {
	var ops []op
	for len(b) >= 2 && len(ops) < 24 {
		n := min(int(b[1]), len(b)-2)
		ops = append(ops, op{b[0] % numOps, string(b[2 : 2+n])})
		b = b[2+n:]
	}
	return ops
}

type seqDevice struct{ id, token string }

type seqHarness struct {
	t         *testing.T
	s         *servertest.Server
	iter      int
	byMachine map[string]string // exact machine ID -> device ID
	byID      map[string]string // device ID -> exact machine ID
	keys      map[string]string // exact machine ID -> device key (sent when registering again)
	devs      []seqDevice       // registered in this script, for pushes
	accepted  int               // pushes answered 200
	newDevs   int               // registrations answered 200 with new: true
}

// jsonRaw is s as JSON string content, escaping only what JSON requires:
// every other byte, invalid UTF-8 included, goes as it is.
func jsonRaw(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20:
			fmt.Fprintf(&b, `\u%04x`, c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// exact is the oracle: may s be stored as device text of at most max bytes?
func exact(s string, max int, required bool) bool {
	if s == "" {
		return !required
	}
	if len(s) > max || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r >= 0x7f && r <= 0x9f {
			return false
		}
	}
	return true
}

func (h *seqHarness) step(o op) {
	nonce := "f" + strconv.Itoa(h.iter) + "-"
	switch o.kind {
	case opRegRaw:
		machine := nonce + o.arg
		h.register(h.registerBody(jsonRaw(machine), machine), machine, verdict(exact(machine, protocol.MaxIDLen, true)))
	case opRegUTF16:
		var units []uint16
		var esc strings.Builder
		for i := 0; i+1 < len(o.arg); i += 2 {
			u := uint16(o.arg[i])<<8 | uint16(o.arg[i+1])
			units = append(units, u)
			fmt.Fprintf(&esc, `\u%04X`, u)
		}
		ok := true
		for i := 0; i < len(units); i++ { // lone surrogates are not text
			switch {
			case units[i] >= 0xd800 && units[i] < 0xdc00 && i+1 < len(units) && units[i+1] >= 0xdc00 && units[i+1] < 0xe000:
				i++
			case units[i] >= 0xd800 && units[i] < 0xe000:
				ok = false
			}
		}
		machine := nonce + string(utf16.Decode(units))
		h.register(h.registerBody(nonce+esc.String(), machine), machine, verdict(ok && exact(machine, protocol.MaxIDLen, true)))
	case opRegBody:
		var r struct {
			MachineID string `json:"machine_id"`
		}
		json.Unmarshal([]byte(o.arg), &r) // used only when the server accepted the body
		h.register(o.arg, r.MachineID, unknown)
	case opPushExtra:
		if len(h.devs) == 0 || o.arg == "" {
			return
		}
		d := h.devs[int(o.arg[0])%len(h.devs)]
		v := o.arg[1:]
		body := `{"seq":` + strconv.Itoa(h.accepted+1) + `,"state":{"extra":{"k":"` + jsonRaw(v) + `"}}}`
		h.push(d, body, verdict(exact(v, protocol.MaxExtraValueLen, false)), func(dev fleet.Device) bool {
			var st struct{ Extra map[string]string }
			return json.Unmarshal(dev.State, &st) == nil && st.Extra["k"] == v
		})
	case opPushConfigError:
		if len(h.devs) == 0 {
			return
		}
		body := `{"seq":1,"config_error":"` + jsonRaw(o.arg) + `","state":{}}`
		h.push(h.devs[len(h.devs)-1], body, verdict(exact(o.arg, protocol.MaxConfigErrorLen, false)), func(dev fleet.Device) bool {
			return dev.ConfigError == o.arg
		})
	case opPushBody:
		if len(h.devs) == 0 {
			return
		}
		h.push(h.devs[len(h.devs)-1], o.arg, unknown, nil)
	}
}

// registerBody is a registration of machineJSON; a machine registered
// before proves itself with its device key (docs/protocol.md#admission).
func (h *seqHarness) registerBody(machineJSON, machine string) string {
	key := ""
	if k, ok := h.keys[machine]; ok {
		key = `,"device_key":"` + k + `"`
	}
	return `{"machine_id":"` + machineJSON + `","device_type":"fuzz","firmware":"1","enrollment_secret":"` + fuzzSecret + `"` + key + `}`
}

// post sends one request and checks the answer's shape.
func (h *seqHarness) post(path, token, body string) (int, map[string]any) {
	t := h.t
	t.Helper()
	req, _ := http.NewRequest("POST", h.s.HTTPURL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := h.s.Client().Do(req)
	if err != nil {
		t.Fatalf("POST %s %q: %v", path, body, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("POST %s %q: %d answer is not JSON: %q", path, body, resp.StatusCode, raw)
	}
	if resp.StatusCode >= 500 {
		t.Fatalf("POST %s %q: %d %s", path, body, resp.StatusCode, raw)
	}
	if resp.StatusCode != 200 && !(resp.StatusCode == 202 && path == protocol.PathRegister && out["pending"] == true) {
		e, _ := out["error"].(map[string]any)
		if resp.StatusCode < 400 || e == nil || e["code"] == "" || e["message"] == "" {
			t.Fatalf("POST %s %q: %d without error body: %s", path, body, resp.StatusCode, raw)
		}
	}
	return resp.StatusCode, out
}

// What the oracle says of a request: text must be refused with 400, must
// not be refused with 400 (429, 503 or 401 may still come), or unknown.
const (
	unknown = iota
	valid
	invalid
)

func verdict(ok bool) int {
	if ok {
		return valid
	}
	return invalid
}

// register posts a registration and checks it against the oracle's verdict.
func (h *seqHarness) register(body, machine string, want int) {
	t := h.t
	t.Helper()
	fl := h.s.Srv.Fleet()
	devices, profiles := fl.Stats().Devices, len(fl.Profiles())
	st, out := h.post(protocol.PathRegister, "", body)
	if st == 202 {
		// A known machine ID without its key: a re-enrollment request for
		// that same device, nothing else stored.
		id, _ := out["device_id"].(string)
		if prev, ok := h.byMachine[machine]; !ok || prev != id || h.byID[id] != machine {
			t.Fatalf("registration %q pending as device %s, which is machine %q, not %q", body, id, h.byID[id], machine)
		}
		if n, p := fl.Stats().Devices, len(fl.Profiles()); n != devices || p != profiles {
			t.Fatalf("pending registration %q stored: devices %d -> %d, profiles %d -> %d", body, devices, n, profiles, p)
		}
		return
	}
	if st != 200 {
		if want == valid && st == 400 || want == invalid && st != 400 {
			t.Fatalf("registration %q: %d %v, the oracle says %s", body, st, out, [...]string{"unknown", "valid", "invalid"}[want])
		}
		if n, p := fl.Stats().Devices, len(fl.Profiles()); n != devices || p != profiles {
			t.Fatalf("refused registration %q stored: devices %d -> %d, profiles %d -> %d", body, devices, n, profiles, p)
		}
		return
	}
	if want == invalid || !utf8.ValidString(body) || !exact(machine, protocol.MaxIDLen, true) {
		t.Fatalf("registration %q accepted, but machine ID %q is not exact text", body, machine)
	}
	id, _ := out["device_id"].(string)
	token, _ := out["token"].(string)
	if id == "" || token == "" {
		t.Fatalf("registration answer %v", out)
	}
	if prev, ok := h.byID[id]; ok && prev != machine {
		t.Fatalf("machine IDs %q and %q share device %s", prev, machine, id)
	}
	prevID, known := h.byMachine[machine]
	if known && prevID != id {
		t.Fatalf("machine %q moved from device %s to %s", machine, prevID, id)
	}
	if out["new"] != !known {
		t.Fatalf("machine %q: new = %v, known before: %v", machine, out["new"], known)
	}
	if !known {
		h.newDevs++
	}
	h.byMachine[machine], h.byID[id] = id, machine
	if k, _ := out["device_key"].(string); k != "" {
		h.keys[machine] = k
	}
	dev := h.device(id)
	if dev.MachineID != machine {
		t.Fatalf("device %s stored machine ID %q, sent %q", id, dev.MachineID, machine)
	}
	h.devs = append(h.devs, seqDevice{id, token})
}

// push posts a push by d; stored checks an accepted push's effect.
func (h *seqHarness) push(d seqDevice, body string, want int, stored func(fleet.Device) bool) {
	t := h.t
	t.Helper()
	before := h.device(d.id)
	st, out := h.post(protocol.PathPush, d.token, body)
	if st != 200 {
		if want == valid && st == 400 || want == invalid && st != 400 && st != 401 {
			t.Fatalf("push %q: %d %v, the oracle says %s", body, st, out, [...]string{"unknown", "valid", "invalid"}[want])
		}
		after := h.device(d.id)
		if after.Seq != before.Seq || after.ConfigError != before.ConfigError || !bytes.Equal(after.State, before.State) ||
			(after.LastSeen == nil) != (before.LastSeen == nil) || after.LastSeen != nil && !after.LastSeen.Equal(*before.LastSeen) {
			t.Fatalf("refused push %q changed device %s: %+v -> %+v", body, d.id, before, after)
		}
		return
	}
	h.accepted++
	if want == invalid || !utf8.ValidString(body) {
		t.Fatalf("push %q accepted, but it is not UTF-8", body)
	}
	after := h.device(d.id)
	if stored != nil && !stored(after) {
		t.Fatalf("push %q accepted, but device %s stored %q / %q", body, d.id, after.State, after.ConfigError)
	}
	var tree any
	dec := json.NewDecoder(bytes.NewReader(after.State))
	dec.UseNumber() // numbers beyond float64 are valid JSON
	if err := dec.Decode(&tree); err != nil {
		t.Fatalf("stored state is not JSON: %q", after.State)
	}
	if !exactTree(tree) {
		t.Fatalf("push %q accepted, stored state %q holds text that is not exact", body, after.State)
	}
}

func exactTree(v any) bool {
	switch v := v.(type) {
	case string:
		return exact(v, protocol.MaxBodyBytes, false)
	case []any:
		for _, e := range v {
			if !exactTree(e) {
				return false
			}
		}
	case map[string]any:
		for k, e := range v {
			if !exact(k, protocol.MaxBodyBytes, false) || !exactTree(e) {
				return false
			}
		}
	}
	return true
}

func (h *seqHarness) device(id string) fleet.Device {
	h.t.Helper()
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		h.t.Fatalf("device ID %q", id)
	}
	d, err := h.s.Srv.Fleet().Device(context.Background(), n)
	if err != nil {
		h.t.Fatalf("device %s: %v", id, err)
	}
	return d
}

// checkCounters compares the server's counters with the 200s seen so far.
func (h *seqHarness) checkCounters() {
	h.t.Helper()
	if v := h.s.MetricT(h.t, "drover_pushes_total", map[string]string{"outcome": "accepted"}); int(v) != h.accepted {
		h.t.Fatalf("server counted %v accepted pushes, the client got %d", v, h.accepted)
	}
	if v := h.s.MetricT(h.t, "drover_registrations_total", map[string]string{"outcome": "new"}); int(v) != h.newDevs {
		h.t.Fatalf("server counted %v new devices, the client registered %d", v, h.newDevs)
	}
	if n := h.s.Srv.Fleet().Stats().Devices; n != len(h.byID) {
		h.t.Fatalf("fleet holds %d devices, the client registered %d", n, len(h.byID))
	}
}
