package sqlite

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/drover/drover/internal/store/contract"
	"github.com/drover/drover/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, newDB)
}

func BenchmarkService(b *testing.B) { storetest.Bench(b, newDB) }

func newDB(t testing.TB) storetest.Opener {
	path := filepath.Join(t.TempDir(), "drover.db")
	return func(t testing.TB) (contract.Store, error) { return Open(context.Background(), path, true) }
}
