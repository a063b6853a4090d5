package agent

// Firmware updates (docs/firmware.md, "The device side"): the push answer
// offers a firmware; the agent downloads it in the background (resuming
// with Range), checks size, SHA-256 and, with --firmware-key, the ed25519
// signature, reports installing, runs --firmware-hook and reports the
// result; the firmware read after the reboot verifies the update.

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// fwJob is the update under way, kept in state.json.
type fwJob struct {
	Rollout   uint64 `json:"rollout"`
	Version   string `json:"version"`
	URL       string `json:"url"`
	SHA256    string `json:"sha256"`
	Size      int64  `json:"size"`
	Signature string `json:"signature,omitempty"`
	// State is downloading, ready (file checked), installing or failed.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	Hooked bool   `json:"hooked,omitempty"` // the install hook was started
	From   string `json:"from,omitempty"`   // the firmware before the install
}

const fwReady = "ready"

// LoadFirmwareKey reads an ed25519 public key: PEM "PUBLIC KEY" or the 32
// raw bytes in base64.
func LoadFirmwareKey(path string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if blk, _ := pem.Decode(b); blk != nil {
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		pk, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("%s: not an ed25519 public key", path)
		}
		return pk, nil
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%s: neither a PEM public key nor 32 bytes in base64", path)
	}
	return ed25519.PublicKey(raw), nil
}

func (a *Agent) fwDir() string { return filepath.Join(a.cfg.StateDir, "firmware") }

func (a *Agent) partPath(sum string) string { return filepath.Join(a.fwDir(), sum+".part") }

// fwStart settles a job left by the previous run: an install that ended on
// the old firmware failed, one on the new is done.
func (a *Agent) fwStart() {
	j := a.st.Firmware
	if j == nil || j.State != protocol.FirmwareInstalling || !j.Hooked {
		return
	}
	if a.identity.Firmware == j.Version {
		a.log.Info("firmware update installed", "version", j.Version)
		a.st.Firmware = nil
	} else {
		j.State, j.Reason = protocol.FirmwareFailed, "still runs "+a.identity.Firmware+" after installing "+j.Version
		a.log.Error("firmware update failed", "reason", j.Reason)
	}
	a.save()
}

// fwReport is the push's report on the job, if any.
func (a *Agent) fwReport() *protocol.FirmwareReport {
	a.fwMu.Lock()
	defer a.fwMu.Unlock()
	j := a.st.Firmware
	if j == nil {
		return nil
	}
	r := &protocol.FirmwareReport{Rollout: j.Rollout, State: j.State, Reason: j.Reason}
	switch j.State {
	case fwReady:
		r.State, r.Progress = protocol.FirmwareDownloading, j.Size
	case protocol.FirmwareDownloading:
		r.Progress = a.fwProgress.Load()
	}
	return r
}

// fwStep acts on the push answer's offer; it returns true when the server
// should hear the result at once.
func (a *Agent) fwStep(ctx context.Context, o *protocol.FirmwareOffer) bool {
	a.fwMu.Lock()
	j := a.st.Firmware
	var state string
	if j != nil {
		state = j.State
	}
	a.fwMu.Unlock()
	switch {
	case o == nil && j == nil:
		return false
	case o == nil && state == protocol.FirmwareInstalling:
		// The server stops offering once told installing.
		if !j.Hooked {
			return a.fwInstall(ctx, j)
		}
		return false // waiting for the reboot
	case o == nil:
		a.log.Info("firmware offer withdrawn", "rollout", j.Rollout, "state", state)
		a.fwCancel()
		a.setJob(nil)
		os.Remove(a.partPath(j.SHA256))
		return false
	case j == nil || j.Rollout != o.Rollout || j.SHA256 != o.SHA256:
		a.fwCancel()
		if j != nil {
			os.Remove(a.partPath(j.SHA256))
		}
		nj := &fwJob{Rollout: o.Rollout, Version: o.Version, URL: o.URL, SHA256: strings.ToLower(o.SHA256), Size: o.Size,
			Signature: o.Signature, State: protocol.FirmwareDownloading, From: a.identity.Firmware}
		switch {
		case a.cfg.FirmwareHook == "":
			nj.State, nj.Reason = protocol.FirmwareFailed, "no firmware hook installed on this device (drover agent --firmware-hook)"
		case o.Size <= 0 || len(nj.SHA256) != 64:
			nj.State, nj.Reason = protocol.FirmwareFailed, "offer without size or sha256"
		case a.fwKey != nil && o.Signature == "":
			nj.State, nj.Reason = protocol.FirmwareFailed, "firmware is not signed and this device requires a signature"
		}
		a.log.Info("firmware offered", "rollout", o.Rollout, "version", o.Version, "size", o.Size, "state", nj.State, "reason", nj.Reason)
		a.fwProgress.Store(0)
		a.setJob(nj)
		if nj.State == protocol.FirmwareFailed {
			return true
		}
		a.fwDownload(ctx, *nj)
		return false
	}
	switch state {
	case protocol.FirmwareDownloading:
		a.fwDownload(ctx, *j) // resumes after a restart or a failed attempt
	case fwReady:
		j.State = protocol.FirmwareInstalling
		a.setJob(j)
		return true // report installing before the hook runs
	case protocol.FirmwareInstalling:
		if !j.Hooked {
			return a.fwInstall(ctx, j)
		}
	}
	return false
}

// setJob replaces the job and saves the state.
func (a *Agent) setJob(j *fwJob) {
	a.fwMu.Lock()
	a.st.Firmware = j
	a.fwMu.Unlock()
	a.save()
}

func (a *Agent) fwCancel() {
	a.fwMu.Lock()
	cancel := a.fwStop
	a.fwStop = nil
	a.fwMu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// fwDownload starts the background download of j unless one runs.
func (a *Agent) fwDownload(ctx context.Context, j fwJob) {
	a.fwMu.Lock()
	if a.fwStop != nil {
		a.fwMu.Unlock()
		return
	}
	dctx, cancel := context.WithCancel(ctx)
	a.fwStop = cancel
	a.fwMu.Unlock()
	go func() {
		err := a.fetchAndCheck(dctx, &j)
		a.fwMu.Lock()
		if a.fwStop != nil && dctx.Err() == nil {
			a.fwStop = nil
		}
		cur := a.st.Firmware
		if dctx.Err() == nil && cur != nil && cur.Rollout == j.Rollout && cur.SHA256 == j.SHA256 {
			if err != nil {
				cur.State, cur.Reason = protocol.FirmwareFailed, clean(err.Error(), protocol.MaxConfigErrorLen)
				a.log.Error("firmware download failed", "rollout", j.Rollout, "err", err)
			} else {
				cur.State = fwReady
				a.log.Info("firmware downloaded and checked", "rollout", j.Rollout, "version", j.Version)
			}
		}
		a.fwMu.Unlock()
		cancel()
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}()
}

// errCheck marks a download that arrived but is not the firmware offered.
var errCheck = errors.New("check failed")

// fetchAndCheck downloads j into its .part file, retrying transient errors
// until ctx ends, and checks it.
func (a *Agent) fetchAndCheck(ctx context.Context, j *fwJob) error {
	if err := os.MkdirAll(a.fwDir(), 0o700); err != nil {
		return err
	}
	path := a.partPath(j.SHA256)
	bo := backoff{min: a.cfg.MinBackoff, max: min(a.cfg.MaxBackoff, time.Minute)}
	for {
		err := a.fetch(ctx, j, path)
		if err == nil {
			err = a.check(j, path)
			if err != nil {
				os.Remove(path)
			}
			return err
		}
		if ctx.Err() != nil || errors.Is(err, errCheck) {
			return err
		}
		wait := bo.next()
		a.log.Warn("firmware download interrupted; resuming", "err", err, "retry_in", wait.Round(time.Millisecond),
			"have", a.fwProgress.Load(), "size", j.Size)
		if !sleepCtx(ctx, wait) {
			return ctx.Err()
		}
	}
}

// fetch appends the rest of the file to path (Range from its size).
func (a *Agent) fetch(ctx context.Context, j *fwJob, path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	have, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	a.fwProgress.Store(have)
	if have >= j.Size {
		return nil
	}
	u, token := j.URL, ""
	if strings.HasPrefix(u, "/") {
		u, token = a.client.base+u, a.st.Token
	} else if p, err := url.Parse(u); err != nil || !(p.Scheme == "https" || (p.Scheme == "http" && a.cfg.TLS.AllowHTTP)) {
		return fmt.Errorf("%w: firmware url %q is not https", errCheck, j.URL)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("%w: %v", errCheck, err)
	}
	req.Header.Set("User-Agent", a.client.userAgent)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if have > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(have, 10)+"-")
		if token != "" {
			req.Header.Set("If-Range", `"`+j.SHA256+`"`) // the server's ETag
		}
	}
	resp, err := a.client.files.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusPartialContent:
	case http.StatusOK: // the whole file
		if err := f.Truncate(0); err != nil {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		have = 0
	case http.StatusRequestedRangeNotSatisfiable:
		return nil // complete; the check decides
	default:
		return fmt.Errorf("firmware download: server answered %d", resp.StatusCode)
	}
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if have+int64(n) > j.Size {
				return fmt.Errorf("%w: the file is larger than the offered %d bytes", errCheck, j.Size)
			}
			if _, err := f.Write(buf[:n]); err != nil {
				return err
			}
			have += int64(n)
			a.fwProgress.Store(have)
		}
		if rerr == io.EOF {
			return f.Sync()
		}
		if rerr != nil {
			return rerr
		}
	}
}

// check verifies size, SHA-256 and, with a key, the signature of path.
func (a *Agent) check(j *fwJob, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	sum := h.Sum(nil)
	switch {
	case n != j.Size:
		return fmt.Errorf("%w: size %d, offered %d", errCheck, n, j.Size)
	case hex.EncodeToString(sum) != j.SHA256:
		return fmt.Errorf("%w: sha256 mismatch: got %x", errCheck, sum)
	}
	if a.fwKey != nil {
		sig, err := base64.StdEncoding.DecodeString(j.Signature)
		if err != nil || !ed25519.Verify(a.fwKey, sum, sig) {
			return fmt.Errorf("%w: the ed25519 signature does not verify with --firmware-key", errCheck)
		}
	}
	return nil
}

// fwInstall runs the hook on the checked file. A hook that reboots never
// returns; one that returns 0 without rebooting is verified by the
// firmware read again.
func (a *Agent) fwInstall(ctx context.Context, j *fwJob) bool {
	j.Hooked = true
	a.setJob(j)
	path := a.partPath(j.SHA256)
	env := append(a.env(), "DROVER_FIRMWARE_FILE="+path, "DROVER_FIRMWARE_VERSION="+j.Version, "DROVER_FIRMWARE_SHA256="+j.SHA256,
		"DROVER_FIRMWARE_ROLLOUT="+strconv.FormatUint(j.Rollout, 10))
	a.log.Info("installing firmware", "version", j.Version, "hook", a.cfg.FirmwareHook)
	out, errOut, err := runShell(ctx, a.cfg.FirmwareHook, nil, env, a.cfg.FirmwareHookTimeout)
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		msg := firstNonEmpty(lastLine(errOut), lastLine(out))
		if msg == "" || strings.HasPrefix(err.Error(), "timed out") {
			msg = "firmware hook " + err.Error()
		}
		j.State, j.Reason = protocol.FirmwareFailed, clean(msg, protocol.MaxConfigErrorLen)
		a.log.Error("firmware hook failed", "err", err, "reason", j.Reason)
		os.Remove(path)
		a.setJob(j)
		return true
	}
	if a.cfg.Identity.Firmware == "" {
		a.identity.Firmware = a.sys.identity().Firmware
	}
	if a.identity.Firmware == j.Version {
		a.log.Info("firmware installed", "version", j.Version)
		os.Remove(path)
		a.setJob(nil)
		return true
	}
	a.log.Info("firmware hook done; waiting for the reboot", "version", j.Version, "running", a.identity.Firmware)
	return false
}
