package logcat

import (
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// logSite is one warning or error the server can log.
type logSite struct {
	Level string // WARN or ERROR
	Msg   string
	Pos   string // file:line
}

// serverSources are the server's source files: everything `drover serve`
// links that logs, below the repository root. Left out: the agent, the
// emulator and perf (other programs' logs), and test support.
func serverSources(t *testing.T) []string {
	t.Helper()
	root := filepath.Join("..", "..")
	skip := map[string]bool{"agent": true, "emulator": true, "perf": true, "clustertest": true, "netlab": true,
		"storetest": true, "dbtest": true, "report": true, "logcat": true}
	var files []string
	err := filepath.WalkDir(filepath.Join(root, "internal"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && skip[d.Name()] {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return append(files, filepath.Join(root, "cmd", "drover", "serve.go"))
}

// scanSites finds every Warn and Error log call of the files, and the
// messages of the API's error table (apiError literals with a log field:
// logged at ERROR with a cause, else WARN, by one call whose message is
// not a literal). Calls whose message is neither are returned as bad.
func scanSites(t *testing.T, files []string) (sites []logSite, bad []string) {
	t.Helper()
	fset := token.NewFileSet()
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				if id, ok := n.Type.(*ast.Ident); ok && id.Name == "apiError" {
					var msg string
					level := "WARN"
					for _, el := range n.Elts {
						kv, ok := el.(*ast.KeyValueExpr)
						if !ok {
							continue
						}
						switch kv.Key.(*ast.Ident).Name {
						case "log":
							msg = literal(kv.Value)
						case "cause":
							level = "ERROR"
						}
					}
					if msg != "" {
						sites = append(sites, logSite{level, msg, fset.Position(n.Pos()).String()})
					}
				}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); ok && (x.Name == "http" || x.Name == "t") {
					return true // http.Error writes an answer, not a log line
				}
				var level string
				arg := 0
				switch sel.Sel.Name {
				case "Warn":
					level = "WARN"
				case "Error":
					level = "ERROR"
				case "WarnContext":
					level, arg = "WARN", 1
				case "ErrorContext":
					level, arg = "ERROR", 1
				default:
					return true
				}
				if len(n.Args) <= arg {
					return true // an error's Error()
				}
				pos := fset.Position(n.Pos()).String()
				if msg := literal(n.Args[arg]); msg != "" {
					sites = append(sites, logSite{level, msg, pos})
				} else if s, ok := n.Args[arg].(*ast.SelectorExpr); !ok || s.Sel.Name != "log" {
					bad = append(bad, pos)
				}
			}
			return true
		})
	}
	return sites, bad
}

func literal(e ast.Expr) string {
	if bl, ok := e.(*ast.BasicLit); ok && bl.Kind == token.STRING {
		s, err := strconv.Unquote(bl.Value)
		if err == nil {
			return s
		}
	}
	return ""
}

var update = flag.Bool("update", false, "write docs/log-catalogue.md from the catalogue")

// Every WARN and ERROR message of the server has a catalogue entry at its
// level, and every entry is still logged somewhere.
func TestEveryServerWarningIsCatalogued(t *testing.T) {
	sites, bad := scanSites(t, serverSources(t))
	for _, pos := range bad {
		t.Errorf("%s: a Warn or Error log call whose message is not a string literal: give it a fixed message (details as attributes) and a catalogue entry", pos)
	}
	if len(sites) < 50 {
		t.Fatalf("found only %d log sites: is the scan still reading the server's source?", len(sites))
	}
	used := map[string]bool{}
	for _, s := range sites {
		e, ok := Lookup(s.Level, s.Msg)
		if !ok {
			t.Errorf("%s: %s %q has no entry in internal/logcat (docs/log-catalogue.md): add what it means, costs and what to do", s.Pos, s.Level, s.Msg)
			continue
		}
		used[e.Key] = true
	}
	keys := map[string]bool{}
	for _, e := range Entries() {
		if keys[e.Key] {
			t.Errorf("key %q twice", e.Key)
		}
		keys[e.Key] = true
		if !used[e.Key] {
			t.Errorf("entry %q (%s %q) is logged nowhere any more: remove it", e.Key, e.Level, e.Msg)
		}
		if e.Means == "" || e.Costs == "" || e.Do == "" || e.Area == "" || (e.Level != "WARN" && e.Level != "ERROR") {
			t.Errorf("entry %q is incomplete", e.Key)
		}
	}
	t.Logf("%d log sites, %d catalogue entries", len(sites), len(Entries()))
}

// The scan finds what it must: a call with a literal, one in a
// non-literal form, the API's error table, and not http.Error.
func TestScanFindsCalls(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "x.go")
	src := `package x
func f() {
	log.Warn("literal warning", "k", 1)
	log.ErrorContext(ctx, "context error")
	log.Error(fmt.Sprintf("made %d", 1))
	a.log.Error(e.log, "endpoint", 1)
	http.Error(w, "not a log", 500)
	_ = &apiError{status: 503, log: "table warning"}
	_ = &apiError{status: 503, log: "table error", cause: err}
}
`
	if err := os.WriteFile(f, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	sites, bad := scanSites(t, []string{f})
	var got []string
	for _, s := range sites {
		got = append(got, s.Level+" "+s.Msg)
	}
	want := "WARN literal warning|ERROR context error|WARN table warning|ERROR table error"
	if strings.Join(got, "|") != want || len(bad) != 1 || !strings.HasSuffix(bad[0], ":5:2") {
		t.Errorf("sites %q, bad %v; want %q and one bad call at line 5", got, bad, want)
	}
}

// docs/log-catalogue.md is the catalogue as Markdown.
func TestDoc(t *testing.T) {
	path := filepath.Join("..", "..", DocPath)
	want := Markdown()
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s is not the catalogue: go test ./internal/logcat -run TestDoc -update", DocPath)
	}
}
