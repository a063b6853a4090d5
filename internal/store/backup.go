package store

import (
	"context"
	"fmt"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/sqlite"
)

// Backup copies the SQLite database dsn names to dst (a new file) with
// SQLite's online backup API, while a server may be writing to it.
// PostgreSQL and MariaDB are backed up with their own tools
// (docs/operations.md#backup-and-restore).
func Backup(ctx context.Context, dsn, dst string) (sqlite.BackupInfo, error) {
	backend, rest, err := Parse(dsn)
	if err != nil {
		return sqlite.BackupInfo{}, err
	}
	switch backend {
	case Postgres:
		return sqlite.BackupInfo{}, fmt.Errorf("drover backup copies SQLite databases; back up PostgreSQL with pg_dump (docs/operations.md#backup-and-restore)")
	case MySQL:
		return sqlite.BackupInfo{}, fmt.Errorf("drover backup copies SQLite databases; back up MariaDB/MySQL with mariadb-dump (docs/operations.md#backup-and-restore)")
	}
	return sqlite.Backup(ctx, rest, dst)
}

// StoredFirmware lists the artifacts whose file the server keeps, from the
// SQLite database file at path (a backup's copy).
func StoredFirmware(ctx context.Context, path string) ([]fleet.Firmware, error) {
	return sqlite.StoredFirmware(ctx, path)
}

// ArchivePath is the SQLite history archive's path beside the database
// file at path.
func ArchivePath(path string) string { return sqlite.ArchivePath(path) }
