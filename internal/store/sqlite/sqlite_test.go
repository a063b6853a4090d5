package sqlite

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/drover/drover/internal/store/contract"
	"github.com/drover/drover/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	old := logRange
	logRange = 8 // the state log is read by several queries, in order
	t.Cleanup(func() { logRange = old })
	storetest.Run(t, newDB)
}

// The store offers the server its background work's reports, and none
// of the other backends' advice.
func TestExtras(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "drover.db"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if x := s.Extras(); x.ObserveUpkeep == nil || x.CheckpointRoom != nil || x.InnoDBSizes != nil {
		t.Errorf("Extras: %+v, want ObserveUpkeep only", x)
	}
}

func BenchmarkService(b *testing.B) { storetest.Bench(b, newDB) }

func newDB(t testing.TB) storetest.Opener {
	path := filepath.Join(t.TempDir(), "drover.db")
	return func(t testing.TB) (contract.Store, error) { return Open(context.Background(), path, true) }
}
