package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// Firmware files in the database (cluster mode, migration
// 086_firmware_blobs.sql, docs/firmware.md): chunks of blobChunk bytes.

const blobChunk = 1 << 20

// PutFirmwareBlob stores the file r under its SHA-256 sum, in one
// transaction (never a part of it); content stored already is kept.
func (s *Store) PutFirmwareBlob(ctx context.Context, sum string, r io.Reader) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	var have bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM firmware_blobs WHERE sha256 = $1 AND n = 0)`, sum).Scan(&have); err != nil || have {
		return err
	}
	buf := make([]byte, blobChunk)
	for n := 0; ; n++ {
		k, rerr := io.ReadFull(r, buf)
		if k > 0 {
			if _, err := tx.Exec(ctx, `INSERT INTO firmware_blobs (sha256, n, data) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, sum, n, buf[:k]); err != nil {
				return err
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	return tx.Commit(ctx)
}

// GetFirmwareBlob writes the stored file of sum to w, chunk by chunk
// (the rows stream: never the whole file in memory).
func (s *Store) GetFirmwareBlob(ctx context.Context, sum string, w io.Writer) (int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT n, data FROM firmware_blobs WHERE sha256 = $1 ORDER BY n`, sum)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var written int64
	want := 0
	for rows.Next() {
		var n int
		var data []byte
		if err := rows.Scan(&n, &data); err != nil {
			return written, err
		}
		if n != want {
			return written, fmt.Errorf("postgres: firmware %s: chunk %d missing", sum, want)
		}
		want++
		k, err := w.Write(data)
		written += int64(k)
		if err != nil {
			return written, err
		}
	}
	if err := rows.Err(); err != nil {
		return written, err
	}
	if want == 0 {
		return 0, fmt.Errorf("postgres: firmware %s is not stored", sum)
	}
	return written, nil
}

// DeleteFirmwareBlob deletes the stored file of sum unless a stored
// artifact (another node's, maybe) names it.
func (s *Store) DeleteFirmwareBlob(ctx context.Context, sum string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM firmware_blobs WHERE sha256 = $1
		AND NOT EXISTS (SELECT 1 FROM firmware WHERE spec::jsonb->>'sha256' = $1 AND coalesce(spec::jsonb->>'url', '') = '')`, sum)
	return err
}
