package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func register(machineID string) string {
	return `{"machine_id":"` + machineID + `","device_type":"t","firmware":"f","enrollment_secret":"s"}`
}

// Every field a device sends is refused with invalid_field naming the field
// when it is not exact text; raw bytes are placed in the JSON as they are.
func TestTextRefused(t *testing.T) {
	bad := []struct{ name, raw, problem string }{
		{"invalid byte", "u\xff", "not valid UTF-8"},
		{"invalid byte fe", "u\xfe", "not valid UTF-8"},
		{"overlong slash", "a\xc0\xafb", "not valid UTF-8"},
		{"overlong dot", "\xc0\xae", "not valid UTF-8"},
		{"overlong 3 bytes", "\xe0\x80\xaf", "not valid UTF-8"},
		{"encoded surrogate", "\xed\xa0\x80", "not valid UTF-8"},
		{"beyond U+10FFFF", "\xf4\x90\x80\x80", "not valid UTF-8"},
		{"truncated sequence", "ab\xe2\x82", "not valid UTF-8"},
		{"lone high surrogate escape", `u\uD800`, "lone UTF-16 surrogate"},
		{"lone low surrogate escape", `u\udc00x`, "lone UTF-16 surrogate"},
		{"high surrogate then non-low", `\uD83D\u0041`, "lone UTF-16 surrogate"},
		{"two high surrogates", `\uD83D\uD83D`, "lone UTF-16 surrogate"},
		{"high surrogate at end", `x\uDBFF`, "lone UTF-16 surrogate"},
		{"escaped NUL", `a\u0000`, "control characters (U+0000)"},
		{"escaped newline", `a\nb`, "control characters"},
		{"escaped tab", `a\tb`, "control characters"},
		{"raw DEL", "a\x7fb", "control characters (U+007F)"},
		{"escaped DEL", `a\u007f`, "control characters (U+007F)"},
		{"raw C1 NEL", "a\u0085b", "control characters (U+0085)"},
		{"escaped C1 NEL", `a\u0085b`, "control characters (U+0085)"},
		{"raw C1 first", "\u0080", "control characters (U+0080)"},
		{"raw C1 last", "\u009f", "control characters (U+009F)"},
	}
	type field struct {
		name string
		body func(v string) string
		path string
	}
	reg := func(f string) func(string) string {
		return func(v string) string {
			m := map[string]string{"machine_id": "m", "device_type": "t", "firmware": "f", "enrollment_secret": "s"}
			var b strings.Builder
			b.WriteString("{")
			for _, k := range []string{"machine_id", "device_type", "model", "firmware", "serial", "enrollment_secret"} {
				val, ok := m[k]
				if k == f {
					val, ok = v, true
				}
				if ok {
					fmt.Fprintf(&b, `"%s":"%s",`, k, val)
				}
			}
			return strings.TrimSuffix(b.String(), ",") + "}"
		}
	}
	push := func(format string) func(string) string {
		return func(v string) string { return strings.ReplaceAll(format, "V", v) }
	}
	fields := []field{
		{"machine_id", reg("machine_id"), "machine_id"},
		{"device_type", reg("device_type"), "device_type"},
		{"model", reg("model"), "model"},
		{"firmware", reg("firmware"), "firmware"},
		{"serial", reg("serial"), "serial"},
		{"enrollment_secret", reg("enrollment_secret"), "enrollment_secret"},
		{"unknown register field", push(`{"machine_id":"m","device_type":"t","firmware":"f","enrollment_secret":"s","future":["x","V"]}`), "future[1]"},
		{"register key", push(`{"machine_id":"m","device_type":"t","firmware":"f","enrollment_secret":"s","V":1}`), "a key of the body"},
		{"config_error", push(`{"seq":1,"config_error":"V","state":{}}`), "config_error"},
		{"state.firmware", push(`{"state":{"firmware":"V"}}`), "state.firmware"},
		{"interface name", push(`{"state":{"interfaces":[{"name":"a"},{"name":"V"}]}}`), "state.interfaces[1].name"},
		{"signal.operator", push(`{"state":{"signal":{"rssi":-60,"operator":"V"}}}`), "state.signal.operator"},
		{"signal.technology", push(`{"state":{"signal":{"technology":"V"}}}`), "state.signal.technology"},
		{"extra value", push(`{"state":{"extra":{"a":"ok","iccid":"V"}}}`), "state.extra.iccid"},
		{"extra value, odd key", push(`{"state":{"extra":{"my key":"V"}}}`), `state.extra["my key"]`},
		{"extra key", push(`{"state":{"extra":{"ok":"1","V":"x"}}}`), "a key of state.extra"},
		{"unknown state field", push(`{"state":{"future":{"deep":[[{"s":"V"}]]}}}`), "state.future.deep[0][0].s"},
		{"unknown state key", push(`{"state":{"future":{"V":null}}}`), "a key of state.future"},
	}
	for _, f := range fields {
		for _, b := range bad {
			t.Run(f.name+"/"+b.name, func(t *testing.T) {
				body := f.body(b.raw)
				var err error
				if strings.HasPrefix(body, `{"machine_id"`) {
					_, err = DecodeRegister([]byte(body))
				} else {
					_, err = DecodePush([]byte(body))
				}
				var pe *Error
				if !errors.As(err, &pe) || pe.Code != CodeInvalidField {
					t.Fatalf("%q: err = %v, want %s", body, err, CodeInvalidField)
				}
				if !strings.HasPrefix(pe.Message, f.path+" ") || !strings.Contains(pe.Message, b.problem) {
					t.Fatalf("%q: message %q, want %q ... %q", body, pe.Message, f.path, b.problem)
				}
				if !utf8.ValidString(pe.Message) {
					t.Fatalf("message is not UTF-8: %q", pe.Message)
				}
			})
		}
	}
}

// Exact text is accepted as sent, and different byte strings stay
// different: u\uFFFD is a legitimate string, not a stand-in for u\xff.
func TestTextAccepted(t *testing.T) {
	good := []struct{ raw, want string }{
		{`u\uFFFD`, "u\uFFFD"},
		{"u\uFFFD", "u\uFFFD"},
		{`\uD83D\uDE00`, "\U0001F600"},
		{`\ud83d\ude00`, "\U0001F600"},
		{"\U0001F600", "\U0001F600"},
		{`a\/b\\c\"d`, `a/b\c"d`},
		{"\u00a0x\u00ffy\u0100", "\u00a0x\u00ffy\u0100"},
		{"\uffff\ufffe\U0010FFFF", "\uffff\ufffe\U0010FFFF"},
		{`\u0041\u007e\u00A0`, "A~\u00a0"},
		{"e\u0301", "e\u0301"}, // not normalised: é and e+U+0301 are two machines
	}
	for _, g := range good {
		r, err := DecodeRegister([]byte(register(g.raw)))
		if err != nil {
			t.Errorf("%q refused: %v", g.raw, err)
			continue
		}
		if r.MachineID != g.want {
			t.Errorf("%q decoded to %q, want %q", g.raw, r.MachineID, g.want)
		}
		p, err := DecodePush([]byte(`{"state":{"extra":{"` + g.raw + `":"` + g.raw + `"},"future":"` + g.raw + `"}}`))
		if err != nil {
			t.Errorf("push with %q refused: %v", g.raw, err)
			continue
		}
		if p.State.Extra[g.want] != g.want {
			t.Errorf("extra: %q", p.State.Extra)
		}
	}
}

// Distinct accepted byte strings decode to distinct machine IDs; the three
// strings that once became one machine ID (the invalid bytes FF and FE, and
// the escape \uFFFD) are two refusals and one machine.
func TestTextNoMerge(t *testing.T) {
	seen := map[string]string{}
	for _, raw := range []string{"u\xff", "u\xfe", `u\uFFFD`, "u\uFFFD", `u\uD800`, `u\uDFFF`, "u\xed\xa0\x80", "u\xc0\xaf", "u/", `u\/`, "u\xef\xbf\xbd"} {
		r, err := DecodeRegister([]byte(register(raw)))
		if err != nil {
			continue
		}
		if prev, ok := seen[r.MachineID]; ok {
			// Only spellings of the same code points may meet.
			if !sameText(prev, raw) {
				t.Errorf("%q and %q both became machine %q", prev, raw, r.MachineID)
			}
		}
		seen[r.MachineID] = raw
	}
	if len(seen) != 2 { // u\uFFFD and u/
		t.Errorf("accepted machines %q, want 2", seen)
	}
}

func sameText(a, b string) bool {
	var x, y string
	return json.Unmarshal([]byte(`"`+a+`"`), &x) == nil && json.Unmarshal([]byte(`"`+b+`"`), &y) == nil &&
		utf8.ValidString(a) && utf8.ValidString(b) && x == y
}

// Validate applies the same rules to values built in code.
func TestValidateText(t *testing.T) {
	for _, v := range []string{"u\xff", "a\x00", "a\x7f", "a\u0085", "a\u009f", "\xc0\xaf"} {
		r := RegisterRequest{MachineID: "m", DeviceType: "t", Firmware: "f", EnrollmentSecret: v}
		if err := r.Validate(); err == nil || !strings.Contains(err.Error(), "enrollment_secret") {
			t.Errorf("secret %q: %v", v, err)
		}
		p := PushRequest{ConfigError: v}
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "config_error") {
			t.Errorf("config_error %q: %v", v, err)
		}
		p = PushRequest{State: State{Extra: map[string]string{"k": v}}}
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), `state.extra["k"]`) {
			t.Errorf("extra value %q: %v", v, err)
		}
		p = PushRequest{State: State{Extra: map[string]string{v: "x"}}}
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "a key of state.extra") {
			t.Errorf("extra key %q: %v", v, err)
		}
	}
	for _, r := range []rune{0, 0x1f, 0x7f, 0x80, 0x85, 0x9f} {
		if !IsControl(r) {
			t.Errorf("IsControl(%U) = false", r)
		}
	}
	for _, r := range []rune{0x20, 0x7e, 0xa0, 0xfffd, 0x2028} {
		if IsControl(r) {
			t.Errorf("IsControl(%U) = true", r)
		}
	}
}

// The raw check must not trip on valid JSON of any shape.
func TestCheckStringsShapes(t *testing.T) {
	for _, body := range []string{
		`{}`, ` { } `, `{"a":[]}`, `{"a":[ ]}`, `{"a":{}}`, `{"a":[1,2.5e3,-0,true,false,null,"x",[],{}]}`,
		`{"a":[[[[["deep"]]]]],"b":{"c":{"d":"e"}}}`, "{\n\t\"a\" :\r\n \"b\" , \"c\":[ 1 , 2 ] }",
		`{"\"":"\\","\/":"\b"}`,
		`{"a":"` + strings.Repeat("é", 100) + `"}`,
		`{"a":` + strings.Repeat("[", 30000) + strings.Repeat("]", 30000) + `}`,
	} {
		e := checkStrings([]byte(body))
		wantErr := strings.Contains(body, `\b`)
		if (e != nil) != wantErr {
			t.Errorf("%.60q: %v", body, e)
		}
	}
	for _, body := range []string{`{"a"}`, `{"a":}`, `{"a":"x`, `{"a":"\u12"}`, `{"a":"\q"}`, `{"a":[1,}`, `{"a":1`, `{`, `[`, `{"a":1]`} {
		if e := checkStrings([]byte(body)); e == nil || e.Code != CodeMalformedJSON {
			t.Errorf("%q: %v, want malformed", body, e)
		}
	}
}
