package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	src := filepath.Join(dir, "src.db")
	s, err := Open(ctx, src, true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	taken := filepath.Join(dir, "taken.db")
	os.WriteFile(taken, []byte("keep me"), 0o600)
	if _, err := Backup(ctx, src, taken); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("backup over an existing file: %v", err)
	}
	if b, _ := os.ReadFile(taken); string(b) != "keep me" {
		t.Fatal("backup overwrote an existing file")
	}
	info, err := Backup(ctx, src, filepath.Join(dir, "copy.db"))
	if err != nil || info.Pages < 1 || info.Bytes < 1 {
		t.Fatalf("backup: %+v %v", info, err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".copy.db.partial*"))
	if len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
	// The copy is a database the store opens, with the migrations applied.
	c, err := Open(ctx, filepath.Join(dir, "copy.db"), true)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
