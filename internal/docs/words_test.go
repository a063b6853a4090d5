package docs

import (
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// diary matches the words of a working diary followed by a number or a
// letter naming a measurement: an issue, a session, a point of a list, a
// helper, a run named by a letter and maybe a number. Users read about the
// product: "the fleet test", "the keep-alive target", a version or a date.
var diary = regexp.MustCompile(`(?i:\b(?:issues?|sessions?|points?|helpers?)\s+#?\d)` +
	`|\b[Rr]uns?\s+(?:[A-Z]\d+|[A-MO-Z])\b`)

// textExt are the files read whole: documentation, scripts, configuration,
// protocols (Markdown, HTML, JSON).
var textExt = map[string]bool{
	".md": true, ".html": true, ".json": true, ".sh": true, ".lua": true, ".txt": true,
	".toml": true, ".yaml": true, ".yml": true, ".cfg": true, ".conf": true,
	".service": true, ".rules": true, ".tmpl": true, ".css": true, ".js": true,
}

// textNames are files without such an extension read whole.
var textNames = map[string]bool{"Containerfile": true, "Dockerfile": true, "Makefile": true}

func TestDiaryMatcher(t *testing.T) {
	i, s, p, h, r := "iss"+"ue", "sess"+"ion", "po"+"int", "hel"+"per", "ru"+"n"
	for _, bad := range []string{
		i + " 11", i + "s 2 and 11", strings.ToUpper(i[:1]) + i[1:] + " 11's fleet test", i + " 16.5:",
		i + " #12", s + " 13", strings.ToUpper(s[:1]) + s[1:] + " 10", s + "s 10 and 11",
		p + " 2", p + "s 1–3", h + " 3", r + " G3", r + "s E", r + " V,", "R" + r[1:] + " M5", i + "\n11",
	} {
		if !diary.MatchString(bad) {
			t.Errorf("%q not caught", bad)
		}
	}
	for _, good := range []string{
		"the fleet test", "the keep-alive target", "an " + i + " tracker", "a TLS " + s + " ticket",
		s + "s.Store", "a " + p + " in time", "runs N devices", "run 3 times", "drover perf run Fleet-1M",
		"v0.0.0-20261127110109-3b0462a9f4cf", "2026-11-27", "the " + h + " binary",
	} {
		if diary.MatchString(good) {
			t.Errorf("%q caught: %q", good, diary.FindString(good))
		}
	}
}

// TestNoDiaryWords reads every text a user or the next engineer reads and
// fails on each diary word, with its file and line.
func TestNoDiaryWords(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		ext := filepath.Ext(name)
		switch {
		case ext == ".go":
			files++
			checkGo(t, rel, path)
		case textExt[ext] || textNames[name]:
			files++
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			report(t, rel, string(b), 1)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read %d files under %s: the walk missed the repository", files, root)
	}
}

// checkGo reads a Go file's comments and string literals: what a reader of
// the code, a log or a --help text sees.
func checkGo(t *testing.T, rel, path string) {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	file := fset.AddFile(rel, -1, len(src))
	var s scanner.Scanner
	s.Init(file, src, nil, scanner.ScanComments)
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			return
		}
		if tok == token.COMMENT || tok == token.STRING || tok == token.CHAR {
			report(t, rel, lit, fset.Position(pos).Line)
		}
	}
}

// report fails the test once per diary word in text, which starts at line.
func report(t *testing.T, rel, text string, line int) {
	t.Helper()
	for _, m := range diary.FindAllStringIndex(text, -1) {
		n := line + strings.Count(text[:m[0]], "\n")
		t.Errorf("%s:%d: %q: say what the product does (the fleet test, the keep-alive target, a version or a date), not the project's diary",
			rel, n, text[m[0]:m[1]])
	}
}

// TestPerformanceReferenceShort keeps docs/performance.md a reference: each
// headline test's current figure, machine, date and command. Runs, tables
// and their analysis go to protocols in docs/results.
func TestPerformanceReferenceShort(t *testing.T) {
	b, err := os.ReadFile("../../docs/performance.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 500 {
		t.Errorf("docs/performance.md has %d lines; a reference has at most 500: move runs and tables to docs/results", n)
	}
}
