package fleet

// Device types' JSON Schemas (docs/configuration.md, "Schemas"): a
// configuration layer change whose merged result, for any device it
// reaches, breaks its device type's schema is refused, and nothing
// changes. Variables are checked as written (strings).

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// layerSchema is a device type's compiled schema and the layer it came
// from.
type layerSchema struct {
	layer  ConfigLayer
	schema *jsonschema.Schema
}

// compileSchema compiles a JSON Schema; it may not load other documents.
func compileSchema(deviceType string, raw []byte) (*layerSchema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("schema is not JSON: %v", err)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(jsonschema.SchemeURLLoader{}) // no files, no network
	loc := "drover:schema/" + deviceType
	if err := c.AddResource(loc, doc); err != nil {
		return nil, fmt.Errorf("schema: %v", err)
	}
	sch, err := c.Compile(loc)
	if err != nil {
		return nil, fmt.Errorf("schema does not compile: %v", err)
	}
	return &layerSchema{layer: ConfigLayer{Kind: LayerSchema, Name: deviceType, Values: raw}, schema: sch}, nil
}

// check validates one merged configuration.
func (sc *layerSchema) check(merged []byte) error {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(merged))
	if err != nil {
		return err
	}
	return sc.schema.Validate(doc)
}

// checkSchemas refuses next when, with it in place, the merged
// configuration of a device it reaches breaks the device's type's schema;
// each distinct merge (profile and layers) is checked once. l.write held.
func (l *layerState) checkSchemas(next ConfigLayer) error {
	l.mu.RLock()
	schemas := maps.Clone(l.schemas)
	l.mu.RUnlock()
	if next.Kind == LayerSchema {
		if next.Deleted {
			return nil
		}
		sc, err := compileSchema(next.Name, next.Values)
		if err != nil {
			return &FieldError{Field: "values", Message: err.Error()}
		}
		schemas = map[string]*layerSchema{next.Name: sc}
	}
	if len(schemas) == 0 {
		return nil
	}
	names := l.labelNames()
	labelID, labelKnown := names.byName[next.Name]
	devID, _ := strconv.ParseUint(next.Name, 10, 64)
	seen := map[string]bool{}
	var first error
	l.devs.each(func(d *device) {
		sc := schemas[d.deviceType]
		if first != nil || sc == nil {
			return
		}
		switch next.Kind {
		case LayerDevice:
			if d.id != devID {
				return
			}
		case LayerLabel:
			if _, has := slices.BinarySearch(d.labels, labelID); !labelKnown || !has {
				return
			}
		}
		in := l.inputsWith(d, names, &next)
		p := d.profile.get()
		key := in.key(p)
		if seen[key] {
			return
		}
		seen[key] = true
		merged, _ := in.merge(p, nil)
		if err := sc.check(encodeJSON(merged)); err != nil {
			first = fmt.Errorf("%w: device %d (%s, profile %d): %v", ErrSchema, d.id, d.deviceType, p.ID, strings.TrimSpace(err.Error()))
		}
	})
	return first
}

// inputsWith is inputs with next in place of its layer's current
// revision (d.mu held).
func (l *layerState) inputsWith(d *device, names *labelNames, next *ConfigLayer) layerInputs {
	in := l.inputs(d, names)
	switch next.Kind {
	case LayerDevice:
		if strconv.FormatUint(d.id, 10) == next.Name {
			in.device = next
			if next.Deleted {
				in.device = nil
			}
		}
	case LayerLabel:
		in.labels = slices.DeleteFunc(in.labels, func(c *ConfigLayer) bool { return c.Name == next.Name })
		id, ok := names.byName[next.Name]
		if _, has := slices.BinarySearch(d.labels, id); ok && has && !next.Deleted {
			in.labels = append(in.labels, next)
			slices.SortStableFunc(in.labels, func(a, b *ConfigLayer) int {
				if a.Priority != b.Priority {
					return a.Priority - b.Priority
				}
				return strings.Compare(a.Name, b.Name)
			})
		}
	}
	return in
}

// key names a merge: the profile's version and each layer's revision.
func (in layerInputs) key(p *Profile) string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(p.Version, 10))
	for _, c := range in.labels {
		fmt.Fprintf(&b, "\x00%s\x00%d\x00%d", c.Name, c.Rev, len(c.Values))
	}
	if c := in.device; c != nil {
		fmt.Fprintf(&b, "\x00device %s\x00%d", c.Name, c.Rev)
	}
	return b.String()
}

// checkProfileSchema refuses next, a profile's new configuration, when it
// breaks its device type's schema alone or merged with the layers of any
// device on the profile (e).
func (l *layerState) checkProfileSchema(e *profileEntry, next *Profile) error {
	l.mu.RLock()
	sc := l.schemas[next.DeviceType]
	l.mu.RUnlock()
	if sc == nil {
		return nil
	}
	names := l.labelNames()
	seen := map[string]bool{}
	check := func(in layerInputs, what string) error {
		key := in.key(next)
		if seen[key] {
			return nil
		}
		seen[key] = true
		merged, _ := in.merge(next, nil)
		if err := sc.check(encodeJSON(merged)); err != nil {
			return fmt.Errorf("%w: profile %d (%s)%s: %v", ErrSchema, next.ID, next.DeviceType, what, strings.TrimSpace(err.Error()))
		}
		return nil
	}
	if err := check(layerInputs{}, ""); err != nil {
		return err
	}
	var first error
	l.devs.each(func(d *device) {
		if first == nil && d.profile == e {
			first = check(l.inputs(d, names), " with the layers of device "+strconv.FormatUint(d.id, 10))
		}
	})
	return first
}
