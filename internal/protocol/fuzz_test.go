package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// The decoders must never panic, must answer every bad input with *Error,
// and everything they accept must pass validation, re-encode, and be exact
// text (see checkAccepted). Run under both decoders:
// go test -fuzz FuzzDecodePush ./internal/protocol/ [-tags drover_stdjson].
func FuzzDecodePush(f *testing.F) {
	f.Add([]byte(goodPush))
	f.Add([]byte(`{"seq":1,"state":{}}`))
	f.Add([]byte(`{"state":{"signal":{"rssi":-1e308}}}`))
	f.Add([]byte(`{"config_error":"u\uFFFD","state":{"extra":{"k":"` + "\u0085" + `"}}}`))
	f.Add([]byte(`{"state":{"extra":{"k":"\uD800"},"x":["` + "\xc0\xae" + `"]}}`))
	f.Add([]byte(`{"seq":2,"state":{},"firmware_update":{"rollout":3,"state":"downloading","progress":1024}}`))
	f.Add([]byte(`{"state":{},"firmware_update":{"rollout":1,"state":"failed","reason":"sha256 mismatch"}}`))
	f.Add([]byte(`{"seq":2,"state":{},"results":[{"id":7,"exit_code":1,"error":"timed out","output":["a","b"],"started_at":1,"finished_at":2}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := DecodePush(body)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Code == "" || pe.Message == "" || !utf8.ValidString(pe.Message) {
				t.Fatalf("error %v is not a coded *Error", err)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("accepted push fails validation: %v", err)
		}
		if !json.Valid(p.RawState) {
			t.Fatalf("raw state is not valid JSON: %q", p.RawState)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, p.RawState); err != nil || !bytes.Equal(compact.Bytes(), p.RawState) {
			t.Fatalf("raw state is not compact: %q", p.RawState)
		}
		checkAccepted(t, body, p)
		checkAccepted(t, p.RawState, p.State)
	})
}

// spaceOutsideStrings says exactly whether compacting valid JSON changes it.
func FuzzSpaceOutsideStrings(f *testing.F) {
	for _, s := range []string{`{"a":"b c"}`, `{"a": 1}`, `{"a":"\\\" x"}`, `{"a":"\\" , "b":2}`, "{\"a\":[1,\n2]}", `"\t"`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, b); err != nil {
			t.Fatal(err)
		}
		if changes := !bytes.Equal(compact.Bytes(), b); spaceOutsideStrings(b) != changes {
			t.Fatalf("spaceOutsideStrings(%q) = %v, compacting changes it: %v", b, !changes, changes)
		}
	})
}

// In valid JSON, plain text is text checkStrings accepts.
func FuzzPlainTextShortcut(f *testing.F) {
	for _, s := range []string{`{"a":"b c"}`, `{"a":"\u0001"}`, `{"a":"\ud800"}`, "{\"a\":\"\x7f\"}", "{\"a\":\"\xc2\x85\"}", "{\"a\":\n[1,\t2]}", `{"a":"\\"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		if e := checkStrings(b); plainText(b) && e != nil {
			t.Fatalf("plainText(%q), but checkStrings refuses it: %v", b, e)
		}
	})
}

func FuzzDecodeRegister(f *testing.F) {
	f.Add([]byte(`{"machine_id":"m","device_type":"t","firmware":"f","enrollment_secret":"s"}`))
	f.Add([]byte(`{"machine_id":"` + "\xff" + `"}`))
	f.Add([]byte(register(`u\uFFFD`)))
	f.Add([]byte(register(`\uD83D\uDE00\u0085`)))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := DecodeRegister(body)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Code == "" || !utf8.ValidString(pe.Message) {
				t.Fatalf("error %v is not a coded *Error", err)
			}
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("accepted registration fails validation: %v", err)
		}
		if _, err := json.Marshal(r); err != nil {
			t.Fatal(err)
		}
		checkAccepted(t, body, r)
	})
}

// checkAccepted checks, independently of checkStrings, that an accepted
// body was exact text: valid UTF-8 throughout (outside strings valid JSON
// is ASCII), no decoder replaced anything with U+FFFD, and no string of the
// decoded value holds a control character.
func checkAccepted(t *testing.T, body []byte, decoded any) {
	t.Helper()
	if !utf8.Valid(body) {
		t.Fatalf("accepted body is not UTF-8: %q", body)
	}
	tree, err := decodeTree(body)
	if err != nil {
		t.Fatalf("accepted body is not JSON: %v", err)
	}
	// Each U+FFFD in the decoded tree must have been sent as U+FFFD, raw or
	// escaped (duplicate keys and "\\ufffd" only make this bound looser).
	sent := bytes.Count(body, []byte("\uFFFD")) + strings.Count(strings.ToLower(string(body)), `\ufffd`)
	if got := countText(tree); got > sent {
		t.Fatalf("decoding made %d U+FFFD out of %d sent: %q", got, sent, body)
	}
	b, err := json.Marshal(decoded)
	if err != nil {
		t.Fatal(err)
	}
	again, err := decodeTree(b)
	if err != nil {
		t.Fatal(err)
	}
	countText(again) // panics on a control character
}

// decodeTree decodes any JSON; numbers stay text (1e700 is valid JSON).
func decodeTree(b []byte) (any, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return v, dec.Decode(&v)
}

// countText counts U+FFFD in every string and key of a decoded JSON tree,
// and panics on a control character.
func countText(v any) int {
	n := 0
	str := func(s string) {
		for _, r := range s {
			if r < 0x20 || r >= 0x7f && r <= 0x9f {
				panic("control character in accepted text: " + strings.ToValidUTF8(s, "?"))
			}
			if r == utf8.RuneError {
				n++
			}
		}
	}
	switch v := v.(type) {
	case string:
		str(v)
	case []any:
		for _, e := range v {
			n += countText(e)
		}
	case map[string]any:
		for k, e := range v {
			str(k)
			n += countText(e)
		}
	}
	return n
}
