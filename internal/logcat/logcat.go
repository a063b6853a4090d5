// Package logcat is the catalogue of the server's warnings and errors
// (docs/log-catalogue.md is written from it): for every WARN and ERROR
// message `drover serve` can log, a stable key, what it means, what it
// costs and what to do. A test parses the server's source and fails when a
// message has no entry; `drover perf` quotes the entries of the warnings a
// test saw in its protocol.
package logcat

import (
	"fmt"
	"strings"
)

// Entry is one message of the catalogue.
type Entry struct {
	Key   string // stable: the anchor in docs/log-catalogue.md
	Level string // WARN or ERROR
	Msg   string // the log record's msg, exactly
	Area  string
	Means string // what happened
	Costs string // what it costs: lost data, refused requests, nothing
	Do    string // what the operator does
}

// Lookup returns the entry of a log message at a level.
func Lookup(level, msg string) (Entry, bool) {
	for _, e := range entries {
		if e.Msg == msg && (level == "" || e.Level == level) {
			return e, true
		}
	}
	return Entry{}, false
}

// Entries returns the catalogue in its order (by area).
func Entries() []Entry { return append([]Entry(nil), entries...) }

// DocPath is where the catalogue is written, from the repository root.
const DocPath = "docs/log-catalogue.md"

// Markdown is docs/log-catalogue.md.
func Markdown() string {
	var b strings.Builder
	b.WriteString(`# Log catalogue

Every warning (WARN) and error (ERROR) ` + "`drover serve`" + ` can log, with what it means, what it
costs and what to do. The server logs with log/slog; the message (` + "`msg`" + `) is fixed and the
details are attributes (` + "`err`" + `, ` + "`device_id`" + `, …). The key is stable: the protocols of
` + "`drover perf`" + ` quote the entry of every warning a test saw, with its count.

This file is written from ` + "`internal/logcat`" + ` (` + "`go test ./internal/logcat -run TestDoc -update`" + `);
a test parses the server's source and fails when a WARN or ERROR message has no entry here.
INFO and DEBUG messages are not listed.

`)
	area := ""
	for _, e := range entries {
		if e.Area != area {
			area = e.Area
			fmt.Fprintf(&b, "## %s\n\n", area)
		}
		fmt.Fprintf(&b, "### %s\n\n`%s` %q\n\n", e.Key, e.Level, e.Msg)
		fmt.Fprintf(&b, "- **Means:** %s\n- **Costs:** %s\n- **Do:** %s\n\n", e.Means, e.Costs, e.Do)
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}
