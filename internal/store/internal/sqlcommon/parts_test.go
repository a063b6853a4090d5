package sqlcommon

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
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
