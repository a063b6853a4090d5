package fleet

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

func TestParseWhere(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`state.cpu > 50`, `state.cpu > 50`},
		{`state.cpu>50 AND firmware=7.4.2`, `state.cpu > 50 and firmware = "7.4.2"`},
		{`state.extra.site = "north 1" and state.signal.rssi <= -80.5`, `state.extra.site = "north 1" and state.signal.rssi <= -80.5`},
		{`state.interfaces.0.name prefix eth`, `state.interfaces.0.name prefix "eth"`},
		{`state.temperature exists and serial missing`, `state.temperature exists and serial missing`},
		{`label = north and label != "sud est"`, `label = "north" and label != "sud est"`},
		{`state.ok = true and state.gone != null`, `state.ok = true and state.gone != null`},
		{`state.version = "2"`, `state.version = "2"`},
		{`device_type contains "ICR" and model >= a`, `device_type contains "ICR" and model >= "a"`},
		{`state.x = 1e3`, `state.x = 1e3`},
	} {
		w, err := ParseWhere(c.in)
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if got := w.String(); got != c.want {
			t.Errorf("%q: canonical %q, want %q", c.in, got, c.want)
		}
	}
	for _, c := range []struct{ in, msg string }{
		{``, "empty expression"},
		{`state.cpu`, "an operator must follow"},
		{`state.cpu >`, "a value must follow"},
		{`state.cpu > 5 state.mem > 1`, `expected "and"`},
		{`state.cpu > 5 and`, `a condition must follow "and"`},
		{`cpu > 5`, `unknown field "cpu"`},
		{`state. > 5`, "bad path"},
		{`state.a..b > 5`, "bad path"},
		{`state.a.b.c.d.e.f.g.h.i = 1`, "at most 8 parts"},
		{`state.cpu ~ 5`, "unexpected character"},
		{`state.cpu ! 5`, `"!" must be "!="`},
		{`state.cpu like 5`, `unknown operator "like"`},
		{`state.cpu = "open`, "not closed"},
		{`state.ok < true`, "takes = or != with true"},
		{`label prefix n`, "label takes = or !="},
		{`label exists`, "label takes = or !="},
		{`label = "a,b"`, "label"},
		{`state.cpu > = 5`, "a value must follow"},
		{strings.Repeat("state.a = 1 and ", 16) + "state.a = 1", "at most 16 conditions"},
		{strings.Repeat("x", MaxWhereBytes+1), "at most 1024 bytes"},
	} {
		_, err := ParseWhere(c.in)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != FilterWhere || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%q: %v; want a where error saying %q", c.in, err, c.msg)
		}
	}
}

func TestLookupJSON(t *testing.T) {
	doc := `{"cpu":12.5,"extra":{"site":"north","a\"b":"q","n":{"deep":[1,{"x":"y"}]}},"interfaces":[{"name":"eth0"},{"name":"wwan0"}],"s":"a\"b","cpu":13, "sp" : { "k" : true } }`
	for _, c := range []struct {
		path, want string
		ok         bool
	}{
		{"cpu", "13", true}, // the last of a repeated name, as encoding/json
		{"extra.site", `"north"`, true},
		{`extra.a"b`, `"q"`, true},
		{"extra.n.deep.1.x", `"y"`, true},
		{"extra.n.deep.2", "", false},
		{"extra.n.deep.x", "", false},
		{"interfaces.1.name", `"wwan0"`, true},
		{"interfaces.name", "", false},
		{"s", `"a\"b"`, true},
		{"sp.k", "true", true},
		{"cpu.x", "", false},
		{"nope", "", false},
	} {
		got, ok := lookupJSON(doc, strings.Split(c.path, "."))
		if ok != c.ok || got != c.want {
			t.Errorf("%s: %q %v; want %q %v", c.path, got, ok, c.want, c.ok)
		}
	}
	for _, bad := range []string{``, `{`, `{"a"`, `{"a":`, `{"a":1`, `{"a":"x`, `[1,`, `{"a" 1}`, `{"a":1 "b":2}`} {
		if v, ok := lookupJSON(bad, []string{"b"}); ok {
			t.Errorf("%q: found %q", bad, v)
		}
	}
}

// TestMatchValue: the comparison rules of docs/groups.md.
func TestMatchValue(t *testing.T) {
	for _, c := range []struct {
		expr, doc string
		want      bool
	}{
		{`state.cpu > 50`, `{"cpu":51}`, true},
		{`state.cpu > 50`, `{"cpu":50}`, false},
		{`state.cpu > 50`, `{}`, false},
		{`state.cpu > 50`, `{"cpu":"60"}`, true}, // text: "60" > "50"
		{`state.cpu = 5`, `{"cpu":5.0}`, true},
		{`state.cpu != 5`, `{"cpu":6}`, true},
		{`state.cpu != 5`, `{}`, false},
		{`state.cpu != 5`, `{"cpu":true}`, true},
		{`state.cpu missing`, `{}`, true},
		{`state.cpu missing`, `{"cpu":null}`, false},
		{`state.cpu exists`, `{"cpu":null}`, true},
		{`state.cpu = null`, `{"cpu":null}`, true},
		{`state.ok = true`, `{"ok":true}`, true},
		{`state.ok != true`, `{"ok":false}`, true},
		{`state.ok = true`, `{"ok":"true"}`, false},
		{`state.v = "2"`, `{"v":2}`, false},
		{`state.v = 2`, `{"v":"2"}`, true},
		{`state.site prefix "no"`, `{"site":"north"}`, true},
		{`state.site contains "rt"`, `{"site":"north"}`, true},
		{`state.site contains "rt"`, `{"site":1}`, false},
		{`state.site < "p"`, `{"site":"north"}`, true},
		{`state.o exists`, `{"o":{"a":1}}`, true},
		{`state.o = "x"`, `{"o":{"a":1}}`, false},
		{`state.o != "x"`, `{"o":[1]}`, true},
		{`state.e = "a\"b"`, `{"e":"a\"b"}`, true},
	} {
		w, err := ParseWhere(c.expr)
		if err != nil {
			t.Fatal(err)
		}
		if got := oracleMatch(w.conds[0], c.doc); got != c.want {
			t.Errorf("oracle: %s on %s: %v, want %v", c.expr, c.doc, got, c.want)
		}
		col := newColumn(w.conds[0].path, w.conds[0].segs)
		record(col, 7, c.doc)
		cw := &compiledWhere{conds: []ccond{{cond: w.conds[0], col: col}}}
		if got := cw.match(&device{id: 7}); got != c.want {
			t.Errorf("index: %s on %s: %v, want %v", c.expr, c.doc, got, c.want)
		}
	}
}

// oracleMatch evaluates a state condition on doc with encoding/json, as
// the rules say, independently of the index.
func oracleMatch(c cond, doc string) bool {
	var v any
	if json.Unmarshal([]byte(doc), &v) != nil {
		return c.op == opMissing
	}
	for _, s := range c.segs {
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[s]; !ok {
				return c.op == opMissing
			}
		case []any:
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 || n >= len(x) || strings.TrimLeft(s, "0123456789") != "" {
				return c.op == opMissing
			}
			v = x[n]
		default:
			return c.op == opMissing
		}
	}
	switch c.op {
	case opExists:
		return true
	case opMissing:
		return false
	}
	switch x := v.(type) {
	case float64:
		if c.lit.kind == kNumber {
			return compare(c.op, x, c.lit.num)
		}
		return c.op == opNe
	case string:
		if c.lit.kind == kNumber || c.lit.kind == kString {
			return compareText(c.op, x, c.lit.str)
		}
		return c.op == opNe
	case bool, nil:
		k := kNull
		if b, ok := x.(bool); ok {
			k = kFalse
			if b {
				k = kTrue
			}
		}
		if c.lit.kind == kNumber || c.lit.kind == kString {
			return c.op == opNe
		}
		return (k == c.lit.kind) == (c.op == opEq)
	default:
		return c.op == opNe
	}
}

func FuzzParseWhere(f *testing.F) {
	for _, s := range []string{`state.cpu > 50`, `state.extra.site = "n" and label != x`, `firmware prefix 7.`, `state.a.0.b exists`, `state.x = "\u00e9\"" and serial missing`, `state.n <= -1.5e-3`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		w, err := ParseWhere(s)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != FilterWhere {
				t.Fatalf("%q: error %v is not a where field error", s, err)
			}
			return
		}
		canon := w.String()
		w2, err := ParseWhere(canon)
		if err != nil {
			t.Fatalf("%q: canonical %q does not parse: %v", s, canon, err)
		}
		if w2.String() != canon {
			t.Fatalf("%q: canonical %q reads back as %q", s, canon, w2.String())
		}
		for i, c := range w.conds {
			c2 := w2.conds[i]
			if c.field != c2.field || c.path != c2.path || c.op != c2.op || c.lit.kind != c2.lit.kind || c.lit.str != c2.lit.str ||
				(c.lit.num != c2.lit.num && !(math.IsNaN(c.lit.num) && math.IsNaN(c2.lit.num))) {
				t.Fatalf("%q: condition %d changed through %q: %+v / %+v", s, i, canon, c, c2)
			}
		}
	})
}

// FuzzLookupJSON: on valid JSON the index finds what encoding/json finds.
func FuzzLookupJSON(f *testing.F) {
	f.Add(`{"a":{"b":[1,"x",{"c":null}]},"a":{"b":[2]}}`, "a.b.0")
	f.Add(`{"a\u0062":1}`, "ab")
	f.Fuzz(func(t *testing.T, doc, path string) {
		segs := strings.Split(path, ".")
		raw, ok := lookupJSON(doc, segs)
		var v any
		if !json.Valid([]byte(doc)) || json.Unmarshal([]byte(doc), &v) != nil {
			return
		}
		w, err := ParseWhere("state." + path + " exists")
		if err != nil {
			return
		}
		if want := oracleMatch(w.conds[0], doc); want != ok {
			t.Fatalf("%q at %q: found %v (%q), encoding/json %v", doc, path, ok, raw, want)
		}
	})
}
