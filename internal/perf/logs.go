package perf

import (
	"bytes"
	"encoding/json"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// logGroup is the warnings or errors of one kind: same level, same message.
type logGroup struct {
	Level   string    `json:"level"`
	Msg     string    `json:"msg"`
	Count   int       `json:"count"`
	First   time.Time `json:"first,omitzero"`
	Last    time.Time `json:"last,omitzero"`
	Example string    `json:"example"` // the first such line, shortened
}

// logSummary is the review of a server log.
type logSummary struct {
	Lines  int        `json:"lines"`
	Groups []logGroup `json:"groups,omitempty"` // warnings and errors, most frequent first
}

// Count returns the entries of a level ("WARN", "ERROR"; panics and other
// unparsed fatal output count as ERROR).
func (s logSummary) Count(level string) int {
	n := 0
	for _, g := range s.Groups {
		if g.Level == level {
			n += g.Count
		}
	}
	return n
}

// logReview groups a server's log lines, written to it as they come (it is
// an io.Writer). It understands log/slog's text and JSON formats; a line
// that is neither and looks like a Go runtime failure (panic, fatal error)
// counts as an ERROR with its first line as message.
type logReview struct {
	mu      sync.Mutex
	partial []byte
	lines   int
	groups  map[string]*logGroup
	onLine  func(line []byte, rec logRecord)
}

// logRecord is one parsed line.
type logRecord struct {
	Time  time.Time
	Level string
	Msg   string
	Attrs map[string]string
}

// newLogReview returns an empty review; onLine, if not nil, sees every line.
func newLogReview(onLine func(line []byte, rec logRecord)) *logReview {
	return &logReview{groups: map[string]*logGroup{}, onLine: onLine}
}

// Write takes log output in chunks of any size.
func (r *logReview) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.partial = append(r.partial, p...)
	for {
		i := bytes.IndexByte(r.partial, '\n')
		if i < 0 {
			break
		}
		r.line(r.partial[:i])
		r.partial = r.partial[i+1:]
	}
	if len(r.partial) > 1<<20 { // a line without end: take it as is
		r.line(r.partial)
		r.partial = nil
	}
	return len(p), nil
}

// Summary returns the review so far (a pending line without newline is
// included).
func (r *logReview) Summary() logSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.partial) > 0 {
		r.line(r.partial)
		r.partial = nil
	}
	s := logSummary{Lines: r.lines}
	for _, g := range r.groups {
		s.Groups = append(s.Groups, *g)
	}
	sort.Slice(s.Groups, func(i, j int) bool {
		a, b := s.Groups[i], s.Groups[j]
		if a.Level != b.Level {
			return a.Level == "ERROR"
		}
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		return a.Msg < b.Msg
	})
	return s
}

func (r *logReview) line(b []byte) {
	b = bytes.TrimRight(b, "\r")
	if len(bytes.TrimSpace(b)) == 0 {
		return
	}
	r.lines++
	rec := parseLogLine(b)
	if r.onLine != nil {
		r.onLine(b, rec)
	}
	if rec.Level != "WARN" && rec.Level != "ERROR" {
		return
	}
	key := rec.Level + "\x00" + rec.Msg
	g := r.groups[key]
	if g == nil {
		ex := string(b)
		if len(ex) > 300 {
			ex = ex[:300] + "…"
		}
		g = &logGroup{Level: rec.Level, Msg: rec.Msg, First: rec.Time, Example: ex}
		r.groups[key] = g
	}
	g.Count++
	if !rec.Time.IsZero() {
		g.Last = rec.Time
	}
}

// parseLogLine parses one slog line (JSON or text). Levels are normalised
// to DEBUG, INFO, WARN, ERROR; slog's offsets ("WARN+2") keep their base.
func parseLogLine(b []byte) logRecord {
	var rec logRecord
	if len(b) > 0 && b[0] == '{' {
		var m map[string]any
		if json.Unmarshal(b, &m) == nil {
			rec.Attrs = map[string]string{}
			for k, v := range m {
				switch k {
				case "time":
					if s, ok := v.(string); ok {
						rec.Time, _ = time.Parse(time.RFC3339Nano, s)
					}
				case "level":
					rec.Level, _ = v.(string)
				case "msg":
					rec.Msg, _ = v.(string)
				default:
					if s, ok := v.(string); ok {
						rec.Attrs[k] = s
					} else {
						j, _ := json.Marshal(v)
						rec.Attrs[k] = string(j)
					}
				}
			}
			rec.Level = normLevel(rec.Level)
			return rec
		}
	}
	if attrs, ok := parseTextAttrs(string(b)); ok && attrs["level"] != "" {
		rec.Level = normLevel(attrs["level"])
		rec.Msg = attrs["msg"]
		rec.Time, _ = time.Parse(time.RFC3339Nano, attrs["time"])
		delete(attrs, "level")
		delete(attrs, "msg")
		delete(attrs, "time")
		rec.Attrs = attrs
		return rec
	}
	s := string(b)
	for _, p := range []string{"panic: ", "fatal error: ", "SIGSEGV", "SIGABRT"} {
		if strings.HasPrefix(s, p) {
			rec.Level, rec.Msg = "ERROR", strings.TrimSpace(s)
			if len(rec.Msg) > 120 {
				rec.Msg = rec.Msg[:120]
			}
			return rec
		}
	}
	return rec
}

func normLevel(l string) string {
	l = strings.ToUpper(l)
	if i := strings.IndexAny(l, "+-"); i > 0 {
		l = l[:i]
	}
	return l
}

// parseTextAttrs parses slog's text format: key=value pairs, values
// quoted with Go syntax when they contain spaces or quotes.
func parseTextAttrs(s string) (map[string]string, bool) {
	m := map[string]string{}
	for {
		s = strings.TrimLeft(s, " ")
		if s == "" {
			return m, len(m) > 0
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || strings.ContainsAny(s[:eq], " \"") {
			return m, false
		}
		key := s[:eq]
		s = s[eq+1:]
		if strings.HasPrefix(s, `"`) {
			end := 1
			for end < len(s) && s[end] != '"' {
				if s[end] == '\\' {
					end++
				}
				end++
			}
			if end >= len(s) {
				return m, false
			}
			v, err := strconv.Unquote(s[:end+1])
			if err != nil {
				return m, false
			}
			m[key] = v
			s = s[end+1:]
			continue
		}
		sp := strings.IndexByte(s, ' ')
		if sp < 0 {
			sp = len(s)
		}
		m[key] = s[:sp]
		s = s[sp:]
	}
}
