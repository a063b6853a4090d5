package ctl

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// A JSON value as a table cell.
func TestCell(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`"text"`, "text"},
		{`null`, ""},
		{``, ""},
		{`42`, "42"},
		{`true`, "true"},
		{`{"queued":1,"done":2}`, "done=2 queued=1"},
		{`["a","b"]`, "a, b"},
		{`[{"a":1}]`, `[{"a":1}]`},
		{`{"a":{"b":1}}`, `{"a":{"b":1}}`},
		{`"two\nlines"`, "two\nlines"},
	} {
		if got := cell(json.RawMessage(c.in)); got != c.want {
			t.Errorf("cell(%s) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := tabSafe("a\tb\nc"); got != "a b | c" {
		t.Errorf("tabSafe: %q", got)
	}
}

// Each answer status has its exit code, and the message is the API's.
func TestErrorExitCodes(t *testing.T) {
	for status, want := range map[int]int{404: ExitNotFound, 401: ExitDenied, 403: ExitDenied, 409: ExitConflict, 400: ExitUsage, 500: ExitFailure, 503: ExitFailure} {
		if got := (&Error{Status: status}).ExitCode(); got != want {
			t.Errorf("status %d: exit %d, want %d", status, got, want)
		}
	}
	e := &Error{Status: 404, Code: "not_found", Message: "no device 9"}
	if e.Error() != "no device 9 (HTTP 404 not_found)" {
		t.Errorf("message: %q", e.Error())
	}
	if (WaitTimeoutError{}).ExitCode() != ExitWaitTimeout || (UsageError{}).ExitCode() != ExitUsage {
		t.Error("wait timeout or usage exit code")
	}
}

// A configuration is checked before any request; plain HTTP to another
// machine is warned about.
func TestNewChecks(t *testing.T) {
	var errb bytes.Buffer
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Server: "ftp://x", Token: "t", Output: OutputTable}, "server must be a URL"},
		{Config{Server: "https://x", Token: "t", Output: "yaml"}, "output must be"},
		{Config{Server: "https://x", Output: OutputTable}, "no API token"},
		{Config{Server: "https://x", Token: "t", Output: OutputTable, CACert: "/nonexistent"}, "CA certificate"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v, want %q", c.cfg, err, c.want)
		}
	}
	if _, err := New(Config{Server: "http://192.0.2.1:8080", Token: "t", Output: OutputTable, Stderr: &errb}); err != nil || !strings.Contains(errb.String(), "unencrypted") {
		t.Errorf("plain HTTP: %v %q", err, errb.String())
	}
	errb.Reset()
	if _, err := New(Config{Server: "http://127.0.0.1:8080", Token: "t", Output: OutputTable, Stderr: &errb}); err != nil || errb.Len() != 0 {
		t.Errorf("plain HTTP on loopback: %v %q", err, errb.String())
	}
}
