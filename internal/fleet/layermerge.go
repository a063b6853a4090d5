package fleet

// How layers merge and variables resolve (docs/configuration.md): the
// merge is RFC 7386 JSON Merge Patch, each layer a patch over the result
// of the ones below; variables are ${NAME} or ${NAME:-DEFAULT} inside
// string values.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
)

// Variables a configuration may use, besides label.KEY.
var deviceVariables = []string{"device.id", "device.machine_id", "device.serial", "device.type", "device.model", "device.firmware"}

// layeredVersionBit marks the versions of effective configurations that
// are not a profile's own: profile versions count up from 1 and never
// reach it, so the two never meet. Versions stay below 2^53, exact as
// JSON numbers in every client.
const layeredVersionBit = int64(1) << 52

// compute merges the layers over p's configuration and resolves the
// variables for d (d.mu held); sources: also say where each member comes
// from.
func (in layerInputs) compute(d *device, p *Profile, names *labelNames, st *stateSource, sources bool) EffectiveConfig {
	var srcs map[string]string
	if sources {
		srcs = map[string]string{}
	}
	root, refs := in.merge(p, srcs)
	var unresolved []string
	lookup := func(name string) (string, bool) {
		if path, ok := strings.CutPrefix(name, "state."); ok {
			return st.lookup(path)
		}
		return variable(d, names, name)
	}
	out := resolveValue(root, lookup, &unresolved).(map[string]any)
	cfg := encodeJSON(out)
	e := EffectiveConfig{Config: cfg, Sources: srcs, Layers: refs, Unresolved: unresolved}
	if refs == nil {
		e.Layers = []LayerRef{}
	}
	if len(refs) == 0 && bytes.Equal(cfg, compactJSON(p.Config)) {
		// Variables in the profile that resolved to what is written: the
		// profile's own version.
		e.Config, e.Version = p.Config, p.Version
		return e
	}
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(p.Version))
	h.Write(b[:])
	for _, r := range refs {
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00", r.Kind, r.Name, r.Rev)
	}
	h.Write(cfg)
	e.Version = int64(h.Sum64()&uint64(layeredVersionBit-1)) | layeredVersionBit
	return e
}

// merge merges the layers over p's configuration, variables as written;
// srcs (when not nil) learns each member's source.
func (in layerInputs) merge(p *Profile, srcs map[string]string) (map[string]any, []LayerRef) {
	root, ok := decodeObject(p.Config)
	if !ok {
		root = map[string]any{}
	}
	if srcs != nil {
		markSources(root, "", "profile", srcs)
	}
	var refs []LayerRef
	apply := func(c *ConfigLayer, source string) {
		refs = append(refs, LayerRef{Kind: c.Kind, Name: c.Name, Rev: c.Rev, Priority: c.Priority})
		if over, ok := decodeObject(c.Values); ok {
			mergePatch(root, over, "", source, srcs)
		}
	}
	for _, c := range in.labels {
		apply(c, "label "+c.Name)
	}
	if in.device != nil {
		apply(in.device, "device")
	}
	return root, refs
}

// decodeObject decodes a JSON object, numbers as written.
func decodeObject(raw []byte) (map[string]any, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if dec.Decode(&m) != nil || m == nil {
		return nil, false
	}
	return m, true
}

// encodeJSON writes v compactly, members sorted, without HTML escaping.
func encodeJSON(v any) json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) != nil {
		return json.RawMessage("{}")
	}
	return bytes.TrimRight(b.Bytes(), "\n")
}

// mergePatch merges over into dst (RFC 7386): objects member by member,
// null removes a member, any other value replaces. srcs (when not nil)
// follows each member's source.
func mergePatch(dst, over map[string]any, path, source string, srcs map[string]string) {
	keys := make([]string, 0, len(over))
	for k := range over {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, p := over[k], path+"/"+pointerEscape(k)
		if v == nil {
			delete(dst, k)
			dropSources(srcs, p)
			continue
		}
		if vm, ok := v.(map[string]any); ok {
			dm, isObj := dst[k].(map[string]any)
			if !isObj {
				dropSources(srcs, p)
				dm = map[string]any{}
				dst[k] = dm
			}
			mergePatch(dm, vm, p, source, srcs)
			if len(dm) == 0 && srcs != nil && !isObj {
				srcs[p] = source
			}
			continue
		}
		dropSources(srcs, p)
		dst[k] = v
		if srcs != nil {
			srcs[p] = source
		}
	}
	if srcs != nil && len(dst) > 0 {
		delete(srcs, path) // no longer an empty object
	}
}

// markSources says source for every member of m.
func markSources(m map[string]any, path, source string, srcs map[string]string) {
	if len(m) == 0 && path != "" {
		srcs[path] = source
	}
	for k, v := range m {
		p := path + "/" + pointerEscape(k)
		if vm, ok := v.(map[string]any); ok {
			markSources(vm, p, source, srcs)
			continue
		}
		srcs[p] = source
	}
}

// dropSources forgets the sources of p and everything below it.
func dropSources(srcs map[string]string, p string) {
	if srcs == nil {
		return
	}
	for k := range srcs {
		if k == p || strings.HasPrefix(k, p+"/") {
			delete(srcs, k)
		}
	}
}

// resolveValue replaces the variables in every string of v.
func resolveValue(v any, lookup func(string) (string, bool), unresolved *[]string) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			v[k] = resolveValue(x, lookup, unresolved)
		}
		return v
	case []any:
		for i, x := range v {
			v[i] = resolveValue(x, lookup, unresolved)
		}
		return v
	case string:
		if !strings.Contains(v, "$") {
			return v
		}
		out, _ := expandVariables(v, func(name string) (string, bool) {
			val, ok := lookup(name)
			if !ok && unresolved != nil {
				*unresolved = append(*unresolved, name)
			}
			return val, ok
		})
		return out
	}
	return v
}

// expandVariables replaces ${NAME} and ${NAME:-DEFAULT} in s; $${ is a
// literal ${. A name lookup has no value for becomes DEFAULT, or the
// empty string. It fails on a ${ without its }, and on a name that is not
// a variable (lookup nil: only the syntax and names are checked).
func expandVariables(s string, lookup func(string) (string, bool)) (string, error) {
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		if i > 0 && s[i-1] == '$' { // $${: a literal ${
			b.WriteString(s[:i-1])
			b.WriteString("${")
			s = s[i+2:]
			continue
		}
		b.WriteString(s[:i])
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", fmt.Errorf("%q has a ${ without its closing }", s[i:])
		}
		ref := s[i+2 : i+end]
		s = s[i+end+1:]
		name, def, _ := strings.Cut(ref, ":-")
		if err := checkVariableName(name); err != nil {
			return "", err
		}
		if lookup == nil {
			continue
		}
		if v, ok := lookup(name); ok {
			b.WriteString(v)
		} else {
			b.WriteString(def)
		}
	}
}

// checkVariableName says whether name is a variable.
func checkVariableName(name string) error {
	if p, ok := strings.CutPrefix(name, "state."); ok {
		if p == "" || strings.HasPrefix(p, ".") || strings.HasSuffix(p, ".") || strings.Contains(p, "..") {
			return fmt.Errorf("${%s}: state variables are ${state.MEMBER} or ${state.MEMBER.MEMBER…}, members of the state the device reports", name)
		}
		return nil
	}
	if k, ok := strings.CutPrefix(name, "label."); ok {
		if k == "" || strings.ContainsAny(k, ",=") {
			return fmt.Errorf("${%s}: label variables are ${label.KEY}, KEY a label's name before its '='", name)
		}
		return nil
	}
	for _, v := range deviceVariables {
		if name == v {
			return nil
		}
	}
	return fmt.Errorf("unknown variable ${%s}: the variables are ${%s}, ${label.KEY} and ${state.MEMBER}", name, strings.Join(deviceVariables, "}, ${"))
}

// CheckVariables checks every variable in a configuration's strings (a
// *FieldError for field when one is not a variable or is not closed).
func CheckVariables(field string, raw []byte) error {
	if !bytes.Contains(raw, []byte("${")) {
		return nil
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return nil // NormalizeConfig reports it
	}
	var first error
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				walk(path+"/"+pointerEscape(k), x)
			}
		case []any:
			for i, x := range v {
				walk(path+"/"+strconv.Itoa(i), x)
			}
		case string:
			if _, err := expandVariables(v, nil); err != nil && first == nil {
				first = &FieldError{Field: field, Message: field + " at " + path + ": " + err.Error()}
			}
		}
	}
	walk("", v)
	return first
}

// variable is the value of variable name for d (d.mu held).
func variable(d *device, names *labelNames, name string) (string, bool) {
	switch name {
	case "device.id":
		return strconv.FormatUint(d.id, 10), true
	case "device.machine_id":
		return d.machineID(), true
	case "device.serial":
		return d.serial(), d.serial() != ""
	case "device.type":
		return d.deviceType, true
	case "device.model":
		return d.model, d.model != ""
	case "device.firmware":
		return d.firmware, d.firmware != ""
	}
	key, ok := strings.CutPrefix(name, "label.")
	if !ok {
		return "", false
	}
	// The first of the device's labels named KEY=VALUE, by name.
	best, found := "", false
	for _, id := range d.labels {
		n := names.byID[id]
		if k, v, ok := strings.Cut(n, "="); ok && k == key && (!found || v < best) {
			best, found = v, true
		}
	}
	return best, found
}

// ConfigMember is one member of an effective configuration: its JSON
// pointer, its value and where it comes from.
type ConfigMember struct {
	Path   string
	Value  json.RawMessage
	Source string
}

// Members lists e's members with their sources, by path.
func (e EffectiveConfig) Members() []ConfigMember {
	doc, _ := decodeObject(e.Config)
	out := make([]ConfigMember, 0, len(e.Sources))
	for p, src := range e.Sources {
		var v any = doc
		for _, tok := range strings.Split(p, "/")[1:] {
			m, _ := v.(map[string]any)
			v = m[strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")]
		}
		out = append(out, ConfigMember{Path: p, Value: encodeJSON(v), Source: src})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// stateValue is one ${state.…} variable's value, ok false: none.
type stateValue struct {
	v  string
	ok bool
}

// stateSource gives ${state.PATH} variables their values: from the push
// being answered, else from the state memory keeps (memory and write-back
// modes), else as last resolved (prev); it records what it was asked.
type stateSource struct {
	pushed []byte
	mem    string
	prev   *effCache
	doc    map[string]any
	read   bool
	used   map[string]stateValue
}

func (s *stateSource) lookup(path string) (string, bool) {
	if s == nil {
		return "", false
	}
	var sv stateValue
	switch {
	case len(s.pushed) > 0 || s.mem != "":
		if !s.read {
			raw := s.pushed
			if len(raw) == 0 {
				raw = []byte(s.mem)
			}
			s.doc, _ = decodeObject(raw)
			s.read = true
		}
		sv.v, sv.ok = stateMember(s.doc, path)
	case s.prev != nil:
		sv = s.prev.state[path]
	}
	if s.used == nil {
		s.used = map[string]stateValue{}
	}
	s.used[path] = sv
	return sv.v, sv.ok
}

// sameState says whether state gives the ${state.…} variables c was
// resolved with the same values.
func (c *effCache) sameState(state []byte) bool {
	if len(c.state) == 0 {
		return true
	}
	doc, _ := decodeObject(state)
	for path, was := range c.state {
		v, ok := stateMember(doc, path)
		if ok != was.ok || v != was.v {
			return false
		}
	}
	return true
}

// stateMember is the scalar at a dotted path of a reported state: a
// string as it is, a number as written, true or false; anything else
// (an object, an array, null, nothing) has no value.
func stateMember(doc map[string]any, path string) (string, bool) {
	var v any = doc
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return "", false
		}
		v = m[k]
	}
	switch v := v.(type) {
	case string:
		return v, true
	case json.Number:
		return v.String(), true
	case bool:
		return strconv.FormatBool(v), true
	}
	return "", false
}
