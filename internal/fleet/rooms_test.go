package fleet

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"slices"
	"strings"
	"testing"
)

// rooms is the fleet's layout (docs/architecture.md, "The fleet's rooms"):
// each room's store interfaces and sentinel errors are declared at the top
// of its main file, before any function, so that one page of one file says
// what the room stores and how it fails.
var rooms = []struct {
	room, file string
	decls      []string // exported interfaces and Err… variables
}{
	{"service", "service.go", []string{"ErrNotFound", "ErrInvalid"}},
	{"service", "store.go", []string{"Backend"}},
	{"persistence", "persist.go", []string{"Persister", "ErrOverloaded", "ErrClosed", "ErrUnavailable"}},
	{"registry and push", "registry.go", []string{"Store", "StateReader", "HistoryDropper", "ErrUnauthorized", "ErrCursor"}},
	{"profiles and policy", "policy.go", []string{"PolicyStore", "ErrNotPending", "ErrProfileInUse", "ErrProfileExists"}},
	{"commands", "commands.go", []string{"CommandStore", "ErrJobState"}},
	{"firmware and rollouts", "firmware.go", []string{"FirmwareStore", "ErrFirmwareExists", "ErrFirmwareInUse", "ErrRolloutState", "ErrNoDevices"}},
	{"trust, admission, enrollment", "admission.go", []string{"TrustStore", "ErrBlocked", "ErrDecommissioned", "ErrNotPreauthorized",
		"ErrEnrollmentToken", "ErrCertificateRequired", "ErrEnrollConflict", "ErrNothingToDo", "ErrEnrollment"}},
	{"quotas", "quota.go", []string{"ErrQuota", "ErrTooManyLifts"}},
	{"labels", "labels.go", []string{"LabelStore", "ErrLabelName", "ErrTooManyIDs"}},
	{"configuration layers", "layers.go", []string{"LayerStore", "ErrSchema"}},
	{"cluster glue", "cluster.go", []string{"ClusterStore", "ClusterCommands", "RolloutCluster"}},
}

// TestRoomsLayout fails when an exported interface or Err… variable is
// declared outside its room's file, below a function there, or missing
// from the table above.
func TestRoomsLayout(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	type place struct {
		file      string
		afterFunc bool // declared below the file's first function
	}
	found := map[string]place{}
	for _, p := range pkgs {
		for name, f := range p.Files {
			seenFunc := false
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					seenFunc = true
				case *ast.GenDecl:
					for _, s := range d.Specs {
						switch s := s.(type) {
						case *ast.TypeSpec:
							if _, ok := s.Type.(*ast.InterfaceType); ok && s.Name.IsExported() {
								found[s.Name.Name] = place{name, seenFunc}
							}
						case *ast.ValueSpec:
							if d.Tok != token.VAR {
								continue
							}
							for _, n := range s.Names {
								if strings.HasPrefix(n.Name, "Err") {
									found[n.Name] = place{name, seenFunc}
								}
							}
						}
					}
				}
			}
		}
	}
	if len(found) == 0 {
		t.Fatal("no declarations found")
	}
	listed := map[string]bool{}
	for _, r := range rooms {
		for _, n := range r.decls {
			listed[n] = true
			pl, ok := found[n]
			switch {
			case !ok:
				t.Errorf("%s (room %s) is not declared any more: update the table and docs/architecture.md", n, r.room)
			case pl.file != r.file:
				t.Errorf("%s is declared in %s; it belongs at the top of %s (room %s)", n, pl.file, r.file, r.room)
			case pl.afterFunc:
				t.Errorf("%s is declared below a function in %s; the interfaces and errors of room %s open the file", n, pl.file, r.room)
			}
		}
	}
	var unlisted []string
	for n, pl := range found {
		if !listed[n] {
			unlisted = append(unlisted, n+" ("+pl.file+")")
		}
	}
	slices.Sort(unlisted)
	for _, n := range unlisted {
		t.Errorf("%s belongs to no room: add it to the table in rooms_test.go and to docs/architecture.md", n)
	}
}
