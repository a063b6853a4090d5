package ctl

// Configuration layers (docs/configuration.md): a device's own values, a
// label's (group) values, a device type's JSON Schema, and a device's
// effective configuration with each member's source.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// Layer names one configuration layer: exactly one field is set.
type Layer struct {
	Device     string // a device's own values (its ID)
	Label      string // a label's values
	DeviceType string // a device type's schema
}

// path is the layer's API path.
func (l Layer) path() (string, error) {
	var out []string
	if l.Device != "" {
		out = append(out, "/api/v1/devices/"+url.PathEscape(l.Device)+"/config")
	}
	if l.Label != "" {
		out = append(out, "/api/v1/labels/"+url.PathEscape(l.Label)+"/config")
	}
	if l.DeviceType != "" {
		out = append(out, "/api/v1/device-types/"+url.PathEscape(l.DeviceType)+"/schema")
	}
	if len(out) != 1 {
		return "", UsageError{fmt.Errorf("name one layer: --device ID, --label NAME or --schema DEVICE_TYPE")}
	}
	return out[0], nil
}

// ConfigLayer shows a layer's current values.
func (c *Client) ConfigLayer(ctx context.Context, l Layer) error {
	p, err := l.path()
	if err != nil {
		return err
	}
	if err := c.noCSV("config get"); err != nil {
		return err
	}
	return c.show(ctx, p)
}

// EffectiveConfig shows a device's effective configuration: as JSON, or
// as a table of each member's value and source.
func (c *Client) EffectiveConfig(ctx context.Context, device string) error {
	raw, err := c.do(ctx, "GET", "/api/v1/devices/"+url.PathEscape(device)+"/config/effective", nil, nil)
	if err != nil {
		return err
	}
	if c.cfg.Output == OutputJSON {
		return c.writeJSON(raw)
	}
	var e struct {
		Version    json.Number       `json:"version"`
		SyncState  string            `json:"sync_state"`
		Config     json.RawMessage   `json:"config"`
		Sources    map[string]string `json:"sources"`
		Unresolved []string          `json:"unresolved"`
	}
	if err := json.Unmarshal(raw, &e); err != nil {
		return fmt.Errorf("answer: %w", err)
	}
	var doc any
	json.Unmarshal(e.Config, &doc)
	paths := make([]string, 0, len(e.Sources))
	for p := range e.Sources {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	rows := make([]map[string]json.RawMessage, 0, len(paths))
	for _, p := range paths {
		v, _ := json.Marshal(pointer(doc, p))
		path, _ := json.Marshal(p)
		src, _ := json.Marshal(e.Sources[p])
		rows = append(rows, map[string]json.RawMessage{"path": path, "value": v, "source": src})
	}
	fmt.Fprintf(c.cfg.Stdout, "version %s, %s\n", e.Version, e.SyncState)
	if len(e.Unresolved) > 0 {
		fmt.Fprintf(c.cfg.Stdout, "unresolved variables: %s\n", strings.Join(e.Unresolved, ", "))
	}
	return c.table(rows, cols("PATH=path", "VALUE=value!", "SOURCE=source"))
}

// pointer is the value at JSON pointer p in doc (nil: none).
func pointer(doc any, p string) any {
	for _, tok := range strings.Split(p, "/")[1:] {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch d := doc.(type) {
		case map[string]any:
			doc = d[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(d) {
				return nil
			}
			doc = d[i]
		default:
			return nil
		}
	}
	return doc
}

// SetConfigLayer sets a layer's values (a JSON object) and, for a label,
// its priority (nil: unchanged), and shows the layer.
func (c *Client) SetConfigLayer(ctx context.Context, l Layer, values json.RawMessage, priority *int) error {
	p, err := l.path()
	if err != nil {
		return err
	}
	if !json.Valid(values) {
		return UsageError{fmt.Errorf("the values are not valid JSON")}
	}
	body := map[string]any{"values": values}
	if priority != nil {
		body["priority"] = *priority
	}
	raw, err := c.do(ctx, "PUT", p, nil, body)
	if err != nil {
		return err
	}
	return c.object(raw)
}

// DeleteConfigLayer removes a layer's values (its history stays).
func (c *Client) DeleteConfigLayer(ctx context.Context, l Layer) error {
	p, err := l.path()
	if err != nil {
		return err
	}
	raw, err := c.do(ctx, "DELETE", p, nil, nil)
	if err != nil {
		return err
	}
	return c.object(raw)
}

// ConfigLayerHistory lists a layer's revisions.
func (c *Client) ConfigLayerHistory(ctx context.Context, l Layer) error {
	p, err := l.path()
	if err != nil {
		return err
	}
	raw, err := c.do(ctx, "GET", p+"/history", nil, nil)
	if err != nil {
		return err
	}
	return c.list(raw, "revisions", cols("REV=rev", "PRIORITY=priority", "DELETED=deleted", "BY=by", "AT=at", "NOTE=note"))
}

// ConfigLayerDiff shows what changed from revision from to revision to.
func (c *Client) ConfigLayerDiff(ctx context.Context, l Layer, from, to int) error {
	p, err := l.path()
	if err != nil {
		return err
	}
	raw, err := c.do(ctx, "GET", p+"/diff", url.Values{"from": {strconv.Itoa(from)}, "to": {strconv.Itoa(to)}}, nil)
	if err != nil {
		return err
	}
	return c.list(raw, "changes", cols("PATH=path", "OP=op", "OLD=old!", "NEW=new!"))
}

// RollbackConfigLayer makes revision rev's values the layer's again (a
// new revision).
func (c *Client) RollbackConfigLayer(ctx context.Context, l Layer, rev int) error {
	p, err := l.path()
	if err != nil {
		return err
	}
	raw, err := c.do(ctx, "POST", p+"/rollback", nil, map[string]int{"rev": rev})
	if err != nil {
		return err
	}
	return c.object(raw)
}
