package fleet

// The filter language (docs/groups.md): conditions on registry fields and
// on the fields devices report, joined by "and". One parser serves the API
// (the where parameter, live labels), the dashboard and drover ctl.
//
//	expr  = cond { "and" cond }
//	cond  = field op value | field ( "exists" | "missing" )
//	field = "state." path | "device_type" | "firmware" | "model"
//	      | "machine_id" | "serial" | "label"
//	op    = "=" | "!=" | "<" | ">" | "<=" | ">=" | "prefix" | "contains"
//	value = a JSON string ("...") | a number | true | false | null
//	      | a bare word (letters, digits and . _ - : / + @), read as text
//
// A path is up to eight names of object members (letters, digits, _ and
// -) or array positions, joined by dots: state.extras.site,
// state.interfaces.0.name.

import (
	"cmp"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
)

// FilterWhere is the parameter of the devices filter that holds an
// expression of the filter language.
const FilterWhere = "where"

// Limits of the filter language.
const (
	MaxWhereBytes = 1024
	MaxWhereConds = 16
	maxPathSegs   = 8
	maxSegBytes   = 64
)

type whereField uint8

const (
	wState whereField = iota
	wDeviceType
	wFirmware
	wModel
	wMachineID
	wSerial
	wLabel
)

var whereFieldNames = [...]string{"state", "device_type", "firmware", "model", "machine_id", "serial", "label"}

type whereOp uint8

const (
	opEq whereOp = iota
	opNe
	opLt
	opGt
	opLe
	opGe
	opPrefix
	opContains
	opExists
	opMissing
)

var whereOpNames = [...]string{"=", "!=", "<", ">", "<=", ">=", "prefix", "contains", "exists", "missing"}

// valKind is the JSON type of a value: of a literal, or of a reported
// field in the index (stateindex.go).
type valKind uint8

const (
	kUnset  valKind = iota // index only: never recorded
	kAbsent                // index only: not reported
	kNull
	kFalse
	kTrue
	kNumber
	kString
	kObject
	kArray
)

// literal is a condition's value.
type literal struct {
	kind valKind // kNull, kFalse, kTrue, kNumber or kString
	num  float64
	str  string // the text: of a string, or as written
	// quoted: written as a JSON string (never read as a number).
	quoted bool
}

// cond is one condition.
type cond struct {
	field whereField
	path  string   // state fields: the path after "state."
	segs  []string // path split at dots
	op    whereOp
	lit   literal
}

// Where is a parsed expression of the filter language; the zero Where
// matches every device.
type Where struct {
	conds []cond
}

// Empty says whether w has no condition.
func (w Where) Empty() bool { return len(w.conds) == 0 }

// StatePaths lists the state paths w reads.
func (w Where) StatePaths() []string {
	var out []string
	for _, c := range w.conds {
		if c.field == wState {
			out = append(out, c.path)
		}
	}
	return out
}

// LabelNames lists the labels w names.
func (w Where) LabelNames() []string {
	var out []string
	for _, c := range w.conds {
		if c.field == wLabel {
			out = append(out, c.lit.str)
		}
	}
	return out
}

// String is w in its canonical form: ParseWhere reads it back to the same
// Where.
func (w Where) String() string {
	var b strings.Builder
	for i, c := range w.conds {
		if i > 0 {
			b.WriteString(" and ")
		}
		if c.field == wState {
			b.WriteString("state.")
			b.WriteString(c.path)
		} else {
			b.WriteString(whereFieldNames[c.field])
		}
		b.WriteByte(' ')
		b.WriteString(whereOpNames[c.op])
		if c.op == opExists || c.op == opMissing {
			continue
		}
		b.WriteByte(' ')
		switch {
		case c.lit.kind == kString:
			q, _ := json.Marshal(c.lit.str)
			b.Write(q)
		default:
			b.WriteString(c.lit.str)
		}
	}
	return b.String()
}

func whereError(format string, args ...any) error {
	return fieldError(FilterWhere, "where: "+format, args...)
}

// ParseWhere reads an expression of the filter language.
func ParseWhere(text string) (Where, error) {
	var w Where
	if len(text) > MaxWhereBytes {
		return w, whereError("at most %d bytes", MaxWhereBytes)
	}
	toks, err := lexWhere(text)
	if err != nil {
		return w, err
	}
	for i := 0; i < len(toks); {
		if len(w.conds) > 0 {
			if !toks[i].word || !strings.EqualFold(toks[i].text, "and") {
				return Where{}, whereError("expected \"and\" before %s", toks[i].quote())
			}
			i++
			if i == len(toks) {
				return Where{}, whereError("a condition must follow \"and\"")
			}
		}
		if len(w.conds) == MaxWhereConds {
			return Where{}, whereError("at most %d conditions", MaxWhereConds)
		}
		c, n, err := parseCond(toks[i:])
		if err != nil {
			return Where{}, err
		}
		w.conds = append(w.conds, c)
		i += n
	}
	return w, nil
}

// whereToken is a word, an operator or a JSON string.
type whereToken struct {
	text   string // a string's value
	word   bool   // a bare word
	op     bool   // = != < > <= >=
	quoted bool   // a JSON string
}

func (t whereToken) quote() string { return strconv.Quote(t.text) }

func isWordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == '-' || c == ':' || c == '/' || c == '+' || c == '@'
}

func lexWhere(s string) ([]whereToken, error) {
	var out []whereToken
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '"':
			j := i + 1
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' {
					j++
				}
			}
			if j >= len(s) {
				return nil, whereError("a string is not closed")
			}
			var v string
			if err := json.Unmarshal([]byte(s[i:j+1]), &v); err != nil {
				return nil, whereError("bad string %s", s[i:j+1])
			}
			out = append(out, whereToken{text: v, quoted: true})
			i = j + 1
		case c == '=' || c == '<' || c == '>' || c == '!':
			j := i + 1
			if j < len(s) && s[j] == '=' && c != '=' {
				j++
			}
			op := s[i:j]
			if op == "!" {
				return nil, whereError("\"!\" must be \"!=\"")
			}
			out = append(out, whereToken{text: op, op: true})
			i = j
		case isWordByte(c):
			j := i
			for j < len(s) && isWordByte(s[j]) {
				j++
			}
			out = append(out, whereToken{text: s[i:j], word: true})
			i = j
		default:
			return nil, whereError("unexpected character %q (quote values with other characters)", rune(c))
		}
	}
	if len(out) == 0 {
		return nil, whereError("empty expression")
	}
	return out, nil
}

// parseCond reads one condition at the start of toks and says how many
// tokens it took.
func parseCond(toks []whereToken) (cond, int, error) {
	var c cond
	if !toks[0].word {
		return c, 0, whereError("expected a field, not %s", toks[0].quote())
	}
	name := toks[0].text
	switch {
	case strings.HasPrefix(name, "state."):
		c.field, c.path = wState, name[len("state."):]
		c.segs = strings.Split(c.path, ".")
		if len(c.segs) > maxPathSegs {
			return c, 0, whereError("a path has at most %d parts: %s", maxPathSegs, name)
		}
		for _, s := range c.segs {
			if s == "" || len(s) > maxSegBytes || strings.ContainsAny(s, ":/+@") {
				return c, 0, whereError("bad path %s: parts are 1 to %d letters, digits, _ or -", name, maxSegBytes)
			}
		}
	default:
		found := false
		for i, n := range whereFieldNames {
			if i != int(wState) && n == name {
				c.field, found = whereField(i), true
			}
		}
		if !found {
			return c, 0, whereError("unknown field %s: fields are state.<path>, %s", toks[0].quote(), oneOf(whereFieldNames[1:]))
		}
	}
	if len(toks) < 2 {
		return c, 0, whereError("an operator must follow %s", name)
	}
	op := toks[1]
	found := false
	if op.op || op.word {
		for i, n := range whereOpNames {
			if n == op.text {
				c.op, found = whereOp(i), true
			}
		}
	}
	if !found {
		return c, 0, whereError("unknown operator %s after %s: operators are %s", op.quote(), name, oneOf(whereOpNames[:]))
	}
	if c.op == opExists || c.op == opMissing {
		if c.field == wLabel {
			return c, 0, whereError("label takes = or !=")
		}
		return c, 2, nil
	}
	if len(toks) < 3 || toks[2].op {
		return c, 0, whereError("a value must follow %s %s", name, op.text)
	}
	v := toks[2]
	c.lit = literalOf(v)
	if c.field == wLabel {
		if c.op != opEq && c.op != opNe {
			return c, 0, whereError("label takes = or !=")
		}
		c.lit = literal{kind: kString, str: v.text, quoted: true}
		if err := ValidLabelName(v.text); err != nil {
			return c, 0, whereError("label %s: %v", v.quote(), err)
		}
	}
	if c.lit.kind != kNumber && c.lit.kind != kString && c.op != opEq && c.op != opNe {
		return c, 0, whereError("%s takes = or != with %s", name, v.text)
	}
	return c, 3, nil
}

// literalOf reads a value whereToken: a JSON string is text; a bare word is
// true, false, null, a number, or else text.
func literalOf(t whereToken) literal {
	if t.quoted {
		return literal{kind: kString, str: t.text, quoted: true}
	}
	switch t.text {
	case "true":
		return literal{kind: kTrue, str: t.text}
	case "false":
		return literal{kind: kFalse, str: t.text}
	case "null":
		return literal{kind: kNull, str: t.text}
	}
	if n, ok := parseNumber(t.text); ok {
		return literal{kind: kNumber, num: n, str: t.text}
	}
	return literal{kind: kString, str: t.text}
}

// parseNumber reads a JSON number.
func parseNumber[T string | []byte](b T) (float64, bool) {
	if !isJSONNumber(b) {
		return 0, false
	}
	n, err := strconv.ParseFloat(string(b), 64)
	return n, err == nil || errors.Is(err, strconv.ErrRange)
}

// isJSONNumber checks JSON number syntax.
func isJSONNumber[T string | []byte](b T) bool {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i, n = i+1, n+1
		}
		return n
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if digits() == 0 {
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(b)
}

// matchText is a condition on a text field of the registry: "" is
// missing.
func (c *cond) matchText(v string) bool {
	switch c.op {
	case opExists:
		return v != ""
	case opMissing:
		return v == ""
	}
	if v == "" {
		return false
	}
	return compareText(c.op, v, c.lit.str)
}

func compareText(op whereOp, v, lit string) bool {
	switch op {
	case opPrefix:
		return strings.HasPrefix(v, lit)
	case opContains:
		return strings.Contains(v, lit)
	}
	return compare(op, v, lit)
}

// compare is one of = != < > <= >= (others: false).
func compare[T cmp.Ordered](op whereOp, v, lit T) bool {
	c := cmp.Compare(v, lit)
	switch op {
	case opEq:
		return c == 0
	case opNe:
		return c != 0
	case opLt:
		return c < 0
	case opGt:
		return c > 0
	case opLe:
		return c <= 0
	case opGe:
		return c >= 0
	}
	return false
}

// matchValue is a condition on a reported value of kind k (number: num;
// string: str). Every operator but missing needs the field reported; !=
// matches a reported field of another value or type. A number compares
// with a reported number as a number, with reported text as text (as
// written).
func (c *cond) matchValue(k valKind, num float64, str string) bool {
	switch c.op {
	case opExists:
		return k > kAbsent
	case opMissing:
		return k <= kAbsent
	}
	if k <= kAbsent {
		return false
	}
	lit := &c.lit
	switch {
	case lit.kind == kNumber && k == kNumber:
		return compare(c.op, num, lit.num)
	case (lit.kind == kNumber || lit.kind == kString) && k == kString:
		return compareText(c.op, str, lit.str)
	case lit.kind == kNumber || lit.kind == kString:
		return c.op == opNe
	default: // null, true, false: = and != only
		return (k == lit.kind) == (c.op == opEq)
	}
}
