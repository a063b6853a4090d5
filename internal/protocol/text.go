package protocol

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Device-supplied text. Both JSON decoders (goccy/go-json and
// encoding/json) silently turn invalid UTF-8 and lone surrogate escapes
// into U+FFFD, so that "u\xff", "u\xfe" and "u\uFFFD" would decode to the
// same string. checkStrings therefore reads the raw body, before any
// decoder has touched it, and refuses every JSON string (object keys
// included, fields this server does not know included) that is not exact
// text; Validate repeats the rune checks on decoded values.

// IsControl reports whether r is refused in device-supplied strings: C0
// controls (U+0000–U+001F), DEL (U+007F) and C1 controls (U+0080–U+009F).
func IsControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) }

// checkStrings refuses a body with a JSON string that holds invalid UTF-8
// (overlong forms and encoded surrogates included), a \u escape of a lone
// UTF-16 surrogate, or a control character (raw or escaped). The error names
// the string's field. body must be syntactically valid JSON (the decoder
// has accepted it); anything unexpected is refused as malformed.
func checkStrings(body []byte) *Error {
	w := walkers.Get().(*walker)
	w.b, w.i, w.stack = body, 0, w.stack[:0]
	err := w.run()
	w.b = nil
	if cap(w.stack) <= 64 {
		walkers.Put(w)
	}
	return err
}

// plainText says whether b is printable ASCII and JSON whitespace without a
// backslash. Valid JSON that is plain text need not be walked: what
// checkStrings refuses needs a byte of 0x7f or more, an escape, or a raw
// control character, which valid JSON has only as whitespace between tokens.
func plainText(b []byte) bool {
	for _, c := range b {
		if c >= 0x7f || c == '\\' || c < 0x20 && c != '\t' && c != '\n' && c != '\r' {
			return false
		}
	}
	return true
}

// frame is one open object or array on the walker's path.
type frame struct {
	object bool
	open   bool   // nothing read inside yet
	key    []byte // raw (still escaped) key of the current member
	index  int    // index of the current array element
}

var walkers = sync.Pool{New: func() any { return &walker{stack: make([]frame, 0, 16)} }}

type walker struct {
	b     []byte
	i     int
	stack []frame
}

func (w *walker) ws() {
	for w.i < len(w.b) {
		switch w.b[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

func (w *walker) malformed() *Error {
	return &Error{Code: CodeMalformedJSON, Message: fmt.Sprintf("invalid JSON at byte %d", w.i)}
}

// run walks the whole document without recursion (bodies may nest deeply).
func (w *walker) run() *Error {
	w.ws()
	if err := w.value(); err != nil {
		return err
	}
	for len(w.stack) > 0 {
		w.ws()
		if w.i >= len(w.b) {
			return w.malformed()
		}
		top := &w.stack[len(w.stack)-1]
		c := w.b[w.i]
		switch {
		case c == '}' && top.object, c == ']' && !top.object:
			w.i++
			w.stack = w.stack[:len(w.stack)-1]
			continue
		case top.open:
			top.open = false
		case c == ',':
			w.i++
			w.ws()
			top.index++
		default:
			return w.malformed()
		}
		if top.object {
			if err := w.key(top); err != nil {
				return err
			}
		}
		if err := w.value(); err != nil {
			return err
		}
	}
	return nil
}

// key reads `"name" :` of an object member into f.
func (w *walker) key(f *frame) *Error {
	if w.i >= len(w.b) || w.b[w.i] != '"' {
		return w.malformed()
	}
	start := w.i + 1
	if err := w.str(true); err != nil {
		return err
	}
	f.key = w.b[start : w.i-1]
	w.ws()
	if w.i >= len(w.b) || w.b[w.i] != ':' {
		return w.malformed()
	}
	w.i++
	w.ws()
	return nil
}

// value reads one value; an object or array is only opened on the stack,
// run reads its members.
func (w *walker) value() *Error {
	if w.i >= len(w.b) {
		return w.malformed()
	}
	switch c := w.b[w.i]; c {
	case '"':
		return w.str(false)
	case '{', '[':
		w.i++
		w.stack = append(w.stack, frame{object: c == '{', open: true})
		return nil
	default: // number, true, false, null
		start := w.i
	scalar:
		for ; w.i < len(w.b); w.i++ {
			switch w.b[w.i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				break scalar
			}
		}
		if w.i == start {
			return w.malformed()
		}
		return nil
	}
}

// str reads the string starting at w.b[w.i] == '"' and checks each of its
// characters.
func (w *walker) str(isKey bool) *Error {
	w.i++
	for w.i < len(w.b) {
		c := w.b[w.i]
		if c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
			w.i++ // plain ASCII: the common case
			continue
		}
		var r rune
		switch {
		case c == '"':
			w.i++
			return nil
		case c == '\\':
			if w.i+1 >= len(w.b) {
				return w.malformed()
			}
			switch e := w.b[w.i+1]; e {
			case '"', '\\', '/':
				r, w.i = rune(e), w.i+2
			case 'b', 'f', 'n', 'r', 't':
				r, w.i = '\n', w.i+2 // stands for any of these C0 controls
			case 'u':
				u, ok := hex4(w.b, w.i+2)
				if !ok {
					return w.malformed()
				}
				r, w.i = rune(u), w.i+6
				if u >= 0xdc00 && u <= 0xdfff {
					return w.bad(isKey, "contains a lone UTF-16 surrogate escape (\\u%04X)", u)
				}
				if u >= 0xd800 && u <= 0xdbff {
					lo, ok := uint16(0), false
					if w.i+1 < len(w.b) && w.b[w.i] == '\\' && w.b[w.i+1] == 'u' {
						lo, ok = hex4(w.b, w.i+2)
					}
					if !ok || lo < 0xdc00 || lo > 0xdfff {
						return w.bad(isKey, "contains a lone UTF-16 surrogate escape (\\u%04X)", u)
					}
					r, w.i = 0x10000+(rune(u)-0xd800)<<10+(rune(lo)-0xdc00), w.i+6
				}
			default:
				return w.malformed()
			}
		case c < utf8.RuneSelf:
			r = rune(c)
			w.i++
		default:
			var size int
			r, size = utf8.DecodeRune(w.b[w.i:])
			if r == utf8.RuneError && size == 1 {
				return w.bad(isKey, "is not valid UTF-8 (byte 0x%02X at offset %d)", c, w.i)
			}
			w.i += size
		}
		if IsControl(r) {
			return w.bad(isKey, "contains control characters (U+%04X)", r)
		}
	}
	return w.malformed()
}

func hex4(b []byte, at int) (uint16, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	var v uint16
	for _, c := range b[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | uint16(c)
	}
	return v, true
}

// bad refuses the string being read, naming its field: "state.extra.iccid"
// for a value, "a key of state.extra" for a key.
func (w *walker) bad(isKey bool, format string, args ...any) *Error {
	var path strings.Builder
	n := len(w.stack)
	if isKey {
		n-- // the innermost frame's key is the string being read
	}
	for _, f := range w.stack[:n] {
		if !f.object {
			fmt.Fprintf(&path, "[%d]", f.index)
			continue
		}
		if !fieldName(f.key) {
			k, err := strconv.Unquote(`"` + string(f.key) + `"`)
			if err != nil {
				k = string(f.key)
			}
			path.WriteString("[" + strconv.Quote(k) + "]")
			continue
		}
		if path.Len() > 0 {
			path.WriteByte('.')
		}
		path.Write(f.key)
	}
	name := path.String()
	switch {
	case isKey && name == "":
		name = "a key of the body"
	case isKey:
		name = "a key of " + name
	case name == "":
		name = "a string"
	}
	return invalid("%s %s", name, fmt.Sprintf(format, args...))
}

// fieldName reports whether k prints plainly in a path (a.b.c).
func fieldName(k []byte) bool {
	if len(k) == 0 || len(k) > MaxExtraKeyLen {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
