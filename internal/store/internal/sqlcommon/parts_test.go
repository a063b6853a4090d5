package sqlcommon

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Each type's methods are in the file that declares it, so that a reader
// finds a table's SQL by the name of its part (labels.go: Labels).
func TestMethodsBesideTheirType(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]string{} // type → file
	type method struct{ recv, name, file string }
	var methods []method
	for _, p := range pkgs {
		for name, f := range p.Files {
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.GenDecl:
					for _, s := range d.Specs {
						if ts, ok := s.(*ast.TypeSpec); ok {
							declared[ts.Name.Name] = name
						}
					}
				case *ast.FuncDecl:
					if d.Recv == nil {
						continue
					}
					typ := d.Recv.List[0].Type
					if st, ok := typ.(*ast.StarExpr); ok {
						typ = st.X
					}
					methods = append(methods, method{typ.(*ast.Ident).Name, d.Name.Name, name})
				}
			}
		}
	}
	for _, m := range methods {
		if declared[m.recv] != m.file {
			t.Errorf("%s.%s is in %s, its type in %s", m.recv, m.name, m.file, declared[m.recv])
		}
	}
	if len(methods) == 0 {
		t.Fatal("no methods found")
	}
}

// The adapters share one Load (load.go): none reads the devices or the
// profiles tables at start with a copy of its own.
func TestOneLoad(t *testing.T) {
	for _, dir := range []string{"../../sqlite", "../../postgres", "../../mariadb"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range []string{"FROM devices ORDER BY id", "FROM profiles ORDER BY id"} {
				if bytes.Contains(b, []byte(q)) {
					t.Errorf("%s reads %q: a Load of its own", f, q)
				}
			}
		}
	}
}
