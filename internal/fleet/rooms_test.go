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
	{"policy", "policy.go", []string{"PolicyStore"}},
	{"profiles", "profile.go", []string{"ErrNotPending", "ErrProfileInUse", "ErrProfileExists"}},
	{"commands", "commands.go", []string{"CommandStore", "ErrJobState"}},
	{"firmware and rollouts", "firmware.go", []string{"FirmwareStore", "ErrFirmwareExists", "ErrFirmwareInUse", "ErrRolloutState", "ErrNoDevices"}},
	{"trust, admission, enrollment", "admission.go", []string{"TrustStore", "ErrBlocked", "ErrDecommissioned", "ErrNotPreauthorized",
		"ErrEnrollmentToken", "ErrCertificateRequired", "ErrEnrollConflict", "ErrNothingToDo", "ErrEnrollment"}},
	{"quotas", "quota.go", []string{"ErrQuota", "ErrTooManyLifts"}},
	{"labels", "labels.go", []string{"LabelStore", "ErrLabelName", "ErrTooManyIDs", "ErrLabelLive", "ErrLabelInUse", "ErrTooManyFields"}},
	{"configuration layers", "layers.go", []string{"LayerStore", "ErrSchema"}},
	{"cluster glue", "cluster.go", []string{"ClusterStore", "ClusterCommands", "RolloutCluster"}},
}

// parseFleet parses the package's files but its tests.
func parseFleet(t *testing.T) map[string]*ast.Package {
	t.Helper()
	pkgs, err := parser.ParseDir(token.NewFileSet(), ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// TestRoomsLayout fails when an exported interface or Err… variable is
// declared outside its room's file, below a function there, or missing
// from the table above.
func TestRoomsLayout(t *testing.T) {
	pkgs := parseFleet(t)
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

// roomFiles are the files of the rooms that are types of their own: every
// method declared there has the room (or a type of its own, listed too)
// as receiver, never *Service. The Service embeds the rooms, which is how
// their exported methods are the Service's.
var roomFiles = map[string][]string{
	"commands.go":         {"commands", "CommandState", "JobState", "CommandSpec", "job", "devCmd"},
	"commands_cluster.go": {"commands", "job"},
	"command_store.go":    nil,
	"admission.go":        {"trust", "Admission", "Policy", "AdmissionFilter", "device"},
	"enrollment.go":       {"trust"},
	"secret.go":           {"trust"},
	"trust_store.go":      nil,
	"firmware.go":         {"firmwareState", "Firmware"},
	"rollout.go":          {"firmwareState", "rollout", "Rollout", "RolloutSpec", "RolloutPlan", "Window"},
	"rollout_cluster.go":  {"firmwareState"},
	"configrollout.go":    {"firmwareState", "rollout"},
	"profilehistory.go":   {"firmwareState"},
	"quota.go":            {"quota", "QuotaError", "device"},
	"policy.go":           {"policy", "ProfilePolicy"},
	"rolloutpolicy.go":    {"policy", "RolloutPolicy"},
	"profile.go":          {"profiles", "profileEntry"},
	"profileselect.go":    {"profiles"},
	"cluster.go":          {"cluster"},
	"labels.go":           {"labels", "device", "labelsRead"},
	"livelabels.go":       {"labels", "compiledWhere"},
	"stateindex.go":       {"labels", "stateIndex", "column"},
	"where.go":            {"Where", "cond", "whereToken"},
	"layers.go":           {"layerState", "device", "profileEntry"},
	"layermerge.go":       {"layerInputs", "EffectiveConfig", "effCache", "stateSource"},
	"layerschema.go":      {"layerState", "layerInputs", "layerSchema"},
	"layerstage.go":       {"layerState", "configStage", "profileEntry", "profiles"},
}

// serviceFiles are the files of the Service's own room (registry, push,
// queries) and of the glue that composes the rooms: the only files with
// methods on *Service.
var serviceFiles = []string{"service.go", "load.go", "registry.go", "push.go", "query.go",
	"validate.go", "events.go", "authenticate.go", "register.go", "readback.go"}

// TestRoomReceivers fails when a method in a room's file has another
// receiver than the room's types (a method of the Service left, or put,
// in the room's file), or when the Service has methods outside its own
// files.
func TestRoomReceivers(t *testing.T) {
	pkgs := parseFleet(t)
	service := 0
	seen := map[string]bool{}
	for _, p := range pkgs {
		for path, f := range p.Files {
			seen[path] = true
			allowed, isRoom := roomFiles[path]
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Recv == nil {
					continue
				}
				recv := fd.Recv.List[0].Type
				if st, ok := recv.(*ast.StarExpr); ok {
					recv = st.X
				}
				id, ok := recv.(*ast.Ident)
				if !ok {
					t.Errorf("%s: method %s: unexpected receiver", path, fd.Name.Name)
					continue
				}
				if id.Name == "Service" {
					service++
					if !slices.Contains(serviceFiles, path) {
						t.Errorf("%s: method %s is on *Service; the file belongs to a room, whose methods have the room as receiver", path, fd.Name.Name)
					}
					continue
				}
				if isRoom && !slices.Contains(allowed, id.Name) {
					t.Errorf("%s: method %s has receiver %s; the room's types are %v", path, fd.Name.Name, id.Name, allowed)
				}
			}
		}
	}
	for path := range roomFiles {
		if !seen[path] {
			t.Errorf("room file %s is gone: update roomFiles and docs/architecture.md", path)
		}
	}
	t.Logf("the Service has %d methods of its own", service)
}
