package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/drover/drover/internal/fsutil"
	"github.com/drover/drover/internal/store"
)

// BackupResult says what Backup wrote.
type BackupResult struct {
	Dir      string
	Database []string // the database copies (the database, its history archive)
	Pages    int      // their pages
	Bytes    int64    // their size
	Files    []string // the other files copied, relative to Dir
}

// Backup writes a copy of a server's state into dir, a new directory that
// can serve as the --data-dir of a restored server: the SQLite database and
// its history archive (copied with SQLite's online backup API while the
// server runs; drover.db and drover-history.db in dir), the
// generated secrets and the generated TLS certificate and key. cfg is the
// server's configuration (its data directory and database).
func Backup(ctx context.Context, cfg Config, dir string) (BackupResult, error) {
	res := BackupResult{Dir: dir}
	if _, err := os.Lstat(dir); err == nil {
		return res, fmt.Errorf("%s exists; back up into a new directory", dir)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return res, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	info, err := store.Backup(ctx, cfg.dbDSN(), filepath.Join(dir, "drover.db"))
	if err != nil {
		return res, err
	}
	res.Database, res.Pages, res.Bytes = info.Files, info.Pages, info.Bytes
	// The files the server generated; a certificate given with --tls-cert
	// and secrets given by flag or environment are the operator's to keep.
	for _, rel := range []string{"secrets.json", filepath.Join("tls", "cert.pem"), filepath.Join("tls", "key.pem")} {
		b, err := os.ReadFile(filepath.Join(cfg.DataDir, rel))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return res, err
		}
		to := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
			return res, err
		}
		if err := fsutil.WriteFileAtomic(to, b, 0o600); err != nil {
			return res, err
		}
		res.Files = append(res.Files, rel)
	}
	ok = true
	return res, nil
}
