package perf

import (
	"strings"
	"testing"

	"github.com/drover/drover/internal/logcat"
)

func TestLogReviewGroupsByLevelAndMessage(t *testing.T) {
	lines := []string{
		`{"time":"2026-01-02T10:00:00.5Z","level":"INFO","msg":"listening","proto":"https","addr":"127.0.0.1:8443"}`,
		`{"time":"2026-01-02T10:00:01Z","level":"WARN","msg":"overloaded","endpoint":"push","reason":"too many requests in flight"}`,
		`{"time":"2026-01-02T10:00:02Z","level":"WARN","msg":"overloaded","endpoint":"register","reason":"x"}`,
		`time=2026-01-02T10:00:03.000Z level=ERROR msg="store commit failed" records=12 err="disk full"`,
		`time=2026-01-02T10:00:04.000Z level=WARN msg=overloaded endpoint=push`,
		`time=2026-01-02T10:00:05.000Z level=WARN+2 msg="history prune failed"`,
		`panic: runtime error: index out of range [3] with length 3`,
		`goroutine 1 [running]:`,
		``,
	}
	var seen []string
	rv := newLogReview(func(_ []byte, rec logRecord) {
		if rec.Msg == "listening" {
			seen = append(seen, rec.Attrs["proto"]+"://"+rec.Attrs["addr"])
		}
	})
	// Written in odd chunks, as a pipe delivers them.
	all := strings.Join(lines, "\n")
	for i := 0; i < len(all); i += 7 {
		rv.Write([]byte(all[i:min(i+7, len(all))]))
	}
	s := rv.Summary()
	if s.Lines != 8 {
		t.Errorf("%d lines, want 8", s.Lines)
	}
	if len(seen) != 1 || seen[0] != "https://127.0.0.1:8443" {
		t.Errorf("listening lines %q", seen)
	}
	got := map[string]int{}
	for _, g := range s.Groups {
		got[g.Level+" "+g.Msg] = g.Count
	}
	want := map[string]int{"WARN overloaded": 3, "ERROR store commit failed": 1, "WARN history prune failed": 1,
		"ERROR panic: runtime error: index out of range [3] with length 3": 1}
	if len(got) != len(want) {
		t.Errorf("groups %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d, want %d", k, got[k], v)
		}
	}
	if s.Groups[0].Level != "ERROR" || s.Count("WARN") != 4 || s.Count("ERROR") != 2 {
		t.Errorf("order or counts: %+v", s.Groups)
	}
	for _, g := range s.Groups {
		if g.Msg == "overloaded" && (g.First.Second() != 1 || g.Last.Second() != 4) {
			t.Errorf("overloaded first %v last %v", g.First, g.Last)
		}
	}
}

func TestParseLogLineText(t *testing.T) {
	r := parseLogLine([]byte(`time=2026-01-02T10:00:03.000Z level=INFO msg="fleet loaded" devices=10 db=sqlite:/x`))
	if r.Level != "INFO" || r.Msg != "fleet loaded" || r.Attrs["devices"] != "10" || r.Attrs["db"] != "sqlite:/x" || r.Time.IsZero() {
		t.Errorf("%+v", r)
	}
	if r := parseLogLine([]byte("just some words")); r.Level != "" {
		t.Errorf("prose parsed as %+v", r)
	}
}

// The protocol quotes the log catalogue's entry of every warning and error
// it saw, with its count over all parts; a message the catalogue does not
// know is named as such.
func TestProtocolQuotesLogCatalogue(t *testing.T) {
	r := seedStab()
	r.Parts[0].Log.Groups = append(r.Parts[0].Log.Groups,
		logGroup{Level: "ERROR", Msg: "store commit failed", Count: 3},
		logGroup{Level: "WARN", Msg: "something new", Count: 1})
	md := markdownOf(r)
	e, ok := logcat.Lookup("ERROR", "store commit failed")
	if !ok {
		t.Fatal("store commit failed is not catalogued")
	}
	for _, want := range []string{"| store-commit-failed |", "`store-commit-failed` \"store commit failed\", 3 times: " + e.Means,
		"Costs: " + e.Costs, "Do: " + e.Do, "`overloaded` \"overloaded\", 2 times", "| not catalogued |", "Not in the log catalogue", "something new"} {
		if !strings.Contains(md, want) {
			t.Errorf("the protocol lacks %q", want)
		}
	}
}
