package fleet

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"testing"
	"unicode/utf8"
)

func TestSameConfig(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{`{}`, `{ }`, true},
		{`{"a":1,"b":[1,2]}`, "{\n\t\"b\": [1, 2],\n\t\"a\": 1\n}", true},
		{`{"a":"é"}`, `{"a":"\u00e9"}`, true},
		{`{"a":"x/y"}`, `{"a":"x\/y"}`, true},
		{`{"a":{"c":1,"d":2}}`, `{"a":{"d":2,"c":1}}`, true},
		{`{"a":1}`, `{"a":1.0}`, false},
		{`{"a":1}`, `{"a":"1"}`, false},
		{`{"a":[1,2]}`, `{"a":[2,1]}`, false},
		{`{"a":null}`, `{}`, false},
		{`{"a":1,"a":2}`, `{"a":2,"a":1}`, false},
		{`{"a":1,"a":2}`, `{"a":2}`, false},
		{`{"a":1,"b":0,"a":2}`, `{"b":0,"a":1,"a":2}`, true},
		{`{"a":"\ud800"}`, `{"a":"\udc00"}`, false},
		{"{\"a\":\"\xff\"}", "{\"a\":\"\xfe\"}", false},
		{`{"a":12345678901234567890}`, `{"a":12345678901234567891}`, false},
		{`{"a":1}`, `{"a":1`, false},
	} {
		if got := SameConfig([]byte(c.a), []byte(c.b)); got != c.same {
			t.Errorf("SameConfig(%s, %s) = %v, want %v", c.a, c.b, got, c.same)
		}
		if got := SameConfig([]byte(c.b), []byte(c.a)); got != c.same {
			t.Errorf("SameConfig(%s, %s) = %v, want %v", c.b, c.a, got, c.same)
		}
	}
}

// SameConfig on any two documents never says the same of two different
// JSON values, and always says it of one value written differently.
func FuzzSameConfig(f *testing.F) {
	f.Add([]byte(`{"apn":"iot","mtu":1400,"dns":["a","b"]}`), []byte(`{"dns":["a","b"],"mtu":1400,"apn":"\u0069ot"}`))
	f.Add([]byte(`{"a":1,"a":2}`), []byte(`{"a":2}`))
	f.Add([]byte(`{"a":"\ud800","b":"\ufffd"}`), []byte(`{"b":"\ufffd","a":"\udc00"}`))
	f.Add([]byte(`[{"z":{"y":[true,false,null,-0.5e3]}}]`), []byte(`[{"z":{"y":[true,false,null,-0.5E3]}}]`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		same := SameConfig(a, b)
		if same != SameConfig(b, a) {
			t.Fatalf("not symmetric: %q, %q", a, b)
		}
		va, okA := decodeNumbers(a)
		vb, okB := decodeNumbers(b)
		if same && !bytes.Equal(a, b) && !(okA && okB && reflect.DeepEqual(va, vb)) {
			t.Fatalf("%q and %q are different values, called the same", a, b)
		}
		if !okA {
			return
		}
		var indented bytes.Buffer
		if json.Indent(&indented, a, "", "  ") == nil && !SameConfig(a, indented.Bytes()) {
			t.Fatalf("%q indented is not the same", a)
		}
		// Written again with members sorted: the same, unless decoding
		// lost something (repeated members, strings it cannot keep).
		again, err := json.Marshal(va)
		if err != nil || bytes.ContainsRune(again, utf8.RuneError) || repeatsMembers(a) {
			return
		}
		if !SameConfig(a, again) {
			t.Fatalf("%q written again as %q is not the same", a, again)
		}
	})
}

// decodeNumbers decodes one JSON value keeping numbers as written.
func decodeNumbers(b []byte) (any, bool) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return nil, false
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, false
	}
	return v, json.Valid(b)
}

// repeatsMembers reports whether an object in b names a member twice.
func repeatsMembers(b []byte) bool {
	d := json.NewDecoder(bytes.NewReader(b))
	type obj struct {
		names map[string]bool
		key   bool // the next string is a member name
	}
	var stack []*obj
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		var top *obj
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				if top != nil {
					top.key = true
				}
				stack = append(stack, &obj{names: map[string]bool{}, key: true})
			case '[':
				if top != nil {
					top.key = true
				}
				stack = append(stack, nil)
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		case string:
			if top != nil && top.key {
				if top.names[v] {
					return true
				}
				top.names[v] = true
				top.key = false
				continue
			}
		}
		if top != nil {
			top.key = true
		}
	}
}
