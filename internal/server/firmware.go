package server

// Firmware files over HTTP (docs/firmware.md); rollouts are in
// rollouts.go, a profile's history in profiles.go.
// Uploads stream to a temporary file while SHA-256 is computed, within
// -firmware-max-size, and are renamed into place; downloads are
// http.ServeContent on the open file (Range, If-Range, no copy through
// memory).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/server/transport"
)

// firmwareFiles is the directory of uploaded firmware.
type firmwareFiles struct {
	dir         string
	max         int64
	downloadMax time.Duration
	// blobs, in cluster mode, is the shared database's copy of every
	// uploaded file: the directory is then this node's cache of it
	// (docs/firmware.md#firmware-files-in-a-cluster); nil otherwise.
	blobs firmwareBlobs
	// fetching: files being fetched from blobs, by SHA-256 (one fetch
	// per file however many devices ask).
	fetchMu  sync.Mutex
	fetching map[string]*blobFetch
}

// firmwareBlobs keeps uploaded firmware files in the shared database
// (store.Cluster).
type firmwareBlobs interface {
	PutFirmwareBlob(ctx context.Context, sum string, r io.Reader) error
	GetFirmwareBlob(ctx context.Context, sum string, w io.Writer) (int64, error)
	DeleteFirmwareBlob(ctx context.Context, sum string) error
}

type blobFetch struct {
	done chan struct{}
	err  error
}

func firmwareTooLarge(max int64) *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, code: "body_too_large",
		msg: "the firmware file exceeds --firmware-max-size, " + strconv.FormatInt(max, 10) + " bytes", outcome: outInvalid}
}

// put streams r into the directory under its SHA-256 and returns both.
func (ff *firmwareFiles) put(r io.Reader) (sum string, size int64, err error) {
	if err := os.MkdirAll(ff.dir, 0o750); err != nil {
		return "", 0, err
	}
	tmp, err := os.CreateTemp(ff.dir, ".upload-*")
	if err != nil {
		return "", 0, err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	h := sha256.New()
	size, err = io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, ff.max+1))
	if err == nil && size > ff.max {
		err = firmwareTooLarge(ff.max)
	}
	if err == nil && size == 0 {
		err = badField("the firmware file is empty")
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			err = firmwareTooLarge(ff.max)
		}
		return "", 0, err
	}
	sum = hex.EncodeToString(h.Sum(nil))
	if err := os.Rename(tmp.Name(), filepath.Join(ff.dir, sum+".bin")); err != nil {
		return "", 0, err
	}
	if d, err := os.Open(ff.dir); err == nil {
		d.Sync()
		d.Close()
	}
	return sum, size, nil
}

// checkFiles warns, at start, of the stored artifacts whose file is not in
// the directory (or not whole): their downloads would answer 503 until the
// file is put back (a restore without the firmware, a lost disk).
func (ff *firmwareFiles) checkFiles(fws []fleet.Firmware, log *slog.Logger) {
	var missing []string
	for _, f := range fws {
		if !f.Stored() {
			continue
		}
		if st, err := os.Stat(filepath.Join(ff.dir, f.FileName())); err != nil || st.Size() != f.Size {
			missing = append(missing, fmt.Sprintf("%d (%s %s, %s)", f.ID, f.DeviceType, f.Version, f.FileName()))
		}
	}
	if len(missing) == 0 {
		return
	}
	n := len(missing)
	if n > 20 {
		missing = append(missing[:20], "…")
	}
	log.Warn("firmware files missing", "artifacts", n, "firmware", strings.Join(missing, ", "), "dir", ff.dir)
}

// extend lets a long transfer run up to downloadMax.
func (ff *firmwareFiles) extend(w http.ResponseWriter) {
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(ff.downloadMax)
	rc.SetReadDeadline(deadline)
	rc.SetWriteDeadline(deadline)
}

func (a *api) listFirmware(*http.Request) (any, error) {
	return firmwareList{a.fleet.Firmware()}, nil
}

func (a *api) getFirmware(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	f, ok := a.fleet.FirmwareByID(id)
	if !ok {
		return nil, notFound("firmware " + strconv.FormatUint(id, 10))
	}
	return f, nil
}

// uploadFirmware adds an artifact: the file as the body with its metadata
// in the query, or (Content-Type application/json) a reference to a file
// kept elsewhere.
func (a *api) uploadFirmware(r *http.Request) (any, error) {
	by, err := changedBy(r)
	if err != nil {
		return nil, err
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct == "application/json" {
		r.Body = http.MaxBytesReader(nil, r.Body, 64<<10)
		var f fleet.Firmware
		if err := decodeStrict(r, "firmware: ", &firmwareRefBody{&f.DeviceType, &f.Version, &f.SHA256, &f.Size, &f.Signature, &f.URL}); err != nil {
			return nil, err
		}
		if f.URL == "" {
			return nil, badField("url is required when no file is uploaded")
		}
		f.By = by
		f, err = a.fleet.AddFirmware(r.Context(), f)
		if err != nil {
			return nil, err
		}
		return created(f), nil
	}
	q := r.URL.Query()
	meta := fleet.Firmware{DeviceType: q.Get("device_type"), Version: q.Get("version"), Signature: q.Get("signature"), By: by}
	f, err := a.storeFirmware(r.Context(), meta, q.Get("sha256"), r.Body, r.ContentLength)
	if err != nil {
		return nil, err
	}
	return created(f), nil
}

// storeFirmware checks meta, stores body as its file and records it; want
// is the SHA-256 the uploader expects ("": any). The dashboard uses it too.
func (a *api) storeFirmware(ctx context.Context, meta fleet.Firmware, want string, body io.Reader, length int64) (fleet.Firmware, error) {
	// The metadata is checked before the body is read.
	probe := meta
	probe.SHA256, probe.Size = strings.Repeat("0", 64), 1
	if err := probe.Check(); err != nil {
		return fleet.Firmware{}, err
	}
	if length > a.fw.max {
		return fleet.Firmware{}, firmwareTooLarge(a.fw.max)
	}
	sum, size, err := a.fw.put(body)
	if err != nil {
		return fleet.Firmware{}, err
	}
	meta.SHA256, meta.Size = sum, size
	if want != "" && !strings.EqualFold(want, sum) {
		err = badField("sha256 mismatch: the uploaded file's is " + sum)
	} else if err = a.fw.share(ctx, sum); err == nil {
		meta, err = a.fleet.AddFirmware(ctx, meta)
	}
	if err != nil {
		a.removeFile(sum)
		return fleet.Firmware{}, err
	}
	return meta, nil
}

// removeFile deletes a stored file no artifact refers to.
func (a *api) removeFile(sum string) {
	for _, f := range a.fleet.Firmware() {
		if f.Stored() && f.SHA256 == sum {
			return
		}
	}
	if err := os.Remove(filepath.Join(a.fw.dir, sum+".bin")); err != nil && !errors.Is(err, os.ErrNotExist) {
		a.log.Warn("removing a firmware file failed", "sha256", sum, "err", err)
	}
	if a.fw.blobs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := a.fw.blobs.DeleteFirmwareBlob(ctx, sum); err != nil {
			a.log.Warn("removing a firmware file from the database failed", "sha256", sum, "err", err)
		}
	}
}

// share, in cluster mode, copies the uploaded file of sum into the
// database, for the other nodes.
func (ff *firmwareFiles) share(ctx context.Context, sum string) error {
	if ff.blobs == nil {
		return nil
	}
	f, err := os.Open(filepath.Join(ff.dir, sum+".bin"))
	if err != nil {
		return err
	}
	defer f.Close()
	return ff.blobs.PutFirmwareBlob(ctx, sum, f)
}

// open opens the stored file of f; in cluster mode a node that lacks it
// fetches it from the database first (once, whoever asks meanwhile
// waits), checking its size and SHA-256 before it is put in place.
func (ff *firmwareFiles) open(ctx context.Context, f fleet.Firmware) (*os.File, error) {
	path := filepath.Join(ff.dir, f.FileName())
	file, err := os.Open(path)
	if err == nil || ff.blobs == nil || !errors.Is(err, os.ErrNotExist) {
		return file, err
	}
	ff.fetchMu.Lock()
	bf := ff.fetching[f.SHA256]
	if bf == nil {
		if ff.fetching == nil {
			ff.fetching = map[string]*blobFetch{}
		}
		bf = &blobFetch{done: make(chan struct{})}
		ff.fetching[f.SHA256] = bf
		go func() {
			bf.err = ff.fetch(f)
			ff.fetchMu.Lock()
			delete(ff.fetching, f.SHA256)
			ff.fetchMu.Unlock()
			close(bf.done)
		}()
	}
	ff.fetchMu.Unlock()
	select {
	case <-bf.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if bf.err != nil {
		return nil, bf.err
	}
	return os.Open(path)
}

// fetch copies f's file from the database into the directory.
func (ff *firmwareFiles) fetch(f fleet.Firmware) error {
	ctx, cancel := context.WithTimeout(context.Background(), ff.downloadMax)
	defer cancel()
	if err := os.MkdirAll(ff.dir, 0o750); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(ff.dir, ".fetch-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	h := sha256.New()
	n, err := ff.blobs.GetFirmwareBlob(ctx, f.SHA256, io.MultiWriter(tmp, h))
	if err == nil && (n != f.Size || hex.EncodeToString(h.Sum(nil)) != f.SHA256) {
		err = fmt.Errorf("the database's copy of firmware %d does not match its size and SHA-256 (%d bytes)", f.ID, n)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(ff.dir, f.FileName()))
	}
	return err
}

func (a *api) deleteFirmware(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	f, err := a.deleteArtifact(r.Context(), id)
	if err != nil {
		return nil, err
	}
	return firmwareDeleted{f}, nil
}

// deleteArtifact forgets an artifact and removes its file unless shared.
func (a *api) deleteArtifact(ctx context.Context, id uint64) (fleet.Firmware, error) {
	f, shared, err := a.fleet.DeleteFirmware(ctx, id)
	if err == nil && f.Stored() && !shared {
		a.removeFile(f.SHA256)
	}
	return f, err
}

// removeFirmware is deleteArtifact for the dashboard.
func (a *api) removeFirmware(ctx context.Context, id uint64) error {
	_, err := a.deleteArtifact(ctx, id)
	return err
}

// firmwareFile serves a stored firmware file to a device of its type (its
// token) or the operator, with Range; a firmware kept elsewhere redirects.
func (a *api) firmwareFile(w http.ResponseWriter, r *http.Request) {
	rt := &route{endpoint: "firmware_file"}
	id, err := pathID(r)
	if err != nil {
		a.fail(w, rt, err)
		return
	}
	var f fleet.Firmware
	token, _ := bearer(r)
	if who, aerr := a.acc.Authenticate(r.Context(), token); aerr == nil && who.Role >= access.Viewer {
		var ok bool
		if f, ok = a.fleet.FirmwareByID(id); !ok {
			err = fleet.ErrNotFound
		}
	} else if token == "" {
		err = errNoBearer
	} else {
		f, err = a.fleet.FirmwareAccess(token, id)
	}
	if err != nil {
		a.fail(w, rt, err)
		return
	}
	if !f.Stored() {
		http.Redirect(w, r, f.URL, http.StatusFound)
		return
	}
	file, err := a.fw.open(r.Context(), f)
	if err != nil {
		a.fail(w, rt, &apiError{status: http.StatusServiceUnavailable, code: "unavailable", msg: "the firmware file cannot be read; retry later",
			retryAfter: 60, log: "firmware file missing", cause: err})
		return
	}
	defer file.Close()
	a.fw.extend(w)
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("ETag", `"`+f.SHA256+`"`)
	h.Set("Cache-Control", "private, max-age=31536000, immutable")
	a.m.firmwareDownloads.Inc()
	transport.NotBusy(r) // paced by the device's link, not the server
	http.ServeContent(w, r, "", f.CreatedAt, file)
}
