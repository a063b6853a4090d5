package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

func TestBackupRefusals(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.db")
	if _, err := Backup(ctx, missing, filepath.Join(dir, "copy.db")); err == nil {
		t.Fatal("backup of a missing database succeeded")
	}
	if _, err := os.Stat(missing); err == nil {
		t.Fatal("backup created the missing source")
	}
	defer setPeriod(time.Minute)()
	src := filepath.Join(dir, "src.db")
	s := openTest(t, src)
	defer s.Close()
	// History in the database and, archived, in the history archive.
	base := time.UnixMilli(600_000)
	var b fleet.Batch
	for i := range 180 {
		b.Samples = append(b.Samples, fleet.Sample{DeviceID: 1, At: base.Add(time.Duration(i) * time.Second), Seq: uint64(i)})
	}
	if err := s.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ArchiveClosedPartitions(ctx, base.Add(2*time.Minute+closeGrace)); err != nil || n != 2 {
		t.Fatalf("archived %d, %v", n, err)
	}
	taken := filepath.Join(dir, "taken.db")
	os.WriteFile(taken, []byte("keep me"), 0o600)
	if _, err := Backup(ctx, src, taken); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("backup over an existing file: %v", err)
	}
	if b, _ := os.ReadFile(taken); string(b) != "keep me" {
		t.Fatal("backup overwrote an existing file")
	}
	copyPath := filepath.Join(dir, "copy.db")
	info, err := Backup(ctx, src, copyPath)
	if err != nil || info.Pages < 1 || info.Bytes < 1 || len(info.Files) != 2 || info.Files[1] != archivePath(copyPath) {
		t.Fatalf("backup: %+v %v", info, err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".*.partial*"))
	if len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
	// The copy is a database the store opens, with all its history.
	c := openTest(t, copyPath)
	defer c.Close()
	got, err := c.History(ctx, 1, fleet.HistoryQuery{From: base, To: base.Add(time.Hour), Limit: 1000})
	if err != nil || len(got) != 180 || got[0].Seq != 0 || got[179].Seq != 179 {
		t.Fatalf("history of the copy: %d samples, %v", len(got), err)
	}
}
