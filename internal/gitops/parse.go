package gitops

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// Problem is one thing wrong with a description, where it is.
type Problem struct {
	Pos    Pos
	Reason string
}

func (p Problem) String() string { return p.Pos.String() + ": " + p.Reason }

// InvalidError is a description refused: every problem found, each with
// its file and line. Nothing was applied.
type InvalidError struct{ Problems []Problem }

func (e *InvalidError) Error() string {
	var b strings.Builder
	n := "a problem"
	if len(e.Problems) > 1 {
		n = strconv.Itoa(len(e.Problems)) + " problems"
	}
	fmt.Fprintf(&b, "the description has %s; nothing was applied:", n)
	for _, p := range e.Problems {
		b.WriteString("\n" + p.String())
	}
	return b.String()
}

// ExitCode is 2: input refused as invalid (docs/ctl.md).
func (e *InvalidError) ExitCode() int { return 2 }

// maxFileBytes bounds one file of a description.
const maxFileBytes = 16 << 20

// ReadPaths reads the documents of every path: a file, or a directory
// whose *.yaml and *.yml files are read in name order, subdirectories
// too (hidden ones, such as .git, skipped). A problem in any file is
// reported with all the others.
func ReadPaths(paths []string) ([]*Object, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		var found []string
		err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && path != p && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			if ext := filepath.Ext(path); !d.IsDir() && (ext == ".yaml" || ext == ".yml") {
				found = append(found, path)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("%s: no .yaml or .yml file in it", p)
		}
		sort.Strings(found)
		files = append(files, found...)
	}
	var all []*Object
	var problems []Problem
	for _, f := range files {
		b, err := readLimited(f)
		if err != nil {
			return nil, err
		}
		objs, err := Parse(f, b)
		var inv *InvalidError
		if errors.As(err, &inv) {
			problems = append(problems, inv.Problems...)
		} else if err != nil {
			return nil, err
		}
		all = append(all, objs...)
	}
	problems = append(problems, duplicates(all)...)
	if len(problems) > 0 {
		return nil, &InvalidError{problems}
	}
	return all, nil
}

func readLimited(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err == nil && len(b) > maxFileBytes {
		err = fmt.Errorf("%s: larger than %d MiB", name, maxFileBytes>>20)
	}
	return b, err
}

// duplicates reports an object described twice.
func duplicates(objs []*Object) []Problem {
	seen := map[string]*Object{}
	var out []Problem
	for _, o := range objs {
		id := o.Kind + "\x00" + o.Key()
		if first, ok := seen[id]; ok {
			out = append(out, Problem{o.Pos, fmt.Sprintf("%s is described twice (also at %s)", o.Name(), first.Pos)})
			continue
		}
		seen[id] = o
	}
	return out
}

// yamlLine finds the line in the YAML library's error messages.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// Parse reads the documents of one file (name is for the messages). Its
// error is an *InvalidError naming each problem's line.
func Parse(name string, data []byte) ([]*Object, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var objs []*Object
	var problems []Problem
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if err == io.EOF {
			break
		}
		if err != nil {
			p := Problem{Pos{name, 1}, strings.TrimPrefix(err.Error(), "yaml: ")}
			if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
				p.Pos.Line, _ = strconv.Atoi(m[1])
				p.Reason = m[2]
			}
			problems = append(problems, p)
			break // the decoder cannot go on after a syntax error
		}
		if len(doc.Content) == 0 || (doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].Tag == "!!null") {
			continue // an empty document
		}
		o, ps := object(name, doc.Content[0])
		sort.SliceStable(ps, func(i, j int) bool { return ps[i].Pos.Line < ps[j].Pos.Line })
		problems = append(problems, ps...)
		if o != nil {
			objs = append(objs, o)
		}
	}
	if len(problems) > 0 {
		return nil, &InvalidError{problems}
	}
	return objs, nil
}

// object reads one document.
func object(file string, n *yaml.Node) (*Object, []Problem) {
	at := func(n *yaml.Node) Pos { return Pos{file, n.Line} }
	if n.Kind != yaml.MappingNode {
		return nil, []Problem{{at(n), "a document must be a mapping with apiVersion and kind"}}
	}
	var problems []Problem
	bad := func(n *yaml.Node, format string, a ...any) {
		problems = append(problems, Problem{at(n), fmt.Sprintf(format, a...)})
	}
	keys := map[string]*yaml.Node{}
	vals := map[string]*yaml.Node{}
	var order []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
			bad(k, "a field name must be plain text")
			continue
		}
		if first, dup := keys[k.Value]; dup {
			bad(k, "field %q is given twice (also on line %d)", k.Value, first.Line)
			continue
		}
		keys[k.Value], vals[k.Value] = k, v
		order = append(order, k.Value)
	}
	kindNode, ok := vals["kind"]
	if !ok {
		return nil, append(problems, Problem{at(n), "kind is missing: one of " + strings.Join(Kinds, ", ")})
	}
	kind := kindNode.Value
	fields, known := kindFields[kind]
	if kindNode.Kind != yaml.ScalarNode || !known {
		return nil, append(problems, Problem{at(kindNode), fmt.Sprintf("unknown kind %q: one of %s", kind, strings.Join(Kinds, ", "))})
	}
	o := &Object{Kind: kind, Fields: map[string]any{}, Pos: at(kindNode), Lines: map[string]int{}}
	if v, ok := vals["apiVersion"]; !ok {
		bad(kindNode, "apiVersion is missing: apiVersion: %s", APIVersion)
	} else if v.Kind != yaml.ScalarNode || v.Value != APIVersion {
		bad(v, "apiVersion must be %s, not %q", APIVersion, v.Value)
	}
	byName := map[string]field{}
	for _, f := range fields {
		byName[f.name] = f
	}
	for _, name := range order {
		if name == "kind" || name == "apiVersion" {
			continue
		}
		k, v := keys[name], vals[name]
		f, ok := byName[name]
		if !ok {
			if what, secret := secretFields[name]; secret {
				bad(k, "%s never go in a description: %s are set with drover ctl users and tokens", what, what)
				continue
			}
			bad(k, "unknown field %q in %s: its fields are %s", name, kind, fieldNames(fields))
			continue
		}
		o.Lines[name] = k.Line
		val, err := value(v, f.typ)
		if err != nil {
			bad(err.node, "%s: %s", name, err.msg)
			continue
		}
		o.Fields[name] = val
	}
	for _, f := range fields {
		if _, ok := keys[f.name]; f.required && !ok {
			bad(kindNode, "%s has no %s", kind, f.name)
		}
		if s, ok := o.Fields[f.name].(string); ok && f.key && strings.TrimSpace(s) == "" {
			bad(keys[f.name], "%s must not be empty", f.name)
		}
	}
	if kind == KindDeviceLayer {
		if s, ok := o.Fields["device"].(string); ok && s != "" {
			if _, err := strconv.ParseUint(s, 10, 64); err != nil {
				bad(keys["device"], "device must be a device ID (a number), not %q", s)
			}
		}
	}
	return o, problems
}

func fieldNames(fs []field) string {
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.name
	}
	return strings.Join(names, ", ")
}

// valueError is a wrong value, at its node.
type valueError struct {
	node *yaml.Node
	msg  string
}

// value reads a field's value as t.
func value(n *yaml.Node, t ftype) (any, *valueError) {
	v, err := jsonValue(n, 0)
	if err != nil {
		return nil, err
	}
	wrong := &valueError{n, "must be " + t.String()}
	switch t {
	case tString:
		// A scalar written plainly (1.4.0, 12) is its text.
		if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
			return nil, wrong
		}
		return n.Value, nil
	case tInt:
		if i, ok := v.(int64); ok {
			return i, nil
		}
		return nil, wrong
	case tNumber:
		switch x := v.(type) {
		case int64:
			return float64(x), nil
		case float64:
			return x, nil
		}
		return nil, wrong
	case tBool:
		if _, ok := v.(bool); !ok {
			return nil, wrong
		}
	case tStrings:
		l, ok := v.([]any)
		if !ok {
			return nil, wrong
		}
		for i, e := range l {
			if _, ok := e.(string); !ok {
				return nil, &valueError{n.Content[i], "must be a string"}
			}
		}
	case tObject:
		if _, ok := v.(map[string]any); !ok {
			return nil, wrong
		}
	}
	return v, nil
}

// maxDepth bounds the nesting of a value.
const maxDepth = 64

// jsonValue turns a node into a JSON value. Anchors' aliases and
// non-text keys are refused: a description says each value once.
func jsonValue(n *yaml.Node, depth int) (any, *valueError) {
	if depth > maxDepth {
		return nil, &valueError{n, fmt.Sprintf("nested deeper than %d", maxDepth)}
	}
	switch n.Kind {
	case yaml.AliasNode:
		return nil, &valueError{n, "aliases (*name) are not supported: write the value out"}
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		lines := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
				return nil, &valueError{k, "a key must be plain text"}
			}
			if l, dup := lines[k.Value]; dup {
				return nil, &valueError{k, fmt.Sprintf("key %q is given twice (also on line %d)", k.Value, l)}
			}
			lines[k.Value] = k.Line
			v, err := jsonValue(n.Content[i+1], depth+1)
			if err != nil {
				return nil, err
			}
			m[k.Value] = v
		}
		return m, nil
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		for _, e := range n.Content {
			v, err := jsonValue(e, depth+1)
			if err != nil {
				return nil, err
			}
			l = append(l, v)
		}
		return l, nil
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return nil, nil
		case "!!bool":
			var b bool
			if err := n.Decode(&b); err != nil {
				return nil, &valueError{n, err.Error()}
			}
			return b, nil
		case "!!int":
			var i int64
			if err := n.Decode(&i); err == nil {
				return i, nil
			}
			var f float64
			if err := n.Decode(&f); err != nil {
				return nil, &valueError{n, "not a number JSON can hold"}
			}
			return f, nil
		case "!!float":
			var f float64
			if err := n.Decode(&f); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				return nil, &valueError{n, "not a number JSON can hold"}
			}
			return f, nil
		case "!!str":
			return n.Value, nil
		default:
			return nil, &valueError{n, fmt.Sprintf("values of tag %s are not supported", n.ShortTag())}
		}
	}
	return nil, &valueError{n, "not a value"}
}
