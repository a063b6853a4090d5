package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/drover/drover/internal/buildinfo"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/fsutil"
	"github.com/drover/drover/internal/store"
)

// ManifestName is the file of a backup that lists every other file of it,
// with its size and SHA-256; Backup writes it last, Restore checks it.
const ManifestName = "manifest.json"

// BackupManifest is a backup's manifest.json.
type BackupManifest struct {
	Format    int       `json:"format"` // 1
	CreatedAt time.Time `json:"created_at"`
	Drover    string    `json:"drover"`  // the version that wrote it
	Backend   string    `json:"backend"` // sqlite, postgres or mysql
	// Database says whether the backup holds the database (SQLite); for
	// PostgreSQL and MariaDB it is the operator's dump, kept apart.
	Database bool         `json:"database"`
	Files    []BackupFile `json:"files"`
}

// BackupFile is one file of a backup, relative to its directory.
type BackupFile struct {
	Path   string `json:"path"` // slash-separated
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// BackupResult says what Backup wrote.
type BackupResult struct {
	Dir      string
	Database []string // the database copies (the database, its history archive)
	Pages    int      // their pages
	Bytes    int64    // size of every file written
	Firmware int      // firmware files
	Files    []string // the other files copied, relative to Dir
}

// BackupError lists what makes a backup unusable: each problem names a
// file of the backup.
type BackupError struct {
	Dir      string
	Problems []string
}

func (e *BackupError) Error() string {
	return fmt.Sprintf("backup %s is incomplete or damaged, nothing was restored:\n  %s", e.Dir, strings.Join(e.Problems, "\n  "))
}

// Backup writes a copy of a server's state into dir, a new directory that
// can serve as the --data-dir of a restored server (or be restored with
// Restore): the SQLite database and its history archive (copied with
// SQLite's online backup API while the server runs), every firmware file
// the server keeps, the generated secrets, the generated TLS certificate
// and key, the ACME account and certificates, and manifest.json listing
// each file with its size and SHA-256, written last. With PostgreSQL or
// MariaDB the database is left to the engine's tools and every other part
// is written. cfg is the server's configuration.
func Backup(ctx context.Context, cfg Config, dir string) (BackupResult, error) {
	return BackupWith(ctx, cfg, dir, BackupOptions{})
}

// BackupOptions change what Backup writes.
type BackupOptions struct {
	// NoDatabase leaves the database out, for PostgreSQL and MariaDB,
	// whose database the engine's tools back up: without it Backup refuses
	// them.
	NoDatabase bool
}

// BackupWith is Backup with options.
func BackupWith(ctx context.Context, cfg Config, dir string, opt BackupOptions) (BackupResult, error) {
	res := BackupResult{Dir: dir}
	backend, _, err := store.Parse(cfg.dbDSN())
	if err != nil {
		return res, err
	}
	switch {
	case backend == store.SQLite && opt.NoDatabase:
		return res, errors.New("the SQLite database is part of the backup: --no-database is for PostgreSQL and MariaDB")
	case backend != store.SQLite && !opt.NoDatabase:
		_, err := store.Backup(ctx, cfg.dbDSN(), "")
		return res, fmt.Errorf("%w; then drover backup --no-database DIR copies what the database does not hold (firmware files, secrets, TLS)", err)
	}
	if _, err := os.Lstat(dir); err == nil {
		return res, fmt.Errorf("%s exists; back up into a new directory", dir)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return res, err
	}
	// The backup holds credentials (secrets.json, the TLS key, device
	// token hashes): owner only.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	m := BackupManifest{Format: 1, CreatedAt: time.Now().UTC().Truncate(time.Second), Drover: buildinfo.Version(), Backend: backend}
	add := func(rel string, size int64, sum string) {
		m.Files = append(m.Files, BackupFile{Path: filepath.ToSlash(rel), Size: size, SHA256: sum})
		res.Bytes += size
	}
	var stored []fleet.Firmware // what the database says the firmware directory holds
	if backend == store.SQLite {
		info, err := store.Backup(ctx, cfg.dbDSN(), filepath.Join(dir, "drover.db"))
		if err != nil {
			return res, err
		}
		res.Database, res.Pages = info.Files, info.Pages
		for _, f := range info.Files {
			size, sum, err := hashFile(f)
			if err != nil {
				return res, err
			}
			add(filepath.Base(f), size, sum)
		}
		m.Database = true
		if stored, err = store.StoredFirmware(ctx, filepath.Join(dir, "drover.db")); err != nil {
			return res, err
		}
	}
	n, err := backupFirmware(ctx, cfg.firmwareDir(), dir, stored, m.Database, add)
	if err != nil {
		return res, err
	}
	res.Firmware = n
	// The files the server generated; a certificate given with --tls-cert
	// and secrets given by flag, environment or file are the operator's to
	// keep.
	for _, rel := range []string{"secrets.json", filepath.Join("tls", "cert.pem"), filepath.Join("tls", "key.pem")} {
		size, sum, err := copyFile(filepath.Join(cfg.DataDir, rel), filepath.Join(dir, rel), "")
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return res, err
		}
		add(rel, size, sum)
		res.Files = append(res.Files, rel)
	}
	acme := cfg.acmeCacheDir()
	entries, err := os.ReadDir(acme)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return res, err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		rel := filepath.Join("acme", e.Name())
		size, sum, err := copyFile(filepath.Join(acme, e.Name()), filepath.Join(dir, rel), "")
		if err != nil {
			return res, err
		}
		add(rel, size, sum)
		res.Files = append(res.Files, rel)
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, ManifestName), append(b, '\n'), 0o600); err != nil {
		return res, err
	}
	ok = true
	return res, nil
}

// firmwareFile matches the name of a stored firmware file.
var firmwareFile = regexp.MustCompile(`^[0-9a-f]{64}\.bin$`)

// backupFirmware copies the firmware files into dir/firmware, checking
// each against its SHA-256 (its name). With the database in the backup
// (byDB) the files are those its stored artifacts name, and one missing
// fails the backup; otherwise every file of the directory.
func backupFirmware(ctx context.Context, from, dir string, stored []fleet.Firmware, byDB bool, add func(string, int64, string)) (int, error) {
	var names []string
	if byDB {
		for _, f := range stored {
			if !slices.Contains(names, f.FileName()) {
				names = append(names, f.FileName())
			}
		}
	} else {
		entries, err := os.ReadDir(from)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, err
		}
		for _, e := range entries {
			if e.Type().IsRegular() && firmwareFile.MatchString(e.Name()) {
				names = append(names, e.Name())
			}
		}
	}
	var problems []string
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		sum := strings.TrimSuffix(name, ".bin")
		rel := filepath.Join("firmware", name)
		size, _, err := copyFile(filepath.Join(from, name), filepath.Join(dir, rel), sum)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			problems = append(problems, fmt.Sprintf("%s is missing on this server (%s)", filepath.Join(from, name), artifactsOf(stored, sum)))
		case errors.Is(err, errSumMismatch):
			problems = append(problems, fmt.Sprintf("%s does not match its SHA-256 (%s)", filepath.Join(from, name), artifactsOf(stored, sum)))
		case err != nil:
			return 0, err
		default:
			add(rel, size, sum)
		}
	}
	if len(problems) > 0 {
		return 0, fmt.Errorf("firmware files the database lists cannot be backed up; upload them again or delete their artifacts, then back up again:\n  %s",
			strings.Join(problems, "\n  "))
	}
	return len(names), nil
}

// artifactsOf names the artifacts whose file has SHA-256 sum.
func artifactsOf(stored []fleet.Firmware, sum string) string {
	var s []string
	for _, f := range stored {
		if f.SHA256 == sum {
			s = append(s, fmt.Sprintf("firmware %d, %s %s", f.ID, f.DeviceType, f.Version))
		}
	}
	if len(s) == 0 {
		return "no artifact"
	}
	return strings.Join(s, "; ")
}

var errSumMismatch = errors.New("SHA-256 mismatch")

// copyFile copies from to to (mode 0600, its directory 0700 if made),
// through a temporary file synced and renamed into place, and returns its
// size and SHA-256; with want set, a copy of another SHA-256 fails with
// errSumMismatch and leaves nothing.
func copyFile(from, to, want string) (int64, string, error) {
	in, err := os.Open(from)
	if err != nil {
		return 0, "", err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
		return 0, "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(to), "."+filepath.Base(to)+".partial-*")
	if err != nil {
		return 0, "", err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	h := sha256.New()
	size, err := io.Copy(io.MultiWriter(tmp, h), in)
	sum := hex.EncodeToString(h.Sum(nil))
	if err == nil && want != "" && sum != want {
		err = fmt.Errorf("%s: %w", from, errSumMismatch)
	}
	if err == nil {
		err = tmp.Chmod(0o600)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), to)
	}
	if err != nil {
		return 0, "", err
	}
	if d, err := os.Open(filepath.Dir(to)); err == nil {
		d.Sync()
		d.Close()
	}
	return size, sum, nil
}

// hashFile returns a file's size and SHA-256.
func hashFile(path string) (int64, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	return n, hex.EncodeToString(h.Sum(nil)), err
}

// ReadBackup reads dir's manifest and checks the backup against it: every
// file listed is there with its size and SHA-256, and (with a database)
// every firmware file the database lists is in the backup. A
// *BackupError names each file missing or corrupt.
func ReadBackup(ctx context.Context, dir string) (BackupManifest, error) {
	var m BackupManifest
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(dir); serr != nil {
			return m, serr
		}
		return m, &BackupError{Dir: dir, Problems: []string{ManifestName + " is missing: the backup was interrupted, or is not one drover backup wrote"}}
	}
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Format != 1 {
		return m, &BackupError{Dir: dir, Problems: []string{ManifestName + " is damaged or of an unknown format"}}
	}
	var problems []string
	listed := map[string]bool{}
	for _, f := range m.Files {
		if err := ctx.Err(); err != nil {
			return m, err
		}
		if !filepath.IsLocal(filepath.FromSlash(f.Path)) || path.Clean(f.Path) != f.Path || f.Path == ManifestName || listed[f.Path] {
			problems = append(problems, fmt.Sprintf("%s: not a valid manifest entry", f.Path))
			continue
		}
		listed[f.Path] = true
		size, sum, err := hashFile(filepath.Join(dir, filepath.FromSlash(f.Path)))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			problems = append(problems, "missing: "+f.Path)
		case err != nil:
			problems = append(problems, fmt.Sprintf("unreadable: %s: %v", f.Path, err))
		case size != f.Size:
			problems = append(problems, fmt.Sprintf("corrupt: %s (%d bytes, the manifest says %d)", f.Path, size, f.Size))
		case sum != f.SHA256:
			problems = append(problems, fmt.Sprintf("corrupt: %s (its SHA-256 is not the manifest's)", f.Path))
		}
	}
	if m.Database && len(problems) == 0 {
		stored, err := store.StoredFirmware(ctx, filepath.Join(dir, "drover.db"))
		if err != nil {
			problems = append(problems, fmt.Sprintf("unreadable: drover.db: %v", err))
		}
		seen := map[string]bool{}
		for _, f := range stored {
			rel := "firmware/" + f.FileName()
			if !listed[rel] && !seen[rel] {
				seen[rel] = true
				problems = append(problems, fmt.Sprintf("missing: %s (%s), which drover.db lists", rel, artifactsOf(stored, f.SHA256)))
			}
		}
	}
	if len(problems) > 0 {
		return m, &BackupError{Dir: dir, Problems: problems}
	}
	return m, nil
}

// RestoreResult says what Restore wrote.
type RestoreResult struct {
	Manifest BackupManifest
	Files    []string // where each file went
	Bytes    int64
	Firmware int
}

// Restore checks the backup in dir (ReadBackup) and copies it into cfg's
// data directory, database path, firmware and ACME directories: the
// places a server started with cfg reads. It never overwrites: each file
// must be new there (a firmware file may exist with the same content).
// Nothing is written unless the backup is complete.
func Restore(ctx context.Context, cfg Config, dir string) (RestoreResult, error) {
	var res RestoreResult
	m, err := ReadBackup(ctx, dir)
	res.Manifest = m
	if err != nil {
		return res, err
	}
	backend, dbPath, err := store.Parse(cfg.dbDSN())
	if err != nil {
		return res, err
	}
	switch {
	case m.Database && backend != store.SQLite:
		return res, fmt.Errorf("backup %s holds a SQLite database; restore it into SQLite (--db sqlite:PATH, or none for data-dir/drover.db)", dir)
	case !m.Database && backend == store.SQLite:
		return res, fmt.Errorf("backup %s holds no database (the server ran on %s): restore that database with its own tools, then run drover restore with its --db", dir, m.Backend)
	}
	// Where each file goes, checked before anything is written.
	dest := map[string]string{}
	var problems []string
	for _, f := range m.Files {
		rel := filepath.FromSlash(f.Path)
		var to string
		switch first, rest, _ := strings.Cut(f.Path, "/"); {
		case f.Path == "drover.db":
			to = dbPath
		case f.Path == "drover-history.db":
			to = store.ArchivePath(dbPath)
		case first == "firmware":
			to = filepath.Join(cfg.firmwareDir(), filepath.FromSlash(rest))
		case first == "acme":
			to = filepath.Join(cfg.acmeCacheDir(), filepath.FromSlash(rest))
		default:
			to = filepath.Join(cfg.DataDir, rel)
		}
		dest[f.Path] = to
		if _, err := os.Lstat(to); err == nil {
			if size, sum, err := hashFile(to); strings.HasPrefix(f.Path, "firmware/") && err == nil && size == f.Size && sum == f.SHA256 {
				continue
			}
			problems = append(problems, to+" exists")
		} else if !errors.Is(err, fs.ErrNotExist) {
			return res, err
		}
	}
	if len(problems) > 0 {
		return res, fmt.Errorf("restore never overwrites; stop the server and move its data aside (or give a new --data-dir):\n  %s", strings.Join(problems, "\n  "))
	}
	if m.Database {
		for _, side := range []string{"-wal", "-shm", "-journal"} {
			os.Remove(dbPath + side) // left by an old database: not this one's
		}
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return res, err
	}
	var written []string
	for _, f := range m.Files {
		to := dest[f.Path]
		if _, err := os.Lstat(to); err == nil {
			continue // the same firmware file
		}
		size, _, err := copyFile(filepath.Join(dir, filepath.FromSlash(f.Path)), to, f.SHA256)
		if err != nil {
			for _, w := range written {
				os.Remove(w)
			}
			return res, fmt.Errorf("restoring %s: %w", f.Path, err)
		}
		written = append(written, to)
		res.Bytes += size
		if strings.HasPrefix(f.Path, "firmware/") {
			res.Firmware++
		}
	}
	res.Files = written
	return res, nil
}
