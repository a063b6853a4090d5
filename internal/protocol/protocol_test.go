package protocol

import (
	"errors"
	"strings"
	"testing"
)

const goodPush = `{"seq":7,"config_version":3,"state":{"uptime":3600,"cpu":12.5,"load1":0.3,
 "mem_total":268435456,"mem_used":100000000,"disk_total":1000,"disk_used":10,"temperature":48.5,
 "firmware":"6.3.5","interfaces":[{"name":"wwan0","rx_bytes":1000,"tx_bytes":2000}],
 "signal":{"rssi":-67,"rsrp":-95,"rsrq":-10,"sinr":12.5,"operator":"Op","technology":"LTE"},
 "extra":{"iccid":"8942"}, "future_field": {"x": 1}}}`

func TestDecodePushGood(t *testing.T) {
	p, err := DecodePush([]byte(goodPush))
	if err != nil {
		t.Fatal(err)
	}
	if p.Seq != 7 || p.ConfigVersion != 3 || *p.State.CPU != 12.5 || p.State.Signal.Technology != "LTE" ||
		p.State.Interfaces[0].TxBytes != 2000 || p.State.Extra["iccid"] != "8942" {
		t.Fatalf("decoded %+v", p)
	}
	raw := string(p.RawState)
	if strings.ContainsAny(raw, "\n ") || !strings.Contains(raw, `"future_field":{"x":1}`) {
		t.Fatalf("raw state not compact or lost unknown fields: %s", raw)
	}
}

// A state sent compact is kept byte for byte, in memory of its own: the
// server keeps it after the request's body buffer is reused.
func TestDecodePushCompactStateIsACopy(t *testing.T) {
	for _, state := range []string{
		`{"cpu":1.5,"extra":{"note":"a-b"},"future_field":[1,2]}`,   // no whitespace at all
		`{"cpu":1.5,"extra":{"note":"a b c"},"future_field":[1,2]}`, // whitespace inside a string only
	} {
		body := []byte(`{"seq":1,"state":` + state + `}`)
		p, err := DecodePush(body)
		if err != nil {
			t.Fatal(err)
		}
		if string(p.RawState) != state {
			t.Fatalf("raw state %s, want %s", p.RawState, state)
		}
		for i := range body {
			body[i] = 'x'
		}
		if string(p.RawState) != state {
			t.Fatalf("raw state shares the body's memory: %s", p.RawState)
		}
	}
}

// Whitespace inside the state's strings needs no compacted copy: such a
// push allocates as much as one without it.
func TestDecodePushSpaceInStringsNoCopy(t *testing.T) {
	allocs := func(note string) float64 {
		body := []byte(`{"seq":1,"state":{"cpu":1.5,"extra":{"note":"` + note + `"}}}`)
		return testing.AllocsPerRun(200, func() {
			if _, err := DecodePush(body); err != nil {
				t.Fatal(err)
			}
		})
	}
	if with, without := allocs("LTE Cat 4 modem"), allocs("LTE-Cat-4-modem"); with > without {
		t.Errorf("%v allocations with spaces inside a string, %v without", with, without)
	}
}

func TestDecodeErrors(t *testing.T) {
	cases := []struct {
		name, body, code, msg string
	}{
		{"empty", ``, CodeMalformedJSON, "JSON object"},
		{"array", `[1]`, CodeMalformedJSON, "JSON object"},
		{"syntax", `{"seq":`, CodeMalformedJSON, ""},
		{"trailing", `{"seq":1,"state":{}} {}`, CodeMalformedJSON, "after the JSON object"},
		{"seq type", `{"seq":"one","state":{}}`, CodeInvalidField, "seq must be an integer"},
		{"negative seq", `{"seq":-1,"state":{}}`, CodeInvalidField, "seq"},
		{"no state", `{"seq":1}`, CodeInvalidField, "state must be a JSON object"},
		{"state not object", `{"seq":1,"state":5}`, CodeInvalidField, "state must be a JSON object"},
		{"cpu type", `{"state":{"cpu":"x"}}`, CodeInvalidField, "state.cpu must be a number"},
		{"cpu range", `{"state":{"cpu":150}}`, CodeInvalidField, "state.cpu must be within 0..100"},
		{"temperature range", `{"state":{"temperature":-300}}`, CodeInvalidField, "temperature"},
		{"rssi range", `{"state":{"signal":{"rssi":5}}}`, CodeInvalidField, "state.signal.rssi"},
		{"iface name", `{"state":{"interfaces":[{"rx_bytes":1}]}}`, CodeInvalidField, "interfaces[0].name is required"},
		{"negative mem", `{"state":{"mem_used":-1}}`, CodeInvalidField, "mem_used"},
		{"negative config version", `{"config_version":-2,"state":{}}`, CodeInvalidField, "config_version"},
		{"extra type", `{"state":{"extra":{"a":1}}}`, CodeInvalidField, "must be a string"},
		{"huge", `{"state":{"extra":{"a":"` + strings.Repeat("x", MaxBodyBytes) + `"}}}`, CodeTooLarge, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodePush([]byte(c.body))
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want *Error", err)
			}
			if pe.Code != c.code || !strings.Contains(pe.Message, c.msg) {
				t.Fatalf("got %s: %s; want code %s containing %q", pe.Code, pe.Message, c.code, c.msg)
			}
		})
	}
}

func TestDecodeRegister(t *testing.T) {
	r, err := DecodeRegister([]byte(`{"machine_id":"m-1","device_type":"ICR-3241","firmware":"6.3.5","enrollment_secret":"s"}`))
	if err != nil || r.MachineID != "m-1" {
		t.Fatalf("%+v %v", r, err)
	}
	for body, want := range map[string]string{
		`{"device_type":"t","firmware":"f","enrollment_secret":"s"}`:                                                 "machine_id is required",
		`{"machine_id":"m","firmware":"f","enrollment_secret":"s"}`:                                                  "device_type is required",
		`{"machine_id":"m","device_type":"t","enrollment_secret":"s"}`:                                               "firmware is required",
		`{"machine_id":"m","device_type":"t","firmware":"f"}`:                                                        "enrollment_secret is required",
		`{"machine_id":"` + strings.Repeat("m", 200) + `","device_type":"t","firmware":"f","enrollment_secret":"s"}`: "longer than",
		`{"machine_id":"a\u0001b","device_type":"t","firmware":"f","enrollment_secret":"s"}`:                         "control characters",
		`{"machine_id":7,"device_type":"t","firmware":"f","enrollment_secret":"s"}`:                                  "machine_id must be a string",
	} {
		_, err := DecodeRegister([]byte(body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", body, err, want)
		}
	}
}

func BenchmarkDecodePush(b *testing.B) {
	body := []byte(goodPush)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodePush(body); err != nil {
			b.Fatal(err)
		}
	}
}
