package postgres

import (
	"context"
	"encoding/json"
	"fmt"
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
	os.Exit(dbtest.Main(m, map[dbtest.Kind]**dbtest.Server{dbtest.Postgres: &server}))
}

func openDSN(t testing.TB, dsn string) fleet.Store {
	t.Helper()
	s, err := Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) { storetest.Run(t, newDB) }

func BenchmarkService(b *testing.B) { storetest.Bench(b, newDB) }

func newDB(t testing.TB) storetest.Opener {
	dsn := dbtest.Need(t, dbtest.Postgres, server).NewDB(t)
	return func(t testing.TB) (contract.Store, error) { return Open(context.Background(), dsn) }
}

// A statement failing late in a commit undoes the earlier ones: here the
// device upsert (machine IDs are unique in this schema) after the profile.
func TestCommitIsAtomic(t *testing.T) {
	ctx := context.Background()
	s := openDSN(t, dbtest.Need(t, dbtest.Postgres, server).NewDB(t))
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
		var n int
		err := s.(*Store).pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM (`+InstanceLockSessions+`) held`).Scan(&n)
		if err == nil && n != 1 {
			t.Fatalf("%d sessions held the instance lock, want 1", n)
		}
		if err != nil {
			t.Fatal(err)
		}
	})
}

// CheckpointRoom reads the server's settings in bytes and seconds: checked
// against SHOW, which PostgreSQL prints with its own units.
func TestCheckpointRoom(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, dbtest.Need(t, dbtest.Postgres, server).NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	room := s.Extras().CheckpointRoom // as the server reads it
	if room == nil || s.Extras().InnoDBSizes != nil || s.Extras().ObserveUpkeep == nil {
		t.Fatalf("Extras: %+v, want CheckpointRoom and ObserveUpkeep (the history packer)", s.Extras())
	}
	wal, timeout, err := room(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var showWAL, showTimeout string
	if err := s.pool.QueryRow(ctx, `SELECT current_setting('max_wal_size'), current_setting('checkpoint_timeout')`).Scan(&showWAL, &showTimeout); err != nil {
		t.Fatal(err)
	}
	if got := showSize(t, showWAL); wal != got {
		t.Errorf("max_wal_size %d bytes, SHOW says %s", wal, showWAL)
	}
	if got := showDuration(t, showTimeout); timeout != got {
		t.Errorf("checkpoint_timeout %v, SHOW says %s", timeout, showTimeout)
	}
}

func showSize(t *testing.T, v string) int64 {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			x, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return x * u.mult
		}
	}
	t.Fatalf("size %q", v)
	return 0
}

func showDuration(t *testing.T, v string) time.Duration {
	for _, u := range []struct {
		suffix string
		unit   time.Duration
	}{{"min", time.Minute}, {"ms", time.Millisecond}, {"s", time.Second}, {"h", time.Hour}, {"d", 24 * time.Hour}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			x, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				continue
			}
			return time.Duration(x) * u.unit
		}
	}
	t.Fatalf("duration %q", v)
	return 0
}

// A device's first push adds its state to the row registration wrote: the
// pages of registered devices have room for that, so the first pushes of
// a registered fleet neither grow the table nor move rows (a moved row
// writes both indexes). With fillfactor 70 the table grew 4.4 times.
func TestFirstPushesFitTheirPages(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, dbtest.Need(t, dbtest.Postgres, server).NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 3000
	now := time.Now()
	var reg fleet.Batch
	for i := range n {
		reg.Devices = append(reg.Devices, fleet.DeviceRecord{ID: uint64(i + 1), MachineID: fmt.Sprintf("%032x", i*7919),
			DeviceType: "router", Model: "EMU-R1", Firmware: "7.4.2", Serial: fmt.Sprintf("EMU%08d", i), TokenHash: make([]byte, 32), RegisteredAt: now})
	}
	if err := s.Commit(ctx, &reg); err != nil {
		t.Fatal(err)
	}
	size := func() (n int64) {
		if err := s.pool.QueryRow(ctx, `SELECT pg_relation_size('devices')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := size()
	// A 750-byte state, as the emulator's router sends.
	state := json.RawMessage(fmt.Sprintf(`{"uptime":3600,"operator":"Example Telecom","notes":%q}`, strings.Repeat("x", 690)))
	for lo := 0; lo < n; lo += 100 {
		var push fleet.Batch
		for i := lo; i < lo+100; i++ {
			push.States = append(push.States, fleet.StateRecord{DeviceID: uint64(i*7%n + 1), Firmware: "7.4.2", LastSeen: now, Seq: 1, State: state})
		}
		if err := s.Commit(ctx, &push); err != nil {
			t.Fatal(err)
		}
	}
	if after := size(); after > before {
		t.Errorf("the first pushes of %d registered devices grew the devices table from %d to %d bytes", n, before, after)
	}
}
