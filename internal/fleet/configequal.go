package fleet

// When a profile update changes nothing (docs/operations.md, "Profiles"):
// two configurations are the same when they are the same JSON value.

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"unicode/utf8"
)

// SameConfig reports whether a and b are the same configuration: the same
// JSON value, written in any way. Whitespace, the order of an object's
// members and how a string is escaped ("é" or "\u00e9") do not count;
// numbers count as written (1 and 1.0 differ), arrays in order, and an
// object's repeated members in their order. Text that is not JSON is the
// same only as the same bytes.
func SameConfig(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	ca, okA := canonicalJSON(a)
	cb, okB := canonicalJSON(b)
	return okA && okB && bytes.Equal(ca, cb)
}

// canonicalJSON writes one JSON value so that the same value always reads
// the same: compact, members sorted by name (stable), strings re-escaped.
func canonicalJSON(raw []byte) ([]byte, bool) {
	var c bytes.Buffer
	if err := json.Compact(&c, raw); err != nil {
		return nil, false
	}
	s := canonScanner{in: c.Bytes()}
	out, ok := s.value(nil)
	return out, ok && s.i == len(s.in)
}

// canonScanner reads compact, valid JSON (json.Compact checked it).
type canonScanner struct {
	in []byte
	i  int
}

func (s *canonScanner) eat(c byte) bool {
	if s.i < len(s.in) && s.in[s.i] == c {
		s.i++
		return true
	}
	return false
}

// value appends the canonical form of the value at s.i to out.
func (s *canonScanner) value(out []byte) ([]byte, bool) {
	if s.i >= len(s.in) {
		return out, false
	}
	switch s.in[s.i] {
	case '{':
		s.i++
		type member struct{ name, value []byte }
		var ms []member
		for !s.eat('}') {
			if len(ms) > 0 && !s.eat(',') {
				return out, false
			}
			name, ok := s.str(nil)
			if !ok || !s.eat(':') {
				return out, false
			}
			v, ok := s.value(nil)
			if !ok {
				return out, false
			}
			ms = append(ms, member{name, v})
		}
		slices.SortStableFunc(ms, func(a, b member) int { return bytes.Compare(a.name, b.name) })
		out = append(out, '{')
		for k, m := range ms {
			if k > 0 {
				out = append(out, ',')
			}
			out = append(append(append(out, m.name...), ':'), m.value...)
		}
		return append(out, '}'), true
	case '[':
		s.i++
		out = append(out, '[')
		for n := 0; !s.eat(']'); n++ {
			if n > 0 {
				if !s.eat(',') {
					return out, false
				}
				out = append(out, ',')
			}
			var ok bool
			if out, ok = s.value(out); !ok {
				return out, false
			}
		}
		return append(out, ']'), true
	case '"':
		return s.str(out)
	default: // number, true, false, null: as written
		start := s.i
		for s.i < len(s.in) && !strings.ContainsRune(",]}:", rune(s.in[s.i])) {
			s.i++
		}
		return append(out, s.in[start:s.i]...), s.i > start
	}
}

// str appends the canonical form of the string at s.i: its characters
// escaped the one way json.Marshal does. A string that decoding would
// alter (invalid UTF-8, a lone surrogate escape, or U+FFFD itself) stays
// as written, so that two different such strings never compare equal.
func (s *canonScanner) str(out []byte) ([]byte, bool) {
	start := s.i
	if !s.eat('"') {
		return out, false
	}
	for s.i < len(s.in) && s.in[s.i] != '"' {
		if s.in[s.i] == '\\' {
			s.i++
		}
		s.i++
	}
	if !s.eat('"') {
		return out, false
	}
	raw := s.in[start:s.i]
	var v string
	if json.Unmarshal(raw, &v) != nil {
		return out, false
	}
	if strings.ContainsRune(v, utf8.RuneError) {
		return append(out, raw...), true
	}
	b, err := json.Marshal(v)
	if err != nil {
		return out, false
	}
	return append(out, b...), true
}
