package agent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// signedImage makes a firmware image, its SHA-256 and a signature with a
// new key whose public half is written as PEM to keyFile.
func signedImage(t *testing.T, keyFile string) (img []byte, sum, sig string) {
	t.Helper()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(pub)
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	img = bytes.Repeat([]byte("drover firmware image "), 20000) // 440 kB
	d := sha256.Sum256(img)
	return img, hex.EncodeToString(d[:]), base64.StdEncoding.EncodeToString(ed25519.Sign(priv, d[:]))
}

// The whole update through a real server: upload, rollout, download,
// signature check, install hook, verification by the firmware reported
// after the "reboot" (the hook rewrites the release file).
func TestFirmwareUpdateEndToEnd(t *testing.T) {
	t.Parallel()
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) {
		c.PushInterval, c.RolloutInterval = 1, 100*time.Millisecond
	}})
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	os.WriteFile(ca, s.CACertPEM, 0o644)
	keyFile := filepath.Join(dir, "fw.pub")
	img, sum, sig := signedImage(t, keyFile)
	root := copyTree(t, "testdata/root")
	flashed := filepath.Join(dir, "flashed.bin")

	cfg := DefaultConfig()
	cfg.Server, cfg.EnrollSecret, cfg.StateDir = s.URL, s.EnrollmentSecret, filepath.Join(dir, "state")
	cfg.TLS.CACert, cfg.Root, cfg.CPUWindow = ca, root, 0
	cfg.Identity.DeviceType = "ICR-3241"
	cfg.MinBackoff, cfg.MaxBackoff, cfg.RequestTimeout = 100*time.Millisecond, time.Second, 5*time.Second
	cfg.FirmwareKey = keyFile
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	cfg.FirmwareHook = fmt.Sprintf(`cp "$DROVER_FIRMWARE_FILE" %s && sed -i "s/^DISTRIB_DESCRIPTION=.*/DISTRIB_DESCRIPTION='$DROVER_FIRMWARE_VERSION'/" %s/etc/openwrt_release`,
		flashed, root)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		a.Close()
	}()
	api := adminAPI(t, s)
	waitFor(t, 20*time.Second, "the device's first push", func() bool {
		var out struct{ Devices []deviceView }
		api("GET", "/api/v1/devices?liveness=online", nil, &out)
		return len(out.Devices) == 1
	})
	if st := api("POST", "/api/v1/firmware?device_type=ICR-3241&version=7.0.0&signature="+strings.ReplaceAll(sig, "+", "%2B"), img, nil); st != 201 {
		t.Fatalf("upload: %d", st)
	}
	if st := api("POST", "/api/v1/rollouts", []byte(`{"firmware_id":1,"waves":["1"]}`), nil); st != 201 {
		t.Fatalf("rollout: %d", st)
	}
	var ro struct {
		State  string
		Counts map[string]int
	}
	var devs struct{ Devices []map[string]any }
	defer func() {
		if t.Failed() {
			t.Logf("rollout %+v, devices %v", ro, devs.Devices)
		}
	}()
	waitFor(t, 60*time.Second, "the device verified", func() bool {
		api("GET", "/api/v1/rollouts/1", nil, &ro)
		api("GET", "/api/v1/rollouts/1/devices", nil, &devs)
		return ro.Counts["verified"] == 1
	})
	if got, _ := os.ReadFile(flashed); !bytes.Equal(got, img) {
		t.Fatalf("the hook was given %d bytes, want the %d-byte image", len(got), len(img))
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "firmware", sum+".part")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("downloaded file left behind: %v", err)
	}
	api("GET", "/api/v1/rollouts/1/devices", nil, &devs)
	if len(devs.Devices) != 1 || devs.Devices[0]["from_firmware"] != "OpenWrt 23.05.3 r23809-234f1a2efa" {
		t.Fatalf("rollout devices %v", devs.Devices)
	}
}

// flakyFiles serves img at /fw.bin, cutting the first answer after half
// the bytes, and records the Range headers it was asked.
type flakyFiles struct {
	img    []byte
	mu     sync.Mutex
	ranges []string
}

func (f *flakyFiles) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.ranges = append(f.ranges, r.Header.Get("Range"))
	first := len(f.ranges) == 1
	f.mu.Unlock()
	if first {
		w.Header().Set("Content-Length", strconv.Itoa(len(f.img)))
		w.Write(f.img[:len(f.img)/2])
		panic(http.ErrAbortHandler) // the link drops
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.img))
}

// An interrupted download resumes with Range; a file that is not the one
// offered (hash, signature) is refused and deleted.
func TestFirmwareDownloadResumesAndChecks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "fw.pub")
	img, sum, sig := signedImage(t, keyFile)
	files := &flakyFiles{img: img}
	hs := httptest.NewServer(files)
	defer hs.Close()
	cfg := DefaultConfig()
	cfg.Server, cfg.StateDir, cfg.Root = "https://drover.invalid", dir, "testdata/root"
	cfg.TLS.AllowHTTP, cfg.FirmwareKey, cfg.FirmwareHook = true, keyFile, "true"
	cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	j := &fwJob{Rollout: 1, Version: "7", URL: hs.URL + "/fw.bin", SHA256: sum, Size: int64(len(img)), Signature: sig}
	if err := a.fetchAndCheck(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	if len(files.ranges) != 2 || files.ranges[0] != "" || files.ranges[1] != "bytes="+strconv.Itoa(len(img)/2)+"-" {
		t.Fatalf("requests' Range headers %q, want none then the second half", files.ranges)
	}
	if got, _ := os.ReadFile(a.partPath(sum)); !bytes.Equal(got, img) {
		t.Fatal("resumed file differs from the image")
	}
	os.Remove(a.partPath(sum))

	bad := *j
	bad.Signature = base64.StdEncoding.EncodeToString(make([]byte, 64))
	if err := a.fetchAndCheck(context.Background(), &bad); !errors.Is(err, errCheck) || !strings.Contains(err.Error(), "signature") {
		t.Fatalf("bad signature: %v", err)
	}
	bad = *j
	bad.SHA256 = strings.Repeat("0", 64)
	if err := a.fetchAndCheck(context.Background(), &bad); !errors.Is(err, errCheck) || !strings.Contains(err.Error(), "sha256 mismatch") {
		t.Fatalf("bad hash: %v", err)
	}
	if _, err := os.Stat(a.partPath(bad.SHA256)); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a file that failed its check is kept")
	}
	bad = *j
	bad.Size = 10
	if err := a.fetchAndCheck(context.Background(), &bad); !errors.Is(err, errCheck) {
		t.Fatalf("larger than offered: %v", err)
	}
}

func TestLoadFirmwareKey(t *testing.T) {
	dir := t.TempDir()
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	raw := filepath.Join(dir, "raw")
	os.WriteFile(raw, []byte(base64.StdEncoding.EncodeToString(pub)+"\n"), 0o600)
	if k, err := LoadFirmwareKey(raw); err != nil || !bytes.Equal(k, pub) {
		t.Fatalf("raw key: %v", err)
	}
	bad := filepath.Join(dir, "bad")
	os.WriteFile(bad, []byte("not a key"), 0o600)
	if _, err := LoadFirmwareKey(bad); err == nil {
		t.Fatal("bad key accepted")
	}
}

// adminAPI calls s's operator API with the admin token.
func adminAPI(t *testing.T, s *servertest.Server) func(method, path string, body []byte, out any) int {
	return func(method, path string, body []byte, out any) int {
		t.Helper()
		return s.Admin(t, method, path, body, out)
	}
}
