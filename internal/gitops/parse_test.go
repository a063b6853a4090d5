package gitops

import (
	"bytes"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestReadPathsFixture(t *testing.T) {
	objs, err := ReadPaths([]string{filepath.Join("testdata", "fleet")})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range objs {
		names = append(names, o.Name()+"@"+o.Pos.String())
	}
	want := []string{
		"Label north@" + filepath.Join("testdata", "fleet", "labels.yaml") + ":3",
		"LabelLayer north@" + filepath.Join("testdata", "fleet", "labels.yaml") + ":8",
		"RolloutPolicy canary-first@" + filepath.Join("testdata", "fleet", "rollouts.yaml") + ":3",
		"AlertRule hot@" + filepath.Join("testdata", "fleet", "rules.yml") + ":2",
		"User alice@" + filepath.Join("testdata", "fleet", "rules.yml") + ":10",
	}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("objects:\n%q\nwant\n%q", names, want)
	}
	ll := objs[1]
	if ll.Fields["priority"] != int64(5) || ll.Lines["values"] != 11 {
		t.Fatalf("label layer: %#v lines %v", ll.Fields, ll.Lines)
	}
	vals := ll.Fields["values"].(map[string]any)
	if vals["apn"] != "internet.north" || vals["log"].(map[string]any)["level"] != "debug" {
		t.Fatalf("values: %#v", vals)
	}
	if p := objs[2]; !reflect.DeepEqual(p.Fields["waves"], []any{"1", "10%", "100%"}) || p.Fields["max_failure_pct"] != 2.5 ||
		p.Fields["stall_timeout"] != int64(900) || p.Fields["window"].(map[string]any)["end"] != "04:00" || p.Lines["window"] != 8 {
		t.Fatalf("rollout policy: %#v lines %v", p.Fields, p.Lines)
	}
	if r := objs[3]; r.Fields["threshold"] != float64(70) || !reflect.DeepEqual(r.Fields["email"], []any{"ops@example.com"}) {
		t.Fatalf("rule: %#v", r.Fields)
	}
}

func TestInvalidFixture(t *testing.T) {
	_, err := ReadPaths([]string{filepath.Join("testdata", "invalid", "bad.yaml")})
	var inv *InvalidError
	if !errors.As(err, &inv) {
		t.Fatalf("err %v, want *InvalidError", err)
	}
	f := filepath.Join("testdata", "invalid", "bad.yaml")
	want := []string{
		f + ":5: push_interval: must be a whole number",
		f + ":11: passwords never go in a description: passwords are set with drover ctl users and tokens",
		f + ":13: apiVersion must be drover/v1, not \"drover/v2\"",
		f + ":17: unknown field \"colour\" in Label: its fields are name, filter",
		f + ":19: unknown kind \"Gadget\": one of " + strings.Join(Kinds, ", "),
		f + ":23: device must be a device ID (a number), not \"twelve\"",
		f + ":24: values: must be a mapping",
	}
	var got []string
	for _, p := range inv.Problems {
		got = append(got, p.String())
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("problems:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if inv.ExitCode() != 2 {
		t.Fatalf("exit code %d", inv.ExitCode())
	}
}

func TestParseProblems(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"syntax", "apiVersion: drover/v1\nkind: Label\nname: \"x\n", "f.yaml:3: found unexpected end of stream"},
		{"not a mapping", "- a\n- b\n", "f.yaml:1: a document must be a mapping with apiVersion and kind"},
		{"no kind", "apiVersion: drover/v1\nname: x\n", "f.yaml:1: kind is missing: one of " + strings.Join(Kinds, ", ")},
		{"no apiVersion", "kind: User\nname: a\nrole: viewer\n", "f.yaml:1: apiVersion is missing: apiVersion: drover/v1"},
		{"missing field", "apiVersion: drover/v1\nkind: User\nname: a\n", "f.yaml:2: User has no role"},
		{"twice", "apiVersion: drover/v1\nkind: User\nname: a\nrole: viewer\nname: b\n", "f.yaml:5: field \"name\" is given twice (also on line 3)"},
		{"alias", "apiVersion: drover/v1\nkind: DeviceLayer\ndevice: \"1\"\nvalues:\n  a: &x 1\n  b: *x\n", "f.yaml:6: values: aliases (*name) are not supported: write the value out"},
		{"key twice inside", "apiVersion: drover/v1\nkind: DeviceLayer\ndevice: \"1\"\nvalues:\n  a: 1\n  a: 2\n", "f.yaml:6: values: key \"a\" is given twice (also on line 5)"},
		{"empty key", "apiVersion: drover/v1\nkind: Label\nname: \"  \"\nfilter: a = b\n", "f.yaml:3: name must not be empty"},
		{"nan", "apiVersion: drover/v1\nkind: DeviceLayer\ndevice: \"1\"\nvalues:\n  a: .nan\n", "f.yaml:5: values: not a number JSON can hold"},
		{"token", "apiVersion: drover/v1\nkind: User\nname: a\nrole: viewer\ntokens: []\n", "f.yaml:5: tokens never go in a description: tokens are set with drover ctl users and tokens"},
		{"strings", "apiVersion: drover/v1\nkind: AlertRule\nname: a\ncondition: offline\nemail: [a, {b: 1}]\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("f.yaml", []byte(tc.in))
			if tc.want == "" {
				if err == nil {
					t.Fatal("accepted")
				}
				return
			}
			var inv *InvalidError
			if !errors.As(err, &inv) || len(inv.Problems) != 1 || inv.Problems[0].String() != tc.want {
				t.Fatalf("got %v\nwant %s", err, tc.want)
			}
		})
	}
}

func TestDuplicateObjects(t *testing.T) {
	in := "apiVersion: drover/v1\nkind: User\nname: a\nrole: viewer\n---\napiVersion: drover/v1\nkind: User\nname: a\nrole: admin\n"
	objs, err := Parse("f.yaml", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	p := duplicates(objs)
	if len(p) != 1 || p[0].String() != "f.yaml:7: User a is described twice (also at f.yaml:2)" {
		t.Fatalf("%v", p)
	}
}

// Encode then Parse gives the same objects.
func TestEncodeRoundTrip(t *testing.T) {
	objs, err := ReadPaths([]string{filepath.Join("testdata", "fleet")})
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse("enc.yaml", Encode(objs))
	if err != nil {
		t.Fatalf("%v\n%s", err, Encode(objs))
	}
	if len(back) != len(objs) {
		t.Fatalf("%d objects, want %d", len(back), len(objs))
	}
	for i := range objs {
		if !sameFields(objs[i], back[i]) || objs[i].Kind != back[i].Kind {
			t.Fatalf("%s: %#v, want %#v", objs[i].Name(), back[i].Fields, objs[i].Fields)
		}
	}
}

func TestUnifiedDiff(t *testing.T) {
	got := unifiedDiff("a", "b", "x: 1\ny: 2\nz: 3\n", "x: 1\ny: 4\nz: 3\n")
	want := "--- a\n+++ b\n@@ -1,3 +1,3 @@\n x: 1\n-y: 2\n+y: 4\n z: 3\n"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if got := unifiedDiff("/dev/null", "b", "", "x: 1\n"); got != "--- /dev/null\n+++ b\n@@ -0,0 +1,1 @@\n+x: 1\n" {
		t.Fatalf("created: %q", got)
	}
}

// FuzzParse: no input makes the parser panic or hang, every problem has a
// line, and what it accepts encodes to documents it reads back the same.
func FuzzParse(f *testing.F) {
	f.Add([]byte("apiVersion: drover/v1\nkind: Label\nname: north\nfilter: a = b\n"))
	f.Add([]byte("apiVersion: drover/v1\nkind: DeviceLayer\ndevice: \"12\"\nvalues: {a: [1, 2.5, null, true], b: {c: x}}\n---\n---\nkind: User\n"))
	f.Add([]byte("a: &x [*x]\n"))
	f.Add([]byte("apiVersion: drover/v1\nkind: AlertRule\nname: r\ncondition: cpu_above\nthreshold: 1e3\nemail: [a]\n"))
	f.Add([]byte("%YAML 1.2\n---\n!!binary aGk=\n...\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		objs, err := Parse("f.yaml", in)
		var inv *InvalidError
		if err != nil {
			if !errors.As(err, &inv) {
				t.Fatalf("error %T %v", err, err)
			}
			for _, p := range inv.Problems {
				if p.Pos.Line < 1 || p.Pos.File != "f.yaml" {
					t.Fatalf("problem without a line: %v", p)
				}
			}
			return
		}
		enc := Encode(objs)
		back, err := Parse("g.yaml", enc)
		if err != nil {
			t.Fatalf("encoded objects refused: %v\n%s", err, enc)
		}
		if len(back) != len(objs) {
			t.Fatalf("%d objects back, want %d\n%s", len(back), len(objs), enc)
		}
		for i := range objs {
			if objs[i].Kind != back[i].Kind || !sameFields(objs[i], back[i]) {
				t.Fatalf("%s changed:\n%#v\n%#v\n%s", objs[i].Name(), objs[i].Fields, back[i].Fields, enc)
			}
		}
		if !bytes.Equal(Encode(back), enc) {
			t.Fatalf("encoding not stable:\n%s\n%s", enc, Encode(back))
		}
	})
}
