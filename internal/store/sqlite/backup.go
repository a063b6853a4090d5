package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/drover/drover/internal/fleet"
	sqlite "modernc.org/sqlite"
)

// BackupInfo describes a finished backup.
type BackupInfo struct {
	Files []string // the copies: the database, then its history archive if it has one
	Pages int      // database pages copied
	Bytes int64    // size of the copies
}

// backuper is the modernc.org/sqlite connection's online backup API.
type backuper interface {
	NewBackup(dstURI string) (*sqlite.Backup, error)
}

// Backup copies the database file at path, and its history archive, to dst
// and dst's archive path; neither may exist. Each file is copied with
// SQLite's online backup API in one read transaction: a consistent snapshot,
// taken while a server keeps writing (in WAL mode readers do not block the
// writer, nor it them). The database goes first: a partition it lists as
// archived was committed to the archive before, so the later snapshot of the
// archive has it (the copies pair like a crash between two archiver steps,
// which the store recovers from). Each copy is written beside its
// destination, checked (PRAGMA integrity_check), synced, then linked into
// place.
func Backup(ctx context.Context, path, dst string) (BackupInfo, error) {
	var info BackupInfo
	srcArchive, dstArchive := archivePath(path), archivePath(dst)
	if _, err := os.Lstat(dstArchive); err == nil {
		return info, fmt.Errorf("backup: %s exists; give a new path", dstArchive)
	}
	pages, err := backupFile(ctx, path, dst)
	if err != nil {
		return info, err
	}
	info.Files, info.Pages = []string{dst}, pages
	if _, err := os.Stat(srcArchive); err == nil {
		pages, err := backupFile(ctx, srcArchive, dstArchive)
		if err != nil {
			os.Remove(dst)
			return info, err
		}
		info.Files, info.Pages = append(info.Files, dstArchive), info.Pages+pages
	}
	for _, f := range info.Files {
		if st, err := os.Stat(f); err == nil {
			info.Bytes += st.Size()
		}
	}
	return info, nil
}

// backupFile copies one database file to dst, which must not exist.
func backupFile(ctx context.Context, path, dst string) (int, error) {
	pages := 0
	if _, err := os.Stat(path); err != nil {
		return 0, fmt.Errorf("backup: no database: %w", err)
	}
	if _, err := os.Lstat(dst); err == nil {
		return 0, fmt.Errorf("backup: %s exists; give a new path", dst)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "query_only(1)")
	src, err := sql.Open("sqlite", "file:"+uriPath(path)+"?"+q.Encode())
	if err != nil {
		return 0, err
	}
	defer src.Close()
	conn, err := src.Conn(ctx)
	if err != nil {
		return 0, fmt.Errorf("backup: open %s: %w", path, err)
	}
	defer conn.Close()

	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".partial")
	removeDB(tmp) // a partial copy left by an interrupted backup
	defer removeDB(tmp)
	err = conn.Raw(func(dc any) error {
		b, ok := dc.(backuper)
		if !ok {
			return errors.New("the SQLite driver has no online backup API")
		}
		for {
			n, err := copyOnce(b, tmp)
			if err == nil {
				pages = n
				return nil
			}
			if !isBusy(err) {
				return err
			}
			// Another connection holds a lock the copy needs (a
			// checkpoint restarting the WAL): try again shortly.
			select {
			case <-ctx.Done():
				return errors.Join(err, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	if err != nil {
		return 0, fmt.Errorf("backup of %s: %w", path, err)
	}
	if err := check(ctx, tmp); err != nil {
		return 0, fmt.Errorf("backup copy %s: %w", tmp, err)
	}
	// The copy holds device credentials (hashed) and history: owner only.
	if err := os.Chmod(tmp, 0o600); err != nil {
		return 0, err
	}
	if err := syncFile(tmp); err != nil {
		return 0, err
	}
	if err := os.Link(tmp, dst); err != nil { // fails if dst appeared meanwhile
		return 0, fmt.Errorf("backup: %w", err)
	}
	if d, err := os.Open(filepath.Dir(dst)); err == nil {
		d.Sync()
		d.Close()
	}
	return pages, nil
}

// copyOnce copies every page in one step, so in one read transaction.
func copyOnce(b backuper, tmp string) (int, error) {
	bk, err := b.NewBackup("file:" + uriPath(tmp))
	if err != nil {
		return 0, err
	}
	more, err := bk.Step(-1)
	pages := bk.PageCount()
	if ferr := bk.Finish(); err == nil {
		err = ferr
	}
	if err == nil && more {
		err = errors.New("backup step stopped before the last page")
	}
	if err != nil {
		removeDB(tmp)
		return 0, err
	}
	return pages, nil
}

func isBusy(err error) bool {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
			return true
		}
	}
	return false
}

// check opens a copy and runs SQLite's integrity check on it.
func check(ctx context.Context, path string) error {
	db, err := sql.Open("sqlite", "file:"+uriPath(path)+"?_pragma=busy_timeout(10000)")
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, "PRAGMA integrity_check")
	if err != nil {
		return err
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return err
		}
		if s != "ok" {
			problems = append(problems, s)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("integrity check: %s", strings.Join(problems, "; "))
	}
	return nil
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// removeDB removes a database file and its journals.
func removeDB(path string) {
	for _, suffix := range []string{"", "-journal", "-wal", "-shm"} {
		os.Remove(path + suffix)
	}
}

// StoredFirmware lists the firmware artifacts whose file the server keeps
// (no URL) in the database file at path, a backup copy: what a backup must
// hold in its firmware directory. The file is opened read-only.
func StoredFirmware(ctx context.Context, path string) ([]fleet.Firmware, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", "file:"+uriPath(path)+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var exists int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'firmware'`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if exists == 0 { // a database from before firmware was kept
		return nil, nil
	}
	rows, err := db.QueryContext(ctx, `SELECT spec FROM firmware ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	defer rows.Close()
	var out []fleet.Firmware
	for rows.Next() {
		var spec string
		if err := rows.Scan(&spec); err != nil {
			return nil, err
		}
		var f fleet.Firmware
		if err := json.Unmarshal([]byte(spec), &f); err != nil {
			return nil, fmt.Errorf("%s: firmware row: %w", path, err)
		}
		if f.Stored() {
			out = append(out, f)
		}
	}
	return out, rows.Err()
}

// ArchivePath is the history archive's path beside the database at path.
func ArchivePath(path string) string { return archivePath(path) }
