package postgres

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"

	"github.com/drover/drover/internal/fleet"
)

// A firmware file in the database: stored in chunks, read back whole and
// in order, stored once however often it is put, and kept while a stored
// artifact names it.
func TestFirmwareBlobs(t *testing.T) {
	ctx := context.Background()
	s := clusterStore(t)
	img := make([]byte, 2*blobChunk+123)
	rand.Read(img)
	sum := "ab" + string(bytes.Repeat([]byte("0"), 62))
	for range 2 {
		if err := s.PutFirmwareBlob(ctx, sum, bytes.NewReader(img)); err != nil {
			t.Fatal(err)
		}
	}
	var chunks int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM firmware_blobs WHERE sha256 = $1`, sum).Scan(&chunks); err != nil || chunks != 3 {
		t.Fatalf("chunks: %d %v, want 3", chunks, err)
	}
	var out bytes.Buffer
	if n, err := s.GetFirmwareBlob(ctx, sum, &out); err != nil || n != int64(len(img)) || !bytes.Equal(out.Bytes(), img) {
		t.Fatalf("read back: %d bytes, %v", n, err)
	}
	if _, err := s.GetFirmwareBlob(ctx, "cd"+sum[2:], &out); err == nil {
		t.Fatal("a file never stored was read")
	}
	if err := s.SaveFirmware(ctx, fleet.Firmware{ID: 1, DeviceType: "t", Version: "1", SHA256: sum, Size: int64(len(img))}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteFirmwareBlob(ctx, sum); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetFirmwareBlob(ctx, sum, &bytes.Buffer{}); err != nil {
		t.Fatalf("deleted while an artifact names it: %v", err)
	}
	if err := s.DeleteFirmware(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteFirmwareBlob(ctx, sum); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetFirmwareBlob(ctx, sum, &bytes.Buffer{}); err == nil {
		t.Fatal("still stored after the delete")
	}
}
