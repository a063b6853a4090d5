package ctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// col is a column of a table: its heading, the JSON key it shows, and
// whether the value is shown as compact JSON.
type col struct {
	head, key string
	asJSON    bool
}

// cols makes columns from "HEAD=key" pairs; "HEAD=key!" shows the value
// as compact JSON.
func cols(spec ...string) []col {
	out := make([]col, len(spec))
	for i, s := range spec {
		h, k, _ := strings.Cut(s, "=")
		raw := strings.HasSuffix(k, "!")
		out[i] = col{h, strings.TrimSuffix(k, "!"), raw}
	}
	return out
}

// writeJSON writes an answer as the API gave it, ending in a newline.
func (c *Client) writeJSON(raw []byte) error {
	if _, err := c.cfg.Stdout.Write(raw); err != nil {
		return err
	}
	if len(raw) == 0 || raw[len(raw)-1] != '\n' {
		_, err := io.WriteString(c.cfg.Stdout, "\n")
		return err
	}
	return nil
}

// list writes an answer holding a list under key: as JSON, or as a
// table of cs.
func (c *Client) list(raw []byte, key string, cs []col) error {
	if c.cfg.Output == OutputJSON {
		return c.writeJSON(raw)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("answer is not a JSON object: %w", err)
	}
	var rows []map[string]json.RawMessage
	if err := json.Unmarshal(m[key], &rows); err != nil && len(m[key]) > 0 && string(m[key]) != "null" {
		return fmt.Errorf("answer's %s is not a list: %w", key, err)
	}
	if err := c.table(rows, cs); err != nil {
		return err
	}
	if next := cell(m["next_cursor"]); next != "" {
		fmt.Fprintf(c.cfg.Stderr, "more: add --cursor %s for the next page\n", next)
	}
	return nil
}

// table writes rows as aligned columns.
func (c *Client) table(rows []map[string]json.RawMessage, cs []col) error {
	tw := tabwriter.NewWriter(c.cfg.Stdout, 0, 4, 2, ' ', 0)
	heads := make([]string, len(cs))
	for i, cl := range cs {
		heads[i] = cl.head
	}
	fmt.Fprintln(tw, strings.Join(heads, "\t"))
	for _, r := range rows {
		cells := make([]string, len(cs))
		for i, cl := range cs {
			v := cell(r[cl.key])
			if cl.asJSON {
				v = compact(r[cl.key])
			}
			cells[i] = tabSafe(v)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// object writes an answer holding one object: as JSON, or one line per
// member in the answer's order (KEY  value).
func (c *Client) object(raw []byte) error {
	if c.cfg.Output == OutputJSON {
		return c.writeJSON(raw)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return fmt.Errorf("answer is not a JSON object")
	}
	tw := tabwriter.NewWriter(c.cfg.Stdout, 0, 4, 2, ' ', 0)
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%s\n", k, tabSafe(cell(v)))
	}
	return tw.Flush()
}

// cell is a JSON value as a table shows it: a string as is, null as
// nothing, an object of plain values as sorted key=value pairs, a list of
// plain values joined by commas, anything else as compact JSON.
func cell(v json.RawMessage) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 || string(v) == "null" {
		return ""
	}
	switch v[0] {
	case '"':
		var s string
		json.Unmarshal(v, &s)
		return s
	case '{':
		var m map[string]json.RawMessage
		if json.Unmarshal(v, &m) == nil && plain(m) {
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			parts := make([]string, len(keys))
			for i, k := range keys {
				parts[i] = k + "=" + cell(m[k])
			}
			return strings.Join(parts, " ")
		}
	case '[':
		var l []json.RawMessage
		if json.Unmarshal(v, &l) == nil {
			parts := make([]string, len(l))
			ok := true
			for i, e := range l {
				if e = bytes.TrimSpace(e); len(e) > 0 && (e[0] == '{' || e[0] == '[') {
					ok = false
					break
				}
				parts[i] = cell(e)
			}
			if ok {
				return strings.Join(parts, ", ")
			}
		}
	}
	return compact(v)
}

// compact is v as compact JSON ("" for none).
func compact(v json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return string(v)
	}
	return b.String()
}

// plain tells whether every value of m is a string, number or boolean.
func plain(m map[string]json.RawMessage) bool {
	for _, v := range m {
		if v = bytes.TrimSpace(v); len(v) > 0 && (v[0] == '{' || v[0] == '[') {
			return false
		}
	}
	return true
}

// tabSafe keeps a cell on one line and in its column.
func tabSafe(s string) string {
	return strings.NewReplacer("\t", " ", "\r\n", " | ", "\n", " | ", "\r", " ").Replace(s)
}
