package mariadb

import (
	"context"
	"database/sql"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/contract"
	"github.com/drover/drover/internal/store/dbtest"
	"github.com/drover/drover/internal/store/storetest"
)

var server *dbtest.Server

func TestMain(m *testing.M) {
	os.Exit(dbtest.Main(m, map[dbtest.Kind]**dbtest.Server{dbtest.MariaDB: &server}))
}

func openDSN(t testing.TB, dsn string) fleet.Store {
	t.Helper()
	s, err := Open(context.Background(), strings.TrimPrefix(dsn, "mysql://"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) { storetest.Run(t, newDB) }

func BenchmarkService(b *testing.B) { storetest.Bench(b, newDB) }

func newDB(t testing.TB) storetest.Opener {
	dsn := dbtest.Need(t, dbtest.MariaDB, server).NewDB(t)
	return func(t testing.TB) (contract.Store, error) {
		return Open(context.Background(), strings.TrimPrefix(dsn, "mysql://"))
	}
}

// A statement failing late in a commit undoes the earlier ones: here the
// device upsert (machine IDs are unique in this schema) after the profile.
func TestCommitIsAtomic(t *testing.T) {
	ctx := context.Background()
	s := openDSN(t, dbtest.Need(t, dbtest.MariaDB, server).NewDB(t))
	defer s.Close()
	dev := func(id uint64, machine string) fleet.DeviceRecord {
		return fleet.DeviceRecord{ID: id, MachineID: machine, DeviceType: "t", Firmware: "f", TokenHash: []byte{1}, RegisteredAt: time.Unix(1, 0)}
	}
	if err := s.Commit(ctx, &fleet.Batch{Devices: []fleet.DeviceRecord{dev(1, "m")}}); err != nil {
		t.Fatal(err)
	}
	bad := &fleet.Batch{
		Profiles: []fleet.Profile{{ID: 1, DeviceType: "t", Firmware: "f", Config: []byte("{}"), PushInterval: 60}},
		Devices:  []fleet.DeviceRecord{dev(2, "m")},
		States:   []fleet.StateRecord{{DeviceID: 1, Seq: 9, State: []byte("{}")}},
	}
	if err := s.Commit(ctx, bad); err == nil {
		t.Fatal("two devices with one machine ID committed")
	}
	var devices int
	res, err := s.Load(ctx, fleet.LoadOptions{}, func(d fleet.DeviceRecord) error {
		devices++
		if d.State.Seq != 0 {
			t.Errorf("device %d has seq %d from the failed commit", d.ID, d.State.Seq)
		}
		return nil
	})
	if err != nil || devices != 1 || len(res.Profiles) != 0 {
		t.Fatalf("after a failed commit: %d devices, %d profiles, %v", devices, len(res.Profiles), err)
	}
}

// The database ends the lock's session; another server opens the store
// before the first takes the lock back.
func TestTakeover(t *testing.T) {
	storetest.RunTakeover(t, newDB, func(t testing.TB, s contract.Store) {
		st := s.(*Store)
		var id sql.NullInt64
		ctx := context.Background()
		if err := st.db.QueryRowContext(ctx, `SELECT IS_USED_LOCK(?)`, st.lock.name).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if id.Valid {
			if _, err := st.db.ExecContext(ctx, `KILL CONNECTION `+strconv.FormatInt(id.Int64, 10)); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// InnoDBSizes reads the buffer pool and redo log sizes in bytes: checked
// against SHOW VARIABLES and InnoDB's least sizes (5 MiB, 1 MiB).
func TestInnoDBSizes(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, strings.TrimPrefix(dbtest.Need(t, dbtest.MariaDB, server).NewDB(t), "mysql://"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sizes := s.Extras().InnoDBSizes // as the server reads it
	if sizes == nil || s.Extras().CheckpointRoom != nil || s.Extras().ObserveUpkeep != nil {
		t.Fatalf("Extras: %+v, want InnoDBSizes only", s.Extras())
	}
	pool, redoLog, err := sizes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []struct {
		name  string
		got   int64
		least int64
	}{{"innodb_buffer_pool_size", pool, 5 << 20}, {"innodb_log_file_size", redoLog, 1 << 20}} {
		var name, show string
		if err := s.db.QueryRowContext(ctx, `SHOW VARIABLES LIKE '`+v.name+`'`).Scan(&name, &show); err != nil {
			t.Fatal(err)
		}
		if want, err := strconv.ParseInt(show, 10, 64); err != nil || v.got != want {
			t.Errorf("%s = %d, SHOW VARIABLES says %s", v.name, v.got, show)
		}
		if v.got < v.least {
			t.Errorf("%s = %d bytes: not a size in bytes", v.name, v.got)
		}
	}
}
