package protocol

import (
	"bytes"
	"strconv"
	"sync"
	"unicode/utf8"
)

// decodePushFast parses a push the way agents send it, in one pass over
// the body, into memory allocated per push rather than per field: the
// state's numbers share one block, the signal and its numbers another, and
// every decoded string is a slice of one string. It answers ok only for a
// body the codec path (decodePushCodec) accepts with the same result;
// anything else, unusual or refused, is left to that path (ok false), so
// errors read exactly as the codec path writes them. Left to it: keys that
// are escaped, not ASCII or match a field only ignoring case, a known field
// given twice or as null, numbers a field's type cannot hold, lone
// surrogate escapes, invalid UTF-8 or raw controls in strings, nesting
// deeper than maxFastDepth, more than MaxInterfaces interfaces or
// MaxExtraKeys extra keys, and the rarer fields firmware_update and results.
// FuzzDecodePushFastDifferential holds the two paths to the same answers.
func decodePushFast(body []byte) (PushRequest, bool) {
	var p PushRequest
	if len(body) > MaxBodyBytes {
		return p, false
	}
	body = bytes.TrimSpace(body)
	s := scratches.Get().(*scratch)
	defer scratches.Put(s)
	d := pushDecoder{b: body, text: s.text[:0], ifaces: s.ifaces[:0], names: s.names[:0], extra: s.extra[:0]}
	ok := d.push(&p) && d.i == len(body) && !(d.special && checkStrings(body) != nil)
	if ok {
		d.finish(&p)
		ok = p.Validate() == nil
	}
	// The scratch keeps no reference into the body or the push: its text is
	// copied out, and interface names are set in the push's own copy.
	s.text, s.ifaces, s.names, s.extra = d.text, d.ifaces, d.names, d.extra
	return p, ok
}

// scratch is a decoder's working memory, reused from push to push.
type scratch struct {
	text   []byte
	ifaces []Interface
	names  []span
	extra  [][2]span
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

// maxFastDepth bounds the nesting of fields unknown to this server that
// the fast path reads (a push's known fields nest four deep).
const maxFastDepth = 32

// span is a decoded string: d.text[off:end].
type span struct{ off, end int32 }

// stateNumbers backs the state's number fields: one allocation per push.
type stateNumbers struct {
	uptime, memTotal, memUsed, diskTotal, diskUsed int64
	cpu, load1, temperature                        float64
}

// signalBlock backs a signal and its numbers: one allocation.
type signalBlock struct {
	Signal
	rssi, rsrp, rsrq, sinr float64
}

type pushDecoder struct {
	b       []byte
	i       int
	special bool   // a string holds a byte >= 0x7f or an escape: checkStrings must read the body
	text    []byte // decoded strings, end to end
	state   []byte // the state object as sent

	spaces      int  // whitespace bytes read between tokens
	stateSpaced bool // some of them in the state

	cfgErr, firmware, operator, technology span
	nums                                   *stateNumbers
	signal                                 *signalBlock
	hasIfaces, hasExtra                    bool
	ifaces                                 []Interface
	names                                  []span // of ifaces
	extra                                  [][2]span
}

// Field names per object, for refusing keys that match one ignoring case:
// the codecs match those; firmware_update, results and "-" (the codecs
// may take it for State's tag) are the codec path's too.
var (
	pushKeys      = []string{"seq", "config_version", "config_error", "state", "firmware_update", "results", "started", "-"}
	stateKeys     = []string{"uptime", "cpu", "load1", "mem_total", "mem_used", "disk_total", "disk_used", "temperature", "firmware", "interfaces", "signal", "extra"}
	interfaceKeys = []string{"name", "rx_bytes", "tx_bytes", "rx_packets", "tx_packets"}
	signalKeys    = []string{"rssi", "rsrp", "rsrq", "sinr", "operator", "technology"}
)

// finish makes the push's strings, interfaces, extra map and raw state.
func (d *pushDecoder) finish(p *PushRequest) {
	text := string(d.text)
	str := func(s span) string { return text[s.off:s.end] }
	p.ConfigError = str(d.cfgErr)
	st := &p.State
	st.Firmware = str(d.firmware)
	if g := d.signal; g != nil {
		g.Operator, g.Technology = str(d.operator), str(d.technology)
	}
	if d.hasIfaces {
		st.Interfaces = make([]Interface, len(d.ifaces))
		copy(st.Interfaces, d.ifaces)
		for i, n := range d.names {
			st.Interfaces[i].Name = str(n)
		}
	}
	if d.hasExtra {
		st.Extra = make(map[string]string, len(d.extra))
		for _, kv := range d.extra {
			st.Extra[str(kv[0])] = str(kv[1])
		}
	}
	if d.stateSpaced {
		p.RawState = compact(d.state)
	} else {
		p.RawState = bytes.Clone(d.state)
	}
}

// compact copies the valid JSON text b without whitespace outside strings.
func compact(b []byte) []byte {
	out := make([]byte, 0, len(b))
	start := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"': // to the closing quote: b is valid JSON
			for i++; b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		case ' ', '\t', '\r', '\n':
			out = append(out, b[start:i]...)
			start = i + 1
		}
	}
	return append(out, b[start:]...)
}

// members reads the object at d.i, calling member with each key (plain
// ASCII, unescaped) and d.i at its value; member reads the value of a
// field it knows. Other keys are skipped, unless they match one of names
// ignoring case (names the codecs match, or leave to the codec path).
func (d *pushDecoder) members(names []string, member func(key []byte) (known, ok bool)) bool {
	if empty, ok := d.open('{', '}'); empty || !ok {
		return ok
	}
	for {
		key, ok := d.key()
		if !ok || !d.colon() {
			return false
		}
		known, ok := member(key)
		if !known {
			ok = !foldsTo(names, key) && d.skip(1)
		}
		if !ok {
			return false
		}
		if more, ok := d.next('}'); !more {
			return ok
		}
	}
}

// foldsTo says whether key is one of names ignoring ASCII case.
func foldsTo(names []string, key []byte) bool {
	for _, n := range names {
		if len(n) == len(key) && bytes.EqualFold(key, []byte(n)) {
			return true
		}
	}
	return false
}

// seen marks field bit of *mask, false when it was marked already.
func seen(mask *uint16, bit uint) bool {
	if *mask&(1<<bit) != 0 {
		return false
	}
	*mask |= 1 << bit
	return true
}

func (d *pushDecoder) push(p *PushRequest) bool {
	var got uint16
	return d.members(pushKeys, func(key []byte) (known, ok bool) {
		known = true
		switch string(key) {
		case "seq":
			if ok = seen(&got, 0); ok {
				p.Seq, ok = d.uint()
			}
		case "config_version":
			if ok = seen(&got, 1); ok {
				p.ConfigVersion, ok = d.int()
			}
		case "config_error":
			if ok = seen(&got, 2); ok {
				d.cfgErr, ok = d.str()
			}
		case "state":
			ok = seen(&got, 3) && d.stateObject(&p.State)
		case "started":
			if ok = seen(&got, 4); ok {
				p.Started, ok = d.bool()
			}
		default:
			known = false
		}
		return known, ok
	}) && got&(1<<3) != 0 // a push without a state is refused
}

func (d *pushDecoder) stateObject(st *State) bool {
	start, spaces := d.i, d.spaces
	var got uint16
	ok := d.members(stateKeys, func(key []byte) (known, ok bool) {
		switch string(key) {
		case "uptime":
			return true, seen(&got, 0) && d.intField(&d.numbers().uptime, &st.Uptime)
		case "cpu":
			return true, seen(&got, 1) && d.floatField(&d.numbers().cpu, &st.CPU)
		case "load1":
			return true, seen(&got, 2) && d.floatField(&d.numbers().load1, &st.Load1)
		case "mem_total":
			return true, seen(&got, 3) && d.intField(&d.numbers().memTotal, &st.MemTotal)
		case "mem_used":
			return true, seen(&got, 4) && d.intField(&d.numbers().memUsed, &st.MemUsed)
		case "disk_total":
			return true, seen(&got, 5) && d.intField(&d.numbers().diskTotal, &st.DiskTotal)
		case "disk_used":
			return true, seen(&got, 6) && d.intField(&d.numbers().diskUsed, &st.DiskUsed)
		case "temperature":
			return true, seen(&got, 7) && d.floatField(&d.numbers().temperature, &st.Temperature)
		case "firmware":
			if !seen(&got, 8) {
				return true, false
			}
			d.firmware, ok = d.str()
			return true, ok
		case "interfaces":
			return true, seen(&got, 9) && d.interfaces()
		case "signal":
			if !seen(&got, 10) {
				return true, false
			}
			d.signal = new(signalBlock)
			st.Signal = &d.signal.Signal
			return true, d.signalObject(d.signal)
		case "extra":
			return true, seen(&got, 11) && d.extraObject()
		}
		return false, false // not a state field
	})
	d.state, d.stateSpaced = d.b[start:d.i], d.spaces != spaces
	return ok
}

// numbers is the block behind the state's numbers, made at the first.
func (d *pushDecoder) numbers() *stateNumbers {
	if d.nums == nil {
		d.nums = new(stateNumbers)
	}
	return d.nums
}

func (d *pushDecoder) intField(v *int64, field **int64) bool {
	n, ok := d.int()
	*v, *field = n, v
	return ok
}

func (d *pushDecoder) floatField(v *float64, field **float64) bool {
	f, ok := d.float()
	*v, *field = f, v
	return ok
}

func (d *pushDecoder) interfaces() bool {
	d.hasIfaces = true
	if empty, ok := d.open('[', ']'); empty || !ok {
		return ok
	}
	for {
		if len(d.ifaces) == MaxInterfaces {
			return false
		}
		var f Interface
		var name span
		var got uint16
		ok := d.members(interfaceKeys, func(key []byte) (known, ok bool) {
			known = true
			switch string(key) {
			case "name":
				if ok = seen(&got, 0); ok {
					name, ok = d.str()
				}
			case "rx_bytes":
				if ok = seen(&got, 1); ok {
					f.RxBytes, ok = d.uint()
				}
			case "tx_bytes":
				if ok = seen(&got, 2); ok {
					f.TxBytes, ok = d.uint()
				}
			case "rx_packets":
				if ok = seen(&got, 3); ok {
					f.RxPackets, ok = d.uint()
				}
			case "tx_packets":
				if ok = seen(&got, 4); ok {
					f.TxPackets, ok = d.uint()
				}
			default:
				known = false
			}
			return known, ok
		})
		if !ok {
			return false
		}
		d.ifaces = append(d.ifaces, f)
		d.names = append(d.names, name)
		if more, ok := d.next(']'); !more {
			return ok
		}
	}
}

func (d *pushDecoder) signalObject(g *signalBlock) bool {
	var got uint16
	return d.members(signalKeys, func(key []byte) (known, ok bool) {
		known = true
		switch string(key) {
		case "rssi":
			ok = seen(&got, 0) && d.floatField(&g.rssi, &g.RSSI)
		case "rsrp":
			ok = seen(&got, 1) && d.floatField(&g.rsrp, &g.RSRP)
		case "rsrq":
			ok = seen(&got, 2) && d.floatField(&g.rsrq, &g.RSRQ)
		case "sinr":
			ok = seen(&got, 3) && d.floatField(&g.sinr, &g.SINR)
		case "operator":
			if ok = seen(&got, 4); ok {
				d.operator, ok = d.str()
			}
		case "technology":
			if ok = seen(&got, 5); ok {
				d.technology, ok = d.str()
			}
		default:
			known = false
		}
		return known, ok
	})
}

// extraObject reads state.extra: any keys, string values.
func (d *pushDecoder) extraObject() bool {
	d.hasExtra = true
	if empty, ok := d.open('{', '}'); empty || !ok {
		return ok
	}
	for {
		if len(d.extra) == MaxExtraKeys {
			return false
		}
		k, ok := d.str()
		if !ok || !d.colon() {
			return false
		}
		v, ok := d.str()
		if !ok {
			return false
		}
		d.extra = append(d.extra, [2]span{k, v})
		if more, ok := d.next('}'); !more {
			return ok
		}
	}
}

func (d *pushDecoder) ws() {
	b, i := d.b, d.i
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	d.spaces += i - d.i
	d.i = i
}

func (d *pushDecoder) char(c byte) bool {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// open reads the opening of an object or array and, when it is empty, its
// end.
func (d *pushDecoder) open(start, end byte) (empty, ok bool) {
	if !d.char(start) {
		return false, false
	}
	d.ws()
	return d.char(end), true
}

// colon reads the colon after a key.
func (d *pushDecoder) colon() bool {
	d.ws()
	ok := d.char(':')
	d.ws()
	return ok
}

// next reads what follows a member or element: a comma (more), or end.
func (d *pushDecoder) next(end byte) (more, ok bool) {
	d.ws()
	switch {
	case d.char(','):
		d.ws()
		return true, true
	case d.char(end):
		return false, true
	}
	return false, false
}

// key reads an object key of plain ASCII without escapes.
func (d *pushDecoder) key() ([]byte, bool) {
	b, i := d.b, d.i
	if i >= len(b) || b[i] != '"' {
		return nil, false
	}
	for start := i + 1; i+1 < len(b); {
		i++
		switch c := b[i]; {
		case c == '"':
			d.i = i + 1
			return b[start:i], true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

func (d *pushDecoder) bool() (bool, bool) {
	switch {
	case bytes.HasPrefix(d.b[d.i:], []byte("true")):
		d.i += 4
		return true, true
	case bytes.HasPrefix(d.b[d.i:], []byte("false")):
		d.i += 5
		return false, true
	}
	return false, false
}

// number reads a JSON number's text; integer: without fraction or exponent.
func (d *pushDecoder) number() (text []byte, integer, ok bool) {
	b, start := d.b, d.i
	i := start
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return nil, false, false
	}
	integer = true
	if i < len(b) && b[i] == '.' {
		integer = false
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return nil, false, false
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		integer = false
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return nil, false, false
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	d.i = i
	return b[start:i], integer, true
}

// uint reads a JSON integer that fits a uint64.
func (d *pushDecoder) uint() (uint64, bool) {
	t, integer, ok := d.number()
	if !ok || !integer || t[0] == '-' {
		return 0, false
	}
	return digits(t)
}

// int reads a JSON integer that fits an int64.
func (d *pushDecoder) int() (int64, bool) {
	t, integer, ok := d.number()
	if !ok || !integer {
		return 0, false
	}
	if t[0] != '-' {
		n, ok := digits(t)
		return int64(n), ok && n <= 1<<63-1
	}
	n, ok := digits(t[1:])
	return -int64(n), ok && n <= 1<<63 && n != 0
}

func digits(t []byte) (uint64, bool) {
	if len(t) > 20 {
		return 0, false
	}
	var n uint64
	for _, c := range t {
		v := uint64(c - '0')
		if n > (1<<64-1-v)/10 {
			return 0, false
		}
		n = n*10 + v
	}
	return n, true
}

// float reads a JSON number within the range of a float64.
func (d *pushDecoder) float() (float64, bool) {
	t, _, ok := d.number()
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(t), 64)
	return f, err == nil
}

// str decodes the string at d.i into d.text.
func (d *pushDecoder) str() (span, bool) {
	if !d.char('"') {
		return span{}, false
	}
	b, off := d.b, int32(len(d.text))
	for {
		start, i := d.i, d.i
		for i < len(b) && b[i] >= 0x20 && b[i] < 0x7f && b[i] != '"' && b[i] != '\\' {
			i++
		}
		d.i = i
		d.text = append(d.text, b[start:i]...)
		if d.i >= len(b) {
			return span{}, false
		}
		switch c := b[d.i]; {
		case c == '"':
			d.i++
			return span{off, int32(len(d.text))}, true
		case c < 0x20:
			return span{}, false
		case c == '\\':
			d.special = true
			r, ok := d.escape()
			if !ok {
				return span{}, false
			}
			d.text = utf8.AppendRune(d.text, r)
		default: // 0x7f and beyond
			d.special = true
			r, size := utf8.DecodeRune(b[d.i:])
			if r == utf8.RuneError && size == 1 {
				return span{}, false
			}
			d.text = append(d.text, b[d.i:d.i+size]...)
			d.i += size
		}
	}
}

// escape reads the escape at d.i; false for a lone surrogate.
func (d *pushDecoder) escape() (rune, bool) {
	b := d.b
	if d.i+1 >= len(b) {
		return 0, false
	}
	e := b[d.i+1]
	d.i += 2
	switch e {
	case '"', '\\', '/':
		return rune(e), true
	case 'b':
		return '\b', true
	case 'f':
		return '\f', true
	case 'n':
		return '\n', true
	case 'r':
		return '\r', true
	case 't':
		return '\t', true
	case 'u':
	default:
		return 0, false
	}
	u, ok := hex4(b, d.i)
	if !ok || u >= 0xdc00 && u <= 0xdfff {
		return 0, false
	}
	d.i += 4
	if u < 0xd800 || u > 0xdbff {
		return rune(u), true
	}
	if d.i+1 >= len(b) || b[d.i] != '\\' || b[d.i+1] != 'u' {
		return 0, false
	}
	lo, ok := hex4(b, d.i+2)
	if !ok || lo < 0xdc00 || lo > 0xdfff {
		return 0, false
	}
	d.i += 6
	return 0x10000 + (rune(u)-0xd800)<<10 + (rune(lo) - 0xdc00), true
}

// skip reads a value of a field unknown to this server: any valid JSON.
func (d *pushDecoder) skip(depth int) bool {
	if d.i >= len(d.b) {
		return false
	}
	switch c := d.b[d.i]; c {
	case '"':
		return d.skipString()
	case '{', '[':
		if depth > maxFastDepth {
			return false
		}
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		if empty, ok := d.open(c, end); empty || !ok {
			return ok
		}
		for {
			if c == '{' && !(d.skipString() && d.colon()) {
				return false
			}
			if !d.skip(depth + 1) {
				return false
			}
			if more, ok := d.next(end); !more {
				return ok
			}
		}
	case 't':
		return d.literal("true")
	case 'f':
		return d.literal("false")
	case 'n':
		return d.literal("null")
	}
	_, _, ok := d.number()
	return ok
}

func (d *pushDecoder) literal(s string) bool {
	if len(d.b)-d.i >= len(s) && string(d.b[d.i:d.i+len(s)]) == s {
		d.i += len(s)
		return true
	}
	return false
}

// skipString reads a string without decoding it.
func (d *pushDecoder) skipString() bool {
	if !d.char('"') {
		return false
	}
	b := d.b
	for d.i < len(b) {
		c := b[d.i]
		switch {
		case c == '"':
			d.i++
			return true
		case c < 0x20:
			return false
		case c == '\\':
			d.special = true
			if d.i+1 >= len(b) {
				return false
			}
			switch b[d.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				d.i += 2
			case 'u':
				if _, ok := hex4(b, d.i+2); !ok {
					return false
				}
				d.i += 6
			default:
				return false
			}
			continue
		case c >= 0x7f:
			d.special = true
		}
		d.i++
	}
	return false
}
