package store

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/dbtest"
)

var pg, my *dbtest.Server

func TestMain(m *testing.M) {
	os.Exit(dbtest.Main(m, map[dbtest.Kind]**dbtest.Server{dbtest.Postgres: &pg, dbtest.MariaDB: &my}))
}

func TestParse(t *testing.T) {
	for _, c := range []struct{ dsn, backend, rest string }{
		{"sqlite:/var/lib/drover/d.db", SQLite, "/var/lib/drover/d.db"},
		{"sqlite:///var/lib/drover/d.db", SQLite, "/var/lib/drover/d.db"},
		{"sqlite:rel/d.db", SQLite, "rel/d.db"},
		{"/abs/d.db", SQLite, "/abs/d.db"},
		{"d.db", SQLite, "d.db"},
		{"postgres://u:p@h:5432/db?sslmode=disable", Postgres, "postgres://u:p@h:5432/db?sslmode=disable"},
		{"postgresql://u@h/db", Postgres, "postgresql://u@h/db"},
		{"mysql://u:p@tcp(h:3306)/db", MySQL, "u:p@tcp(h:3306)/db"},
		{"mariadb://u:p@h:3306/db", MySQL, "u:p@h:3306/db"},
	} {
		b, r, err := Parse(c.dsn)
		if err != nil || b != c.backend || r != c.rest {
			t.Errorf("Parse(%q) = %q, %q, %v; want %q, %q", c.dsn, b, r, err, c.backend, c.rest)
		}
	}
	for _, bad := range []string{"", "sqlite:", "redis://h/0", "sqlite://"} {
		if _, _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

// Every backend opens from its DSN, keeps what was committed across a
// reopen, and `drover migrate` reports the schema.
func TestOpenAndMigrate(t *testing.T) {
	ctx := context.Background()
	dsns := map[string]string{"sqlite": "sqlite:" + filepath.Join(t.TempDir(), "sub", "d.db")}
	dsns["postgres"] = dbtest.Need(t, dbtest.Postgres, pg).NewDB(t)
	dsns["mysql"] = dbtest.Need(t, dbtest.MariaDB, my).NewDB(t)
	// The URL form.
	dsns["mariadb-url"] = "mariadb://" + strings.NewReplacer("tcp(", "", ")/", "/").Replace(strings.TrimPrefix(my.NewDB(t), "mysql://"))
	for name, dsn := range dsns {
		t.Run(name, func(t *testing.T) {
			// The command's output is tested in cmd/drover.
			res, err := Migrate(ctx, dsn)
			if err != nil {
				t.Fatalf("migrate: %v", err)
			}
			// Version numbers may have gaps (each engineer's own range):
			// every migration recorded ran now, the highest is the version.
			backend, rest, _ := Parse(dsn)
			recorded, verr := schemaVersions(ctx, backend, rest)
			if verr != nil || res.Applied < 1 || res.Applied != len(recorded) || res.Version != recorded[len(recorded)-1] {
				t.Fatalf("first migrate: %+v; recorded %v (%v)", res, recorded, verr)
			}
			again, err := Migrate(ctx, dsn)
			if err != nil {
				t.Fatalf("migrate again: %v", err)
			}
			if again.Applied != 0 || again.Version != res.Version {
				t.Fatalf("second migrate: %+v, want 0 applied, schema version %d", again, res.Version)
			}
			s, err := Open(ctx, dsn, Options{})
			if err != nil {
				t.Fatal(err)
			}
			id := uint64(len(name))
			b := &fleet.Batch{Devices: []fleet.DeviceRecord{{ID: id, MachineID: "m-" + name, DeviceType: "t", Firmware: "f", TokenHash: []byte{0, 1}}}}
			if err := s.Commit(ctx, b); err != nil {
				t.Fatal(err)
			}
			s.Close()
			if s, err = Open(ctx, dsn, Options{}); err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			found := false
			if _, err := s.Load(ctx, fleet.LoadOptions{}, func(d fleet.DeviceRecord) error {
				found = found || d.MachineID == "m-"+name
				return nil
			}); err != nil || !found {
				t.Fatalf("after reopen: found %v, %v", found, err)
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	for _, dsn := range []string{"postgres://nobody@127.0.0.1:1/x?connect_timeout=2", "mysql://nobody@tcp(127.0.0.1:1)/x", "mysql://u@tcp(h:1)/"} {
		if s, err := Open(ctx, dsn, Options{}); err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", dsn)
		}
	}
}
